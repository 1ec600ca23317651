"""The simulator's precompute pass: everything about a program that does not depend on time.

For every queue and instruction: its static cost (cached per *signature*, ``sim_static.py``:
op, cost-relevant attributes, and each operand's memory, partition start and count, free dims
and dtype; the instructions of a tiled loop share a few signatures), the dependent-instruction
penalty, its waits and signals, the checked geometry of its operands (when checks are on), TensorE facts for
the dynamic model (exposed LoadStationary time), the NC-v2 shared-port mask, and the static
statistics (FLOPs and their TensorE time at peak, transcendental ScalarE elements and their time
at the ScalarE rate, ``sim_static.TRANSCENDENTAL``; DMA count and bytes, HBM bytes, spill bytes).

A looped stream (``loops.Stream``) is prepared per static instruction by
``sim_prepare_loops.prepare_stream`` into the same lists (unless dynamic checks need every
instance as an instruction: the simulator then writes it out first).

Invariant: nothing here reads or advances simulated time; ``simulator._simulate`` runs the
event loop over the lists built here.
"""
from __future__ import annotations

import math
from typing import Iterator

from .checks import (MachineError, PsumGroups, check_ap, check_instr_shape, check_psum_bank,
                     check_waits, psum_banks_of)
from .costs import Cost, clock_ghz, depends_on_previous
from .isa import EngineKind, Instr, Op, Queue, matmul_kmn
from .loops import Stream
from .sim_prepare_loops import StreamPrep
from .sim_static import COST_ATTRS, PENALIZED, QueueLists, StaticFacts, cost_signature, penalty_ns
from .targets import Target

ENGINE_NAMES = ("pe", "dve", "act", "pool", "dma")


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


def _prepare_seq(q: Queue, stream: tuple[Instr, ...], tgt: Target, bufs: dict, checks: bool,
                 dynamic: bool, apcache: dict, spill_names: set[str]) -> QueueLists:
    """A straight-line stream, instruction by instruction (equal objects computed once)."""
    L = QueueLists()
    eng = q.engine
    clk = clock_ghz(eng, tgt)
    penalty = penalty_ns(eng, tgt)
    cost_attrs = COST_ATTRS
    cache: dict[tuple, StaticFacts] = {}
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
    icache: dict[tuple, tuple] = {}   # (op, ids of attrs and operands) -> (StaticFacts, geoms)
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
                key = cost_signature(ins, ak)
                st = cache.get(key)
                if st is None:
                    if checks:
                        check_instr_shape(ins, q, tgt)
                    st = cache[key] = StaticFacts(ins, q, tgt)
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
