"""The static rules of checks.py over a looped stream (``loops.Stream``), per static instruction.

Every rule checks.py applies to each instance of a straight-line stream holds for every instance
of a looped one, and an error names the first instance that breaks it (``<queue> #<index>``
with its concrete text, plus the loop counters there), as the instance-by-instance check would:
- Structure (ProgramError): loop counts >= 1, no loop reusing the variable of a loop around it,
  every ``Index`` variable bound by an enclosing loop, ``offsets`` with one entry per operand
  slot and only on present operands, ``start_when`` only on matmul, ``fields`` only of
  ``loops.VARYING_FIELDS``, semaphore names non-empty.
- Waits, op/engine/operand shape rules: iteration-invariant (they read neither offsets nor the
  varying fields), so checked once per instruction and attribute variant (a matmul with
  ``start_when`` has two: accumulating and starting a group).
- Access patterns: everything but the byte bounds is offset-independent; the bounds are monotone
  in the offset, so the AP is checked at the minimum and maximum of its offset expression over
  the loop ranges. Only when that (for a rotating slot, conservative) test fails are the
  instances' offsets evaluated to find the first one out of bounds, if any.
- TensorE PSUM rules depend on each instance's address. One bank per destination: decided on
  one instance when every step of the offset is a multiple of the bank size, else evaluated per
  instance. Accumulation groups (in TensorE program order): every accumulating product must lie
  in the latest group-opening product of its bank, evaluated per instance.
Per-instance evaluations run on numpy arrays, one ``loops.units`` unit at a time (the open
groups carried from unit to unit), so their memory does not grow with the trip counts.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from .checks import (MachineError, ProgramError, ap_geom, check_ap, check_ap_layout,
                     check_instr_shape, check_psum_bank, check_waits, crosses_banks,
                     psum_banks_of, psum_group_error)
from .isa import AP, Buffer, EngineKind, Instr, Op, Queue
from .loops import VARYING_FIELDS, Expansion, Loop, Looped, Stream, base_of, operands, units
from .targets import Target

_ROLES = ("dst", "accum")
Found = list[tuple[tuple[int, int], MachineError]]    # ((position, stage), error)


def _role(k: int) -> str:
    return _ROLES[k] if k < 2 else f"src{k - 2}"


def check_stream(q: Queue, stream: Stream, bufs: dict[str, Buffer], target: Target) -> None:
    """Raise the first violation of a static rule in ``stream`` on queue ``q``."""
    _check_loops(stream.body, ())
    exp = Expansion(stream.body)          # static facts only: no per-instance arrays
    found: Found = []
    scans: dict[int, list[_Scan]] = {}    # id(template) -> per-instance tests to run
    for t in range(len(exp.templates)):
        if exp.size[t]:
            _check_template(stream, exp, t, q, bufs, target, found, scans)
    tensor = q.engine is EngineKind.TENSOR
    if tensor or any(scans.values()):
        _scan_units(stream, scans, bufs, target, found, tensor)
    if found:
        (pos, _), err = min(found, key=lambda f: f[0])
        it, env = stream.locate(pos)
        if env:
            err.message += f" [loop iteration {', '.join(f'{v}={c}' for v, c in env.items())}]"
        raise err.with_context(q, pos, _instance(it, env))


def _instance(it: Instr | Looped, env: dict[str, int]) -> Instr | str:
    """The instance for an error message (a malformed Looped as written)."""
    if not isinstance(it, Looped):
        return it
    try:
        return it.at(env)
    except Exception:       # e.g. a counter no loop binds: the error says so
        return str(it)


def _check_loops(body: tuple, outer: tuple[str, ...]) -> None:
    for it in body:
        if isinstance(it, Loop):
            if it.count < 1:
                raise ProgramError(f"loop {it.var}: count must be >= 1, got {it.count}")
            if it.var in outer:
                raise ProgramError(f"loop {it.var} is nested in a loop of the same variable")
            _check_loops(it.body, outer + (it.var,))


def _structure(it: Looped, ins: Instr, bound: set[str]) -> None:
    ops = operands(ins)
    if it.offsets and len(it.offsets) != len(ops):
        raise ProgramError(f"looped instruction: {len(it.offsets)} offsets for {len(ops)} operand "
                           f"slots (dst, accum, srcs)")
    for k, o in enumerate(it.offsets):
        if o is not None and ops[k] is None:
            raise ProgramError(f"looped instruction: an offset for the absent {_role(k)}")
    if it.start_when and ins.op is not Op.MATMUL:
        raise ProgramError(f"start_when applies to matmul only, got {ins.op.value}")
    allowed = VARYING_FIELDS.get(ins.op, frozenset())
    for f, _ in it.fields:
        if f not in allowed:
            raise ProgramError(f"{ins.op.value} field {f!r} cannot vary per iteration "
                               f"(varying fields: {sorted(allowed)})")
    for w in it.waits:
        if not w.sem or not isinstance(w.sem, str):
            raise ProgramError(f"wait {w.sem!r}: semaphore names are non-empty strings")
    for v in it.vars:
        if v not in bound:
            raise ProgramError(f"looped instruction uses counter {v!r} outside its loop "
                               f"(enclosing loops: {sorted(bound)})")


Pred = Callable[[Expansion, int, dict[str, int]], np.ndarray]


class _Scan:
    """A per-instance test of one template: ``pred`` masks a unit's instances of it that break
    the rule; ``report(env)`` raises the rule's error on the first such instance."""

    __slots__ = ("stage", "pred", "report", "done")

    def __init__(self, stage: int, pred: Pred, report: Callable[[dict[str, int]], object]) -> None:
        self.stage, self.pred, self.report, self.done = stage, pred, report, False


def _scan_units(stream: Stream, scans: dict[int, list[_Scan]], bufs: dict[str, Buffer],
                target: Target, found: Found, tensor: bool) -> None:
    """One pass over the stream's units: every pending per-instance test, and (TensorE) the
    PSUM accumulation groups. Stops after the first unit with a violation (later units only
    hold later instances)."""
    groups: dict[int, tuple[int, int, int, int]] | None = {} if tensor else None
    for ue, outer, base in units(stream.body):
        first: dict[_Scan, tuple[int, dict[str, int]]] = {}
        for t, it in enumerate(ue.templates):
            for sc in scans.get(id(it), ()):
                if sc.done or not ue.size[t]:
                    continue
                bad = np.flatnonzero(sc.pred(ue, t, outer))
                if len(bad):
                    k = int(bad[0])
                    p = base + int(ue.pos(t)[k])
                    if sc not in first or p < first[sc][0]:   # (a template twice in the unit)
                        first[sc] = (p, ue.env_at(t, k, outer))
        for sc, (p, env) in first.items():
            sc.done = True
            _record(found, (p, sc.stage), lambda: sc.report(env))
        hits = len(first)
        if groups is not None:
            hits += _psum_groups_unit(ue, outer, base, groups, bufs, target, found)
        if hits:
            return


def _check_template(stream: Stream, exp: Expansion, t: int, q: Queue, bufs: dict[str, Buffer],
                    target: Target, found: Found, scans: dict[int, list[_Scan]]) -> None:
    it = exp.templates[t]
    ins = base_of(it)
    first = exp.first[t]
    todo = scans.setdefault(id(it), [])
    try:
        if isinstance(it, Looped):
            _structure(it, ins, set(exp.counts(t)))
        check_waits(ins)
    except MachineError as e:
        found.append(((first, 0), e))
        return
    # shape rules, per attribute variant: a variant that breaks one fails at its first instance
    variants = [ins] + ([replace(ins, attrs=it.first_attrs())]
                        if isinstance(it, Looped) and it.start_when else [])
    errs = []
    for v in variants:
        try:
            check_instr_shape(v, q, target)
            errs.append(None)
        except MachineError as e:
            errs.append(e)
    if len(variants) == 1 or (errs[0] is not None and errs[1] is not None):
        if errs[0] is not None:
            found.append(((first, 0), errs[0]))
    else:
        for v, e, want in zip(variants, errs, (True, False)):
            if e is not None:
                todo.append(_Scan(0, lambda ue, u, o, want=want: ue.accumulate(u, o) == want,
                                  lambda env, v=v: check_instr_shape(v, q, target)))
    counts = exp.counts(t)
    for k, a in enumerate(operands(ins)):
        if a is None:
            continue
        try:
            buf = check_ap_layout(a, bufs, _role(k))
        except MachineError as e:
            found.append(((first, 1 + k), e))
            continue
        lo, hi = a.byte_extent()
        o = it.offsets[k] if isinstance(it, Looped) and k < len(it.offsets) else None
        if o is not None:
            olo, ohi = o.bounds(counts)
            lo, hi = lo + olo, hi + ohi
        if lo < 0 or hi > buf.bytes_per_partition:     # at the extremes: look at each instance
            size = buf.bytes_per_partition
            todo.append(_Scan(1 + k, lambda ue, u, outer, k=k, size=size: _out_of(ue, u, k, outer, size),
                              lambda env, k=k: check_ap(operands(it.at(env))[k], bufs, _role(k))))  # type: ignore[union-attr, arg-type]
    if q.engine is EngineKind.TENSOR and ins.dst is not None and ins.dst.buffer in bufs:
        _check_bank(it, counts, bufs, target, found, first, todo)


def _record(found: Found, key: tuple[int, int], check: Callable[[], object]) -> None:
    try:
        check()
    except MachineError as e:
        found.append((key, e))


def _bytes(ue: Expansion, t: int, slot: int, outer: dict[str, int], base: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) bytes (``base`` + the AP's extent) of operand ``slot`` over template ``t``'s
    instances in a unit."""
    a = operands(base_of(ue.templates[t]))[slot]
    assert a is not None
    lo0, hi0 = a.byte_extent()
    offs = ue.offsets(t, slot, outer) + base
    return offs + (lo0 - a.byte_offset), offs + (hi0 - a.byte_offset)


def _out_of(ue: Expansion, t: int, slot: int, outer: dict[str, int], size: int) -> np.ndarray:
    lo, hi = _bytes(ue, t, slot, outer, 0)
    return (lo < 0) | (hi > size)


def _check_bank(it: Instr | Looped, counters: dict[str, int], bufs: dict[str, Buffer],
                target: Target, found: Found, first: int, todo: list[_Scan]) -> None:
    """The destination stays in one PSUM bank in every instance: decided on one instance when
    every step of its offset is a whole number of banks, else per instance."""
    d = base_of(it).dst
    assert d is not None
    buf = bufs[d.buffer]
    bank = target.psum_bank_bytes
    op = base_of(it).op.value
    banks = psum_banks_of(base_of(it), target)

    def report(env: dict[str, int]) -> None:
        inst = it.at(env) if isinstance(it, Looped) else it
        check_psum_bank(ap_geom(inst.dst, buf), target, op, banks)  # type: ignore[arg-type]

    o = it.offsets[0] if isinstance(it, Looped) and it.offsets else None
    steps = [] if o is None else [k for _, k in o.terms] + ([] if o.rot is None else [o.rot[3]])
    if all(k % bank == 0 for k in steps):     # every instance at the same place in its bank:
        _record(found, (first, 10), lambda: report(dict.fromkeys(counters, 0)))
        return                                # the first one (every counter 0) decides

    def crosses(ue: Expansion, u: int, outer: dict[str, int]) -> np.ndarray:
        lo_v, hi_v = _bytes(ue, u, 0, outer, buf.offset or 0)
        return crosses_banks(lo_v, hi_v, bank, banks)
    todo.append(_Scan(10, crosses, report))


def _psum_groups_unit(ue: Expansion, outer: dict[str, int], base: int,
                      open_: dict[int, tuple[int, int, int, int]], bufs: dict[str, Buffer],
                      target: Target, found: Found) -> int:
    """checks.PsumGroups over a unit's matmul/transpose instances: an accumulating instance must
    lie inside the latest group-opening instance of its bank (``open_``: carried from unit to
    unit). Returns 1 (and records the error) on the first violation."""
    bank_bytes = target.psum_bank_bytes
    parts = []
    for t, it in enumerate(ue.templates):
        d = base_of(it).dst
        if base_of(it).op not in (Op.MATMUL, Op.TRANSPOSE) or d is None \
                or d.buffer not in bufs or not ue.size[t]:
            continue
        lo, hi = _bytes(ue, t, 0, outer, bufs[d.buffer].offset or 0)
        acc = ue.accumulate(t, outer)
        n = len(lo)
        parts.append((ue.pos(t), np.full(n, t), np.arange(n), np.full(n, d.partition_start),
                      np.full(n, d.partition_start + d.partitions), lo, hi,
                      np.ones(n, dtype=bool) if acc is None else ~acc))
    if not parts:
        return 0
    cols = [np.concatenate(c) for c in zip(*parts)]
    order = np.argsort(cols[0], kind="stable")
    pos, tid, inst, p0, p1, lo, hi, opens = (c[order] for c in cols)
    span = (hi - 1) // bank_bytes - lo // bank_bytes + 1
    if span.max() > 1:      # NC-v4 destinations over several banks: one piece per bank, in order
        rep = np.repeat(np.arange(len(lo)), span)
        k = np.arange(len(rep)) - np.repeat(np.cumsum(span) - span, span)
        b = lo[rep] // bank_bytes + k
        pos, tid, inst, p0, p1, opens = (c[rep] for c in (pos, tid, inst, p0, p1, opens))
        lo, hi = np.maximum(lo[rep], b * bank_bytes), np.minimum(hi[rep], (b + 1) * bank_bytes)
    bank = lo // bank_bytes
    hits = []
    for b in np.unique(bank).tolist():
        sel = np.flatnonzero(bank == b)
        last = np.maximum.accumulate(np.where(opens[sel], np.arange(len(sel)), -1))
        o = sel[np.maximum(last, 0)]
        g0, g1, glo, ghi = open_.get(b, (0, -1, 0, -1))            # (none: contains nothing)
        r0 = np.where(last < 0, g0, p0[o])
        r1 = np.where(last < 0, g1, p1[o])
        rlo = np.where(last < 0, glo, lo[o])
        rhi = np.where(last < 0, ghi, hi[o])
        bad = ~opens[sel] & ((r0 > p0[sel]) | (p1[sel] > r1) | (rlo > lo[sel]) | (hi[sel] > rhi))
        hit = np.flatnonzero(bad)
        if len(hit):
            h = int(hit[0])
            j = int(sel[h])
            none = last[h] < 0 and b not in open_
            rect = None if none else (int(r0[h]), int(r1[h]), int(rlo[h]), int(rhi[h]))
            hits.append((int(pos[j]), j, b, rect))
        if opens[sel].any():
            k = int(sel[last[-1]])
            open_[b] = (int(p0[k]), int(p1[k]), int(lo[k]), int(hi[k]))
    if not hits:
        return 0
    p, j, b, rect = min(hits)
    t = int(tid[j])
    it = ue.templates[t]
    d = operands(it.at(ue.env_at(t, int(inst[j]), outer)) if isinstance(it, Looped) else it)[0]
    assert d is not None
    found.append(((base + p, 11), psum_group_error(ap_geom(d, bufs[d.buffer]), b, rect)))
    return 1
