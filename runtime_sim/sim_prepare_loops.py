"""The simulator's precompute pass over a looped stream (``loops.Stream``), per static instruction.

Produces the same per-instance lists as ``sim_prepare._prepare_seq`` does for the stream's
straight-line expansion (busy and latency times, DMA costs, waits, signals, port masks, exposed
LoadStationary times, statistics), without building an instruction per instance: the static
facts (cost, signature, statistics) are computed once per static instruction and attribute
variant, and what depends on an instance's counters is evaluated for all of its instances at once
(numpy, via ``loops.Expansion``):
- waits: each looped wait's count and activity vectors; the instances' wait tuples are built per
  pattern of active waits;
- the dependent-instruction penalty (compute engines): per pair of consecutive static
  instructions that can touch the same buffer, the byte ranges of the previous instance's writes
  against this one's sources;
- exposed LoadStationary (TensorE): a matmul whose stationary (buffer, partitions, dims, offset)
  differs from the previous matmul's.
Statistics are summed per signature in order of first occurrence, as the straight-line pass does,
so every float sum (and the simulated time) is bit-identical. Static checks, when on, are
``checks_loops.check_stream``'s.
"""
from __future__ import annotations

import math

import numpy as np

from .checks_loops import check_stream
from .costs import clock_ghz
from .isa import Buffer, EngineKind, Instr, Op, Queue
from .loops import Expansion, Looped, Stream, base_of, operands
from .sim_prepare import _COST_ATTRS, PENALIZED, QueueLists, _signature, _Static, penalty_ns
from .targets import Target


def prepare_stream(q: Queue, stream: Stream, tgt: Target, bufs: dict[str, Buffer], checks: bool,
                   spill_names: set[str]) -> QueueLists:
    exp = check_stream(q, stream, bufs, tgt) if checks else Expansion(stream)
    L = QueueLists()
    eng = q.engine
    n = exp.n
    cache: dict[tuple, _Static] = {}
    # per (template, attribute variant): its _Static and positions
    groups: list[tuple[int, _Static, np.ndarray]] = []
    for t, it in enumerate(exp.templates):
        ins = base_of(it)
        pos = exp.pos(t)
        if not len(pos):
            continue
        variants = [(ins, pos)]
        if isinstance(it, Looped) and it.start_when:
            acc = exp.accumulate(t)
            assert acc is not None
            variants = [(ins, pos[acc]), (Instr(ins.op, ins.dst, ins.srcs, it.first_attrs(), ins.waits,
                                                ins.signals, ins.tag, ins.accum), pos[~acc])]
        for v, vpos in variants:
            if len(vpos):
                ak = v.attrs if checks else _COST_ATTRS[v.op](v.attrs)
                key = _signature(v, ak)
                st = cache.get(key)
                if st is None:
                    st = cache[key] = _Static(v, q, tgt)
                groups.append((t, st, vpos))
    code = np.empty(n, dtype=np.int64)       # position -> index in groups
    statics = [st for _, st, _ in groups]
    busy = np.empty(n)
    lat = np.empty(n)
    for g, (t, st, vpos) in enumerate(groups):
        code[vpos] = g
        busy[vpos] = st.busy
        lat[vpos] = st.lat
    pen = penalty_ns(eng, tgt)
    if pen and n > 1:
        _add_penalty(exp, busy, pen)
    L.busy = busy.tolist()
    L.lat = lat.tolist()
    codes = code.tolist()
    dma = eng is EngineKind.DMA
    if dma:
        L.dcost = list(map([st.cost for st in statics].__getitem__, codes))
    if tgt.shared_ports and eng in PENALIZED:
        L.ports = list(map([st.port for st in statics].__getitem__, codes))
    if eng is EngineKind.TENSOR:
        L.ls = _load_stationary(exp, tgt, clock_ghz(eng, tgt))
    # statistics per signature, in order of first occurrence
    for g in sorted(range(len(groups)), key=lambda g: int(groups[g][2][0])):
        t, st, vpos = groups[g]
        if dma or st.flops or st.trans:
            L.nst[st] = L.nst.get(st, 0) + len(vpos)
        if dma and spill_names:
            ins = base_of(exp.templates[t])
            if ins.srcs[0].buffer in spill_names or ins.dst.buffer in spill_names:  # type: ignore[union-attr]
                L.spill += len(vpos) * st.dma_bytes
    tids = exp.tid.tolist()
    L.sigs = list(map([base_of(it).signals for it in exp.templates].__getitem__, tids))
    for it in exp.templates:
        L.sig_set.update(base_of(it).signals)
    L.waits = _waits(exp, tids, L.wait_set)
    return L


def _waits(exp: Expansion, tids: list[int], used: set[str]) -> list[tuple]:
    """Every instance's concrete waits (what ``Looped.at`` gives), built per template."""
    w_l = list(map([base_of(it).waits for it in exp.templates].__getitem__, tids))
    for t, it in enumerate(exp.templates):
        static = base_of(it).waits
        for s, _ in static:
            used.add(s)
        if not isinstance(it, Looped) or not it.waits or not exp.size[t]:
            continue
        env, m = exp.env(t), exp.size[t]
        cols, act = [], []
        for w in it.waits:
            c = w.count.vector(env, m)
            a = c >= 1
            if w.guard is not None:
                a &= w.guard.vector(env, m) < w.bound
            cols.append(c)
            act.append(a)
        pattern = np.zeros(m, dtype=np.int64)
        for j, a in enumerate(act):
            pattern |= a.astype(np.int64) << j
        vals: list = [None] * m
        pats = np.unique(pattern)
        for p in pats.tolist():
            js = [j for j in range(len(it.waits)) if p >> j & 1]
            idx = np.flatnonzero(pattern == p) if len(pats) > 1 else None
            sel = [cols[j] if idx is None else cols[j][idx] for j in js]
            sems = [it.waits[j].sem for j in js]
            used.update(sems)
            got = _tuples(static, sems, [c.tolist() for c in sel], m if idx is None else len(idx))
            if idx is None:
                vals = got
            else:
                for k, v in zip(idx.tolist(), got):
                    vals[k] = v
        for p, v in zip(exp.pos(t).tolist(), vals):
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


def _add_penalty(exp: Expansion, busy: np.ndarray, pen: float) -> None:
    """``busy[i] += pen`` where instance ``i`` reads bytes instance ``i - 1`` wrote
    (``costs.depends_on_previous``, evaluated per pair of static instructions)."""
    T = len(exp.templates)
    tid = exp.tid
    pair = tid[:-1] * T + tid[1:]
    order = np.argsort(pair, kind="stable")
    sp = pair[order]
    cuts = np.flatnonzero(np.diff(sp)) + 1
    offs: dict[tuple[int, int], np.ndarray] = {}

    def off(t: int, slot: int) -> np.ndarray:
        o = offs.get((t, slot))
        if o is None:
            o = offs[(t, slot)] = exp.offsets(t, slot)
        return o

    for chunk in np.split(order, cuts):
        tp, tc = divmod(int(pair[chunk[0]]), T)
        prev, cur = base_of(exp.templates[tp]), base_of(exp.templates[tc])
        tests = _overlap_tests(prev, cur)
        if not tests:
            continue
        at = chunk + 1                                     # positions of the current instances
        kp = np.searchsorted(exp.pos(tp), at - 1)
        kc = np.searchsorted(exp.pos(tc), at)
        dep = np.zeros(len(at), dtype=bool)
        for ws, wlo, whi, rs, rlo, rhi in tests:
            wo = off(tp, ws)[kp]
            ro = off(tc, rs)[kc]
            dep |= (ro + rlo < wo + whi) & (wo + wlo < ro + rhi)
        busy[at[dep]] += pen


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


def _load_stationary(exp: Expansion, tgt: Target, clk: float) -> list[float]:
    """Exposed LoadStationary time per instance: a matmul whose stationary differs from the
    previous matmul's (the first one included)."""
    keys: dict[tuple, int] = {}
    parts = []
    for t, it in enumerate(exp.templates):
        ins = base_of(it)
        if ins.op is not Op.MATMUL or not exp.size[t]:
            continue
        s0 = ins.srcs[0]
        k = keys.setdefault((s0.buffer, s0.partition_start, s0.partitions, s0.dims), len(keys))
        m = exp.size[t]
        val = math.ceil(s0.free_size / tgt.load_stationary_speedup) / clk
        parts.append((exp.pos(t), np.full(m, k), exp.offsets(t, 2), np.full(m, val)))
    ls = np.zeros(exp.n)
    if parts:
        pos, key, off, val = (np.concatenate(c) for c in zip(*parts))
        order = np.argsort(pos, kind="stable")
        pos, key, off, val = pos[order], key[order], off[order], val[order]
        new = np.ones(len(pos), dtype=bool)
        new[1:] = (key[1:] != key[:-1]) | (off[1:] != off[:-1])
        ls[pos[new]] = val[new]
    return ls.tolist()
