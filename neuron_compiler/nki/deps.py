"""The tracer's access records: which queue last read or wrote which bytes of a memory space.

Before an instruction is emitted, the tracer asks the records of each space it touches for the
semaphore counts to wait for (tracer.py, "Synchronisation"): for a read, the last writer of
every overlapping box on each queue; for a write, the last reader or writer. Only the largest
count per (box, queue) can ever be asked for (a queue's counts grow), so the records are an
index, not a log: ``box -> {semaphore: [last write count, last access count]}``, one entry per
distinct box, however often a kernel re-reads a tile. A write drops every box it covers.

A kernel re-reading the same tiles in a loop (attention over a long sequence) kept one record
per read before, and each instruction scanned them all: tracing ``attn_fwd_v3`` at s4096 did
not finish in 20 minutes, ~38,000 records per space holding ~20 distinct boxes.

Boxes are tuples of half-open ``(lo, hi)`` ranges (HBM: per tensor dimension; on chip:
(partitions, bytes)); ``None`` is the whole space.
"""
from __future__ import annotations

from typing import Callable, Iterator


def overlap(a, b) -> bool:
    if a is None or b is None:
        return True
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def covers(a, b) -> bool:
    """Box ``a`` contains box ``b``."""
    if a is None:
        return True
    if b is None:
        return False
    return all(lo1 <= lo2 and hi2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


class Records:
    """Access records of one memory space (module docstring)."""

    __slots__ = ("boxes",)

    def __init__(self) -> None:
        self.boxes: dict = {}       # box -> {sem: [last write count, last access count]}

    def __len__(self) -> int:
        return len(self.boxes)

    def waits(self, box, write: bool, want: Callable[[str, int], None]) -> None:
        """Call ``want(sem, count)`` for what an access of ``box`` must wait for: the last
        overlapping writes (a read), or the last overlapping reads and writes (a write)."""
        k = 1 if write else 0
        for b, sems in self.boxes.items():
            if overlap(box, b):
                for sem, e in sems.items():
                    if e[k]:
                        want(sem, e[k])

    def add(self, box, sem: str, count: int, write: bool) -> None:
        """Record an access by ``sem``'s instruction ``count``; a write first drops the boxes it
        covers (every later access of those bytes orders against this write instead)."""
        if write:
            gone = [b for b in self.boxes if covers(box, b)]
            for b in gone:
                del self.boxes[b]
        e = self.boxes.setdefault(box, {}).setdefault(sem, [0, 0])
        if write and count > e[0]:
            e[0] = count
        if count > e[1]:
            e[1] = count

    def merge(self, other: "Records", keep: Callable[[object], bool] = lambda b: True) -> None:
        """Take ``other``'s records of the boxes ``keep`` accepts (a buffer reusing freed memory
        inherits the old tile's accesses there)."""
        for b, sems in other.boxes.items():
            if not keep(b):
                continue
            mine = self.boxes.setdefault(b, {})
            for sem, (w, a) in sems.items():
                e = mine.setdefault(sem, [0, 0])
                e[0], e[1] = max(e[0], w), max(e[1], a)

    def __iter__(self) -> Iterator[tuple]:
        """(box, sem, last write count, last access count) of every record."""
        for b, sems in self.boxes.items():
            for sem, (w, a) in sems.items():
                yield b, sem, w, a
