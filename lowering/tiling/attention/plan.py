"""Choices of the two-phase attention path (``attention/rows.py``), each made by pricing
candidate tile bodies with the simulator's cost table (``estimate.profile``): which key blocks'
exps go to VectorE's fast exponential, which P^T copies to ScalarE (NC-v4) and whether the row
sums come from the second product (``exp_plan``, by the softmax pipeline's time per query
block, ``unit_period``), whether a query block takes a key block's P^T by DMA transposes, the
cheapest engine for one instruction.

Invariants
- Every price comes from ``runtime_sim.costs`` through ``estimate.profile``; nothing here prices
  an instruction itself.
- The candidate bodies mirror what ``tile_rows`` emits for one query block (or a few in its
  program order, for ``unit_period``); they are scratch programs, never part of the program
  being tiled.
- A choice depends only on its (hashable) arguments: each is computed once per process.
"""
from __future__ import annotations

from functools import lru_cache

from lowering.tiling.attention.steps import F32, KB, MDT, QB, _cols, _half_max, _ones_column
from lowering.tiling.estimate import profile, scratch
from lowering.tir.builder import hbm_ap
from lowering.tir.schedule import probe_instr
from runtime_sim.costs import instr_cost
from runtime_sim.isa import ActFunc, AluOp, EngineKind, Memory, Op, Queue


class _Body:
    """A scratch program of tile_rows' instructions for query blocks of one shape: ``qk``,
    ``row_max``, ``exp``, ``transpose`` (P^T pieces and their copy out of PSUM) and ``pv``
    emit what tile_rows emits for one key block of width ``kw``."""

    def __init__(self, s, D: int, Dv: int, dt, pdt, nk: int, ones: bool, tag: str = ""):
        nd = -(-D // 128)
        self.s, self.D, self.Dv, self.pdt, self.tag = s, D, Dv, pdt, tag
        self.qt = s.tile("qt", Memory.SBUF, min(D, 128), nd * QB, dt, 1)
        self.kt = s.tile("kt", Memory.SBUF, min(D, 128), nd * KB, dt, 1)
        # the row sums from the second product (``_ones_column``): V and the output one wider
        self.ones = ones
        self.v = s.tile("v", Memory.SBUF, 128, Dv + self.ones, dt, 1)
        self.o = s.tile("o" + tag, Memory.PSUM, QB, Dv + self.ones, F32, 1)
        # per row (``tag``: a parity of unit_period's pipeline)
        self.mb = s.tile("mb" + tag, Memory.SBUF, QB, nk, MDT, 1)
        self.mh = s.tile("mh" + tag, Memory.SBUF, QB, nk * KB // 2, MDT, 1)
        self.m = s.tile("m" + tag, Memory.SBUF, QB, 1, F32, 1).ap()
        self.den = s.tile("den" + tag, Memory.SBUF, QB, 1, F32, 1).ap()

    def qk(self, name: str, kw: int):
        s, sc = self.s, self.s.tile(name, Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),))
        for d0 in range(0, self.D, 128):
            dw = min(128, self.D - d0)
            s.matmul(sc, self.qt.ap(dw, elem_offset=d0 // 128 * QB, dims=((1, QB),)),
                     self.kt.ap(dw, elem_offset=d0 // 128 * KB, dims=((1, kw),)))
        return sc

    def row_max(self, c: int, sc, kw: int) -> None:
        _half_max(self.s, _cols(self.mb.ap(), c, 1), sc, _cols(self.mh.ap(), c * KB // 2, kw // 2),
                  kw, AluOp.MAX)

    def exp(self, name: str, c: int, sc, kw: int, vector: bool):
        pc = self.s.tile(name + self.tag, Memory.SBUF, QB, KB, self.pdt, 1).ap(dims=((1, kw),))
        acc = {} if self.ones else {"accum": _cols(self.mb.ap(), c, 1)}
        if vector:
            self.s.exponential(pc, sc, self.m, **acc)
        else:
            self.s.activation(pc, sc, ActFunc.EXP, bias_ap=self.m, reduce=AluOp.ADD if acc else None, **acc)
        return pc

    def transpose(self, c: int, pc, kw: int, copy_engine: EngineKind, tensor: bool = True,
                  dma: bool = False):
        s, n = self.s, -(-kw // 128) * QB
        if dma:     # by DMA transposes (not counted: see estimate.profile), straight into SBUF
            return s.tile(f"pt{c}", Memory.SBUF, min(kw, 128), n, self.pdt, 1)
        tp = s.tile(f"t{c}{self.tag}", Memory.PSUM, min(kw, 128), n, self.pdt, 1)
        pt = s.tile(f"pt{c}{self.tag}", Memory.SBUF, min(kw, 128), n, self.pdt, 1)
        for s0 in range(0, kw, 128) if tensor else ():
            sw = min(128, kw - s0)
            s.transpose(_cols(tp.ap(), s0 // 128 * QB, QB, sw), _cols(pc, s0, sw))
        s.tensor_copy(pt.ap(), tp.ap(), engines=(copy_engine,))
        return pt

    def close(self, nk: int, nv: int) -> None:
        """A query block's per-row work besides its key blocks': m and -m on GpSimdE for
        VectorE's exps (else -scale * max on ScalarE, one instruction for several blocks), the
        row sums of several blocks' exp sums without the ones column (GpSimdE) and the output's
        normalisation, on the engine the builder picks for it (as ``_store``)."""
        self.stats(nk, nv)
        self.sums(nk)
        self.norm()

    def sums(self, nk: int) -> None:
        """Without the ones column, the row sum of several blocks' exp sums (GpSimdE)."""
        if not self.ones and nk > 1:
            self.s.tensor_reduce(self.den, self.mb.ap(), AluOp.ADD, engines=(EngineKind.GPSIMD,))

    def norm(self, engine: EngineKind | None = None) -> None:
        """The output's normalisation, on ``engine`` or the one the builder picks for it."""
        w = self.s.tile("w" + self.tag, Memory.SBUF, QB, self.Dv, self.pdt, 1)
        self.s.tensor_scalar(w.ap(), _cols(self.o.ap(), 0, self.Dv), AluOp.DIVIDE, self.den,
                             **({"engines": (engine,)} if engine else {}))

    def stats(self, nk: int, nv: int) -> None:
        """m and -m on GpSimdE for VectorE's exps, else -scale * max on ScalarE (one
        instruction for several blocks)."""
        s = self.s
        if nv:
            s.tensor_reduce(self.m, self.mb.ap(), AluOp.MAX, engines=(EngineKind.GPSIMD,))
            s.tensor_reduce(self.m, self.mb.ap(), AluOp.MAX, negate=True, engines=(EngineKind.GPSIMD,))
        elif nk > 1:
            s.activation(self.mb.ap(), self.mb.ap(), ActFunc.COPY, scale=-1.0, reduce=AluOp.MIN,
                         accum=self.m)

    def pv(self, pt, kw: int) -> None:
        for s0 in range(0, kw, 128):
            sw = min(128, kw - s0)
            self.s.matmul(self.o.ap(), _cols(pt.ap(), s0 // 128 * QB, QB, sw), self.v.ap(sw))


def block_busy(t, kbs, D: int, Dv: int, dt, pdt, nv: int, na: int, ones: bool, tensor: bool,
               dma: int = 0, close: bool = False) -> dict:
    """Busy time per engine of one full query block's work as tile_rows emits it (row maxes,
    exps with the first ``nv`` on VectorE, P^T copies with the first ``na`` on ScalarE, the row
    sums from the second product with ``ones`` (``_ones_column``), else from the exps; with
    ``tensor`` also its products, transposes and second products; the first ``dma`` key blocks'
    P^T by DMA transposes; with ``close`` also the row's closing work, ``_Body.close``), priced by
    the simulator's cost table (``estimate.profile``)."""
    with scratch(t) as s:
        body = _Body(s, D, Dv, dt, pdt, len(kbs), ones)
        for c, (_, kw) in enumerate(kbs):
            sc = (body.qk(f"s{c}", kw) if tensor
                  else s.tile(f"s{c}", Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),)))
            body.row_max(c, sc, kw)
            pc = body.exp(f"p{c}", c, sc, kw, c < nv)
            pt = body.transpose(c, pc, kw, EngineKind.SCALAR if c < na else EngineKind.VECTOR,
                                tensor, dma=c < dma)
            if tensor:
                body.pv(pt, kw)
        if close:
            body.close(len(kbs), nv)
    return profile(s)[0]


def spare_engine(t, busy: dict, emit, engines) -> EngineKind:
    """The engine of ``engines`` for one more instruction ``emit(builder, engine)`` in every
    unit whose engines are ``busy`` (``block_busy``): the one that keeps the busiest engine's
    time lowest with it added (ties: the cheaper instruction). An engine on the unit's critical
    chain that prices an instruction cheapest can still be the worse place for it."""
    best = None
    for e in engines:
        with scratch(t) as s:
            emit(s, e)
        cost = profile(s)[0][e]
        key = (max(busy.get(e, 0.0) + cost, max(busy.values(), default=0.0)), cost)
        if best is None or key < best[0]:
            best = (key, e)
    return best[1]


_RUN = 6     # query blocks of unit_period's longer pipeline: the first ones fill it


def unit_period(t, kbs, D: int, Dv: int, dt, pdt, nv: int, na: int, ones: bool) -> float:
    """The steady-state time per query block of tile_rows' softmax pipeline, one query block
    per unit, exps and P^T copies spread by (nv, na) and the row sums by ``ones`` (as
    ``block_busy``): per block, in tile_rows' program order, its row maxes (with background
    transposes the previous block's transposes and P^T copies between them, else after its
    statistics), the previous block's row sums, its statistics and exps, the previous block's
    normalisation (``norm_engine``); the second products, which only TensorE runs, are left
    out. Unlike the engines' busy times it sees the chains between engines: VectorE's exps wait
    for GpSimdE's part of the row max, a P^T copy for its exp and transposes, and whatever
    sits behind them in an in-order queue waits too. The difference of two such pipelines'
    makespans (``estimate.profile``: each instruction after the ones that wrote what it
    reads), ``_RUN`` and two blocks long, per block."""
    nk = len(kbs)
    norm = norm_engine(t, tuple(kw for _, kw in kbs), D, Dv, dt, pdt, nv, ones)

    def makespan(n: int) -> float:
        with scratch(t) as s:
            rows = [_Body(s, D, Dv, dt, pdt, nk, ones, tag=f"_{u}") for u in range(2)]
            banks = [[s.tile(f"s{c}_{u}", Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),))
                      for c, (_, kw) in enumerate(kbs)] for u in range(2)]
            prev = None

            def tp(c: int) -> None:
                if prev is not None:
                    prev[0].transpose(c, prev[1][c], kbs[c][1],
                                      EngineKind.SCALAR if c < na else EngineKind.VECTOR)
            for i in range(n):
                row, sc = rows[i % 2], banks[i % 2]
                for c, (_, kw) in enumerate(kbs):
                    if t.background_transpose:
                        tp(c)
                    row.row_max(c, sc[c], kw)
                if prev is not None:
                    prev[0].sums(nk)
                row.stats(nk, nv)
                for c in range(nk) if not t.background_transpose else ():
                    tp(c)
                pcs = [row.exp(f"p{c}", c, sc[c], kw, c < nv) for c, (_, kw) in enumerate(kbs)]
                if prev is not None:
                    prev[0].norm(norm)
                prev = (row, pcs)
        return profile(s)[1]
    return (makespan(_RUN) - makespan(2)) / (_RUN - 2)


@lru_cache(maxsize=None)
def exp_plan(t, kbs, D: int, Dv: int, dt, pdt, vector: bool = True) -> tuple[int, int, bool]:
    """(nv, na, ones): on a target with VectorE's fast exponential (and ``vector``), the first
    ``nv`` key blocks' exps go to it (the others stay on ScalarE; nv = 0 without it), the first
    ``na`` blocks' P^T copies to ScalarE (the others to VectorE), and with ``ones`` the row sums
    come from the second product (``_ones_column``: V one column wider; ScalarE's exps sum
    nothing, GpSimdE adds no sums up). Chosen by the cost model: the candidate whose softmax
    pipeline takes least time per query block (``unit_period``; ties: the lower busiest
    non-TensorE engine of ``block_busy``, then TensorE's time, then fewer moves)."""
    nk = len(kbs)
    best = None
    for ones in (True, False) if _ones_column(pdt, Dv, t) else (False,):
        for nv in range(nk + 1) if vector and t.vector_exp_speedup > 1 else (0,):
            for na in range(nk + 1):
                busy = block_busy(t, kbs, D, Dv, dt, pdt, nv, na, ones, tensor=True)
                tens = busy.pop(EngineKind.TENSOR, 0.0)
                key = (unit_period(t, kbs, D, Dv, dt, pdt, nv, na, ones), max(busy.values()),
                       tens, nv + na)
                if best is None or key < best[0]:
                    best = (key, (nv, na, ones))
    return best[1]


def _dma_ns(t, kw: int, D: int, Dv: int, dt, pdt, n: int, rows: int) -> float:
    """DMA time of a unit of ``rows`` query blocks whose first ``n`` key blocks' P^T come by DMA
    transposes (SBUF -> SBUF, a [128, 128] piece per 128 keys, each spread over every DMA engine,
    so their data phases queue one behind the other), beside its rows' Q^T loads and output
    stores: one fixed phase and every transfer's data phase, priced by ``runtime_sim.costs``."""
    with scratch(t) as s:
        p = s.tile("p", Memory.SBUF, QB, KB, pdt, 1)
        pt = s.tile("pt", Memory.SBUF, 128, -(-KB // 128) * QB, pdt, 1)
        s.hbm_tensor("x", QB * max(D, Dv) * 4, dt, "input")
        qt = s.tile("qt", Memory.SBUF, min(D, 128), -(-D // 128) * QB, dt, 1)
        w = s.tile("w", Memory.SBUF, QB, Dv, dt, 1)
        for _ in range(rows if n else 0):
            for d0 in range(0, D, 128):
                dw = min(128, D - d0)
                s.dma(_cols(qt.ap(dw), d0 // 128 * QB, QB, dw),
                      hbm_ap("x", dt, d0, dw, 1, ((QB, D),)), transpose=True)
            s.dma(hbm_ap("x", dt, 0, QB, Dv, ((Dv, 1),)), w.ap())
        for _ in range(n):
            for s0 in range(0, kw, 128):
                sw = min(128, kw - s0)
                s.dma(_cols(pt.ap(sw), s0 // 128 * QB, QB, sw), _cols(p.ap(), s0, sw), transpose=True)
    tp = s.program((), ())
    costs = [instr_cost(probe_instr(tp, ins), Queue(EngineKind.DMA), t) for ins, _ in tp.instrs()
             if ins.op is Op.DMA_COPY]
    return max((c.issue_ns for c in costs), default=0.0) + sum(c.busy_ns for c in costs)


@lru_cache(maxsize=None)
def dma_transposes(t, widths: tuple[int, ...], rows: int, D: int, Dv: int, dt, pdt, nv: int,
                   na: int, ones: bool) -> int:
    """How many of its first banks a unit of query blocks whose key blocks (in bank order) are
    ``widths`` wide (``rows`` query blocks) takes P^T of by DMA transposes (SBUF -> SBUF) instead of TensorE transposes
    and a PSUM -> SBUF copy: on a target that has them for 2-byte types and no background
    transposes, the count that keeps lowest the longer of the unit's busiest compute engine
    (``block_busy``: TensorE loses the transposes, VectorE the copy) and the DMA time of the
    transposes (``_dma_ns``: the unit's transfers must not fall behind the pipeline). The first
    banks: their exps are the unit's first, so their transposes have the rest of the unit's
    exps to land before the second products read them (``tile_rows`` issues those products
    last). Full key blocks only: a narrower bank (a short causal row) saves TensorE a
    transpose or two, less than the DMA's fixed phase adds to the latency of the row's second
    products (measured on causal SDPA)."""
    if t.background_transpose or t.dma_transpose_efficiency <= 0 or pdt.itemsize != 2:
        return 0
    kbs = tuple((0, kw) for kw in widths)
    full = next((i for i, kw in enumerate(widths) if kw < KB), len(widths))
    best = None
    for n in range(full + 1):
        busy = max(block_busy(t, kbs, D, Dv, dt, pdt, nv, na, ones, tensor=True, dma=n).values())
        key = max(busy, _dma_ns(t, KB, D, Dv, dt, pdt, n, rows))
        if best is None or key < best[0]:
            best = (key, n)
    return best[1]


@lru_cache(maxsize=None)
def norm_engine(t, widths: tuple[int, ...], D: int, Dv: int, dt, pdt, nv: int,
                ones: bool) -> EngineKind:
    """The engine of a unit's output normalisation (one instruction reading the output in
    PSUM): it sits in its engine's queue behind the next unit's exps (``tile_rows`` issues them
    first), and the unit after that waits for it (the output shares a score bank), so the one
    of VectorE and ScalarE whose queue holds less exp time for a unit of key blocks ``widths``
    wide, the first ``nv`` exps on VectorE (``exp_plan``), priced by ``estimate.profile``
    (ties: VectorE)."""
    with scratch(t) as s:
        body = _Body(s, D, Dv, dt, pdt, len(widths), ones)
        for c, kw in enumerate(widths):
            sc = s.tile(f"s{c}", Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),))
            body.exp(f"p{c}", c, sc, kw, c < nv)
    busy = profile(s)[0]
    return min((EngineKind.VECTOR, EngineKind.SCALAR), key=lambda e: busy.get(e, 0.0))
