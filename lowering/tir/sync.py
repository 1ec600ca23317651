"""Sync pass: semaphore waits for a tile program, derived per loop iteration from the bytes
every instruction touches.

Every awaited instruction ``Y`` gets its own counting semaphore ``s<sid>``, signalled by each of
its executions, so after the execution with flat index ``n`` (see ``analysis``) completes the
semaphore holds ``n + 1``. An instruction ``X`` that must run after some execution of ``Y`` (a
read after write, write after read or write after write on overlapping bytes, different queues)
waits until ``s<Y>`` reaches that execution's count: an affine function of ``X``'s loop
variables. A count <= 0 means "no wait" for that iteration.

How the awaited execution is found, for an access of ``X`` at iteration ``i`` and an access of
``Y`` to the same buffer (one of them a write):
- Same allocation (both inside the buffer's scope, same allocation number; for HBM tensors the
  whole program is one allocation): the latest execution ``j`` of ``Y`` before ``X@i`` in
  program order whose bytes may overlap. In the same iteration of every loop they share when
  ``Y``'s statement comes first; otherwise in the previous iteration of the innermost shared
  loop along which different iterations may overlap (shared loops along which iterations are
  provably disjoint -- *separating* -- keep ``X``'s value).
- Previous occupant of the slot (``X`` writes, the buffer rotates): the latest execution of
  ``Y`` in allocation ``gen - bufs`` whose bytes may overlap.
- ``Y``'s own loops that ``X`` does not share take their last value, unless a loop of ``X``
  walks the same bytes with the same stride and separates them (then ``Y``'s variable equals
  ``X``'s: a block loaded tile by tile is awaited tile by tile).
- Another buffer that held the same SBUF/PSUM bytes earlier: the first occupancy of each slot
  waits for that buffer's last accesses (constant counts).

Invariants
- Safety: every wait names an execution of ``Y`` that precedes ``X@i`` in program order (never
  a later one: no deadlock), and it is no earlier than the latest conflicting execution (no
  race). Approximations only ever wait for a *later* preceding execution (over-waiting).
  ``emit`` checks the first property on every instance; the simulator's race detector checks
  the second on every functional run.
- Accesses on the same queue need no wait (queues run and complete in order).
"""
from __future__ import annotations

import bisect
import functools
import math
from collections import defaultdict
from dataclasses import dataclass, field

from lowering.tir.affine import Affine
from lowering.tir.analysis import (InstrInfo, Structure, common_loops, flat_of, precedes_in_body,
                                   without_cyclic_gc)
from lowering.tir.ir import TAP, TBuf, TProgram
from lowering.tir.plan import MemPlan
from runtime_sim.isa import Memory, Queue


@dataclass(frozen=True)
class Wait:
    sem: int                                 # sid of the awaited instruction
    count: Affine                            # over the waiting instruction's loop variables
    first_gen: tuple[Affine, int] | None = None   # only while this allocation number < limit


@dataclass
class SyncPlan:
    waits: dict[int, tuple[Wait, ...]] = field(default_factory=dict)
    signalers: set[int] = field(default_factory=set)

    def text(self) -> str:
        lines = []
        for sid in sorted(self.waits):
            ws = ", ".join(f"s{w.sem}>={w.count}" + (f" if {w.first_gen[0]}<{w.first_gen[1]}"
                                                       if w.first_gen else "") for w in self.waits[sid])
            lines.append(f"{sid:4d}: waits {ws}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Access:
    info: InstrInfo
    tap: TAP
    write: bool

    @property
    def sid(self) -> int:
        return self.info.ins.sid

    @functools.cached_property
    def yflat(self) -> Affine:
        """The flat iteration index over its loops, renamed as the later side of a pair
        (computed once: an access is the later side of many pairs)."""
        return _rename(flat_of(self.info.loops))


def _extent(x: _Access) -> tuple[int, int]:
    """Bytes of its slot that ``x`` may touch over all its iterations (a bounding interval)."""
    lo, hi = x.tap.offset.bounds(x.info.counts())
    slo, shi = x.tap.byte_span()
    return lo + slo, hi + shi


def _period(x: _Access) -> int:
    """The gcd of the loop coefficients of ``x``'s offset (0: a fixed offset): every place it
    takes is its constant offset plus a multiple of this."""
    g = 0
    for _, c in x.tap.offset.terms:
        g = math.gcd(g, abs(c))
    return g


def _residues_meet(a: _Access, b: _Access, ga: int, gb: int) -> bool:
    """False when ``a`` and ``b`` can never touch a common byte: their offsets differ by
    ``cb - ca`` plus a multiple of gcd(ga, gb), and the bytes meet only at differences in
    (alo - bhi, ahi - blo)."""
    g = math.gcd(ga, gb)
    if g == 0:
        return True
    (alo, ahi), (blo, bhi) = a.tap.byte_span(), b.tap.byte_span()
    width = (ahi - alo) + (bhi - blo)
    if width >= g:
        return True
    t = (b.tap.offset.const - a.tap.offset.const - (alo - bhi)) % g
    return 0 < t < width


def _candidate_pairs(accs: list[_Access]):
    """Ordered index pairs of accesses of one buffer that may touch a common byte (byte extents
    that intersect: accesses elsewhere in a slot never meet, in any slot; offsets that agree
    modulo their loops' common period), in no particular order (the waits found are sorted)."""
    ext = [_extent(x) for x in accs]
    per = [_period(x) for x in accs]
    order = sorted(range(len(accs)), key=lambda i: ext[i][0])
    for n, i in enumerate(order):
        lo, hi = ext[i]
        for j in order[n + 1:]:
            if ext[j][0] >= hi:
                break
            if ext[j][1] > lo and _residues_meet(accs[i], accs[j], per[i], per[j]):
                yield i, j
                yield j, i


def _y(v: str) -> str:
    return "y:" + v


def _rename(a: Affine) -> Affine:
    return Affine(a.const, tuple((_y(v), c) for v, c in a.terms))


@without_cyclic_gc
def synchronize(tp: TProgram, queues: dict[int, Queue], plan: MemPlan,
                st: Structure | None = None) -> SyncPlan:
    st = st or Structure(tp)
    by_buf: dict[str, list[_Access]] = defaultdict(list)
    for sid in sorted(st.info):
        inf = st.info[sid]
        for a, w in inf.ins.accesses():
            by_buf[a.buf].append(_Access(inf, a, w))
    found: dict[int, dict[int, list[Wait]]] = defaultdict(lambda: defaultdict(list))

    for name, accs in by_buf.items():
        buf = tp.buffer(name)
        # per access x and queue: its same-loop-nest partners, nearest preceding first
        nearest: dict[tuple[int, Queue], list[_Access]] = defaultdict(list)
        sids = [a.sid for a in accs]
        qs = [queues[sid] for sid in sids]
        wr = [a.write for a in accs]
        one = buf.scope is None
        for i, j in _candidate_pairs(accs):
            if sids[i] == sids[j] or not (wr[i] or wr[j]) or qs[i] == qs[j]:
                continue
            if one:
                nearest[(i, qs[j])].append(accs[j])
                continue
            w = _same_buffer(st, buf, accs[i], accs[j])
            if w is not None:
                found[sids[i]][sids[j]].append(w)
        _nearest_waits(st, buf, accs, nearest, found)

    # members of one alias group: every write waits for the latest preceding access of the others
    groups: dict[str, list[str]] = defaultdict(list)
    for b in tp.buffers:
        if plan.root_of(b.name) != b.name and b.name in by_buf:
            groups[plan.root_of(b.name)].append(b.name)
    for root, members in groups.items():
        names = [root] + members if root in by_buf else members
        for xn in names:
            for yn in names:
                if xn == yn:
                    continue
                for x in by_buf[xn]:
                    if not x.write:
                        continue
                    for y in by_buf[yn]:
                        if queues[x.sid] != queues[y.sid]:
                            w = _same_buffer(st, None, x, y)
                            if w is not None:
                                found[x.sid][y.sid].append(w)

    _cross_buffer(tp, st, plan, by_buf, queues, found)

    out = SyncPlan()
    for xs, per_y in found.items():
        ws: list[Wait] = []
        for ys, lst in sorted(per_y.items()):
            ws.extend(_dominant(lst))
        out.waits[xs] = tuple(ws)
        out.signalers.update(per_y)
    return out


def _nearest_waits(st: Structure, buf: TBuf, accs: list[_Access],
                   nearest: dict[tuple[int, Queue], list[_Access]],  # (index of x, queue)
                   found: dict[int, dict[int, list[Wait]]]) -> None:
    """Waits of ``x`` on the accesses of one other queue, for a buffer of one allocation. A
    queue runs and completes in order, so a wait for the latest conflicting execution covers
    every earlier one on that queue: among the partners that precede ``x`` within the current
    iterations of the loops they share with it, only the last in program order (``y*``, the
    first that conflicts) is kept; a partner reached through an earlier iteration of a shared
    loop is dropped when ``y*`` lies inside that loop too (its execution is later), and kept
    otherwise. (This keeps the pass near-linear in the accesses of a buffer that a long
    unrolled body reuses, instead of quadratic.)"""
    for (xi, _), ys in nearest.items():
        x = accs[xi]
        X = x.info
        cur, prev = [], []
        for y in ys:
            c = common_loops(X, y.info)
            (cur if precedes_in_body(y.info, X, c) else prev).append((c, y))
        cur.sort(key=lambda cy: cy[1].info.path, reverse=True)
        depth = -1
        for c, y in cur:
            w = _same_buffer(st, buf, x, y)
            if w is not None:
                found[x.sid][y.sid].append(w)
                depth = c
                break
        for c, y in prev:
            if c > depth:
                w = _same_buffer(st, buf, x, y)
                if w is not None:
                    found[x.sid][y.sid].append(w)


def _dominant(ws: list[Wait]) -> list[Wait]:
    """Drop waits on one semaphore that another wait always matches or exceeds."""
    keep: list[Wait] = []
    for w in sorted(set(ws), key=lambda w: (w.first_gen is not None, -w.count.const, str(w.count))):
        if any(k.first_gen is None and (k.count - w.count).is_const and (k.count - w.count).const >= 0
               for k in keep):
            continue
        keep.append(w)
    return keep


# ---- overlap algebra ------------------------------------------------------------------------
def _window(a: TAP, b: TAP) -> tuple[int, ...]:
    """Overlap of [off_b + span_b) and [off_a + span_a) <=> off_b - off_a in [lo, hi]; when
    both walk the same rows (``_rows``), (lo, hi, row bytes, rows, width_a, width_b)."""
    alo, ahi = a.byte_span()
    blo, bhi = b.byte_span()
    return (alo - bhi + 1, ahi - blo - 1) + _rows(a, b)


def _rows(a: TAP, b: TAP) -> tuple[int, ...]:
    """(S, R, Wa, Wb) when ``a`` and ``b`` have the same outer axis (R rows S bytes apart) and
    the rest of each lies in its first ``W`` bytes of a row (``W <= S``): then they can meet
    only at row offsets ``k*S - Wb < off_b - off_a < k*S + Wa`` (columns of one row-major
    tensor, e.g. two stores side by side, never overlap although their bounding boxes do)."""
    if len(a.dims) < 2 or len(b.dims) < 2 or a.dims[0] != b.dims[0] or a.dtype != b.dtype:
        return ()
    (st, rows), isz = a.dims[0], a.dtype.itemsize
    if st <= 0 or rows < 2:
        return ()
    widths = []
    for t in (a, b):
        if any(s < 0 for s, _ in t.dims[1:]):
            return ()
        widths.append(sum(s * (n - 1) for s, n in t.dims[1:]) * isz + isz)
    if max(widths) > st * isz:
        return ()
    return (st * isz, rows, widths[0], widths[1])


def _can_overlap(diff: Affine, win: tuple[int, ...], dom: dict[str, int]) -> bool:
    lo, hi = diff.bounds(dom)
    if not (lo <= win[1] and hi >= win[0]):
        return False
    if len(win) > 2:        # some row offset k*S within reach of [lo, hi]
        S, rows, wa, wb = win[2:]
        k0 = max(-(rows - 1), -((wa - 1 - lo) // S))
        k1 = min(rows - 1, (hi + wb - 1) // S)
        return k0 <= k1
    return True


def _separating(diff: Affine, yv: str, xv: str, win: tuple[int, int], dom: dict[str, int]) -> bool | None:
    """``diff = c*(yv - xv) + rest`` with the same ``c`` on both: True when only ``yv == xv``
    can overlap, None when no pair of iterations can (never overlaps), False otherwise."""
    c = diff.coef(yv)
    if c == 0 or diff.coef(xv) != -c:
        return False
    rest = diff - Affine.var(yv) * c + Affine.var(xv) * c
    rlo, rhi = rest.bounds(dom)
    if not (rlo <= win[1] and rhi >= win[0]):
        # yv == xv never overlaps; yv == xv + d may (same stride, another start: a copy loop
        # that wrote rows 3..4 of what a product loop reads as rows 0..4)
        lo, hi = diff.bounds(dom)
        return None if not (lo <= win[1] and hi >= win[0]) else False
    c = abs(c)
    return c + rlo > win[1] and -c + rhi < win[0]


def _choose_free(diff: Affine, free: list[tuple[str, int]], xvars: list[tuple[str, int]],
                 win: tuple[int, int], dom: dict[str, int]) -> dict[str, Affine] | None:
    """Values for ``Y``'s free (renamed) variables, outermost first: the variable of a loop of
    ``X`` that separates it, else its last value. None when no choice can overlap."""
    choice: dict[str, Affine] = {}
    used: set[str] = set()
    for yv, cnt in free:
        c = diff.coef(yv)
        if c == 0:
            choice[yv] = Affine(cnt - 1)
            continue
        picked = None
        for xv, xc in xvars:
            if xv in used or diff.coef(xv) != -c:
                continue
            sep = _separating(diff, yv, xv, win, dom)
            if sep is None:
                return None
            if sep and xc <= cnt:
                picked = xv
                break
        if picked is None:
            choice[yv] = Affine(cnt - 1)     # over-approximation: the latest of all
            continue
        used.add(picked)
        choice[yv] = Affine.var(picked)
        diff = diff.subs({yv: Affine.var(picked)})
    if not _can_overlap(diff, win, dom):
        return None
    return choice


ALWAYS = (-(1 << 62), 1 << 62)   # an overlap window no difference escapes


def _same_buffer(st: Structure, buf: TBuf | None, x: _Access, y: _Access) -> Wait | None:
    """``buf=None``: two members of an alias group, assumed to overlap everywhere (no
    allocation numbers: the latest preceding access)."""
    a, b = x.tap, y.tap
    if buf is not None and (a.partition_start + a.partitions <= b.partition_start
                            or b.partition_start + b.partitions <= a.partition_start):
        return None
    if buf is not None and not a.offset.vars and not b.offset.vars:
        # fixed places in a slot: bytes disjoint there are disjoint in every slot
        (alo, ahi), (blo, bhi) = a.byte_span(), b.byte_span()
        if a.offset.const + ahi <= b.offset.const + blo or b.offset.const + bhi <= a.offset.const + alo:
            return None
    X, Y = x.info, y.info
    c = common_loops(X, Y)
    k = -1
    if buf is not None and buf.scope is not None:
        k = next(i for i, lp in enumerate(X.loops) if lp.var == buf.scope)
        assert k < c, (buf.name, x.sid, y.sid)
    win = _window(a, b) if buf is not None else ALWAYS
    dom = X.counts()
    dom.update({_y(lp.var): lp.count for lp in Y.loops})
    xvars = [(lp.var, lp.count) for lp in X.loops]
    yflat = y.yflat
    boff = _rename(b.offset)

    # same allocation: gen levels (0..k) are X's
    eq = {_y(Y.loops[m].var): Affine.var(Y.loops[m].var) for m in range(k + 1)}
    inner = list(range(k + 1, c))                       # shared loops inside the scope
    priv = [(_y(lp.var), lp.count) for lp in Y.loops[c:]]
    if precedes_in_body(Y, X, c):
        sub = dict(eq)
        sub.update({_y(Y.loops[m].var): Affine.var(Y.loops[m].var) for m in inner})
        diff = boff.subs(sub) - a.offset
        ch = _choose_free(diff, priv, xvars, win, dom)
        if ch is not None:
            sub.update(ch)
            return Wait(y.sid, yflat.subs(sub) + 1)
    # loop-carried within the allocation: innermost shared loop that does not separate
    for lvl in reversed(inner):
        v = Y.loops[lvl].var
        sub = dict(eq)
        sub.update({_y(Y.loops[m].var): Affine.var(Y.loops[m].var) for m in inner if m != lvl})
        diff = boff.subs(sub) - a.offset
        sep = _separating(diff, _y(v), v, win, dom)
        if sep is None:
            break                                       # never overlaps at all
        if sep:
            continue
        steady = diff.coef(_y(v)) == 0 and diff.coef(v) == 0
        sub[_y(v)] = Affine.var(v) - 1
        diff = boff.subs(sub) - a.offset
        ch = _choose_free(diff, priv, xvars, win, dom)
        if ch is None and steady:
            # neither place moves with ``v``: what cannot overlap one iteration back cannot
            # overlap at any distance (two halves of one tile, each at a fixed place)
            continue
        if ch is None:
            ch = {yv: Affine(cnt - 1) for yv, cnt in priv}
        sub.update(ch)
        return Wait(y.sid, yflat.subs(sub) + 1)
    # previous occupant of the slot
    if k >= 0 and x.write:
        gen = st.gen(buf, x.sid)
        stride = st.gen_stride(buf, y.sid)
        ifree = [(_y(lp.var), lp.count) for lp in Y.loops[k + 1:]]
        diff = boff - a.offset
        # Y's gen-level variables range freely (another allocation): keep them free in diff
        ch = _choose_free(diff, ifree, xvars, win, dom)
        if ch is None:
            return None
        iflat = _rename(flat_of(Y.loops[k + 1:])).subs(ch)
        return Wait(y.sid, (gen - buf.bufs) * stride + iflat + 1)
    return None


def _final_per_queue(names: list[str], by_buf: dict[str, list[_Access]],
                     queues: dict[int, Queue]) -> dict[Queue, tuple[int, int]]:
    """Per queue, the (sid, executions) of the statically last instruction touching any of
    ``names``: its last execution is the queue's last access to them (a queue completes in
    order, so waiting for all of its executions covers every earlier one there)."""
    out: dict[Queue, tuple[int, int]] = {}
    for m in names:
        for y in by_buf[m]:
            q = queues[y.sid]
            if q not in out or out[q][0] < y.sid:
                out[q] = (y.sid, y.info.count)
    return out


def _cross_buffer(tp: TProgram, st: Structure, plan: MemPlan, by_buf: dict[str, list[_Access]],
                  queues: dict[int, Queue], found) -> None:
    """Buffers that share SBUF/PSUM bytes. Inside one loop nest (a top-level statement both
    touch): every write of each waits for the latest preceding access of the other. Otherwise
    (disjoint loop nests): the first occupancy of each slot waits for the earlier buffer's last
    accesses (constant counts; owners retire the bytes a later buffer takes, so only the latest
    owner is awaited)."""
    members: dict[str, list[str]] = defaultdict(list)
    for b in tp.buffers:
        if b.name in plan.offsets:
            members[plan.root_of(b.name)].append(b.name)
    tops: dict[str, set[int]] = {}
    for root, ms in members.items():
        tops[root] = {x.info.top for m in ms for x in by_buf[m]}
    for mem in (Memory.SBUF, Memory.PSUM):
        bufs = [b for b in tp.buffers if b.memory is mem and b.name in plan.offsets
                and plan.root_of(b.name) == b.name]
        bufs.sort(key=lambda b: (plan.lifetimes[b.name][0], b.name))
        span = {b.name: (plan.offsets[b.name], plan.offsets[b.name] + plan.size(b)) for b in bufs}
        by_top: dict[int, list[str]] = defaultdict(list)
        for b in bufs:
            for t in tops[b.name]:
                by_top[t].append(b.name)
        paired: set[tuple[str, str]] = set()
        for names in by_top.values():
            for i, an in enumerate(names):
                for bn in names[i + 1:]:
                    (alo, ahi), (blo, bhi) = span[an], span[bn]
                    if alo < bhi and blo < ahi and (an, bn) not in paired:
                        paired.add((an, bn))
                        _pairwise(members, by_buf, queues, found, st, an, bn)
                        _pairwise(members, by_buf, queues, found, st, bn, an)
        # the bytes' latest owners: disjoint [l, h) intervals sorted by l (``starts`` their l's)
        owners: list[tuple[int, int, str]] = []
        starts: list[int] = []
        finals: dict[str, dict[Queue, tuple[int, int]]] = {}
        for b in bufs:
            lo, hi = span[b.name]
            tb = tops[b.name]
            i0 = max(0, bisect.bisect_right(starts, lo) - 1)
            if i0 < len(owners) and owners[i0][1] <= lo:
                i0 += 1
            i1 = i0
            while i1 < len(owners) and owners[i1][0] < hi:
                i1 += 1
            hit = owners[i0:i1]       # the owners overlapping [lo, hi), contiguous
            preds = {o for (_, _, o) in hit if tops[o].isdisjoint(tb)}
            if preds:
                writers = [x for m in members[b.name] for x in by_buf[m] if x.write]
                for pname in sorted(preds):
                    if pname not in finals:
                        finals[pname] = _final_per_queue(members[pname], by_buf, queues)
                    for x in writers:
                        xb = tp.buffer(x.tap.buf)
                        guard = (st.gen(xb, x.sid), xb.bufs) if xb.scope is not None else None
                        for q, (ys, n) in finals[pname].items():
                            if q != queues[x.sid]:
                                found[x.sid][ys].append(Wait(ys, Affine(n), guard))
            new = ([(hit[0][0], lo, hit[0][2])] if hit and hit[0][0] < lo else []) + [(lo, hi, b.name)] \
                + ([(hi, hit[-1][1], hit[-1][2])] if hit and hit[-1][1] > hi else [])
            owners[i0:i1] = new
            starts[i0:i1] = [e[0] for e in new]


def _pairwise(members, by_buf, queues, found, st: Structure, xn: str, yn: str) -> None:
    """Every write to group ``xn`` waits for the latest preceding access to group ``yn``."""
    for xm in members[xn]:
        for x in by_buf[xm]:
            if not x.write:
                continue
            for ym in members[yn]:
                for y in by_buf[ym]:
                    if queues[x.sid] != queues[y.sid]:
                        w = _same_buffer(st, None, x, y)
                        if w is not None:
                            found[x.sid][y.sid].append(w)
