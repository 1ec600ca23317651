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
  instances' offsets evaluated (numpy) to find the first one out of bounds, if any.
- TensorE PSUM rules (one bank per destination; accumulation groups in TensorE program order)
  depend on each instance's address: evaluated over all instances at once (numpy), the groups
  by the latest group-opening instance of each bank.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .checks import (MachineError, ProgramError, ap_geom, check_ap, check_ap_layout,
                     check_instr_shape, check_psum_bank, check_waits, psum_group_error)
from .isa import AP, Buffer, EngineKind, Instr, Op, Queue
from .loops import VARYING_FIELDS, Expansion, Loop, Looped, Stream, base_of, operands
from .targets import Target

_ROLES = ("dst", "accum")


def _role(k: int) -> str:
    return _ROLES[k] if k < 2 else f"src{k - 2}"


def check_stream(q: Queue, stream: Stream, bufs: dict[str, Buffer], target: Target,
                 exp: Expansion | None = None) -> Expansion:
    """Raise the first violation of a static rule in ``stream`` on queue ``q``; return the
    stream's expansion (for the caller to reuse)."""
    _check_loops(stream.body, ())
    exp = exp or Expansion(stream)
    found: list[tuple[tuple[int, int], MachineError]] = []   # ((position, stage), error)
    for t in range(len(exp.templates)):
        if exp.size[t]:
            _check_template(exp, t, q, bufs, target, found)
    if q.engine is EngineKind.TENSOR:
        _check_psum_groups(exp, bufs, target, found)
    if found:
        (pos, _), err = min(found, key=lambda f: f[0])
        it, env = stream.locate(pos)
        if env:
            err.message += f" [loop iteration {', '.join(f'{v}={c}' for v, c in env.items())}]"
        raise err.with_context(q, pos, _instance(it, env))
    return exp


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


def _check_template(exp: Expansion, t: int, q: Queue, bufs: dict[str, Buffer], target: Target,
                    found: list) -> None:
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
    variants = [(ins, None)]
    if isinstance(it, Looped) and it.start_when:
        acc = exp.accumulate(t)
        assert acc is not None
        variants = [(ins, acc), (replace(ins, attrs=it.first_attrs()), ~acc)]
    for v, where in variants:
        if where is None or where.any():
            try:
                check_instr_shape(v, q, target)
            except MachineError as e:
                found.append(((first if where is None else int(exp.pos(t)[where][0]), 0), e))
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
            lo_v, hi_v = _bytes(exp, t, k, 0)
            bad = np.flatnonzero((lo_v < 0) | (hi_v > buf.bytes_per_partition))
            if len(bad):
                j = int(bad[0])
                try:
                    check_ap(_concrete(exp, t, j, k), bufs, _role(k))
                except MachineError as e:
                    found.append(((int(exp.pos(t)[j]), 1 + k), e))
    if q.engine is EngineKind.TENSOR and ins.dst is not None and ins.dst.buffer in bufs:
        _check_bank(exp, t, bufs, target, found)


def _check_bank(exp: Expansion, t: int, bufs: dict[str, Buffer], target: Target, found: list) -> None:
    """The destination stays in one PSUM bank in every instance: decided on one instance when
    every step of its offset is a whole number of banks, else on each."""
    it = exp.templates[t]
    d = base_of(it).dst
    assert d is not None
    bank = target.psum_bank_bytes
    o = it.offsets[0] if isinstance(it, Looped) and it.offsets else None
    steps = [] if o is None else [k for _, k in o.terms] + ([] if o.rot is None else [o.rot[3]])
    if all(k % bank == 0 for k in steps):
        bad = [0]
        lo0, hi0 = ap_geom(_concrete(exp, t, 0, 0), bufs[d.buffer])[3:5]
        if lo0 // bank == (hi0 - 1) // bank:
            return
    else:
        lo_v, hi_v = _bytes(exp, t, 0, bufs[d.buffer].offset or 0)
        bad = np.flatnonzero(lo_v // bank != (hi_v - 1) // bank).tolist()
        if not bad:
            return
    j = int(bad[0])
    try:
        check_psum_bank(ap_geom(_concrete(exp, t, j, 0), bufs[d.buffer]), target, base_of(it).op.value)
    except MachineError as e:
        found.append(((int(exp.pos(t)[j]), 10), e))


def _concrete(exp: Expansion, t: int, k: int, slot: int) -> AP:
    """Operand ``slot`` of template ``t``'s ``k``-th instance."""
    it = exp.templates[t]
    ins = it.at(exp.env_at(t, k)) if isinstance(it, Looped) else it
    a = operands(ins)[slot]
    assert a is not None
    return a


def _bytes(exp: Expansion, t: int, slot: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) bytes (``base`` + the AP's extent) of operand ``slot`` over template ``t``'s
    instances."""
    a = operands(base_of(exp.templates[t]))[slot]
    assert a is not None
    lo0, hi0 = a.byte_extent()
    offs = exp.offsets(t, slot) + base
    return offs + (lo0 - a.byte_offset), offs + (hi0 - a.byte_offset)


def _check_psum_groups(exp: Expansion, bufs: dict[str, Buffer], target: Target, found: list) -> None:
    """checks.PsumGroups over every matmul/transpose instance, vectorized: an accumulating
    instance must lie inside the latest group-opening instance of its bank."""
    parts = []
    for t, it in enumerate(exp.templates):
        d = base_of(it).dst
        if base_of(it).op not in (Op.MATMUL, Op.TRANSPOSE) or d is None or d.buffer not in bufs \
                or not exp.size[t]:
            continue
        lo, hi = _bytes(exp, t, 0, bufs[d.buffer].offset or 0)
        acc = exp.accumulate(t)
        n = len(lo)
        parts.append((exp.pos(t), np.full(n, t), np.arange(n), np.full(n, d.partition_start),
                      np.full(n, d.partition_start + d.partitions), lo, hi,
                      np.ones(n, dtype=bool) if acc is None else ~acc))
    if not parts:
        return
    cols = [np.concatenate(c) for c in zip(*parts)]
    order = np.argsort(cols[0], kind="stable")
    pos, tid, inst, p0, p1, lo, hi, opens = (c[order] for c in cols)
    bank = lo // target.psum_bank_bytes
    for b in np.unique(bank[~opens]):
        sel = np.flatnonzero(bank == b)
        last = np.maximum.accumulate(np.where(opens[sel], np.arange(len(sel)), -1))
        o = sel[np.maximum(last, 0)]
        bad = ~opens[sel] & ((last < 0) | (p0[o] > p0[sel]) | (p1[sel] > p1[o])
                             | (lo[o] > lo[sel]) | (hi[sel] > hi[o]))
        hit = np.flatnonzero(bad)
        if len(hit):
            j, k = sel[hit[0]], o[hit[0]]
            t = int(tid[j])
            g = ap_geom(_concrete(exp, t, int(inst[j]), 0), bufs[base_of(exp.templates[t]).dst.buffer])  # type: ignore[union-attr]
            rect = None if last[hit[0]] < 0 else (int(p0[k]), int(p1[k]), int(lo[k]), int(hi[k]))
            found.append(((int(pos[j]), 11), psum_group_error(g, int(b), rect)))
