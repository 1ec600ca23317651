"""Prefetch pass: the first blocks of a weight too big for SBUF, loaded kernels ahead into SBUF
the program leaves free, while earlier kernels leave the DMA queues idle.

A kernel that streams a weight through a few rotating slots (a language model's output
projection: GPT-2 small's is 77 MB) has all of its DMA time after the kernels before it, whose
own weights leave the queues idle part of the time (an attention between two matmuls). This
pass takes ``P`` blocks of that loop (the *streaming loop*: the last top-level loop whose body
starts with loads of a weight into a buffer it allocates per iteration):
- their loads become copies placed at the starts of earlier weight-streaming kernels, one block
  every ``BLOCK_SPACING`` of them, the first block earliest, into one buffer ``<slots>.far``
  (the program order of weight loads is the weight stream's order, ``tir/schedule.py``);
- the loop becomes ``g`` groups, each the products of ``P / g`` prefetched blocks (from
  ``<slots>.far``) then a loop over ``(count - P) / g`` streamed blocks: the stream keeps loading
  into the slots while the prefetched blocks' products run, so the DMA queues never wait for
  them (all prefetched products first would fill the slots and leave the queues idle);
- the loop's slots drop to ``STREAM_SLOTS``, and statements of the kernel after the loop that
  touch none of its bytes (the remainder block, from its own prefetched buffer) move ahead of
  it, so the kernel ends on the last streamed block.
A one-row kernel (a decode step's LM head) loads each K tile's piece of a block beside its
products, in an inner loop; the pass first splits that loop (``_split_block_loads``): the
block's pieces load side by side into one slot per block (``<slots>.blk``), then the products.
``P`` is the largest count whose memory plan gives up nothing the plan without prefetch had
(SBUF and PSUM lifetime modes, weight streams ahead; the copies of the loop's PSUM buffers share
their bytes), and no more blocks than the DMA queues' idle time before the loop can load
(``dma_idle_ns``: the makespan of the compute there, from the simulator's cost table, minus the
transfers' data phases). Where the kernels before the loop keep the DMA engines busy (GPT-2
small on trn2) the estimate finds little or no idle time there, and few or no blocks are
prefetched.

Invariants
- Values are unchanged: every block's products are computed once, from the same bytes of the
  weight, in groups whose order only the sync pass sees (it derives every wait from the bytes
  touched; a block's load waits for whatever used its bytes before).
- Only data no instruction writes is prefetched (``Structure.weight_loads`` of an HBM input the
  program never writes).
- Statement ids are renumbered in program order; loop variables stay unique.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable

from lowering.errors import Unsupported
from lowering.tir.affine import Affine
from lowering.tir.analysis import Structure, kernel_key
from lowering.tir.ir import TAP, Loop, Stmt, TBuf, TProgram, walk
from lowering.tir.plan import WEIGHT_STREAM_BYTES, MemPlan, plan_memory
from lowering.tir.schedule import probe_instr
from lowering.tiling.estimate import program_profile
from runtime_sim.costs import instr_cost
from runtime_sim.isa import EngineKind, Memory, dma_queue
from runtime_sim.targets import Target

BLOCK_SPACING = 4   # weight-streaming kernels between two blocks' placements (a block every
#                     2nd stream measured slower)
STREAM_SLOTS = 3    # the streaming loop's slots when blocks are prefetched: two blocks in flight
#                     while the products use the third, enough for the stream to run on through
#                     up to 3 prefetched blocks' products (5 slots leave SBUF room for 2 blocks
#                     only; 2 slots measured slower)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    index: int                 # of the streaming loop in the program body
    slots: TBuf                # its rotating weight buffer
    loads: tuple[int, ...]     # indices in the loop body of the statements that fill it


def prefetch_far_weights(tp: TProgram, target: Target,
                         plan: Callable[[TProgram], MemPlan] | None = None
                         ) -> tuple[TProgram, str | None]:
    """``tp`` with the last streaming loop's first blocks prefetched (module docstring), and a
    note saying what moved; ``tp`` unchanged (and no note) when there is no such loop or no
    block fits."""
    plan = plan or (lambda p: plan_memory(p, target))
    orig = tp
    st = Structure(tp)
    cand = _find(tp, st)
    if cand is None:        # a block's loads in an inner loop, each beside its products
        tp = _split_block_loads(tp, st)
        if tp is orig:
            return orig, None
        st = Structure(tp)
        cand = _find(tp, st)
        if cand is None:
            return orig, None
    loop = tp.body[cand.index]
    hosts = _hosts(tp, st, cand.index)
    base = plan(orig)
    want = (base.modes.get(Memory.SBUF), base.modes.get(Memory.PSUM), base.ahead)
    slots = min(cand.slots.bufs, STREAM_SLOTS)
    # as many blocks as the DMA's idle time before the loop loads (each at its loads' data
    # phases), at most half of SBUF
    block_ns = sum(inf.count // loop.count * instr_cost(probe_instr(tp, inf.ins), dma_queue(0),
                                                        target).busy_ns
                   for inf in st.info.values() if inf.top == cand.index
                   and inf.ins.dst is not None and inf.ins.dst.buf == cand.slots.name)
    most = min(target.sbuf_bytes_per_partition // 2 // cand.slots.slot_bytes,
               int(dma_idle_ns(tp, st, target, cand.index) // max(block_ns, 1.0)))
    for p in range(min(loop.count - 4, len(hosts), most), 1, -1):
        for g in _groups(loop.count, p, slots):
            new = _peel(tp, cand, p, g, slots, hosts)
            try:
                got = plan(new)
            except Unsupported:
                continue
            if (got.modes.get(Memory.SBUF), got.modes.get(Memory.PSUM), got.ahead) == want:
                mb = p * cand.slots.slot_bytes * cand.slots.partitions / 1e6
                return new, (f"prefetch: {p} of the {loop.count} blocks of {cand.slots.name} "
                             f"({mb:.1f} MB) load at the starts of earlier weight-streaming "
                             f"kernels, one every {BLOCK_SPACING}, into {cand.slots.name}.far; "
                             f"their products run in {g} groups of {p // g} among the others "
                             f"({slots} slots)")
    return orig, None


def dma_idle_ns(tp: TProgram, st: Structure, target: Target, before: int) -> float:
    """How long the DMA queues idle in top-level statements ``[0, before)``, as far as an
    estimate from the simulator's cost table says: the compute's makespan there
    (``tiling.estimate.program_profile``: instructions in program order on their engines, each
    after the ones whose bytes it reads) minus every transfer's data phase on its busiest DMA
    engine, when positive. The weight stream runs kernels ahead (``tir/plan.py``), so only the
    totals matter: a machine whose kernels stream more bytes than their chain of dependent
    work takes has nothing to prefetch into."""
    _, makespan = program_profile(tp, target, upto=before)
    dma = 0.0
    for inf in st.info.values():
        if inf.top < before and EngineKind.DMA in inf.ins.engines:
            # a transfer over 128 partitions moves on every engine at once
            dma += inf.count * instr_cost(probe_instr(tp, inf.ins), dma_queue(0), target).busy_ns
    return max(0.0, makespan - dma)


def _find(tp: TProgram, st: Structure) -> _Candidate | None:
    """The last top-level loop whose body begins with weight loads into a rotating buffer it
    allocates (the statements filling it hold nothing else; the rest only read it)."""
    inputs = _never_written(tp, st)
    for i in range(len(tp.body) - 1, -1, -1):
        lp = tp.body[i]
        if not isinstance(lp, Loop) or lp.count < 4:
            continue
        for r in [b for b in tp.buffers if b.scope == lp.var and b.memory is Memory.SBUF
                  and b.bufs >= 2 and b.alias is None]:
            n = _load_prefix(lp, r, st, inputs)
            if n:
                return _Candidate(i, r, tuple(range(n)))
    return None


def _split_block_loads(tp: TProgram, st: Structure) -> TProgram:
    """The last top-level loop whose body begins with an inner loop that loads a weight piece
    into a rotating buffer and then uses it (a one-row matmul's streamed weights: for each K
    tile, its load and its products), with the inner loop split in two: every piece's load into
    one slot per outer iteration (``<buffer>.blk``, the pieces side by side), then the products
    over them; ``tp`` itself when there is none. Tail tiles that shared the buffer's bytes share
    the new one's."""
    inputs = _never_written(tp, st)
    for i in range(len(tp.body) - 1, -1, -1):
        lp = tp.body[i]
        if not isinstance(lp, Loop) or lp.count < 4 or not lp.body or not isinstance(lp.body[0], Loop):
            continue
        inner: Loop = lp.body[0]
        for r in [b for b in tp.buffers if b.scope == inner.var and b.memory is Memory.SBUF
                  and b.bufs >= 2 and b.alias is None]:
            n = _load_prefix(inner, r, st, inputs)
            if not n:
                continue
            names = _Names(tp)
            blk = TBuf(f"{r.name}.blk", Memory.SBUF, r.partitions, (inner.count * _elems(r),),
                       r.dtype, max(2, r.bufs // inner.count), lp.var)
            k2 = names.var(inner.var)
            piece = lambda v: Affine.var(v) * r.slot_bytes      # noqa: E731
            loads = Loop(inner.var, inner.count, tuple(
                _clone(x, {}, {r.name: (blk.name, piece(inner.var))}, {}, None)
                for x in inner.body[:n]))
            prods = Loop(k2, inner.count, tuple(
                _clone(x, {inner.var: Affine.var(k2)}, {r.name: (blk.name, piece(k2))}, {}, None)
                for x in inner.body[n:]))
            bufs = []
            for b in tp.buffers:
                if b.name == r.name:
                    continue
                if b.alias == r.name:
                    b = dataclasses.replace(b, alias=blk.name, bufs=min(b.bufs, blk.bufs))
                elif b.scope == inner.var:
                    b = dataclasses.replace(b, scope=k2)
                bufs.append(b)
            body = tp.body[:i] + (Loop(lp.var, lp.count, (loads, prods) + lp.body[1:]),) + tp.body[i + 1:]
            return _renumber(dataclasses.replace(tp, buffers=tuple(bufs) + (blk,), body=body,
                                                 _index={}))
    return tp


def _never_written(tp: TProgram, st: Structure) -> set[str]:
    out = {b.name for b in tp.buffers if b.memory is Memory.HBM and b.role == "input"}
    for inf in st.info.values():
        for a in inf.ins.writes:
            out.discard(a.buf)
    return out


def _load_prefix(lp: Loop, r: TBuf, st: Structure, inputs: set[str]) -> int:
    """How many statements at the start of ``lp``'s body only load weights into ``r``, when the
    rest only reads it (0 otherwise)."""
    n = 0
    for s in lp.body:
        ins = [x for x, _ in walk((s,), ())]
        if not ins or any(x.dst is None or x.dst.buf != r.name for x in ins):
            break
        if any(x.sid not in st.weight_loads or EngineKind.DMA not in x.engines
               or any(a.buf not in inputs for a in x.srcs) for x in ins):
            return 0
        n += 1
    if not n or n == len(lp.body):
        return 0
    for s in lp.body[n:]:
        for x, _ in walk((s,), ()):
            if any(a.buf == r.name for a in x.writes):
                return 0
    return n


def _hosts(tp: TProgram, st: Structure, before: int) -> list[int]:
    """Top-level indices where blocks may go, the latest first: the first statement of every
    ``BLOCK_SPACING``-th weight-streaming kernel before statement ``before``, starting with the
    last of them."""
    wbytes: dict[str, int] = {}
    start: dict[str, int] = {}
    for sid in sorted(st.info):
        inf = st.info[sid]
        if inf.top >= before:
            break
        k = kernel_key(inf.ins)
        start.setdefault(k, inf.top)
        if sid in st.weight_loads:
            a = inf.ins.srcs[0]
            wbytes[k] = wbytes.get(k, 0) + inf.count * a.partitions * a.free_size * a.dtype.itemsize
    streams = [start[k] for k in start if wbytes.get(k, 0) >= WEIGHT_STREAM_BYTES]
    return streams[::-1][::BLOCK_SPACING]


def _groups(count: int, p: int, slots: int) -> list[int]:
    """Group counts ``g`` (most first) that split ``p`` prefetched blocks and the ``count - p``
    streamed ones evenly, each group's prefetched blocks at most ``slots`` (the stream loads
    that many blocks ahead while their products run), every loop at least 2 iterations."""
    rest = count - p
    return [g for g in range(p, 1, -1)
            if p % g == 0 and rest % g == 0 and rest // g >= 2 and p // g <= slots]


def _peel(tp: TProgram, cand: _Candidate, p: int, g: int, slots: int,
          hosts: list[int]) -> TProgram:
    """The streaming loop as ``g`` groups, each the products of ``p // g`` prefetched blocks
    (read from ``<slots>.far``) then a loop over ``(count - p) // g`` streamed blocks; the
    prefetched blocks' loads placed at ``hosts``."""
    loop: Loop = tp.body[cand.index]
    r = dataclasses.replace(cand.slots, bufs=slots)
    tp = dataclasses.replace(tp, buffers=tuple(
        r if b.name == r.name else dataclasses.replace(b, bufs=min(b.bufs, slots))
        if b.alias == r.name else b for b in tp.buffers), _index={})
    far = TBuf(f"{r.name}.far", Memory.SBUF, r.partitions, (p * _elems(r),), r.dtype)
    names = _Names(tp)
    q, m, v = p // g, (loop.count - p) // g, loop.var
    o = names.var(v)                                 # the group
    f = names.var(v) if q > 1 else o                 # a prefetched block within the group
    block = Affine.var(o) * q + Affine.var(f) if q > 1 else Affine.var(o)
    # the prefetched blocks' products: fresh variables, fresh copies of the loop's buffers
    inner_vars = _loop_vars(loop.body)
    varmap = {v: f, **{x: names.var(x) for x in sorted(inner_vars)}}
    env = {v: block, **{x: Affine.var(varmap[x]) for x in inner_vars}}
    bufmap: dict[str, tuple[str, Affine]] = {r.name: (far.name, block * r.slot_bytes)}
    copies: list[TBuf] = []
    for b in tp.buffers:
        if b.scope in inner_vars | {v} and b.name != r.name:
            copies.append(dataclasses.replace(b, name=names.buf(b.name)))
            bufmap[b.name] = (copies[-1].name, Affine(0))
    orig = {bufmap[b.name][0]: b for b in tp.buffers if b.name in bufmap and b.name != r.name}
    # PSUM copies share their original's bytes (an alias: the sync pass orders the two loops'
    # accumulations), so the PSUM plan keeps its mode; SBUF copies get their own bytes
    copies = [dataclasses.replace(
        b, scope=varmap[b.scope],
        alias=((orig[b.name].alias or orig[b.name].name) if b.memory is Memory.PSUM else
               bufmap[b.alias][0] if b.alias in bufmap else b.alias)) for b in copies]
    n = len(cand.loads)
    prods = tuple(_clone(s, env, bufmap, varmap, lambda t: t) for s in loop.body[n:])
    streamed = Loop(v, m, tuple(_clone(s, {v: Affine.var(v) + Affine.var(o) * m + p}, {}, {}, None)
                                for s in loop.body))
    group = Loop(o, g, ((Loop(f, q, prods),) if q > 1 else prods) + (streamed,))
    # each prefetched block's loads at the start of its host kernel (block 0 earliest)
    placed: dict[int, list[Stmt]] = {}
    for j in range(p):
        host = hosts[p - 1 - j]
        hkey = kernel_key(next(ins for ins, _ in walk((tp.body[host],), ())))
        vm = {x: names.var(x) for x in _loop_vars(loop.body[:n])}
        e = {v: Affine(j), **{x: Affine.var(y) for x, y in vm.items()}}
        bm = {r.name: (far.name, Affine(j * r.slot_bytes))}
        placed.setdefault(host, []).extend(
            _clone(s, e, bm, vm, lambda t, h=hkey: f"{h}:prefetch of {t}")
            for s in loop.body[:n])
    tail = _independent_tail(tp, cand.index)
    tail_stmts = tp.body[cand.index + 1:cand.index + 1 + tail]
    out: list[Stmt] = []
    for i, s in enumerate(tp.body):
        if cand.index < i <= cand.index + tail:
            continue
        out.extend(placed.get(i, ()))
        if i == cand.index:
            out.extend(tail_stmts)
        out.append(group if i == cand.index else s)
    return _renumber(dataclasses.replace(tp, buffers=tp.buffers + (far, *copies),
                                         body=tuple(out), _index={}))


def _independent_tail(tp: TProgram, index: int) -> int:
    """How many top-level statements after the streaming loop belong to its kernel and touch
    none of the bytes the loop touches (aliases aside: the sync pass orders those; but no load
    into a buffer sharing the loop's buffers' bytes): the remainder block of the weight,
    computed from its own (whole, prefetched) buffer."""
    loop = tp.body[index]
    key = kernel_key(next(ins for ins, _ in walk((loop,), ())))
    on_chip = {b.name for b in tp.buffers if b.memory is not Memory.HBM}
    touched = {a.buf for ins, _ in walk((loop,), ()) for a, _ in ins.accesses()} & on_chip
    written = {a.buf for ins, _ in walk((loop,), ()) for a in ins.writes} & on_chip
    # a load into bytes the loop's buffers share (a tail alias of its slots) would hold the
    # loop's first loads until the tail's products are done: such a tail stays after it
    roots = {tp.buffer(b).alias or b for b in touched}
    n = 0
    for s in tp.body[index + 1:]:
        ins = [x for x, _ in walk((s,), ())]
        if any(kernel_key(x) != key for x in ins) or any(
                a.buf in (touched if w else written) for x in ins for a, w in x.accesses()) or any(
                EngineKind.DMA in x.engines and (tp.buffer(a.buf).alias or a.buf) in roots
                for x in ins for a in x.writes):
            break
        n += 1
    return n


def _elems(b: TBuf) -> int:
    return math.prod(b.free)


def _loop_vars(body) -> set[str]:
    out: set[str] = set()
    for s in body:
        if isinstance(s, Loop):
            out.add(s.var)
            out |= _loop_vars(s.body)
    return out


def _clone(s: Stmt, env, bufmap, varmap, retag) -> Stmt:
    if isinstance(s, Loop):
        return Loop(varmap.get(s.var, s.var), s.count,
                    tuple(_clone(x, env, bufmap, varmap, retag) for x in s.body))

    def tap(a: TAP | None) -> TAP | None:
        if a is None:
            return None
        name, extra = bufmap.get(a.buf, (a.buf, Affine(0)))
        return dataclasses.replace(a, buf=name, offset=a.offset.subs(env) + extra)

    return dataclasses.replace(
        s, dst=tap(s.dst), srcs=tuple(tap(a) for a in s.srcs), accum=tap(s.accum),
        start_when=tuple(e.subs(env) for e in s.start_when),
        dyn_attrs=tuple((f, e.subs(env)) for f, e in s.dyn_attrs),
        tag=retag(s.tag) if retag else s.tag, copy_of=None if retag else s.copy_of)


def _renumber(tp: TProgram) -> TProgram:
    ids = itertools.count()
    new_id: dict[int, int] = {}

    def go(body):
        out = []
        for s in body:
            if isinstance(s, Loop):
                out.append(Loop(s.var, s.count, go(s.body)))
            else:
                new_id[s.sid] = n = next(ids)
                out.append(dataclasses.replace(s, sid=n))
        return tuple(out)

    body = go(tp.body)

    def fix(body):
        return tuple(Loop(s.var, s.count, fix(s.body)) if isinstance(s, Loop) else
                     dataclasses.replace(s, copy_of=new_id.get(s.copy_of)) if s.copy_of is not None
                     else s for s in body)

    return dataclasses.replace(tp, body=fix(body), _index={})


class _Names:
    """Fresh loop-variable and buffer names."""

    def __init__(self, tp: TProgram):
        self.taken = {b.name for b in tp.buffers} | _loop_vars(tp.body)
        self.n = itertools.count()

    def _fresh(self, base: str) -> str:
        while True:
            name = f"{base}_f{next(self.n)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    var = buf = _fresh
