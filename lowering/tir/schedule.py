"""Schedule pass: one queue per tile-IR instruction (the same queue in every iteration).

Engines run their instructions in order, so a loop body pipelines across iterations only when
each engine's part of the body does not wait, in the middle, for another engine's work of the
same iteration (an engine that hands a tile to another engine and later takes the result back
stalls every iteration: the *ping-pong* of an in-order machine). The pass therefore treats a
loop body as an assembly line:
- an instruction that several engines can run (``TInstr.engines``) never goes to an engine that
  already worked on its inputs upstream unless that engine produced one of them directly;
- a tiny instruction (at most a few minimum initiation intervals) stays on the engine of its
  producer, so it never waits behind big work on another engine;
- otherwise the engine whose busy time, counted over the kernel so far (its top-level
  statements, loop nests or lone instructions, in program order; each instruction weighted by
  how often it runs; a statement's fixed-engine instructions counted from its start) stays
  lowest: a matmul's epilogues, one top-level statement per output cell, spread over the
  engines that can run them instead of each cell's choosing the same one;
- an instruction of a hand-unrolled copy of a body (``TInstr.copy_of``, from
  ``TirBuilder._replica``) takes the engine of its counterpart in the first copy, as every
  iteration of a loop body does (fresh greedy choices let the balance drift from copy to copy:
  one copy's updates all on GpSimdE, the next one's on VectorE). Estimates come from the simulator's cost table
  (``runtime_sim.costs.instr_cost``) on the instruction's first iteration.
DMA transfers go to the DMA queue least loaded by their own kernel, then over the whole program,
round-robin on ties, so the static transfers of one kernel land on distinct queues and run
together (a queue's transfers run and complete in order; balanced over the program only,
GPT-2's 12 attention transposes issued at once took 4 queues). Each DMA
engine has several queues (``Target.dma_queues_per_engine``): loads of data no instruction of
the program writes (weights, graph inputs) take a second queue of every engine, the *prefetch*
queues, so that they never wait in line behind a transfer that waits for compute (an output
store, a load of an intermediate); they wait only for their slot to be free, and run ahead
into the next kernel's weights while the current kernel computes. Weight loads whose data phase
is at least ``STREAM_SHARE`` of the queue's descriptor generation (the tilers cut weights into
pieces of about one fixed phase: ``tiling/stream.paced_pieces``) all take one queue (``_stream_loads``;
not a kernel's loads into several refilled buffers, which would hold each other up),
the *weight stream*: issued in program order, i.e. in the order the kernels consume them, so
the next kernel's weights never share the engines with (and delay) the current kernel's
(engines serve transfers in issue order); small ones alternate between the prefetch lanes
by kernel.

Invariants
- Only the queue is chosen; correctness never depends on it (the sync pass derives every wait
  from the bytes touched).
- Every queue runs its instructions in program order.
"""
from __future__ import annotations

from collections import defaultdict

from lowering.tir.analysis import Structure, kernel_key, without_cyclic_gc
from lowering.tir.ir import TAP, TInstr, TProgram
from runtime_sim.costs import instr_cost, min_ii_ns
from runtime_sim.isa import AP, EngineKind, Instr, Memory, Queue, dma_queue
from runtime_sim.targets import Target

BIG_LOAD = 64 * 1024   # bytes: a load that matters to the stream (not a bias or a norm gain)
TINY_II = 3   # an instruction of at most this many minimum initiation intervals is "tiny"
PREFETCH_LANES = 2   # prefetch queues per engine: consecutive prefetching kernels alternate
STREAM_SHARE = 0.85   # of its fixed phase: the least data phase of a weight-stream load (the
#                      tilers cut weights into pieces of about one fixed phase: tiling/stream.py)


def machine_ap(tp: TProgram, a: TAP, byte_offset: int | None = None) -> AP:
    """The machine AP of a tile access (``byte_offset`` defaults to the constant part)."""
    mem = tp.buffer(a.buf).memory
    off = a.offset.const if byte_offset is None else byte_offset
    return AP(a.buf, mem, a.partition_start, a.partitions, off, a.dims, a.dtype)


def probe_instr(tp: TProgram, ins: TInstr) -> Instr:
    """A machine instruction with ``ins``'s shapes, for cost estimates."""
    def m(a):
        return None if a is None else machine_ap(tp, a)
    return Instr(ins.op, m(ins.dst), tuple(m(s) for s in ins.srcs), ins.attrs, accum=m(ins.accum))


def dma_queues(target: Target, lane: int = 0) -> list[Queue]:
    """Queue ``lane`` of every DMA engine (lane 1: the prefetch queues, when engines have more
    than one)."""
    lane = min(lane, target.dma_queues_per_engine - 1)
    return [dma_queue(e * target.dma_queues_per_engine + lane) for e in range(target.dma_engines)]


def _occupancy(probe: Instr, q: Queue, target: Target) -> float:
    c = instr_cost(probe, q, target)
    return c.issue_ns if q.engine is EngineKind.DMA else c.busy_ns


@without_cyclic_gc
def schedule(tp: TProgram, target: Target, st: Structure | None = None) -> dict[int, Queue]:
    st = st or Structure(tp)
    lanes = tuple(dma_queues(target, i) for i in range(1 + PREFETCH_LANES))
    out: dict[int, Queue] = {}
    regions: dict[int, list[int]] = defaultdict(list)
    for sid in sorted(st.info):
        regions[st.info[sid].top].append(sid)
    dma_load: dict[Queue, float] = defaultdict(float)   # DMA queues: over the whole program
    kernel_dma: dict[tuple, float] = defaultdict(float)  # (kernel, DMA queue): its transfers
    rr = [0] * len(lanes)
    # prefetch lanes alternate between consecutive kernels that prefetch: a kernel whose loads
    # wait for its own slots holds up only the kernel two prefetching kernels later
    lane_of: dict[str, int] = {}
    for sid in sorted(st.info):
        ins = st.info[sid].ins
        if EngineKind.DMA in ins.engines and sid in st.weight_loads:
            lane_of.setdefault(kernel_key(ins), 1 + len(lane_of) % PREFETCH_LANES)
    stream = _stream_loads(tp, st, target, lanes[1][0])
    kload: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for sids in regions.values():
        _schedule_region(tp, st, sids, target, lanes, out, dma_load, rr, lane_of, stream,
                         kernel_dma, kload)
    return out


def _stream_loads(tp: TProgram, st: Structure, target: Target, q: Queue) -> set[int]:
    """The weight loads that take the weight stream: per kernel, its weight loads whose data
    phase is at least ``STREAM_SHARE`` of their descriptor generation (one queue issuing them
    back to back keeps the engines that busy, and no busier: paced pieces), unless the kernel refills more than one weight buffer (counting a buffer
    with its tail aliases) by loads of at least ``BIG_LOAD`` bytes, as a GEMM streaming both
    operands does: on one in-order queue a load waiting for its slot would hold up the other
    operand's. A buffer holding its whole weight tensor is never refilled."""
    per: dict[str, list[int]] = defaultdict(list)
    for sid in sorted(st.info):
        ins = st.info[sid].ins
        if EngineKind.DMA in ins.engines and sid in st.weight_loads:
            c = instr_cost(probe_instr(tp, ins), q, target)
            if c.busy_ns >= STREAM_SHARE * c.issue_ns:
                per[kernel_key(ins)].append(sid)
    out: set[int] = set()
    for sids in per.values():
        refilled = {tp.buffer(b).alias or b for b in (st.info[sid].ins.dst.buf for sid in sids
                                                      if not _whole(tp, st.info[sid].ins)
                                                      and _bytes(st.info[sid]) >= BIG_LOAD)}
        if len(refilled) <= 1:
            out.update(sids)
    return out


def _bytes(inf) -> int:
    """Bytes one static load moves over all its executions."""
    a = inf.ins.srcs[0]
    return inf.count * a.partitions * a.free_size * a.dtype.itemsize


def _whole(tp: TProgram, ins: TInstr) -> bool:
    """The load's buffer holds its whole source tensor: no slot of it is refilled."""
    d = tp.buffer(ins.dst.buf)
    return d.slot_bytes * d.bufs * d.partitions >= sum(tp.buffer(a.buf).free[0] for a in ins.srcs)


def _schedule_region(tp, st, sids, target, lanes, out, dma_load, rr, lane_of, stream,
                     kernel_dma, kload) -> None:
    load = kload[kernel_key(st.info[sids[0]].ins)]   # the kernel's engines' busy time so far
    probes: dict[int, Instr] = {}
    for sid in sids:                                 # fixed engines count from the start
        ins = st.info[sid].ins
        probes[sid] = probe_instr(tp, ins)
        if len(ins.engines) == 1 and ins.engines[0] is not EngineKind.DMA:
            q = Queue(ins.engines[0])
            load[q] += st.info[sid].count * _occupancy(probes[sid], q, target)
    writer: dict[str, int] = {}                      # on-chip buffer -> its latest writer
    upstream: dict[int, frozenset] = {}              # sid -> engines that worked on its inputs
    for sid in sids:
        inf = st.info[sid]
        ins = inf.ins
        n = inf.count
        producers = [writer[a.buf] for a in ins.srcs if a.buf in writer]
        direct = {out[p].engine for p in producers}
        up: set = set()
        for p in producers:
            up |= upstream[p] | {out[p].engine}
        if EngineKind.DMA in ins.engines:
            lane = lane_of[kernel_key(ins)] if sid in st.weight_loads else 0
            dmas = lanes[lane]
            if sid in stream:
                dmas = lanes[1][:1]            # the weight stream: one queue, program order
            kk = kernel_key(ins)
            best = min(range(len(dmas)), key=lambda i: (kernel_dma[kk, dmas[i]], dma_load[dmas[i]],
                                                        (i - rr[lane]) % len(dmas)))
            q = dmas[best]
            rr[lane] = (best + 1) % len(dmas)
            occ = n * _occupancy(probes[sid], q, target)
            dma_load[q] += occ
            kernel_dma[kk, q] += occ
        elif len(ins.engines) == 1:
            q = Queue(ins.engines[0])
        else:
            twin = out.get(ins.copy_of) if ins.copy_of is not None else None
            if twin is not None and twin.engine in ins.engines:
                q = twin                             # an unrolled copy: its original's engine
            else:
                q = _choose(ins, probes[sid], n, direct, up, load, target)
            load[q] += n * _occupancy(probes[sid], q, target)
        out[sid] = q
        upstream[sid] = frozenset(up)
        for a in ins.writes:
            if tp.buffer(a.buf).memory is not Memory.HBM:
                writer[a.buf] = sid


def _choose(ins: TInstr, probe: Instr, n: int, direct: set, up: set, load, target: Target) -> Queue:
    cands = [Queue(e) for e in ins.engines]
    costs = {q: _occupancy(probe, q, target) for q in cands}
    tiny = {q: costs[q] <= TINY_II * min_ii_ns(q.engine, target) for q in cands}
    stay = [q for q in cands if q.engine in direct and tiny[q]]
    if stay:
        return min(stay, key=lambda q: costs[q])
    ok = [q for q in cands if q.engine in direct or q.engine not in up] or cands
    return min(ok, key=lambda q: (load[q] + n * costs[q], q.engine not in direct))
