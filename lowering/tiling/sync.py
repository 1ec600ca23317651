"""Synchronisation: derive every semaphore wait from the bytes instructions touch.

After memory planning every access has a physical address. Walking the program in order, an
instruction that reads bytes depends on the last writers of those bytes; one that writes depends
on the last writers and readers since (read-after-write, write-after-read, write-after-write).
Dependencies on the same queue are free (queues run in order). The remaining ones become waits on
one counting semaphore per queue (``sem.<queue>``); a wait already implied by an earlier wait of
the same queue (tracked with vector clocks) is dropped. Only instructions that are waited on
signal, and a wait's count is the number of signals of that queue up to the awaited instruction.

Invariants
- For every pair of accesses to overlapping bytes in program order (at least one a write) on
  different queues, the later instruction is ordered after the earlier by a semaphore path.
- The result is race-free by construction; the simulator's race checker verifies it.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from lowering.tiling.builder import PInstr, Pool
from lowering.tiling.schedule import Rect, covers, overlaps, rect_of
from runtime_sim.isa import AP, Instr, Memory, Queue


def sem_name(q: Queue) -> str:
    return f"sem.{q.name}"


class _History:
    """Live accesses per address space, bucketed by pool so that only pools that share bytes
    are compared."""

    def __init__(self, pools: dict[str, Pool]):
        self.entries: dict[str, list[tuple[Rect, bool, int, Queue]]] = defaultdict(list)
        self.neighbours: dict[str, list[str]] = {}
        by_mem: dict[Memory, list[Pool]] = defaultdict(list)
        for p in pools.values():
            if p.offset is not None:
                by_mem[p.memory].append(p)
        for ps in by_mem.values():
            for p in ps:
                lo, hi = p.offset, p.offset + p.bytes_per_partition
                self.neighbours[p.name] = [q.name for q in ps
                                           if q.offset < hi and lo < q.offset + q.bytes_per_partition]
        self.pools = pools

    def key_rect(self, a: AP) -> tuple[str, Rect]:
        if a.memory is Memory.HBM:
            return a.buffer, rect_of(a)
        return a.buffer, rect_of(a, self.pools[a.buffer].offset or 0)

    def access(self, a: AP, is_write: bool, idx: int, deps: set[int]) -> None:
        key, r = self.key_rect(a)
        for nb in self.neighbours.get(key, (key,)):
            for (r2, w2, j, _q) in self.entries.get(nb, ()):
                if (is_write or w2) and overlaps(r, r2):
                    deps.add(j)

    def record(self, a: AP, is_write: bool, idx: int, q: Queue) -> None:
        """Remember an access. A write retires every entry it covers (later accesses to those
        bytes are ordered after this write, hence after them); a read retires only an earlier
        read of the same bytes by the same queue (queues run in order)."""
        key, r = self.key_rect(a)
        if is_write:
            for nb in self.neighbours.get(key, (key,)):
                lst = self.entries.get(nb)
                if lst:
                    lst[:] = [e for e in lst if not covers(r, e[0])]
        else:
            lst = self.entries[key]
            lst[:] = [e for e in lst if not (e[0] == r and not e[1] and e[3] == q)]
        self.entries[key].append((r, is_write, idx, q))


def synchronize(instrs: list[PInstr], pools: dict[str, Pool]) -> dict[Queue, tuple[Instr, ...]]:
    hist = _History(pools)
    pos: list[int] = []                       # position of each instruction in its queue
    counts: dict[Queue, int] = defaultdict(int)
    waits_of: list[list[tuple[Queue, int]]] = []
    # vector clocks: per queue, versions (position from which valid, clock dict)
    versions: dict[Queue, list[tuple[int, dict[Queue, int]]]] = defaultdict(list)
    known: dict[Queue, dict[Queue, int]] = defaultdict(dict)

    def clock_at(q: Queue, p: int) -> dict[Queue, int]:
        vs = versions[q]
        i = bisect.bisect_right([v[0] for v in vs], p) - 1 if vs else -1
        base = dict(vs[i][1]) if i >= 0 else {}
        base[q] = p
        return base

    for idx, ins in enumerate(instrs):
        q = ins.queue
        p = counts[q]
        counts[q] += 1
        pos.append(p)
        deps: set[int] = set()
        for a in ins.srcs:
            hist.access(a, False, idx, deps)
        for a in (ins.dst, ins.accum):
            if a is not None:
                hist.access(a, True, idx, deps)
        for a in ins.srcs:
            hist.record(a, False, idx, q)
        for a in (ins.dst, ins.accum):
            if a is not None:
                hist.record(a, True, idx, q)
        # latest dependency per other queue
        latest: dict[Queue, int] = {}
        for j in deps:
            qj = instrs[j].queue
            if qj == q:
                continue
            if pos[j] > latest.get(qj, -1):
                latest[qj] = pos[j]
        kq = known[q]
        ws: list[tuple[Queue, int]] = []
        changed = False
        for qj, pj in sorted(latest.items(), key=lambda kv: -kv[1]):
            if kq.get(qj, -1) >= pj:
                continue
            ws.append((qj, pj))
            for k, v in clock_at(qj, pj).items():
                if v > kq.get(k, -1):
                    kq[k] = v
            changed = True
        if changed:
            versions[q].append((p, dict(kq)))
        waits_of.append(ws)

    # signal only what is awaited; a count is the number of signals up to that position
    signalers: dict[Queue, set[int]] = defaultdict(set)
    for ws in waits_of:
        for qj, pj in ws:
            signalers[qj].add(pj)
    ordinal: dict[Queue, dict[int, int]] = {}
    for qj, s in signalers.items():
        ordinal[qj] = {pj: i + 1 for i, pj in enumerate(sorted(s))}

    streams: dict[Queue, list[Instr]] = defaultdict(list)
    for idx, ins in enumerate(instrs):
        q = ins.queue
        waits = tuple((sem_name(qj), ordinal[qj][pj]) for qj, pj in waits_of[idx])
        signals = (sem_name(q),) if pos[idx] in signalers.get(q, ()) else ()
        streams[q].append(ins.to_instr(waits, signals))
    return {q: tuple(v) for q, v in streams.items()}
