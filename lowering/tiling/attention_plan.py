"""Choices of the two-phase attention path (``attention_rows.py``), each made by pricing
candidate tile bodies with the simulator's cost table (``estimate.profile``): which key blocks'
exps go to VectorE's fast exponential and which P^T copies to ScalarE (NC-v4), whether a query
block takes a key block's P^T by DMA transposes, the engines of the row maxes, the cheapest
engine for one instruction.

Invariants
- Every price comes from ``runtime_sim.costs`` through ``estimate.profile``; nothing here prices
  an instruction itself.
- The candidate bodies mirror what ``tile_rows`` emits for one query block (or two, for the
  maxes); they are scratch programs, never part of the program being tiled.
"""
from __future__ import annotations

from lowering.tiling.attention_steps import F32, KB, QB, _cols
from runtime_sim.isa import ActFunc, AluOp, EngineKind, Memory


def block_busy(t, kbs, D: int, Dv: int, dt, pdt, nv: int, na: int, tensor: bool) -> dict:
    """Busy time per engine of one full query block's work as tile_rows emits it (row maxes,
    exps with the first ``nv`` on VectorE, P^T copies with the first ``na`` on ScalarE; with
    ``tensor`` also its products, transposes and second products), priced by the simulator's
    cost table (``estimate.profile``)."""
    from lowering.tiling.estimate import profile, scratch
    nk, nd = len(kbs), -(-D // 128)
    with scratch(t) as s:
        mb = s.tile("mb", Memory.SBUF, QB, nk, F32, 1)
        m = s.tile("m", Memory.SBUF, QB, 1, F32, 1).ap()
        if tensor:
            qt = s.tile("qt", Memory.SBUF, min(D, 128), nd * QB, dt, 1)
            kt = s.tile("kt", Memory.SBUF, min(D, 128), nd * KB, dt, 1)
            v = s.tile("v", Memory.SBUF, 128, Dv, dt, 1)
            o = s.tile("o", Memory.PSUM, QB, Dv, F32, 1)
        for c, (_, kw) in enumerate(kbs):
            sc = s.tile(f"s{c}", Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),))
            pc = s.tile(f"p{c}", Memory.SBUF, QB, KB, pdt, 1).ap(dims=((1, kw),))
            for d0 in range(0, D, 128) if tensor else ():
                dw = min(128, D - d0)
                s.matmul(sc, qt.ap(dw, elem_offset=d0 // 128 * QB, dims=((1, QB),)),
                         kt.ap(dw, elem_offset=d0 // 128 * KB, dims=((1, kw),)))
            s.tensor_reduce(_cols(mb.ap(), c, 1), sc, AluOp.MAX,
                            engines=(EngineKind.VECTOR if c % 2 == 0 else EngineKind.GPSIMD,))
            if c < nv:
                s.exponential(pc, sc, m, accum=_cols(mb.ap(), c, 1))
            else:
                s.activation(pc, sc, ActFunc.EXP, bias_ap=m, reduce=AluOp.ADD, accum=_cols(mb.ap(), c, 1))
            tp = s.tile(f"t{c}", Memory.PSUM, min(kw, 128), -(-kw // 128) * QB, pdt, 1)
            pt = s.tile(f"pt{c}", Memory.SBUF, min(kw, 128), -(-kw // 128) * QB, pdt, 1)
            for s0 in range(0, kw, 128) if tensor else ():
                sw = min(128, kw - s0)
                s.transpose(_cols(tp.ap(), s0 // 128 * QB, QB, sw), _cols(pc, s0, sw))
            s.tensor_copy(pt.ap(), tp.ap(), engines=(EngineKind.SCALAR if c < na else EngineKind.VECTOR,))
            for s0 in range(0, kw, 128) if tensor else ():
                sw = min(128, kw - s0)
                s.matmul(o.ap(), _cols(pt.ap(), s0 // 128 * QB, QB, sw), v.ap(sw))
    return profile(s)[0]


def max_engines(t, prev_w: list[int], next_w: list[int], D: int, Dv: int, dt, pdt,
                 copy_engines, nv: int) -> tuple[EngineKind, ...]:
    """The engine of each row-max reduce of a query block whose key blocks are ``next_w`` wide,
    issued (as tile_rows does) after its products and before the previous block's (``prev_w``)
    transposes, P^T copies and second products, then its own exps (the first ``nv`` on
    VectorE's fast exponential). Chosen by the cost table:
    the candidate (the first k maxes on VectorE, even key blocks first, the rest on GpSimdE)
    whose body, run alone in program order (``estimate.profile``'s makespan), ends first: the
    maxes gate the exps, the copies gate TensorE's second products, and VectorE serves both."""
    from lowering.tiling.estimate import profile, scratch
    n, nd = len(next_w), -(-D // 128)
    order = [c for c in range(n) if c % 2 == 0] + [c for c in range(n) if c % 2]
    best = None
    for k in range(n + 1):
        eng = tuple(EngineKind.VECTOR if c in order[:k] else EngineKind.GPSIMD for c in range(n))
        with scratch(t) as s:
            qt = s.tile("qt", Memory.SBUF, min(D, 128), nd * QB, dt, 1)
            kt = s.tile("kt", Memory.SBUF, min(D, 128), nd * KB, dt, 1)
            v = s.tile("v", Memory.SBUF, 128, Dv, dt, 1)
            o = s.tile("o", Memory.PSUM, QB, Dv, F32, 1)
            mb = s.tile("mb", Memory.SBUF, QB, n, F32, 1)
            m = s.tile("m", Memory.SBUF, QB, 1, F32, 1).ap()
            sc = []
            for c, kw in enumerate(next_w):
                sc.append(s.tile(f"s{c}", Memory.PSUM, QB, KB, F32, 1).ap(dims=((1, kw),)))
                for d0 in range(0, D, 128):
                    dw = min(128, D - d0)
                    s.matmul(sc[c], qt.ap(dw, elem_offset=d0 // 128 * QB, dims=((1, QB),)),
                             kt.ap(dw, elem_offset=d0 // 128 * KB, dims=((1, kw),)))
                s.tensor_reduce(_cols(mb.ap(), c, 1), sc[c], AluOp.MAX, engines=(eng[c],))
            s.tensor_reduce(m, mb.ap(), AluOp.MAX, engines=(EngineKind.GPSIMD,))
            pts = []
            for c, kw in enumerate(prev_w):
                pc = s.tile(f"p{c}", Memory.SBUF, QB, KB, pdt, 1).ap(dims=((1, kw),))
                tp = s.tile(f"t{c}", Memory.PSUM, min(kw, 128), -(-kw // 128) * QB, pdt, 1)
                pts.append(s.tile(f"pt{c}", Memory.SBUF, min(kw, 128), -(-kw // 128) * QB, pdt, 1))
                for s0 in range(0, kw, 128):
                    sw = min(128, kw - s0)
                    s.transpose(_cols(tp.ap(), s0 // 128 * QB, QB, sw), _cols(pc, s0, sw))
                s.tensor_copy(pts[c].ap(), tp.ap(), engines=copy_engines)
            for c, kw in enumerate(next_w):
                pn = s.tile(f"pn{c}", Memory.SBUF, QB, KB, pdt, 1).ap(dims=((1, kw),))
                if c < nv:
                    s.exponential(pn, sc[c], m, accum=_cols(mb.ap(), c, 1))
                else:
                    s.activation(pn, sc[c], ActFunc.EXP, bias_ap=m, reduce=AluOp.ADD,
                                 accum=_cols(mb.ap(), c, 1))
            for c, kw in enumerate(prev_w):
                for s0 in range(0, kw, 128):
                    sw = min(128, kw - s0)
                    s.matmul(o.ap(), _cols(pts[c].ap(), s0 // 128 * QB, QB, sw), v.ap(sw))
        key = profile(s)[1]
        if best is None or key < best[0]:
            best = (key, eng)
    return best[1]


def cheapest_engine(t, emit, engines) -> EngineKind:
    """The engine of ``engines`` on which the instruction ``emit(builder, engine)`` writes costs
    least (``estimate.profile``)."""
    from lowering.tiling.estimate import profile, scratch
    best = None
    for e in engines:
        with scratch(t) as s:
            emit(s, e)
        busy = profile(s)[0][e]
        if best is None or busy < best[0]:
            best = (busy, e)
    return best[1]


def exp_plan(t, kbs, D: int, Dv: int, dt, pdt) -> tuple[int, int]:
    """(nv, na): on a target with VectorE's fast exponential, the first ``nv`` key blocks' exps
    go to it (the others stay on ScalarE) and the first ``na`` blocks' P^T copies to ScalarE
    (the others to VectorE); (0, 0) without it. Chosen by the cost model: each candidate's
    non-TensorE work of one query block is priced per engine (``block_busy``) and the busiest
    engine's time is kept lowest (ties: fewer moves)."""
    if t.vector_exp_speedup <= 1:
        return 0, 0
    nk = len(kbs)
    best = None
    for nv in range(nk + 1):
        for na in range(nk + 1):
            busy = block_busy(t, kbs, D, Dv, dt, pdt, nv, na, tensor=False)
            key = (max(busy.values()), nv + na)
            if best is None or key < best[0]:
                best = (key, (nv, na))
    return best[1]


def dma_transposes(t, kbs, D: int, Dv: int, dt, pdt, nv: int, na: int) -> bool:
    """Whether a full query block's first key block takes its P^T by DMA transposes (SBUF ->
    SBUF) instead of TensorE: on a target that has them for 2-byte types and no background
    transposes, when TensorE is the busiest engine of the block (``block_busy``). One key
    block only: a [128, 128] transpose spans all 128 partitions, so every DMA engine, and a
    second block's transfers would queue behind the first's past the second products that
    read them."""
    if t.background_transpose or t.dma_transpose_efficiency <= 0 or pdt.itemsize != 2:
        return False
    busy = block_busy(t, kbs, D, Dv, dt, pdt, nv, na, tensor=True)
    return busy.get(EngineKind.TENSOR, 0.0) > max(v for e, v in busy.items() if e is not EngineKind.TENSOR)
