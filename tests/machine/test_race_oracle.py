"""The race detector against a brute-force happens-before oracle on random programs.

Random programs over three compute queues touch a few overlapping (dense and strided) SBUF
regions, with random counting semaphores (several signallers per semaphore allowed). The oracle
builds the happens-before graph explicitly (program order + an edge from each of the first n
signals, in completion-time order, to a wait (sem, n)) and looks for conflicting accesses with no
path between them. The simulator must raise RaceError exactly when the oracle finds a race.
"""
from __future__ import annotations

import random

import pytest

from progs import B
from runtime_sim import (GPSIMD, SCALAR, VECTOR, DType, Instr, MemsetAttrs, Op, RaceError,
                         TensorCopyAttrs, ap)

F32 = DType.FP32
QUEUES = (VECTOR, SCALAR, GPSIMD)
# (partition_start, partitions, byte_offset, dims): dense tiles, a shifted tile and even/odd columns
REGIONS = [(0, 32, 0, ((1, 8),)), (32, 32, 0, ((1, 8),)), (0, 64, 16, ((1, 8),)),
           (0, 32, 0, ((2, 8),)), (0, 32, 4, ((2, 8),)), (0, 32, 128, ((1, 8),)), (0, 32, 64, ((1, 8),))]


def _bytes(reg):
    p0, n, off, dims = reg
    (st, sz), = dims
    return {(p, off + 4 * st * k + j) for p in range(p0, p0 + n) for k in range(sz) for j in range(4)}


def _random_program(rng: random.Random):
    b = B()
    buf = b.sbuf("t", 256)
    sent: dict[str, int] = {}
    n = rng.randint(3, 12)
    plan = []
    for _ in range(n):
        q = rng.randrange(3)
        waits = []
        for s, cnt in sent.items():
            if rng.random() < 0.85:
                waits.append((s, cnt if rng.random() < 0.8 else rng.randint(1, cnt)))
        sigs = []
        if rng.random() < 0.8:
            s = f"s{rng.randrange(2)}"
            sigs.append(s)
            sent[s] = sent.get(s, 0) + 1
        dst = rng.randrange(len(REGIONS))
        src = rng.randrange(len(REGIONS)) if rng.random() < 0.5 else None
        if src is not None and REGIONS[src][1] != REGIONS[dst][1]:
            src = None
        if src is None and q == 1:
            src = dst                   # ScalarE has no memset: copy the region onto itself
        plan.append((q, dst, src, tuple(waits), tuple(sigs)))
    for q, dst, src, waits, sigs in plan:
        p0, np_, off, dims = REGIONS[dst]
        d = ap(buf, F32, dims, partitions=np_, partition_start=p0, byte_offset=off)
        if src is None:
            ins = Instr(Op.MEMSET, d, (), MemsetAttrs(1.0), waits=waits, signals=sigs)
        else:
            s0, sn, soff, sdims = REGIONS[src]
            sa = ap(buf, F32, sdims, partitions=sn, partition_start=s0, byte_offset=soff)
            ins = Instr(Op.TENSOR_COPY, d, (sa,), TensorCopyAttrs(), waits=waits, signals=sigs)
        b.add(QUEUES[q], ins)
    return b, plan


def _oracle_has_race(b: B, plan) -> bool:
    res = b.run(mode="timing", checks=False, trace=True)
    # (queue name, index) -> completion time, from the trace
    done = {(e.queue, int(e.args["index"])): e.start_ns + e.dur_ns for e in res.trace}
    names = [q.name for q in QUEUES]
    nodes = []           # (queue, index in queue, plan entry)
    count = [0, 0, 0]
    for q, dst, src, waits, sigs in plan:
        nodes.append((q, count[q], (dst, src, waits, sigs)))
        count[q] += 1
    key = {(q, i): k for k, (q, i, _) in enumerate(nodes)}
    signals: dict[str, list[tuple[float, int]]] = {}
    for k, (q, i, (_, _, _, sigs)) in enumerate(nodes):
        for s in sigs:
            signals.setdefault(s, []).append((done[(names[q], i)], k))
    preds: dict[int, set[int]] = {k: set() for k in range(len(nodes))}
    for k, (q, i, (_, _, waits, _)) in enumerate(nodes):
        if i > 0:
            preds[k].add(key[(q, i - 1)])
        for s, n in waits:
            for _, src in sorted(signals[s])[:n]:
                preds[k].add(src)
    anc: dict[int, set[int]] = {}

    def ancestors(k: int) -> set[int]:
        if k not in anc:
            a: set[int] = set()
            for p in preds[k]:
                a |= {p} | ancestors(p)
            anc[k] = a
        return anc[k]

    acc = []
    for k, (q, i, (dst, src, _, _)) in enumerate(nodes):
        acc.append((k, q, True, _bytes(REGIONS[dst])))
        if src is not None:
            acc.append((k, q, False, _bytes(REGIONS[src])))
    for x in range(len(acc)):
        for y in range(x + 1, len(acc)):
            k1, q1, w1, b1 = acc[x]
            k2, q2, w2, b2 = acc[y]
            if q1 == q2 or not (w1 or w2) or not (b1 & b2):
                continue
            if k1 not in ancestors(k2) and k2 not in ancestors(k1):
                return True
    return False


@pytest.mark.parametrize("seed", range(300))
def test_race_detector_matches_oracle(seed):
    rng = random.Random(seed)
    b, plan = _random_program(rng)
    expected = _oracle_has_race(b, plan)
    try:
        b.run(mode="timing")
        found = False
    except RaceError:
        found = True
    assert found == expected, b.program()


@pytest.mark.parametrize("seed", range(300, 400))
def test_race_detector_matches_oracle_with_aggressive_pruning(seed, monkeypatch):
    import runtime_sim.races as races
    monkeypatch.setattr(races, "_PRUNE_EVERY", 2)
    monkeypatch.setattr(races, "_BUCKET_PRUNE_LEN", 1)
    test_race_detector_matches_oracle(seed)
