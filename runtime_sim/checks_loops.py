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
                     check_instr_shape, check_psum_bank, check_waits, psum_group_error)
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
    for t in range(len(exp.templates)):
        if exp.size[t]:
            _check_template(stream, exp, t, q, bufs, target, found)
    if q.engine is EngineKind.TENSOR:
        _check_psum_groups(stream, bufs, target, found)
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


def _first(stream: Stream, it: Instr | Looped, pred: Pred) -> tuple[int, dict[str, int]] | None:
    """The first instance of ``it`` (position, counters) where ``pred`` (a mask over a unit's
    instances of it) holds."""
    for ue, outer, base in units(stream.body):
        best = None
        for t, x in enumerate(ue.templates):
            if x is it and ue.size[t]:
                hit = np.flatnonzero(pred(ue, t, outer))
                if len(hit):
                    k = int(hit[0])
                    p = base + int(ue.pos(t)[k])
                    if best is None or p < best[0]:
                        best = (p, ue.env_at(t, k, outer))
        if best is not None:
            return best
    return None


def _check_template(stream: Stream, exp: Expansion, t: int, q: Queue, bufs: dict[str, Buffer],
                    target: Target, found: Found) -> None:
    it = exp.templates[t]
    ins = base_of(it)
    first = exp.first[t]
    try:
        if isinstance(it, Looped):
            _structure(it, ins, set(exp.counts(t)))
        check_waits(ins)
    except MachineError as e:
        found.append(((first, 0), e))
        return
    # shape rules, once per attribute variant, at the first instance using it
    variants: list[tuple[Instr, int | None]] = [(ins, first)]
    if isinstance(it, Looped) and it.start_when:
        variants = []
        for v, want in ((ins, True), (replace(ins, attrs=it.first_attrs()), False)):
            at = _first(stream, it, lambda ue, u, o, want=want: ue.accumulate(u, o) == want)
            if at is not None:
                variants.append((v, at[0]))
    for v, p in variants:
        try:
            check_instr_shape(v, q, target)
        except MachineError as e:
            found.append(((p, 0), e))
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
            at = _first(stream, it, lambda ue, u, outer, k=k, size=size: _out_of(ue, u, k, outer, size))
            if at is not None:
                _record(found, (at[0], 1 + k), lambda: check_ap(operands(it.at(at[1]))[k], bufs, _role(k)))  # type: ignore[union-attr, arg-type]
    if q.engine is EngineKind.TENSOR and ins.dst is not None and ins.dst.buffer in bufs:
        _check_bank(stream, it, bufs, target, found, first)


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


def _check_bank(stream: Stream, it: Instr | Looped, bufs: dict[str, Buffer], target: Target,
                found: Found, first: int) -> None:
    """The destination stays in one PSUM bank in every instance."""
    d = base_of(it).dst
    assert d is not None
    buf = bufs[d.buffer]
    bank = target.psum_bank_bytes
    o = it.offsets[0] if isinstance(it, Looped) and it.offsets else None
    steps = [] if o is None else [k for _, k in o.terms] + ([] if o.rot is None else [o.rot[3]])
    if all(k % bank == 0 for k in steps):     # every instance at the same place in its bank
        at = None if o is None else stream.locate(first)[1]
        lo, hi = ap_geom(d if at is None else operands(it.at(at))[0], buf)[3:5]  # type: ignore[union-attr, arg-type]
        if lo // bank == (hi - 1) // bank:
            return
        pos_env: tuple[int, dict[str, int]] | None = (first, at or {})
    else:
        def crosses(ue: Expansion, u: int, outer: dict[str, int]) -> np.ndarray:
            lo_v, hi_v = _bytes(ue, u, 0, outer, buf.offset or 0)
            return lo_v // bank != (hi_v - 1) // bank
        pos_env = _first(stream, it, crosses)
        if pos_env is None:
            return
    p, env = pos_env
    inst = it.at(env) if isinstance(it, Looped) else it
    _record(found, (p, 10), lambda: check_psum_bank(ap_geom(inst.dst, buf), target, inst.op.value))  # type: ignore[arg-type]


def _check_psum_groups(stream: Stream, bufs: dict[str, Buffer], target: Target, found: Found) -> None:
    """checks.PsumGroups over every matmul/transpose instance, unit by unit: an accumulating
    instance must lie inside the latest group-opening instance of its bank."""
    bank_bytes = target.psum_bank_bytes
    open_: dict[int, tuple[int, int, int, int]] = {}       # bank -> open group, across units
    for ue, outer, base in units(stream.body):
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
            continue
        cols = [np.concatenate(c) for c in zip(*parts)]
        order = np.argsort(cols[0], kind="stable")
        pos, tid, inst, p0, p1, lo, hi, opens = (c[order] for c in cols)
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
                j = int(sel[hit[0]])
                none = last[hit[0]] < 0 and b not in open_
                rect = None if none else (int(r0[hit[0]]), int(r1[hit[0]]), int(rlo[hit[0]]), int(rhi[hit[0]]))
                hits.append((int(pos[j]), j, b, rect))
            if opens[sel].any():
                k = int(sel[last[-1]])
                open_[b] = (int(p0[k]), int(p1[k]), int(lo[k]), int(hi[k]))
        if hits:
            p, j, b, rect = min(hits)
            t = int(tid[j])
            it = ue.templates[t]
            d = operands(it.at(ue.env_at(t, int(inst[j]), outer)) if isinstance(it, Looped) else it)[0]
            assert d is not None
            found.append(((base + p, 11), psum_group_error(ap_geom(d, bufs[d.buffer]), b, rect)))
            return
