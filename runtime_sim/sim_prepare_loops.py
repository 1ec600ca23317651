"""The simulator's precompute pass over a looped stream (``loops.Stream``), per static instruction.

Produces, chunk by chunk, the same per-instance lists as ``sim_prepare`` gives for
the stream's straight-line expansion (busy and latency times, DMA costs, waits, signals, port
masks, exposed LoadStationary times) and the same statistics, without an instruction object per
instance:
- static facts (cost, signature, statistics) once per static instruction and attribute variant
  (a matmul with ``start_when``: accumulating or starting a group);
- a chunk is a unit of ``loops.units`` (at most ``loops.UNIT`` instances; every iteration of a
  cut loop shares one ``Expansion``, so a repeated body is derived once); what depends on the
  counters is evaluated for all of a chunk's instances at once (numpy):
  * waits: each looped wait's count and activity; the wait tuples are built per pattern of
    active waits;
  * the dependent-instruction penalty (compute engines): per pair of consecutive static
    instructions that can touch the same buffer, the previous instance's written bytes against
    this one's sources (across a chunk boundary: the two instances themselves);
  * exposed LoadStationary (TensorE): a matmul whose stationary (buffer, partitions, dims,
    offset) differs from the previous matmul's (carried across chunks);
- statistics are summed per signature in order of first occurrence, busy time in instance
  order, as the straight-line pass does, so every float sum (and the simulated time) is
  bit-identical.
Memory: the static facts plus one chunk's lists and arrays, whatever the trip counts. Static
checks, when on, are ``checks_loops.check_stream``'s, before the first chunk.
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .checks_loops import check_stream
from .costs import clock_ghz, depends_on_previous
from .isa import Buffer, EngineKind, Instr, Op, Queue, matmul_kmn
from .loops import Expansion, Looped, Stream, base_of, operands, units
from .sim_static import COST_ATTRS, PENALIZED, QueueLists, StaticFacts, cost_signature, penalty_ns
from .targets import Target


class StreamPrep:
    """A looped stream's static facts; ``chunks()`` yields its per-instance lists in order and
    accumulates its statistics into ``stats`` (complete once every chunk has been taken)."""

    def __init__(self, q: Queue, stream: Stream, tgt: Target, bufs: dict[str, Buffer],
                 checks: bool, spill_names: set[str]) -> None:
        if checks:
            check_stream(q, stream, bufs, tgt)
        self.q, self.stream, self.tgt = q, stream, tgt
        eng = q.engine
        self.dma = eng is EngineKind.DMA
        self.pen = penalty_ns(eng, tgt)
        self.clk = clock_ghz(eng, tgt)
        self.ports = tgt.shared_ports and eng in PENALIZED
        self.stats = QueueLists()             # nst, spill, wait/signal sets (no lists)
        self.busy_sum = 0.0
        cache: dict[tuple, StaticFacts] = {}
        # id(template) -> (static of the base attributes, of the group-starting variant | None)
        self.static: dict[int, tuple[StaticFacts, StaticFacts | None]] = {}
        self.spill: set[int] = set()          # ids of DMA templates that move spill bytes
        self.port_mask = 0
        self.has_matmul = False
        self.bg = eng is EngineKind.TENSOR and tgt.background_transpose   # NC-v4 lanes (costs.TensorLanes)
        self.has_transpose = False
        for it, _ in stream.statics():
            if id(it) in self.static:
                continue
            ins = base_of(it)
            vs: list[StaticFacts | None] = []
            for v in (ins, _first_variant(it)):
                if v is None:
                    vs.append(None)
                    continue
                key = cost_signature(v, v.attrs if checks else COST_ATTRS[v.op](v.attrs))
                st = cache.get(key)
                if st is None:
                    st = cache[key] = StaticFacts(v, q, tgt)
                vs.append(st)
            self.static[id(it)] = (vs[0], vs[1])  # type: ignore[assignment]
            self.port_mask |= vs[0].port | (vs[1].port if vs[1] is not None else 0)  # type: ignore[union-attr]
            self.has_matmul |= ins.op is Op.MATMUL
            self.has_transpose |= self.bg and ins.op is Op.TRANSPOSE
            if self.dma and spill_names and (ins.srcs[0].buffer in spill_names
                                             or ins.dst.buffer in spill_names):  # type: ignore[union-attr]
                self.spill.add(id(it))
            self.stats.sig_set.update(ins.signals)
            self.stats.wait_set.update(s for s, _ in ins.waits)
            if isinstance(it, Looped):
                self.stats.wait_set.update(w.sem for w in it.waits)
        self._prev: Instr | None = None       # the last instance so far (dependent penalty)
        self._skeys: dict[tuple, int] = {}    # stationary (buffer, partitions, dims) -> number
        self._last_st: tuple | None = None    # the last matmul's (stationary number, offset)

    def chunks(self) -> Iterator[QueueLists]:
        for ue, outer, _ in units(self.stream.body):
            if ue.n:
                yield self._chunk(ue, outer)

    def _chunk(self, ue: Expansion, outer: dict[str, int]) -> QueueLists:
        L = QueueLists()
        n = ue.n
        groups: list[tuple[int, StaticFacts, np.ndarray]] = []    # (template, static, positions)
        for t, it in enumerate(ue.templates):
            if not ue.size[t]:
                continue
            st, st_first = self.static[id(it)]
            pos = ue.pos(t)
            if st_first is None:
                groups.append((t, st, pos))
            else:
                acc = ue.accumulate(t, outer)
                assert acc is not None
                for s, vpos in ((st, pos[acc]), (st_first, pos[~acc])):
                    if len(vpos):
                        groups.append((t, s, vpos))
        code = np.empty(n, dtype=np.int64)
        busy = np.empty(n)
        lat = np.empty(n)
        for g, (t, st, vpos) in enumerate(groups):
            code[vpos] = g
            busy[vpos] = st.busy
            lat[vpos] = st.lat
        if self.pen:
            self._penalty(ue, outer, busy)
        L.busy = busy.tolist()
        L.lat = lat.tolist()
        self.busy_sum = sum(L.busy, self.busy_sum)
        codes = code.tolist()
        statics = [st for _, st, _ in groups]
        if self.dma:
            L.dcost = list(map([st.cost for st in statics].__getitem__, codes))
        if self.ports:
            L.ports = list(map([st.port for st in statics].__getitem__, codes))
        if self.q.engine is EngineKind.TENSOR:
            L.ls = self._load_stationary(ue, outer)
            if self.has_transpose:
                L.tr = [base_of(it).op is Op.TRANSPOSE for it in ue.templates]
                L.tr = list(map(L.tr.__getitem__, ue.tid.tolist()))
        nst = self.stats.nst
        for t, st, vpos in sorted(groups, key=lambda g: int(g[2][0])):
            if self.dma or st.flops or st.trans:
                nst[st] = nst.get(st, 0) + len(vpos)
            if id(ue.templates[t]) in self.spill:
                self.stats.spill += len(vpos) * st.dma_bytes
        tids = ue.tid.tolist()
        L.sigs = list(map([base_of(it).signals for it in ue.templates].__getitem__, tids))
        L.waits = _waits(ue, outer, tids)
        L.waits.append(())                    # sentinel: the "head" past the chunk
        return L

    def _instance(self, ue: Expansion, outer: dict[str, int], i: int) -> Instr:
        """Instance ``i`` of a chunk, as an instruction."""
        t = int(ue.tid[i])
        it = ue.templates[t]
        if not isinstance(it, Looped):
            return it
        k = int(np.searchsorted(ue.pos(t), i))
        return it.at(ue.env_at(t, k, outer))

    def _penalty(self, ue: Expansion, outer: dict[str, int], busy: np.ndarray) -> None:
        """``busy[i] += pen`` where instance ``i`` reads bytes instance ``i - 1`` wrote
        (``costs.depends_on_previous``, evaluated per pair of static instructions)."""
        prev = self._prev
        if prev is not None and prev.dst is not None and \
                depends_on_previous(self._instance(ue, outer, 0), prev):
            busy[0] += self.pen
        self._prev = self._instance(ue, outer, ue.n - 1)
        if ue.n < 2:
            return
        T = len(ue.templates)
        tid = ue.tid
        pair = tid[:-1] * T + tid[1:]
        order = np.argsort(pair, kind="stable")
        cuts = np.flatnonzero(np.diff(pair[order])) + 1
        offs: dict[tuple[int, int], np.ndarray] = {}

        def off(t: int, slot: int) -> np.ndarray:
            o = offs.get((t, slot))
            if o is None:
                o = offs[(t, slot)] = ue.offsets(t, slot, outer)
            return o

        for chunk in np.split(order, cuts):
            tp, tc = divmod(int(pair[chunk[0]]), T)
            tests = _overlap_tests(base_of(ue.templates[tp]), base_of(ue.templates[tc]))
            if not tests:
                continue
            at = chunk + 1                                     # positions of the later instances
            kp = np.searchsorted(ue.pos(tp), at - 1)
            kc = np.searchsorted(ue.pos(tc), at)
            dep = np.zeros(len(at), dtype=bool)
            for ws, wlo, whi, rs, rlo, rhi in tests:
                wo = off(tp, ws)[kp]
                ro = off(tc, rs)[kc]
                dep |= (ro + rlo < wo + whi) & (wo + wlo < ro + rhi)
            busy[at[dep]] += self.pen

    def _load_stationary(self, ue: Expansion, outer: dict[str, int]) -> list[float]:
        """Exposed LoadStationary time per instance: a matmul whose stationary differs from the
        previous matmul's (the first one included)."""
        parts = []
        for t, it in enumerate(ue.templates):
            ins = base_of(it)
            if ins.op is not Op.MATMUL or not ue.size[t]:
                continue
            s0 = ins.srcs[0]
            m = ue.size[t]
            key = self._skeys.setdefault((s0.buffer, s0.partition_start, s0.partitions, s0.dims),
                                         len(self._skeys))
            val = math.ceil(matmul_kmn(ins)[1] / self.tgt.load_stationary_speedup) / self.clk
            parts.append((ue.pos(t), np.full(m, key), ue.offsets(t, 2, outer), np.full(m, val)))
        ls = np.zeros(ue.n)
        if parts:
            pos, key, off, val = (np.concatenate(c) for c in zip(*parts))
            order = np.argsort(pos, kind="stable")
            pos, key, off, val = pos[order], key[order], off[order], val[order]
            new = np.ones(len(pos), dtype=bool)
            new[1:] = (key[1:] != key[:-1]) | (off[1:] != off[:-1])
            new[0] = self._last_st != (int(key[0]), int(off[0]))
            self._last_st = (int(key[-1]), int(off[-1]))
            ls[pos[new]] = val[new]
        return ls.tolist()


def _first_variant(it: Instr | Looped) -> Instr | None:
    """A matmul with ``start_when``: the instruction of the instances that start a group."""
    if not isinstance(it, Looped) or not it.start_when:
        return None
    ins = it.ins
    return Instr(ins.op, ins.dst, ins.srcs, it.first_attrs(), ins.waits, ins.signals, ins.tag,
                 ins.accum)


def _waits(ue: Expansion, outer: dict[str, int], tids: list[int]) -> list[tuple]:
    """Every instance's concrete waits (what ``Looped.at`` gives), built per template."""
    w_l = list(map([base_of(it).waits for it in ue.templates].__getitem__, tids))
    for t, it in enumerate(ue.templates):
        if not isinstance(it, Looped) or not it.waits or not ue.size[t]:
            continue
        static = it.ins.waits
        env, m = ue.env(t, outer), ue.size[t]
        cols, act = [], []
        for w in it.waits:
            c = w.count.vector(env, m)
            a = c >= 1
            if w.guard is not None:
                a &= w.guard.vector(env, m) < w.bound
            cols.append(c)
            act.append(a)
        # the pattern of active waits per instance (a row of booleans: an instruction may
        # wait on more semaphores than an integer has bits)
        pats, pattern = np.unique(np.stack(act, axis=1), axis=0, return_inverse=True)
        pattern = pattern.reshape(-1)
        vals: list = [None] * m
        for pi, p in enumerate(pats.tolist()):
            js = [j for j in range(len(it.waits)) if p[j]]
            idx = np.flatnonzero(pattern == pi) if len(pats) > 1 else None
            sel = [(cols[j] if idx is None else cols[j][idx]).tolist() for j in js]
            got = _tuples(static, [it.waits[j].sem for j in js], sel, m if idx is None else len(idx))
            if idx is None:
                vals = got
            else:
                for k, v in zip(idx.tolist(), got):
                    vals[k] = v
        for p, v in zip(ue.pos(t).tolist(), vals):
            w_l[p] = v
    return w_l


def _tuples(static: tuple, sems: list[str], cols: list[list[int]], m: int) -> list[tuple]:
    if not sems:
        return [static] * m
    if len(sems) == 1:
        s0 = sems[0]
        return [static + ((s0, a),) for a in cols[0]] if static else [((s0, a),) for a in cols[0]]
    if len(sems) == 2 and not static:
        s0, s1 = sems
        return [((s0, a), (s1, b)) for a, b in zip(*cols)]
    if len(sems) == 3 and not static:
        s0, s1, s2 = sems
        return [((s0, a), (s1, b), (s2, c)) for a, b, c in zip(*cols)]
    return [static + tuple(zip(sems, r)) for r in zip(*cols)]


def _overlap_tests(prev: Instr, ins: Instr) -> list[tuple[int, int, int, int, int, int]]:
    """The (write slot, its extent relative to the offset, source slot, its extent) pairs whose
    byte ranges decide ``depends_on_previous(ins, prev)``; empty when it is always False."""
    if prev.dst is None:
        return []
    pb = prev.dst.buffer
    pa = prev.accum.buffer if prev.accum is not None else None
    if not any(r.buffer == pb or r.buffer == pa for r in ins.srcs):
        return []
    out = []
    pops, iops = operands(prev), operands(ins)
    for ws in (0, 1):
        w = pops[ws]
        if w is None:
            continue
        for rs in range(2, len(iops)):
            r = iops[rs]
            assert r is not None
            if r.buffer == w.buffer and r.partition_start < w.partition_start + w.partitions \
                    and w.partition_start < r.partition_start + r.partitions:
                wl, wh = w.byte_extent()
                rl, rh = r.byte_extent()
                out.append((ws, wl - w.byte_offset, wh - w.byte_offset,
                            rs, rl - r.byte_offset, rh - r.byte_offset))
    return out
