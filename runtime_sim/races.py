"""Race detection with happens-before (vector clocks), as ThreadSanitizer does.

Model
- Each queue ``q`` has a vector clock ``vc[q]``: ``vc[q][r]`` = how many instructions of queue
  ``r`` are known to have completed before the current point of ``q``. Same-queue accesses are
  ordered by program order.
- When an instruction completes it publishes ``vc[q]`` (with its own slot set to its index + 1)
  on every semaphore it signals. A satisfied wait ``(sem, n)`` joins the clocks published by the
  first ``n`` signals of ``sem`` in completion-time order (for a semaphore signalled by a single
  queue that is the clock of the n-th signal).
- Access history: per memory space (SBUF and PSUM by *physical* address, so buffers that the
  planner placed on the same bytes are checked against each other; each HBM buffer on its own),
  entries ``(queue, index, is_write, partitions [p0, p1), bytes [lo, hi))`` bucketed by address.
  A new access from ``q`` overlapping an entry from another queue ``r`` with at least one write
  is a race unless ``vc[q][r] > index``. Bounding boxes decide overlap when both patterns are
  dense; otherwise the exact sets of contiguous byte runs are intersected (patterns of more than
  2**20 runs fall back to the bounding box, which is conservative).
- Pruning: an entry is dropped when a newer access of the same queue covers it with at least the
  same kind (it would race with anything the old one races with), and periodically when every
  queue that has not finished has synchronised past it.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .checks import APGeom, RaceError, contiguous_run_elems

_SHIFT = 11            # bucket = 2 KiB of per-partition address space
_MAX_RUNS = 1 << 20
_PRUNE_EVERY = 4096
_BUCKET_PRUNE_LEN = 48


@lru_cache(maxsize=4096)
def _runs(base: int, dims: tuple[tuple[int, int], ...], isz: int) -> tuple[np.ndarray, int] | None:
    run = contiguous_run_elems(dims)
    outer = []
    acc = 1
    # dims after removing the innermost contiguous run
    rem = list(dims)
    while rem and acc < run:
        st, sz = rem.pop()
        acc *= sz
    for st, sz in rem:
        if sz > 1:
            outer.append((st, sz))
    n = 1
    for _, sz in outer:
        n *= sz
    if n > _MAX_RUNS:
        return None
    offs = np.zeros(1, dtype=np.int64)
    for st, sz in outer:
        offs = (offs[:, None] + np.arange(sz, dtype=np.int64)[None, :] * (st * isz)).ravel()
    return np.sort(offs + base), run * isz


def exact_overlap(a: APGeom, b: APGeom) -> bool:
    """Do two patterns (whose bounding boxes overlap) share a byte? Exact when both have at most
    2**20 contiguous runs."""
    ra = _runs(a.base, a.dims, a.itemsize)
    rb = _runs(b.base, b.dims, b.itemsize)
    if ra is None or rb is None:
        return True
    sa, la = ra
    sb, lb = rb
    if len(sa) < len(sb):
        sa, la, sb, lb = sb, lb, sa, la
    idx = np.searchsorted(sa, sb + lb, side="left")
    valid = idx > 0
    if not valid.any():
        return False
    cand = sa[np.maximum(idx - 1, 0)]
    return bool(np.any(valid & (cand + la > sb)))


class RaceDetector:
    def __init__(self, queue_names: list[str], stream_of: list) -> None:
        nq = len(queue_names)
        self.nq = nq
        self.names = queue_names
        self.streams = stream_of          # per queue: the instruction tuple (for messages)
        self.vc: list[list[int]] = [[0] * nq for _ in range(nq)]
        self.spaces: dict[object, dict[int, list]] = {}
        self.done = [False] * nq
        self.count = 0
        self.minclock: list[int] = [0] * nq

    # -- synchronisation ---------------------------------------------------------------------
    def join(self, q: int, clock: tuple[int, ...] | list[int]) -> None:
        v = self.vc[q]
        for r in range(self.nq):
            c = clock[r]
            if c > v[r]:
                v[r] = c

    def publish(self, q: int, index: int) -> tuple[int, ...]:
        v = self.vc[q]
        v[q] = index + 1
        return tuple(v)

    def finish(self, q: int) -> None:
        self.done[q] = True

    # -- accesses ----------------------------------------------------------------------------
    def access(self, q: int, index: int, g: APGeom, is_write: bool) -> None:
        buckets = self.spaces.get(g.space)
        if buckets is None:
            buckets = self.spaces[g.space] = {}
        vq = self.vc[q]
        p0, p1, lo, hi, dense = g.p0, g.p1, g.lo, g.hi, g.dense
        entry = (q, index, is_write, p0, p1, lo, hi, g)
        self.count += 1
        if self.count % _PRUNE_EVERY == 0:
            self._refresh_min()
        for b in range(lo >> _SHIFT, ((hi - 1) >> _SHIFT) + 1):
            lst = buckets.get(b)
            if lst is None:
                buckets[b] = [entry]
                continue
            drop = False
            for e in lst:
                eq = e[0]
                if eq == q:
                    if (is_write or not e[2]) and p0 <= e[3] and e[4] <= p1 and lo <= e[5] and e[6] <= hi \
                            and (dense or e[7].key == g.key):
                        drop = True
                    continue
                if vq[eq] > e[1] or not (is_write or e[2]):
                    continue
                if e[3] < p1 and p0 < e[4] and e[5] < hi and lo < e[6]:
                    if dense and e[7].dense or exact_overlap(g, e[7]):
                        self._race(q, index, is_write, g, e)
            if drop:
                lst = [e for e in lst if not (e[0] == q and (is_write or not e[2]) and p0 <= e[3]
                                              and e[4] <= p1 and lo <= e[5] and e[6] <= hi
                                              and (dense or e[7].key == g.key))]
            if len(lst) >= _BUCKET_PRUNE_LEN:
                m = self.minclock
                lst = [e for e in lst if m[e[0]] <= e[1]]
            lst.append(entry)
            buckets[b] = lst

    def _refresh_min(self) -> None:
        nq = self.nq
        m = [1 << 62] * nq
        for q in range(nq):
            if self.done[q]:
                continue
            v = self.vc[q]
            for r in range(nq):
                if r != q and v[r] < m[r]:
                    m[r] = v[r]
        self.minclock = m

    def _race(self, q: int, index: int, is_write: bool, g: APGeom, e: tuple) -> None:
        eq, ei, ew = e[0], e[1], e[2]
        other = self.streams[eq][ei]
        kind = lambda w: "writes" if w else "reads"
        raise RaceError(
            f"it {kind(is_write)} {_where(g)} which {self.names[eq]} #{ei} ({other}) {kind(ew)} "
            f"at {_where(e[7])}, and no semaphore path orders them "
            f"({self.names[q]} has seen {self.vc[q][eq]} instruction(s) of {self.names[eq]}, "
            f"needs > {ei})")


def _where(g: APGeom) -> str:
    sp = g.space
    name = f"hbm:{sp[1]}" if isinstance(sp, tuple) else sp.value
    return f"{name} partitions [{g.p0}, {g.p1}) bytes [{g.lo}, {g.hi})"
