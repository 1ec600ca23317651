"""Race detection with happens-before (vector clocks), as ThreadSanitizer does.

Model
- Each queue ``q`` has a vector clock ``vc[q]``: ``vc[q][r]`` = how many instructions of queue
  ``r`` are known to have completed before the current point of ``q``. Same-queue accesses are
  ordered by program order.
- When an instruction completes it publishes ``vc[q]`` (with its own slot set to its index + 1)
  on every semaphore it signals. A satisfied wait ``(sem, n)`` joins the clocks published by the
  first ``n`` signals of ``sem`` in completion-time order (the simulator keeps prefix joins, so a
  wait costs one join; for a semaphore signalled by a single queue the n-th clock already is the
  join).
- Access history: per memory space (SBUF and PSUM by *physical* address, so buffers that the
  planner placed on the same bytes are checked against each other; each HBM buffer on its own),
  read and write entries ``(queue, index, is_write, partitions [p0, p1), bytes [lo, hi), geom)``
  bucketed by address (bucket size adapted to the space: at least 2 KiB, at most 1/64 of it).
  A new access from ``q`` overlapping an entry from another queue ``r``, at least one of them a
  write, is a race unless ``vc[q][r] > index``. Bounding boxes decide overlap when both patterns
  are dense; otherwise the exact sets of contiguous byte runs are intersected (patterns of more
  than 2**20 runs fall back to the bounding box, which is conservative).
- What is recorded: a read only if some other queue ever writes that space, a write only if some
  other queue ever touches it (known statically from the program), so read-only inputs and
  single-queue scratch cost nothing.
- Pruning: an entry is dropped when a newer access of the same queue covers it with at least the
  same kind (it would race with anything the old one races with), and when every other queue
  that touches the space has either finished or synchronised past it.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .checks import APGeom, RaceError, contiguous_run_elems

_MAX_RUNS = 1 << 20
_PRUNE_EVERY = 2048
_BUCKET_PRUNE_LEN = 32


@lru_cache(maxsize=4096)
def _runs(base: int, dims: tuple[tuple[int, int], ...], isz: int) -> tuple[np.ndarray, int] | None:
    run = contiguous_run_elems(dims)
    acc = 1
    rem = list(dims)
    while rem and acc < run:           # drop the innermost contiguous run
        _, sz = rem.pop()
        acc *= sz
    outer = [(st, sz) for st, sz in rem if sz > 1]
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


class _Space:
    __slots__ = ("shift", "table", "writers", "accessors")

    def __init__(self, size: int, writers: set[int], accessors: set[int]) -> None:
        shift = 11
        while (size >> shift) > 64:
            shift += 1
        self.shift = shift
        self.table: dict[int, dict[int, list]] = {}   # bucket -> queue -> entries, oldest first
        self.writers = writers
        self.accessors = accessors


class RaceDetector:
    def __init__(self, queue_names: list[str], streams: list, spaces: dict[object, tuple[int, set[int], set[int]]]) -> None:
        """``spaces``: space -> (bytes per partition, queues that write it, queues that touch it)."""
        nq = len(queue_names)
        self.nq = nq
        self.names = queue_names
        self.streams = streams          # per queue: the instruction tuple (for messages)
        self.vc: list[list[int]] = [[0] * nq for _ in range(nq)]
        self.spaces = {k: _Space(*v) for k, v in spaces.items()}
        self.done = [False] * nq
        self.count = 0
        self.dead: dict[object, list[int]] = {k: [0] * nq for k in spaces}

    # -- synchronisation ---------------------------------------------------------------------
    def join(self, q: int, clock: tuple[int, ...]) -> None:
        v = self.vc[q]
        v[:] = map(max, v, clock)

    def publish(self, q: int, index: int) -> tuple[int, ...]:
        v = self.vc[q]
        v[q] = index + 1
        return tuple(v)

    def finish(self, q: int) -> None:
        self.done[q] = True

    # -- accesses ----------------------------------------------------------------------------
    def access(self, q: int, index: int, g: APGeom, is_write: bool) -> None:
        sp = self.spaces[g.space]
        if is_write:
            if len(sp.accessors) == 1:
                return                  # only this queue ever touches the space
        elif len(sp.writers) == 0 or (len(sp.writers) == 1 and q in sp.writers):
            return                      # nobody else ever writes here: reads cannot race
        self.count += 1
        if self.count % _PRUNE_EVERY == 0:
            self._refresh_dead()
        vq = self.vc[q]
        p0, p1, lo, hi, dense = g.p0, g.p1, g.lo, g.hi, g.dense
        shift = sp.shift
        table = sp.table
        key = g.key
        entry = (q, index, is_write, p0, p1, lo, hi, g)
        for b in range(lo >> shift, ((hi - 1) >> shift) + 1):
            bd = table.get(b)
            if bd is None:
                table[b] = {q: [entry]}
                continue
            # other queues' entries: a queue whose newest entry we are past is skipped at once
            for r, lst in bd.items():
                if r == q:
                    continue
                c = vq[r]
                if c > lst[-1][1]:
                    continue
                for e in reversed(lst):
                    if c > e[1]:
                        break
                    if (is_write or e[2]) and e[3] < p1 and p0 < e[4] and e[5] < hi and lo < e[6]:
                        if dense and e[7].dense or exact_overlap(g, e[7]):
                            self._race(q, index, is_write, g, e)
            # record; drop this queue's entries it covers (a write covers reads and writes, a
            # read covers reads): they could only race with what the new one races with
            lst = bd.get(q)
            if lst is None:
                bd[q] = [entry]
                continue
            e = lst[-1]
            if len(lst) == 1 and (is_write or not e[2]) and (e[7] is g or e[7].key == key):
                lst[0] = entry          # the common case: the same pattern again
                continue
            lst = [e for e in lst if not ((is_write or not e[2]) and p0 <= e[3] and e[4] <= p1
                                          and lo <= e[5] and e[6] <= hi and (dense or e[7].key == key))]
            if len(lst) >= _BUCKET_PRUNE_LEN:
                d = self.dead[g.space][q]
                lst = [e for e in lst if e[1] >= d]
            lst.append(entry)
            bd[q] = lst

    def _refresh_dead(self) -> None:
        """dead[space][r] = min over the other live queues touching the space of vc[q][r]: entries
        of r with index below it can never race again."""
        nq = self.nq
        for key, sp in self.spaces.items():
            m = [1 << 62] * nq
            for q in sp.accessors:
                if self.done[q]:
                    continue
                v = self.vc[q]
                for r in range(nq):
                    if r != q and v[r] < m[r]:
                        m[r] = v[r]
            self.dead[key] = m

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
