"""The simulator's precompute pass: everything about a program that does not depend on time.

For every queue and instruction: its static cost (cached per *signature*: op, cost-relevant
attributes, and each operand's memory, partition start and count, free dims and dtype; the
instructions of a tiled loop share a few signatures), the dependent-instruction penalty, its
waits and signals, the checked geometry of its operands (when checks are on), TensorE facts for
the dynamic model (exposed LoadStationary time), the NC-v2 shared-port mask, and the static
statistics (FLOPs and their TensorE time at peak, transcendental ScalarE elements and their time
at the ScalarE rate, DMA count and bytes, HBM bytes, spill bytes).

Transcendental functions (``TRANSCENDENTAL``): the ``activation`` functions that only ScalarE's
lookup tables compute -- exp, log, tanh, sigmoid, gelu (erf and tanh forms), silu, erf, sin, cos.
Not in the set: sqrt, rsqrt and reciprocal (VectorE computes them with its ``pow`` / ``divide``
ALU ops, so they are not work that must run on ScalarE), and identity/copy/relu/square/abs/sign/
neg (VectorE work as well). Their time at the ScalarE rate is ``elements / (lanes x ScalarE
clock x the 2-byte factor when input and output are 2-byte floats)``: one element per lane per
cycle, all 128 lanes, no fixed cost, stride penalty or MIN_II floor.

A looped stream (``loops.Stream``) is prepared per static instruction by
``sim_prepare_loops.prepare_stream`` into the same lists (unless dynamic checks need every
instance as an instruction: the simulator then writes it out first).

Invariant: nothing here reads or advances simulated time; ``simulator._simulate`` runs the
event loop over the lists built here.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

from .checks import (MachineError, PsumGroups, check_ap, check_instr_shape, check_psum_bank,
                     check_waits, psum_banks_of)
from .costs import Cost, clock_ghz, depends_on_previous, indirect_bytes, instr_cost
from .isa import ActFunc, EngineKind, Instr, Memory, Op, Queue, matmul_kmn
from .loops import Stream
from .targets import Target

ENGINE_NAMES = ("pe", "dve", "act", "pool", "dma")
PENALIZED = (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD)  # dependent-instruction penalty
PORT_SBUF, PORT_PSUM = 1, 2   # NC-v2 shared ports: VectorE/GpSimdE on SBUF, VectorE/ScalarE on PSUM
TRANSCENDENTAL = frozenset({ActFunc.EXP, ActFunc.LOG, ActFunc.TANH, ActFunc.SIGMOID, ActFunc.GELU,
                            ActFunc.GELU_TANH, ActFunc.SILU, ActFunc.ERF, ActFunc.SIN, ActFunc.COS})


class _Static:
    """Per-signature facts of an instruction: its cost and its static statistics."""

    __slots__ = ("cost", "busy", "lat", "flops", "tensor_ns", "trans", "trans_ns", "dma_bytes",
                 "hbm_bytes", "port")

    def __init__(self, ins: Instr, q: Queue, tgt: Target) -> None:
        self.cost = c = instr_cost(ins, q, tgt, None)
        self.busy, self.lat = c.busy_ns, c.latency_ns
        self.flops = 0
        self.tensor_ns = 0.0
        self.trans = 0             # transcendental elements (ScalarE activation)
        self.trans_ns = 0.0
        self.dma_bytes = 0
        self.hbm_bytes = 0
        self.port = 0
        if ins.op is Op.MATMUL:
            st = ins.srcs[0]
            kk, mm, nn = matmul_kmn(ins)
            self.flops = 2 * kk * mm * nn
            self.tensor_ns = self.flops / tgt.peak_flops_per_ns(st.dtype.itemsize)
        elif ins.op is Op.ACTIVATION and ins.attrs.func in TRANSCENDENTAL:  # type: ignore[union-attr]
            s0 = ins.srcs[0]
            self.trans = s0.partitions * s0.free_size
            two = all(a.dtype.itemsize == 2 and a.dtype.is_float for a in (s0,) + ins.writes[:1])
            lanes_per_ns = tgt.lanes * tgt.scalar_clock_ghz * (
                tgt.scalar_bf16_factor if two else 1)
            self.trans_ns = self.trans / lanes_per_ns
        elif ins.op is Op.DMA_COPY:
            s0, d0 = ins.srcs[0], ins.dst
            assert d0 is not None
            self.dma_bytes = s0.bytes
            self.hbm_bytes = s0.bytes * ((s0.memory is Memory.HBM) + (d0.memory is Memory.HBM))
        elif ins.op is Op.DMA_GATHER or ins.op is Op.DMA_SCATTER:
            self.dma_bytes, _, self.hbm_bytes = indirect_bytes(ins)
        elif tgt.shared_ports and ins.op is not Op.SEM:
            mems = {a.memory for a in ins.writes + ins.srcs}
            e = q.engine
            if Memory.SBUF in mems and e in (EngineKind.VECTOR, EngineKind.GPSIMD):
                self.port |= PORT_SBUF
            if Memory.PSUM in mems and e in (EngineKind.VECTOR, EngineKind.SCALAR):
                self.port |= PORT_PSUM


# Which attributes the *cost* of an op depends on (the key used when checks are off; with checks
# on the whole attrs object is part of the key, since the operand rules read all of it).
_COST_ATTRS: dict[Op, Callable[[object], object]] = {
    Op.DMA_COPY: lambda a: a.transpose, Op.MATMUL: lambda a: a.perf_mode, Op.TRANSPOSE: lambda a: None,
    Op.ACTIVATION: lambda a: (a.reduce, a.func), Op.TENSOR_TENSOR: lambda a: a.op,
    Op.TENSOR_TENSOR_SCAN: lambda a: a.initial_from_src,
    Op.TENSOR_SCALAR: lambda a: (a.op0, a.reverse0, a.op1, a.reverse1),
    Op.TENSOR_REDUCE: lambda a: a.op, Op.TENSOR_COPY: lambda a: None,
    Op.MEMSET: lambda a: a.value == 0, Op.IOTA: lambda a: None, Op.SELECT: lambda a: None,
    Op.BN_STATS: lambda a: None, Op.BN_AGGR: lambda a: None, Op.DMA_GATHER: lambda a: None,
    Op.DMA_SCATTER: lambda a: a.accumulate, Op.MAX8: lambda a: None,
    Op.FIND_INDEX8: lambda a: None, Op.MATCH_REPLACE8: lambda a: None,
    Op.RAND_PHILOX: lambda a: None, Op.EXPONENTIAL: lambda a: None, Op.QUANTIZE_MX: lambda a: None,
    Op.SEM: lambda a: None,
}


def _signature(ins: Instr, akey: object) -> tuple:
    """Everything an instruction's cost and operand rules depend on, except byte offsets."""
    d = ins.dst
    k: tuple = (ins.op, akey) if d is None else (ins.op, akey, d.memory, d.partition_start, d.partitions,
                                                 d.dims, d.dtype)
    a = ins.accum
    if a is not None:
        k += (None, a.memory, a.partition_start, a.partitions, a.dims, a.dtype)
    for a in ins.srcs:
        k += (a.memory, a.partition_start, a.partitions, a.dims, a.dtype)
    return k


def _geoms(ins: Instr, eng: EngineKind, bufs: dict, apcache: dict, tgt: Target) -> tuple:
    """Checked geometry of every operand as ((geom, is_write), ...), cached per AP value."""
    out = []
    for role, a in (("dst", ins.dst), ("accum", ins.accum)):
        if a is not None:
            k = (a.buffer, a.memory, a.partition_start, a.partitions, a.byte_offset, a.dims, a.dtype)
            g = apcache.get(k)
            if g is None:
                g = apcache[k] = check_ap(a, bufs, role)
            out.append((g, True))
    n = 0
    for a in ins.srcs:
        k = (a.buffer, a.memory, a.partition_start, a.partitions, a.byte_offset, a.dims, a.dtype)
        g = apcache.get(k)
        if g is None:
            g = apcache[k] = check_ap(a, bufs, f"src{n}")
        out.append((g, False))
        n += 1
    if eng is EngineKind.TENSOR and out:
        check_psum_bank(out[0][0], tgt, ins.op.value, psum_banks_of(ins, tgt))
    return tuple(out)


class Prepared:
    """Per-queue lists (index = position in the queue's current chunk, see ``chunks``) and
    static statistics (complete after ``finish``)."""

    def __init__(self, nq: int) -> None:
        self.busy: list[list[float]] = []
        self.lat: list[list[float]] = []
        self.dcost: list[list[Cost] | None] = []      # DMA queues: the full Cost
        self.waits: list[list[tuple]] = []            # ends with a () sentinel
        self.sigs: list[list[tuple]] = []
        self.ports: list[list[int] | None] = []       # NC-v2 port masks (None: no port use)
        self.ls: list[list[float] | None] = []        # TensorE: exposed LoadStationary time
        self.tr: list[list[bool] | None] = []         # TensorE (NC-v4): a background-capable transpose?
        self.geoms: list[list[tuple]] | None = None
        # a looped stream comes in chunks: the lists above hold the current one; ``chunks[q]``
        # yields the next ones (None: the lists hold the whole stream)
        self.chunks: list[Iterator[QueueLists] | None] = []
        self.port_mask: list[int] = []                # OR of a queue's port masks
        self.has_ls: list[bool] = []                  # some exposed LoadStationary time possible
        self.has_tr: list[bool] = []                  # NC-v4 TensorE queue with a transpose
        self.sig_q: list[set[str]] = []
        self.wait_q: list[set[str]] = []
        self.touch: set[tuple[object, int, bool]] = set()
        self.flops = 0
        self.tensor_ns = 0.0             # sum over matmuls of FLOPs / TensorE peak for their dtype
        self.trans = 0                   # transcendental elements of ScalarE activations
        self.trans_ns = 0.0              # ... at the ScalarE rate (see the module docstring)
        self.dma_count = self.dma_bytes = self.hbm_bytes = self.spill_bytes = 0
        self.static_busy = dict.fromkeys(ENGINE_NAMES, 0.0)
        self._stats: list[tuple[EngineKind, QueueLists, object]] = []

    def load(self, q: int, L: QueueLists) -> None:
        """Make ``L`` queue ``q``'s current lists."""
        self.busy[q], self.lat[q], self.waits[q], self.sigs[q] = L.busy, L.lat, L.waits, L.sigs
        self.dcost[q], self.ports[q], self.ls[q], self.tr[q] = L.dcost, L.ports, L.ls, L.tr

    def finish(self) -> None:
        """Sum the static statistics (once every chunk has been taken), queue by queue."""
        for eng, st_l, sp in self._stats:
            for st, n in st_l.nst.items():      # per signature x occurrences
                self.dma_count += n if eng is EngineKind.DMA else 0
                self.dma_bytes += n * st.dma_bytes
                self.hbm_bytes += n * st.hbm_bytes
                self.flops += n * st.flops
                self.tensor_ns += n * st.tensor_ns
                self.trans += n * st.trans
                self.trans_ns += n * st.trans_ns
            self.spill_bytes += st_l.spill
            if eng is not EngineKind.DMA:
                self.static_busy[eng.value] += sum(st_l.busy) if sp is None else sp.busy_sum  # type: ignore[attr-defined]


class QueueLists:
    """One queue's per-instance lists (index = position in the stream) and its statistics."""

    __slots__ = ("busy", "lat", "waits", "sigs", "dcost", "ports", "ls", "tr", "geoms", "wait_set",
                 "sig_set", "nst", "spill")

    def __init__(self) -> None:
        self.busy: list[float] = []
        self.lat: list[float] = []
        self.waits: list[tuple] = []
        self.sigs: list[tuple] = []
        self.dcost: list[Cost] | None = None
        self.ports: list[int] | None = None
        self.ls: list[float] | None = None
        self.tr: list[bool] | None = None
        self.geoms: list[tuple] = []
        self.wait_set: set[str] = set()
        self.sig_set: set[str] = set()
        self.nst: dict[_Static, int] = {}     # DMA / matmul / transcendental signatures -> count,
        self.spill = 0                        # in order of first occurrence


def prepare(program, queues: list[Queue], streams: list, tgt: Target, bufs: dict,
            checks: bool, dynamic: bool) -> Prepared:
    """``streams[i]``: queue i's instructions, a tuple or (not with ``dynamic``) a
    ``loops.Stream``, which is prepared per static instruction, in chunks (sim_prepare_loops)."""
    P = Prepared(len(queues))
    if dynamic:
        P.geoms = []
    apcache: dict = {}
    spill_names = {b.name for b in program.buffers if b.name.startswith("spill")}
    for qi, (q, stream) in enumerate(zip(queues, streams)):
        sp = None
        if isinstance(stream, Stream):
            assert not dynamic, "dynamic checks run on materialized streams"
            from .sim_prepare_loops import StreamPrep
            sp = StreamPrep(q, stream, tgt, bufs, checks, spill_names)
            chunks = sp.chunks()
            L = next(chunks)
            P._stats.append((q.engine, sp.stats, sp))
            P.chunks.append(chunks)
            P.port_mask.append(sp.port_mask if sp.ports else 0)
            P.has_ls.append(sp.has_matmul)
            P.has_tr.append(sp.has_transpose)
            P.wait_q.append(sp.stats.wait_set)
            P.sig_q.append(sp.stats.sig_set)
        else:
            L = _prepare_seq(q, stream, tgt, bufs, checks, dynamic, apcache, spill_names)
            if dynamic:
                for gs in L.geoms:
                    for g, is_w in gs:
                        P.touch.add((g.space, qi, is_w))
            L.waits.append(())               # sentinel: the "head" of a finished queue
            if L.ports is not None and not any(L.ports):
                L.ports = None
            if L.ls is not None and not any(L.ls):
                L.ls = None
            if L.tr is not None and not any(L.tr):
                L.tr = None
            P._stats.append((q.engine, L, None))
            P.chunks.append(None)
            m = 0
            for x in L.ports or ():
                m |= x
            P.port_mask.append(m)
            P.has_ls.append(L.ls is not None)
            P.has_tr.append(L.tr is not None)
            P.wait_q.append(L.wait_set)
            P.sig_q.append(L.sig_set)
            if P.geoms is not None:
                P.geoms.append(L.geoms)
        for lst in (P.busy, P.lat, P.waits, P.sigs, P.dcost, P.ports, P.ls, P.tr):
            lst.append(None)  # type: ignore[arg-type]
        P.load(qi, L)
    return P


def penalty_ns(eng: EngineKind, tgt: Target) -> float:
    """The dependent-instruction penalty of a compute engine (0 on TensorE and DMA)."""
    if eng in (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD):
        return tgt.dependent_vector_penalty_cycles / clock_ghz(eng, tgt)
    return 0.0


def _prepare_seq(q: Queue, stream: tuple[Instr, ...], tgt: Target, bufs: dict, checks: bool,
                 dynamic: bool, apcache: dict, spill_names: set[str]) -> QueueLists:
    """A straight-line stream, instruction by instruction (equal objects computed once)."""
    L = QueueLists()
    eng = q.engine
    clk = clock_ghz(eng, tgt)
    penalty = penalty_ns(eng, tgt)
    cost_attrs = _COST_ATTRS
    cache: dict[tuple, _Static] = {}
    b_l, l_l, w_l, s_l, g_l = L.busy, L.lat, L.waits, L.sigs, L.geoms
    d_l: list[Cost] | None = [] if eng is EngineKind.DMA else None
    p_l: list[int] | None = [] if tgt.shared_ports and eng in PENALIZED else None
    tensor = eng is EngineKind.TENSOR
    ls_l: list[float] | None = [] if tensor else None
    tr_l: list[bool] | None = [] if tensor and tgt.background_transpose else None
    L.dcost, L.ports, L.ls, L.tr = d_l, p_l, ls_l, tr_l
    groups = PsumGroups(tgt) if tensor and checks else None
    prev_st = prev_st_obj = None
    prev: Instr | None = None
    prev_buf: str | None = None
    q_wait_add, q_sig_update = L.wait_set.add, L.sig_set.update
    icache: dict[tuple, tuple] = {}   # (op, ids of attrs and operands) -> (_Static, geoms)
    nst = L.nst
    depc: dict[tuple, bool] = {}      # (ids of the previous writes, ids of the sources) -> dependent?
    last_sg = None
    for i, ins in enumerate(stream):
        op = ins.op
        d = ins.dst
        ss = ins.srcs
        ns = len(ss)
        # fast path: an instruction made of the very same attrs/AP objects as an earlier one
        # (ids are stable: the program keeps every object alive while this runs)
        if ns == 1:
            ikey = (op, id(ins.attrs), id(d), id(ins.accum), id(ss[0]))
        elif ns == 2:
            ikey = (op, id(ins.attrs), id(d), id(ins.accum), id(ss[0]), id(ss[1]))
        else:
            ikey = (op, id(ins.attrs), id(d), id(ins.accum)) + tuple(map(id, ss))
        hit = icache.get(ikey)
        try:
            if hit is None:
                ak = ins.attrs if checks else cost_attrs[op](ins.attrs)
                key = _signature(ins, ak)
                st = cache.get(key)
                if st is None:
                    if checks:
                        check_instr_shape(ins, q, tgt)
                    st = cache[key] = _Static(ins, q, tgt)
                gs = _geoms(ins, eng, bufs, apcache, tgt) if checks else None
                icache[ikey] = (st, gs)
            else:
                st, gs = hit
            if checks:
                for x in ins.waits:
                    if type(x[1]) is not int or x[1] < 1 or not x[0]:
                        check_waits(ins)
                if groups is not None and gs and (op is Op.MATMUL or op is Op.TRANSPOSE):
                    groups.step(ins, gs[0][0])
                if dynamic:
                    g_l.append(gs)
        except MachineError as e:
            raise e.with_context(q, i, ins) from None
        bz = st.busy
        if penalty:
            if prev_buf is not None:
                for x in ss:
                    if x.buffer == prev_buf or prev.accum is not None:  # type: ignore[union-attr]
                        dk = (id(prev.dst), id(prev.accum)) + tuple(map(id, ss))  # type: ignore[union-attr]
                        dep = depc.get(dk)
                        if dep is None:
                            dep = depc[dk] = depends_on_previous(ins, prev)
                        if dep:
                            bz += penalty
                        break
            prev = ins
            prev_buf = d.buffer if d is not None else None
        b_l.append(bz)
        l_l.append(st.lat)
        if d_l is not None:
            d_l.append(st.cost)
            nst[st] = nst.get(st, 0) + 1
            if spill_names and (ss[0].buffer in spill_names or d.buffer in spill_names):  # type: ignore[union-attr]
                L.spill += st.dma_bytes
        elif st.flops or st.trans:
            nst[st] = nst.get(st, 0) + 1
        if p_l is not None:
            p_l.append(st.port)
        if ls_l is not None:
            ls = 0.0
            if op is Op.MATMUL:
                s0 = ss[0]
                if s0 is not prev_st_obj:
                    sk = (s0.buffer, s0.partition_start, s0.partitions, s0.byte_offset, s0.dims)
                    if sk != prev_st:
                        ls = math.ceil(matmul_kmn(ins)[1] / tgt.load_stationary_speedup) / clk
                    prev_st = sk
                    prev_st_obj = s0
            ls_l.append(ls)
        if tr_l is not None:
            tr_l.append(op is Op.TRANSPOSE)
        wt = ins.waits
        w_l.append(wt)
        if wt:
            for x in wt:
                q_wait_add(x[0])
        sg = ins.signals
        s_l.append(sg)
        if sg and sg is not last_sg:
            q_sig_update(sg)
            last_sg = sg
    return L
