"""Static memory offset assignment ("buffer packing").

Problem: every buffer ``(id, lower, upper, size)`` is alive over the half-open
interval ``[lower, upper)`` and must get an ``offset`` such that two buffers
alive at the same time never share an address in ``[offset, offset + size)``.
The goal is a small peak ``max(offset + size)``; the lower bound is the largest
total size alive at one instant.

Algorithm (ideas from MiniMalloc, Moreira et al., ASPLOS 2023; no code taken):

1. Time is cut into *sections*, the intervals between consecutive distinct
   endpoints; a buffer covers a contiguous run of sections.
2. A depth-first search decides "does everything fit below capacity C?".  It
   only builds *canonical* solutions: buffers are placed in non-decreasing
   ``(offset, rank)`` order and each buffer sits directly on top of the
   highest already-placed buffer it overlaps (its *minimum offset*), i.e. the
   placed buffers form a skyline.  Pruning rules:
     * dominance: never place a buffer at or above the minimum *top* of any
       unplaced buffer (that one could have gone underneath);
     * section inference: in every section the floor plus the total size of
       the still-unplaced buffers must stay within C;
     * unallocated floor: a section's floor is at least the smallest minimum
       offset of its unplaced buffers;
     * "hatless" pruning: if a placement raised nobody and still failed,
       the alternatives at that node fail too;
     * dynamic decomposition: once no unplaced buffer crosses a section
       boundary, both sides are solved independently.
3. The optimiser (a) runs the search without capacity, i.e. one greedy
   descent (the skyline heuristic), for nine static rank orders; (b) tries
   the lower bound with each order; (c) bisects between the lower bound and
   the best peak with short searches, the k-th order aiming slightly below
   the midpoint (success is chaotic in the capacity, so varied targets add
   diversity); a midpoint nobody reaches becomes a soft floor; (d) repeats
   the bisection with rank orders perturbed by a seeded RNG until the budget
   is spent.  Budgets are counted in search steps, so results are
   deterministic; an optional wall-clock budget only cuts the work short.
   A search that exhausts its tree proves its capacity infeasible.

Invariants of ``pack_offsets``' result: every id gets an integer offset that is
a multiple of ``alignment``; zero-size buffers get offset 0; two non-empty
buffers whose lifetimes intersect occupy disjoint address ranges; the peak is
never below ``lower_bound`` and never above the best greedy peak.
"""

from __future__ import annotations

import bisect
import operator
import time
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

BufferSpec = tuple[Hashable, int, int, int]

_NO_LIMIT = 1 << 62


class PackingError(ValueError):
    """The requested capacity cannot be met (or was not met within budget)."""

    def __init__(self, capacity: int, best_peak: int, lower_bound: int) -> None:
        self.capacity = capacity
        self.best_peak = best_peak
        self.lower_bound = lower_bound
        proven = " (impossible: below the lower bound)" if capacity < lower_bound else ""
        super().__init__(
            f"cannot pack buffers into capacity {capacity}{proven}: best peak found "
            f"{best_peak}, lower bound {lower_bound}"
        )


# --------------------------------------------------------------------------- #
# Input handling and public helpers
# --------------------------------------------------------------------------- #


def _as_int(value: object, what: str, ident: Hashable) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"buffer {ident!r}: {what} must be an integer, got {value!r}") from None


def _normalize(buffers: Iterable[Sequence[object]]) -> list[BufferSpec]:
    """Checks and converts the input rows into ``(id, lower, upper, size)``."""
    rows: list[BufferSpec] = []
    seen: set[Hashable] = set()
    for row in buffers:
        if len(row) != 4:
            raise ValueError(f"expected (id, lower, upper, size), got {row!r}")
        ident = row[0]
        lower = _as_int(row[1], "lower", ident)
        upper = _as_int(row[2], "upper", ident)
        size = _as_int(row[3], "size", ident)
        if lower >= upper:
            raise ValueError(f"buffer {ident!r}: empty lifetime, lower {lower} >= upper {upper}")
        if size < 0:
            raise ValueError(f"buffer {ident!r}: negative size {size}")
        if ident in seen:
            raise ValueError(f"duplicate buffer id {ident!r}")
        seen.add(ident)
        rows.append((ident, lower, upper, size))
    return rows


def lower_bound(buffers: Iterable[Sequence[object]]) -> int:
    """Largest total size of the buffers alive at one instant."""
    deltas: dict[int, int] = {}
    for _, lower, upper, size in _normalize(buffers):
        deltas[lower] = deltas.get(lower, 0) + size
        deltas[upper] = deltas.get(upper, 0) - size
    best = live = 0
    for t in sorted(deltas):
        live += deltas[t]
        best = max(best, live)
    return best


def peak(buffers: Iterable[Sequence[object]], offsets: Mapping[Hashable, int]) -> int:
    """Highest address used: ``max(offset + size)`` (0 if there is nothing)."""
    return max((offsets[row[0]] + row[3] for row in _normalize(buffers)), default=0)


def validate(buffers: Iterable[Sequence[object]], offsets: Mapping[Hashable, int]) -> None:
    """Raises ``ValueError`` naming two buffers that are alive at the same time
    and share addresses (or a buffer without a valid offset)."""
    rows = [r for r in _normalize(buffers) if r[3] > 0]
    for ident, *_ in rows:
        if ident not in offsets:
            raise ValueError(f"buffer {ident!r} has no offset")
        if _as_int(offsets[ident], "offset", ident) < 0:
            raise ValueError(f"buffer {ident!r} has negative offset {offsets[ident]}")
    # Sweep over time; at equal times ends (kind 0) come before starts (kind 1).
    events = sorted(
        [(lo, 1, k) for k, (_, lo, _, _) in enumerate(rows)]
        + [(up, 0, k) for k, (_, _, up, _) in enumerate(rows)]
    )
    live: list[tuple[int, int, int]] = []  # sorted (offset, end, k)
    for _, kind, k in events:
        ident, _, _, size = rows[k]
        start = int(offsets[ident])
        item = (start, start + size, k)
        if kind == 0:
            live.pop(bisect.bisect_left(live, item))
            continue
        pos = bisect.bisect_left(live, item)
        for other in live[pos - 1 : pos] + live[pos : pos + 1]:
            if other[0] < item[1] and item[0] < other[1]:
                a_id, b_id = rows[other[2]][0], ident
                raise ValueError(
                    f"buffers {a_id!r} and {b_id!r} are alive at the same time and overlap: "
                    f"[{other[0]}, {other[1]}) vs [{item[0]}, {item[1]})"
                )
        live.insert(pos, item)


# --------------------------------------------------------------------------- #
# Preprocessed instance
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Instance:
    """Non-empty buffers in alignment units, with their section structure."""

    size: list[int]
    first: list[int]  # first section of each buffer
    stop: list[int]  # one past its last section
    neighbors: list[list[int]]  # buffers alive at the same time
    members: list[list[int]]  # buffers alive in each section
    total: list[int]  # total size alive in each section
    cuts: list[int]  # number of buffers crossing boundary k | k+1
    lengths: list[int]  # lifetime lengths (upper - lower)

    @property
    def n(self) -> int:
        return len(self.size)

    @property
    def lower_bound(self) -> int:
        return max(self.total, default=0)


def _build_instance(lower: list[int], upper: list[int], size: list[int]) -> _Instance:
    lo = np.asarray(lower, dtype=np.int64)
    up = np.asarray(upper, dtype=np.int64)
    times = np.unique(np.concatenate([lo, up]))
    first = np.searchsorted(times, lo)
    stop = np.searchsorted(times, up)
    n_sections = max(len(times) - 1, 0)
    neighbors = []
    for i in range(len(size)):
        mask = (first < stop[i]) & (stop > first[i])
        mask[i] = False
        neighbors.append(np.flatnonzero(mask).tolist())
    members: list[list[int]] = [[] for _ in range(n_sections)]
    total = [0] * n_sections
    diff = np.zeros(n_sections + 1, dtype=np.int64)
    for i, (f, s) in enumerate(zip(first.tolist(), stop.tolist())):
        for sec in range(f, s):
            members[sec].append(i)
            total[sec] += size[i]
        if s - f > 1:
            diff[f] += 1
            diff[s - 1] -= 1
    cuts = np.cumsum(diff)[: max(n_sections - 1, 0)].tolist()
    return _Instance(
        size=list(size),
        first=first.tolist(),
        stop=stop.tolist(),
        neighbors=neighbors,
        members=members,
        total=total,
        cuts=cuts,
        lengths=(up - lo).tolist(),
    )


def _static_rank(inst: _Instance, heuristic: str) -> list[int]:
    """Rank of every buffer (0 = first among candidates at the same offset)
    for a MiniMalloc-style preordering, keys compared in the order given:
    W lifetime length, A area, T largest total of its sections, C number of
    sections, O number of overlapping buffers, U end, L start; all descending,
    ties by index."""
    width = np.asarray(inst.lengths, dtype=np.float64)
    first = np.asarray(inst.first, dtype=np.float64)
    stop = np.asarray(inst.stop, dtype=np.float64)
    keys = {
        "W": lambda: width,
        "A": lambda: width * np.asarray(inst.size, dtype=np.float64),
        "T": lambda: np.asarray([max(inst.total[f:s]) for f, s in zip(inst.first, inst.stop)]),
        "C": lambda: stop - first,
        "O": lambda: np.asarray([len(nb) for nb in inst.neighbors], dtype=np.float64),
        "U": lambda: stop,
        "L": lambda: first,
    }
    columns = [keys[c]() for c in heuristic]
    # np.lexsort sorts by the last key first; negate for descending order.
    order = np.lexsort([np.arange(inst.n)] + [-c for c in reversed(columns)])
    rank = np.empty(inst.n, dtype=np.int64)
    rank[order] = np.arange(inst.n)
    return rank.tolist()


# --------------------------------------------------------------------------- #
# Depth-first search over canonical solutions
# --------------------------------------------------------------------------- #


class _Node:
    """A search node: the unplaced buffers of one partition (a section range)."""

    __slots__ = ("order", "lo", "hi", "last", "pos", "limit", "trial")

    def __init__(self, order: list[int], lo: int, hi: int, last: int) -> None:
        self.order = order
        self.lo = lo
        self.hi = hi
        self.last = last  # canonical order: keys below this one are not placed here
        self.pos = 0
        self.limit = -1  # largest offset a candidate may take
        self.trial: _Trial | None = None


class _Seq:
    """Independent partitions that must all be solved, one after the other."""

    __slots__ = ("parts", "k")

    def __init__(self, parts: list[tuple[list[int], int, int]]) -> None:
        self.parts = parts
        self.k = 0


class _Trial:
    """Undo record of one placement."""

    __slots__ = ("buf", "offset", "raised", "old", "zeros")

    def __init__(self, buf: int, offset: int, raised: list[int], old: list[int]) -> None:
        self.buf = buf
        self.offset = offset
        self.raised = raised  # buffers whose minimum offset went up ...
        self.old = old  # ... and their previous minimum offsets
        # Boundaries whose crossing count dropped to 0; None until counts change.
        self.zeros: list[int] | None = None


class _Search:
    """One capacity-bounded search; ``run`` returns offsets, ``False`` when the
    capacity is proven infeasible, or ``None`` when the step limit is hit."""

    def __init__(
        self,
        inst: _Instance,
        capacity: int,
        rank: list[int],
        steps: int,
        deadline: float | None = None,
    ) -> None:
        self.inst = inst
        self.cap = capacity
        self.rank = rank
        self.steps_left = steps
        self.deadline = deadline
        n = inst.n
        self.scale = n + 1
        self.mo = [0] * n  # minimum offset of each unplaced buffer (placed: _NO_LIMIT)
        self.key = [r for r in rank]  # mo * scale + rank
        self.total = list(inst.total)  # unplaced size per section
        self.cuts = list(inst.cuts)
        self.sol = [0] * n
        # Per section, a buffer that recently proved its floor low enough.
        self.witness = [m[0] if m else 0 for m in inst.members]

    # -- placement / undo ------------------------------------------------- #

    def _place(self, i: int, offset: int) -> _Trial | None:
        """Places buffer ``i``; returns the undo record, or None (state
        unchanged) when the unallocated-floor inference proves a dead end."""
        inst, mo, key = self.inst, self.mo, self.key
        size_i = inst.size[i]
        top = offset + size_i
        raised = [j for j in inst.neighbors[i] if mo[j] < top]
        old = [mo[j] for j in raised]
        base = top * self.scale
        rank = self.rank
        for j in raised:
            mo[j] = top
            key[j] = base + rank[j]
        mo[i] = _NO_LIMIT  # placed buffers never count as low
        f, s = inst.first[i], inst.stop[i]
        total = self.total
        total[f:s] = [t - size_i for t in total[f:s]]
        trial = _Trial(i, offset, raised, old)
        if raised and not self._floors_ok(f, s, top, raised):
            self._undo(trial)
            return None
        cuts = self.cuts
        zeros = []
        for k in range(f, s - 1):
            cuts[k] -= 1
            if cuts[k] == 0:
                zeros.append(k)
        trial.zeros = zeros
        return trial

    def _floors_ok(self, f: int, s: int, top: int, raised: list[int]) -> bool:
        """Unallocated floor: in a section next to the placed buffer, nothing can
        go below the lowest minimum offset of its unplaced buffers."""
        inst, total, mo = self.inst, self.total, self.mo
        threshold = self.cap - top
        lo = min(map(inst.first.__getitem__, raised))
        hi = max(map(inst.stop.__getitem__, raised))
        cap, members, witness = self.cap, inst.members, self.witness
        for sec in (*range(lo, f), *range(s, hi)):
            remaining = total[sec]
            if remaining <= threshold:
                continue
            # A raised neighbour lives here, so the floor is <= top; the section
            # fails iff every unplaced buffer in it starts above ``highest``.
            highest = cap - remaining
            k = witness[sec]
            if mo[k] <= highest:
                continue
            for k in members[sec]:
                if mo[k] <= highest:
                    witness[sec] = k
                    break
            else:
                return False
        return True

    def _undo(self, trial: _Trial) -> None:
        inst, mo, key = self.inst, self.mo, self.key
        i = trial.buf
        size_i = inst.size[i]
        f, s = inst.first[i], inst.stop[i]
        if trial.zeros is not None:
            cuts = self.cuts
            for k in range(f, s - 1):
                cuts[k] += 1
        self.total[f:s] = [t + size_i for t in self.total[f:s]]
        mo[i] = trial.offset
        scale, rank = self.scale, self.rank
        for j, value in zip(trial.raised, trial.old):
            mo[j] = value
            key[j] = value * scale + rank[j]

    # -- the search ------------------------------------------------------- #

    def _split(self, order: list[int], lo: int, hi: int, zeros: list[int]) -> _Seq:
        bounds = [lo] + [k + 1 for k in zeros] + [hi]
        groups: list[list[int]] = [[] for _ in range(len(bounds) - 1)]
        first = self.inst.first
        for j in order:
            groups[bisect.bisect_right(bounds, first[j]) - 1].append(j)
        parts = [(g, bounds[k], bounds[k + 1]) for k, g in enumerate(groups) if g]
        return _Seq(parts)

    def _open(self, node: _Node) -> bool:
        """Prepares a fresh node; False if it is a leaf (nothing to place)."""
        order = node.order
        if not order:
            return False
        mo, size = self.mo, self.inst.size
        order.sort(key=self.key.__getitem__)
        min_top = _NO_LIMIT
        for j in order:  # ascending minimum offsets: stop once none can be lower
            if mo[j] >= min_top:
                break
            top = mo[j] + size[j]
            if top < min_top:
                min_top = top
        # Section inference: every offset o used from now on needs
        # o + (unplaced size of any section of this partition) <= capacity.
        room = self.cap - max(self.total[node.lo : node.hi])
        node.limit = min(min_top - 1, room)
        return True

    def _next_child(self, node: _Node) -> _Node | _Seq | None:
        """Places the next viable candidate of ``node``; returns the child to
        search, or None when the candidates are exhausted."""
        order, mo, key = node.order, self.mo, self.key
        while node.pos < len(order):
            i = order[node.pos]
            node.pos += 1
            offset = mo[i]
            if offset > node.limit:
                return None
            if key[i] < node.last:
                continue
            self.steps_left -= 1
            if self.steps_left < 0:
                raise _StepLimit
            if self.deadline is not None and not self.steps_left & 255:
                if time.monotonic() > self.deadline:
                    raise _StepLimit
            trial = self._place(i, offset)
            if trial is None:  # dead end found by the floor inference
                continue
            node.trial = trial
            rest = order[: node.pos - 1] + order[node.pos :]
            if trial.zeros:
                return self._split(rest, node.lo, node.hi, trial.zeros)
            return _Node(rest, node.lo, node.hi, key[i])
        return None

    def run(self) -> list[int] | bool | None:
        inst = self.inst
        zeros = [k for k, count in enumerate(self.cuts) if count == 0]
        root = self._split(list(range(inst.n)), 0, len(inst.total), zeros)
        stack: list[_Node | _Seq] = [root]
        result: bool | None = True  # True/False: a child just finished; None: fresh node
        try:
            while stack:
                frame = stack[-1]
                if isinstance(frame, _Seq):
                    if result is False or frame.k == len(frame.parts):
                        stack.pop()
                        continue
                    order, lo, hi = frame.parts[frame.k]
                    frame.k += 1
                    stack.append(_Node(order, lo, hi, -1))
                    result = None
                    continue
                if result is None:
                    if not self._open(frame):
                        stack.pop()
                        result = True
                        continue
                else:
                    trial = frame.trial
                    assert trial is not None
                    frame.trial = None
                    self._undo(trial)
                    if result:
                        self.sol[trial.buf] = trial.offset
                        stack.pop()
                        continue
                    if not trial.raised:  # "hatless": alternatives fail as well
                        stack.pop()
                        continue
                child = self._next_child(frame)
                if child is None:
                    stack.pop()
                    result = False
                    continue
                stack.append(child)
                result = True if isinstance(child, _Seq) else None
        except _StepLimit:
            return None
        return self.sol if result else False


class _StepLimit(Exception):
    """Raised inside the search when its step budget is exhausted."""


# --------------------------------------------------------------------------- #
# Optimisation driver
# --------------------------------------------------------------------------- #

# Static rank orders tried by the greedy and the searches (MiniMalloc letters:
# W lifetime, A area, T section total, C sections, O overlaps, U end, L start,
# Z size; all descending).
_PORTFOLIO = ("TWA", "WAT", "UAT", "CAT", "OAT", "TAW", "WTA", "AWT", "LAT")
_SHORT_RUN = 3.0  # step limit of an attempt, in multiples of n


class _Optimizer:
    """Finds a low peak for one instance within a step budget (and deadline)."""

    def __init__(self, inst: _Instance, steps: int, deadline: float | None, seed: int) -> None:
        self.inst = inst
        self.steps_left = steps
        self.deadline = deadline
        self.rng = np.random.default_rng(seed)
        self.lower = inst.lower_bound
        self.floor = self.lower  # bisection: capacities below look infeasible
        self.proven = self.lower  # capacities below this are proven infeasible
        self.tolerance = max(1, self.lower // 500)  # bisection stops at this gap
        self.best = _NO_LIMIT
        self.best_sol: list[int] = []
        self.last_peak = _NO_LIMIT

    def _exhausted(self) -> bool:
        if self.steps_left <= 0:
            return True
        return self.deadline is not None and time.monotonic() > self.deadline

    def _attempt(self, capacity: int, rank: list[int], limit: int) -> bool | None:
        """One bounded search; True if it improved the best solution, False if
        it proved ``capacity`` infeasible, None otherwise."""
        limit = min(limit, self.steps_left)
        if limit <= 0:
            return None
        search = _Search(self.inst, capacity, rank, limit, self.deadline)
        result = search.run()
        self.steps_left -= limit - max(search.steps_left, 0)
        if result is False:
            self.proven = max(self.proven, capacity + 1)
            self.floor = max(self.floor, self.proven)
            return False
        if result is None:
            return None
        return self._offer(result)

    def _offer(self, solution: list[int]) -> bool:
        top = max(map(operator.add, solution, self.inst.size))
        self.last_peak = top
        if top < self.best:
            self.best, self.best_sol = top, list(solution)
            return True
        return False

    def _done(self) -> bool:
        return self.best <= self.proven or self._exhausted()

    def run(self) -> list[int]:
        inst, n = self.inst, self.inst.n
        orders = [_static_rank(inst, h) for h in _PORTFOLIO]
        greedy_peaks = []
        for k, rank in enumerate(orders):  # uncapped: a greedy descent (n steps)
            if k and self._exhausted():
                break
            search = _Search(inst, _NO_LIMIT, rank, _NO_LIMIT)
            solution = search.run()
            assert isinstance(solution, list)
            self.steps_left -= _NO_LIMIT - search.steps_left
            self._offer(solution)
            greedy_peaks.append(self.last_peak)
            if self.best <= self.lower:
                return self.best_sol
        # Most promising orders first (by their greedy peaks).
        ranked = sorted(zip(greedy_peaks, range(len(greedy_peaks)), orders))
        orders = [rank for _, _, rank in ranked]
        limit = max(int(_SHORT_RUN * n), 16)
        for rank in orders:  # cheap shots at the optimum
            if self._done() or self._attempt(self.lower, rank, limit) is not None:
                break
        self._bisect(orders, limit)
        self._diversify(orders, limit)
        return self.best_sol

    def _bisect(self, orders: list[list[int]], limit: int) -> None:
        """Bisects between the floor and the best peak with quick attempts.
        The landscape is chaotic (success at one capacity says little about a
        nearby one), so the k-th order of a round aims a little lower than
        the midpoint; a midpoint no order reaches becomes the (soft) floor."""
        while not self._done() and self.best - self.floor > self.tolerance:
            middle = (self.floor + self.best) // 2
            spread = (middle - self.floor) // (2 * len(orders))
            for k, rank in enumerate(orders):
                outcome = self._attempt(middle - k * spread, rank, limit)
                if outcome:
                    orders.insert(0, orders.pop(k))  # move to front
                    break
                if outcome is False or self._exhausted():
                    break
            else:
                self.floor = max(self.floor, middle + 1)

    def _diversify(self, orders: list[list[int]], limit: int) -> None:
        """Until the budget ends: more bisections (from the proven floor) with
        rank orders perturbed by seeded noise of growing strength."""
        sigma = 1.0
        while not self._done():
            self.floor = self.proven
            perturbed = [self._perturbed(rank, sigma) for rank in orders]
            if self.best - self.floor > self.tolerance:
                self._bisect(perturbed, limit)
            for rank in perturbed:  # the gap is small: try just below
                if self._done():
                    break
                self._attempt(self.best - 1, rank, limit)
            sigma *= 2

    def _perturbed(self, rank: list[int], sigma: float) -> list[int]:
        """``rank`` with random swaps of positions about ``sigma`` apart."""
        keys = np.asarray(rank, dtype=np.float64) + self.rng.normal(0.0, sigma, len(rank))
        new = np.empty(len(rank), dtype=np.int64)
        new[np.argsort(keys, kind="stable")] = np.arange(len(rank))
        return new.tolist()


# --------------------------------------------------------------------------- #
# Public entry point
# --------------------------------------------------------------------------- #


def pack_offsets(
    buffers: Iterable[Sequence[object]],
    capacity: int | None = None,
    *,
    alignment: int = 1,
    effort: int | None = None,
    time_budget_s: float | None = None,
    seed: int = 0,
) -> dict[Hashable, int]:
    """Assigns an offset to every buffer ``(id, lower, upper, size)`` so that
    buffers alive at the same time (half-open ``[lower, upper)``) never share
    addresses, keeping the peak ``max(offset + size)`` low.

    ``alignment``: every offset is a multiple of it.  ``effort``: search budget
    in steps (default ``min(50000, 400 n, 2e7 / n)``, about 1-2 s for 150-450
    buffers); results are deterministic for a given effort and ``seed``.
    ``time_budget_s`` additionally bounds the wall-clock time (results may then
    depend on machine speed).  Raises ``PackingError`` when ``capacity`` is
    given and the best peak found exceeds it.
    """
    rows = _normalize(buffers)
    if isinstance(alignment, bool) or _as_int(alignment, "alignment", "<alignment>") < 1:
        raise ValueError(f"alignment must be a positive integer, got {alignment!r}")
    offsets: dict[Hashable, int] = {ident: 0 for ident, *_ in rows}
    live = [row for row in rows if row[3] > 0]
    bound = lower_bound(rows)
    if capacity is not None and capacity < bound:
        raise PackingError(capacity, _greedy_peak(live, alignment), bound)
    if live:
        inst = _build_instance(
            [r[1] for r in live], [r[2] for r in live], [-(-r[3] // alignment) for r in live]
        )
        steps = effort if effort is not None else _default_effort(inst.n)
        deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
        solution = _Optimizer(inst, steps, deadline, seed).run()
        for row, offset in zip(live, solution):
            offsets[row[0]] = offset * alignment
    top = peak(rows, offsets)
    if capacity is not None and top > capacity:
        raise PackingError(capacity, top, bound)
    return offsets


def _default_effort(n: int) -> int:
    """Search steps: ~1-2 s of CPU here for 150-450 buffers; fewer for small
    inputs (they finish early anyway) and for big ones (steps cost O(n))."""
    return max(1, min(50_000, 400 * n, 20_000_000 // n))


def _greedy_peak(live: list[BufferSpec], alignment: int) -> int:
    """Peak of the skyline greedy (used for error messages only)."""
    if not live:
        return 0
    inst = _build_instance(
        [r[1] for r in live], [r[2] for r in live], [-(-r[3] // alignment) for r in live]
    )
    solution = _Search(inst, _NO_LIMIT, _static_rank(inst, _PORTFOLIO[0]), inst.n).run()
    assert isinstance(solution, list)
    return max(map(operator.add, solution, inst.size)) * alignment
