"""Emit pass: the machine program of a scheduled, planned and synchronised tile program.

Loops are expanded in program order into one in-order instruction stream per queue: every
iteration's access patterns get their concrete byte offsets (the slot of the current allocation
plus the affine offset inside it), every wait its concrete count (dropped when <= 0, or when it
guards only a slot's first occupancy and this is a later one), every awaited instruction signals
its own semaphore ``s<sid>``. Equal access patterns and attributes are shared objects (the
simulator caches per object).

Invariants
- The streams hold exactly the instances of the tile program, each on its scheduled queue, in
  program order.
- Every wait names an execution that precedes the waiting one in program order; a wait for a
  later one (a sync-pass bug that would deadlock) raises ``LoweringError`` naming both.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from lowering.errors import LoweringError
from lowering.tir.analysis import Structure
from lowering.tir.ir import Loop, Stmt, TAP, TInstr, TProgram
from lowering.tir.plan import MemPlan
from lowering.tir.sync import SyncPlan
from runtime_sim.isa import AP, Buffer, Instr, Memory, Queue, Program


class _Template:
    """One tile-IR instruction, ready to be instantiated for an iteration ``env``."""

    __slots__ = ("sid", "op", "ops", "attrs", "attrs_first", "start_when", "dyn", "waits",
                 "signals", "tag", "ndst", "has_accum")

    def __init__(self, tp: TProgram, st: Structure, ins: TInstr, plan: MemPlan, sync: SyncPlan):
        self.sid = ins.sid
        self.op = ins.op
        self.tag = ins.tag
        self.ops = [self._operand(tp, st, ins, a) for a in (ins.dst, ins.accum, *ins.srcs)]
        self.ndst = ins.dst is not None
        self.has_accum = ins.accum is not None
        self.attrs = ins.attrs
        self.start_when = tuple((e.const, e.terms) for e in ins.start_when)
        self.attrs_first = replace(ins.attrs, accumulate=False) if ins.start_when else None
        self.dyn = tuple((f, e.const, e.terms) for f, e in ins.dyn_attrs)
        self.waits = tuple((f"s{w.sem}", w.sem, w.count.const, w.count.terms,
                            None if w.first_gen is None else (w.first_gen[0].const, w.first_gen[0].terms,
                                                              w.first_gen[1]))
                           for w in sync.waits.get(ins.sid, ()))
        self.signals = (f"s{ins.sid}",) if ins.sid in sync.signalers else ()

    @staticmethod
    def _operand(tp: TProgram, st: Structure, ins: TInstr, a: TAP | None):
        if a is None:
            return None
        buf = tp.buffer(a.buf)
        slot = None
        if buf.memory is not Memory.HBM and buf.scope is not None and buf.bufs > 1:
            g = st.gen(buf, ins.sid)
            slot = (g.const, g.terms, buf.bufs, None)
        return [a.buf, buf.memory, a.partition_start, a.partitions, a.dims, a.dtype,
                a.offset.const, a.offset.terms, slot]


def emit_program(tp: TProgram, queues: dict[int, Queue], plan: MemPlan, sync: SyncPlan,
                 st: Structure | None = None) -> Program:
    st = st or Structure(tp)
    templates: dict[int, _Template] = {sid: _Template(tp, st, inf.ins, plan, sync)
                                       for sid, inf in st.info.items()}
    for t in templates.values():
        for o in t.ops:
            if o is not None and o[8] is not None:
                g0, gt, nb, _ = o[8]
                o[8] = (g0, gt, nb, plan.slot_stride[o[0]])
    streams: dict[Queue, list[Instr]] = defaultdict(list)
    emitted: dict[int, int] = defaultdict(int)
    aps: dict[tuple, AP] = {}
    attrs_cache: dict[tuple, object] = {}
    env: dict[str, int] = {}

    def ap_of(o) -> AP | None:
        if o is None:
            return None
        name, mem, ps, np_, dims, dt, c, terms, slot = o
        off = c
        for v, k in terms:
            off += k * env[v]
        if slot is not None:
            g0, gt, nb, stride = slot
            g = g0
            for v, k in gt:
                g += k * env[v]
            off += (g % nb) * stride
        key = (name, ps, np_, off, dims, dt)
        a = aps.get(key)
        if a is None:
            a = aps[key] = AP(name, mem, ps, np_, off, dims, dt)
        return a

    def make(t: _Template) -> Instr:
        ops = [ap_of(o) for o in t.ops]
        dst, accum, srcs = ops[0], ops[1], tuple(ops[2:])
        attrs = t.attrs
        if t.start_when and all(c + sum(k * env[v] for v, k in terms) == 0
                                for c, terms in t.start_when):
            attrs = t.attrs_first
        if t.dyn:
            vals = []
            for f, c, terms in t.dyn:
                x = c
                for v, k in terms:
                    x += k * env[v]
                vals.append((f, x))
            key = (id(attrs), tuple(vals))
            a2 = attrs_cache.get(key)
            if a2 is None:
                a2 = attrs_cache[key] = replace(attrs, **dict(vals))
            attrs = a2
        waits = []
        for name, ysid, c, terms, guard in t.waits:
            n = c
            for v, k in terms:
                n += k * env[v]
            if n <= 0:
                continue
            if guard is not None:
                g = guard[0]
                for v, k in guard[1]:
                    g += k * env[v]
                if g >= guard[2]:
                    continue
            if n > emitted[ysid]:
                raise LoweringError(
                    f"sync: instruction {t.sid} ({t.op.value}, {t.tag}) at {dict(env)} waits for "
                    f"execution {n} of instruction {ysid}, but only {emitted[ysid]} precede it")
            waits.append((name, n))
        return Instr(t.op, dst, srcs, attrs, tuple(waits), t.signals, t.tag, accum)

    def run(body: tuple[Stmt, ...]) -> None:
        for s in body:
            if isinstance(s, Loop):
                for v in range(s.count):
                    env[s.var] = v
                    run(s.body)
                del env[s.var]
            else:
                t = templates[s.sid]
                streams[queues[s.sid]].append(make(t))
                emitted[s.sid] += 1

    run(tp.body)
    bufs: list[Buffer] = []
    for b in tp.buffers:
        if b.memory is Memory.HBM:
            bufs.append(Buffer(b.name, Memory.HBM, 1, b.free[0], 0))
        elif b.name in plan.offsets:
            bufs.append(Buffer(b.name, b.memory, b.partitions, plan.size(b), plan.offsets[b.name]))
    return Program(tp.target, tuple(bufs), {q: tuple(v) for q, v in streams.items()},
                   tp.inputs, tp.outputs)
