"""Helpers of the simulator that run once per result or on the error path: trace arguments,
the DMA busy-interval union, the deadlock report and the late-writer race report."""
from __future__ import annotations

import numpy as np

from .checks import DeadlockError, RaceError
from .isa import Instr, Queue
from .races import exact_overlap


def _trace_args(ins: Instr, index: int) -> dict[str, str]:
    a = {"index": str(index), "instr": str(ins)}
    if ins.dst is not None:
        a["dst"] = str(ins.dst)
    for k, s in enumerate(ins.srcs):
        a[f"src{k}"] = str(s)
    if ins.waits:
        a["waits"] = ",".join(f"{n}>={c}" for n, c in ins.waits)
    if ins.signals:
        a["signals"] = ",".join(ins.signals)
    if ins.tag:
        a["tag"] = ins.tag
    return a


def _late_writer(q: int, mine: tuple, geoms: list[list[tuple]], heads: list[int], lens: list[int],
                 qnames: list[str], streams: list[tuple[Instr, ...]]) -> RaceError | None:
    """An instruction read never-written bytes: if a not-yet-issued instruction of another queue
    writes them, nothing orders the two (it would have been issued first), so report the race."""
    for g, is_w in mine:
        if is_w:
            continue
        for r in range(len(heads)):
            if r == q:
                continue
            for j in range(heads[r], lens[r]):
                for g2, w2 in geoms[r][j]:
                    if w2 and g2.space == g.space and g2.p0 < g.p1 and g.p0 < g2.p1 and g2.lo < g.hi \
                            and g.lo < g2.hi and (g.dense and g2.dense or exact_overlap(g, g2)):
                        return RaceError(
                            f"it reads bytes that were never written when it ran; {qnames[r]} #{j} "
                            f"({streams[r][j]}) writes them, and no semaphore path orders the write "
                            f"before this read")
    return None


def _union(iv: list[tuple[float, float]]) -> float:
    if not iv:
        return 0.0
    a = np.array(iv, dtype=np.float64)
    a = a[np.argsort(a[:, 0], kind="stable")]
    ends = np.maximum.accumulate(a[:, 1])
    total = 0.0
    # merge: a new run starts where start > max end so far
    starts = a[:, 0]
    prev_end = np.concatenate([[-np.inf], ends[:-1]])
    new = starts > prev_end
    run_id = np.cumsum(new) - 1
    run_start = starts[new]
    run_end = np.zeros(len(run_start))
    np.maximum.at(run_end, run_id, a[:, 1])
    total = float(np.sum(run_end - run_start))
    return total


def _deadlock(blocked: list[int], queues: list[Queue], streams: list[tuple[Instr, ...]],
              heads: list[int], waits: list[list[tuple]], sem_times: dict[str, list[float]],
              signallers: dict[str, set[int]]) -> DeadlockError:
    lines = []
    for q in blocked:
        i = heads[q]
        unmet = []
        for s, n in waits[q][i]:
            have = len(sem_times[s])
            if have < n:
                who = sorted(queues[x].name for x in signallers.get(s, ()))
                src = f"signalled by {', '.join(who)}" if who else "no instruction signals it"
                unmet.append(f"{s!r} >= {n} (count is {have}; {src})")
        lines.append(f"{queues[q].name} #{i}: {streams[q][i]}\n    waits on {'; '.join(unmet) or '?'}")
    return DeadlockError(f"{len(blocked)} queue(s) can never proceed:\n  " + "\n  ".join(lines))
