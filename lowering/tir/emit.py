"""Emit pass: the machine program of a scheduled, planned and synchronised tile program.

The program keeps the tile program's loops: each queue's stream (``runtime_sim.loops.Stream``)
is the loop nest restricted to the instructions scheduled on that queue, in program order, and
each tile instruction becomes one static machine instruction, so the program's size follows the
tile program, not the trip counts. What varies per iteration is written as ``loops.Index``
expressions of the loop counters:
- operand byte offsets: the affine offset inside the allocation plus, for a rotating SBUF/PSUM
  pool, ``(allocation number mod slots) * slot stride``;
- waits: the sync pass's affine counts, a wait being active where its count is >= 1 and, for a
  wait that guards only a slot's first occupancy, while the allocation number is below its limit;
  every awaited instruction signals its own semaphore ``s<sid>``;
- ``accumulate=False`` where every ``start_when`` expression is 0; ``dyn_attrs`` fields.
Whatever is constant is folded into the static instruction (an instruction with nothing varying
is a plain ``Instr`` repeated by its loops). ``Program.flat()`` writes the instances out.

Invariants
- The instances of the streams are exactly the instances of the tile program, each on its
  scheduled queue, in program order (the same instructions a straight-line expansion gives).
- Every wait names an execution that precedes the waiting one in program order; a wait for a
  later one (a sync-pass bug that would deadlock) raises ``LoweringError`` naming both. This is
  decided per static wait in closed form (the executions of ``Y`` before ``X@i`` are affine in
  ``X``'s counters), and only where that bound is inconclusive by evaluating every instance.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import numpy as np

from lowering.errors import LoweringError
from lowering.tir.affine import Affine
from lowering.tir.analysis import (InstrInfo, Structure, common_loops, flat_of, precedes_in_body,
                                   without_cyclic_gc)
from lowering.tir.ir import Loop, Stmt, TAP, TInstr, TProgram
from lowering.tir.plan import MemPlan
from lowering.tir.sync import SyncPlan, Wait
from runtime_sim.isa import AP, Buffer, Instr, Memory, Program, Queue
from runtime_sim.loops import Index, Item, Looped, LWait, Stream
from runtime_sim.loops import Loop as MLoop


def _index(e: Affine) -> Index:
    return Index(e.const, e.terms)


def _operand(tp: TProgram, st: Structure, plan: MemPlan, ins: TInstr,
             a: TAP | None) -> tuple[AP | None, Index | None]:
    """The operand's AP (fixed part of its offset) and its varying offset (None: fixed)."""
    if a is None:
        return None, None
    buf = tp.buffer(a.buf)
    const, terms, rot = a.offset.const, a.offset.terms, None
    if buf.memory is not Memory.HBM and buf.scope is not None and buf.bufs > 1:
        g = st.gen(buf, ins.sid)
        stride = plan.slot_stride[a.buf]
        if g.terms:
            rot = (g.const, g.terms, buf.bufs, stride)
        else:
            const += (g.const % buf.bufs) * stride
    ap = AP(a.buf, buf.memory, a.partition_start, a.partitions, const, a.dims, a.dtype)
    return ap, (Index(0, terms, rot) if terms or rot else None)


def _waits(ws: tuple[Wait, ...]) -> tuple[tuple[tuple[str, int], ...], tuple[LWait, ...]]:
    """(static waits, varying waits) in the sync plan's order; all varying if any one is."""
    kept: list[LWait] = []
    for w in ws:
        guard, bound = None, 0
        if w.first_gen is not None:
            g, bound = w.first_gen
            if g.is_const:
                if g.const >= bound:
                    continue            # never a first occupancy: never active
            else:
                guard = _index(g)
        if w.count.is_const and w.count.const < 1:
            continue                    # never active
        kept.append(LWait(f"s{w.sem}", _index(w.count), guard, bound))
    if all(w.count.is_const and w.guard is None for w in kept):
        return tuple((w.sem, w.count.const) for w in kept), ()
    return (), tuple(kept)


def _item(tp: TProgram, st: Structure, plan: MemPlan, sync: SyncPlan, ins: TInstr) -> Item:
    ops = [_operand(tp, st, plan, ins, a) for a in (ins.dst, ins.accum, *ins.srcs)]
    aps = [a for a, _ in ops]
    offsets = tuple(o for _, o in ops)
    static_waits, lwaits = _waits(sync.waits.get(ins.sid, ()))
    attrs = ins.attrs
    start_when = tuple(_index(e) for e in ins.start_when if not e.is_const)
    if any(e.is_const and e.const != 0 for e in ins.start_when):
        start_when = ()                 # never every expression 0: never starts a group
    elif ins.start_when and not start_when:
        attrs = replace(attrs, accumulate=False)    # always starts a group
    fields = tuple((f, _index(e)) for f, e in ins.dyn_attrs if not e.is_const)
    fixed = {f: e.const for f, e in ins.dyn_attrs if e.is_const}
    if fixed:
        attrs = replace(attrs, **fixed)
    signals = (f"s{ins.sid}",) if ins.sid in sync.signalers else ()
    base = Instr(ins.op, aps[0], tuple(aps[2:]), attrs, static_waits, signals, ins.tag, aps[1])
    if not (any(o is not None for o in offsets) or lwaits or start_when or fields):
        return base
    return Looped(base, offsets if any(o is not None for o in offsets) else (), lwaits,
                  start_when, fields)


def _check_order(st: Structure, ins: TInstr, ws: tuple[Wait, ...]) -> None:
    """Every wait of ``ins`` names an execution of the awaited instruction that precedes it."""
    x = st.info[ins.sid]
    counts = x.counts()
    for w in ws:
        y = st.info[w.sem]
        before = _preceding(x, y)
        if (w.count - before).bounds(counts)[1] <= 0:
            continue                    # never more than precede it, wherever active or not
        _check_order_exactly(x, y, w, before)


def _preceding(x: InstrInfo, y: InstrInfo) -> Affine:
    """Executions of ``y`` before ``x`` at ``x``'s counters, in program order."""
    c = common_loops(x, y)
    inner = math.prod(lp.count for lp in y.loops[c:])
    return flat_of(x.loops[:c]) * inner + (inner if precedes_in_body(y, x, c) else 0)


def _check_order_exactly(x: InstrInfo, y: InstrInfo, w: Wait, before: Affine) -> None:
    loops = x.loops
    grid = np.indices(tuple(lp.count for lp in loops), dtype=np.int64).reshape(len(loops), -1)
    env = {lp.var: grid[k] for k, lp in enumerate(loops)}
    n = grid.shape[1]
    count = _index(w.count).vector(env, n)
    bad = (count >= 1) & (count > _index(before).vector(env, n))
    if w.first_gen is not None:
        bad &= _index(w.first_gen[0]).vector(env, n) < w.first_gen[1]
    hit = np.flatnonzero(bad)
    if len(hit):
        k = int(hit[0])
        at = {lp.var: int(grid[j, k]) for j, lp in enumerate(loops)}
        ins = x.ins
        raise LoweringError(
            f"sync: instruction {ins.sid} ({ins.op.value}, {ins.tag}) at {at} waits for "
            f"execution {int(count[k])} of instruction {w.sem}, but only "
            f"{before.eval(at)} precede it")


@without_cyclic_gc
def emit_program(tp: TProgram, queues: dict[int, Queue], plan: MemPlan, sync: SyncPlan,
                 st: Structure | None = None) -> Program:
    st = st or Structure(tp)
    items: dict[int, Item] = {}
    for sid, inf in st.info.items():
        items[sid] = _item(tp, st, plan, sync, inf.ins)
        _check_order(st, inf.ins, sync.waits.get(sid, ()))

    def project(body: tuple[Stmt, ...]) -> dict[Queue, list[Item]]:
        out: dict[Queue, list[Item]] = defaultdict(list)
        for s in body:
            if isinstance(s, Loop):
                for q, sub in project(s.body).items():
                    out[q].append(MLoop(s.var, s.count, tuple(sub)))
            else:
                out[queues[s.sid]].append(items[s.sid])
        return out

    streams = {q: Stream(body) for q, body in project(tp.body).items()}
    bufs: list[Buffer] = []
    for b in tp.buffers:
        if b.memory is Memory.HBM:
            bufs.append(Buffer(b.name, Memory.HBM, 1, b.free[0], 0))
        elif b.name in plan.offsets:
            bufs.append(Buffer(b.name, b.memory, b.partitions, plan.size(b), plan.offsets[b.name]))
    return Program(tp.target, tuple(bufs), streams, tp.inputs, tp.outputs)
