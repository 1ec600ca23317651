"""The discrete-event NeuronCore simulator: times every instruction and (functional mode)
computes its values.

``simulate(program, inputs=None, *, mode="functional", target=None, checks=True, trace=False)``

Execution model
- Every queue (pe, dve, act, pool, dmaN) runs its stream in order. The head instruction of a
  queue starts at the earliest time when the queue is free and every wait ``(sem, n)`` holds: a
  semaphore is a counter starting at 0, incremented by each completing instruction that lists it
  in ``signals``; ``(sem, n)`` holds from the time of the n-th signal (in completion-time order).
  Waits do not consume. Semaphore names are arbitrary non-empty strings.
- The loop always issues the globally earliest-startable head (ties: queue order pe, dve, act,
  pool, dma0, dma1, ...). Any instruction issued later starts (and completes) no earlier, so
  every semaphore time it could change is already known: the schedule is exact, not a
  heuristic (a start that a trn1 shared port delays is still decided at issue, in order of
  readiness). Functional semantics run at issue time, which is correct for race-free programs
  (a consumer ordered by a semaphore is always issued after its producer).
- Compute instructions occupy their queue for ``Cost.busy_ns`` and complete ``latency_ns``
  later; DMAs follow ``costs.DmaModel`` (descriptor stage on the queue, data phase on the DMA
  engines that serve its partitions and on HBM, then the fixed latency); a DMA queue's
  instructions complete in order. See costs.py.
- No startable head while some queue still has instructions -> DeadlockError naming every
  blocked instruction and each semaphore it waits on with its current count.

Looped streams (``loops.Stream``) mean their straight-line expansion and time identically. In
timing mode without race checks or a trace they are prepared per static instruction (no
instruction object per instance, sim_prepare_loops); otherwise they are written out first
(functional semantics, race checks and traces work on instances).

Modes
- ``functional``: memories hold bytes; every name in ``program.inputs`` must be given in
  ``inputs`` (``{name: array}``, any dtype/shape, its bytes are copied in, at most the buffer's
  size); ``SimResult.outputs`` maps each ``program.outputs`` name to the buffer's bytes (uint8).
- ``timing``: no memory contents or semantics (``outputs`` is empty, ``inputs`` ignored); every
  instruction is still timed and the static and race checks still run.

Checks (``checks=True``): the static rules of checks.py before running (including the PSUM
accumulation groups); at run time races (races.py) in both modes, reads of never-written bytes
and accumulation onto PSUM bytes last written by a non-matmul in functional mode. ``checks="static"`` runs only the static rules (cheap: use it for large timing runs, where
race detection costs several times the simulation itself). ``checks=False`` skips them all
(memory bounds are still guarded in functional mode).

Dynamic costs (costs.py): the TensorE power ramp on trn2/trn3 and the exposed LoadStationary
(``TensorRamp``), the NC-v2 shared SBUF/PSUM ports on trn1 (``SharedPorts``). Indirect DMA
(``dma_gather``/``dma_scatter``) is timed like a copy with one descriptor per looked-up row;
its bounds check on index values runs in functional mode only (timing mode has no values).
docs/simulator.md states the whole model and its calibration.

Statistics (SimStats): ``total_ns`` = last completion; ``engine_busy_ns`` per engine name (pe,
dve, act, pool: sum of busy time; dma: union of the DMA data phases of all queues);
``semaphore_wait_ns`` per engine name: time a queue was free but its head waited on semaphores;
``flops`` = sum of 2*K*M*N over matmuls; ``hbm_bytes`` = bytes DMAs read from or wrote to HBM;
``dma_count``/``dma_bytes``; ``spill_bytes`` = DMA bytes whose source or destination buffer name
starts with "spill"; ``sbuf_peak_bytes``/``psum_peak_bytes`` = max over that memory's buffers of
(offset + bytes_per_partition) x 128 partitions (the planner's high-water mark, whether or not
every byte is used); ``min_hbm_bytes`` = sizes of the input buffers + sizes of the output buffers;
``roofline_ns`` = the physical floor max(sum over matmuls of FLOPs / TensorE peak for their
dtype, transcendental activation elements / the ScalarE rate, min_hbm_bytes / the core's HBM
share), each term also reported (stats.py); ``hbm_bytes / min_hbm_bytes`` is the traffic ratio.
"""
from __future__ import annotations

import gc
import heapq
from bisect import bisect_right

import numpy as np

from .checks import InputError, MachineError, UninitializedReadError, check_buffers
from .costs import DmaModel, SharedPorts, TensorLanes, TensorRamp
from .isa import EngineKind, Memory, Program, Queue
from .loops import Stream, materialize
from .memory import MachineMemory
from .races import RaceDetector
from .sim_report import _deadlock, _late_writer, _trace_args, _union
from .semantics import SEMANTICS
from .sim_prepare import ENGINE_NAMES, prepare
from .sim_static import PORT_PSUM, PORT_SBUF
from .stats import SimResult, SimStats, TraceEvent
from .targets import Target, get_target

MODES = ("functional", "timing")


def simulate(program: Program, inputs: dict[str, np.ndarray] | None = None, *,
             mode: str = "functional", target: Target | str | None = None,
             checks: bool | str = True, trace: bool = False,
             dma: DmaModel | None = None) -> SimResult:
    """Run ``program``; see the module docstring for the model, the modes and the checks.
    ``dma``: the DMA/HBM model to time DMAs with (default: a fresh ``costs.DmaModel`` of the
    target); ``runtime_sim.multicore`` passes one whose HBM is shared with another core."""
    # The loop allocates many small long-lived objects and no cycles: the cyclic GC would only
    # rescan them (it costs more than the simulation itself on large programs).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(program, inputs, mode, target, checks, trace, dma)
    finally:
        if was_enabled:
            gc.enable()


def _simulate(program: Program, inputs: dict[str, np.ndarray] | None, mode: str,
              target: Target | str | None, checks: bool | str, trace: bool,
              dma: DmaModel | None = None) -> SimResult:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if checks not in (True, False, "static"):
        raise ValueError(f"checks must be True, False or 'static', got {checks!r}")
    dynamic = checks is True            # races, uninitialised reads, PSUM accumulation
    checks = checks is not False        # from here on: run the static rules
    if target is None:
        tgt = get_target(program.target)
    elif isinstance(target, str):
        tgt = get_target(target)
    else:
        tgt = target
    functional = mode == "functional"
    bufs = check_buffers(program, tgt) if checks else {b.name: b for b in program.buffers}

    queues: list[Queue] = [q for q in sorted(program.streams) if program.streams[q]]
    nq = len(queues)
    # looped streams (loops.Stream) are stepped through per static instruction, unless values,
    # race checks or a trace need every instance as an instruction: then they are written out
    aps: dict = {}
    concrete = functional or dynamic or trace
    streams: list = [materialize(program.streams[q], aps) if concrete or not isinstance(
        program.streams[q], Stream) else program.streams[q] for q in queues]
    qnames = [q.name for q in queues]
    engines = [q.engine for q in queues]

    # ---- precompute: costs (cached per signature), static checks, semaphores, statistics --
    P = prepare(program, queues, streams, tgt, bufs, checks, dynamic)
    busy, lat, dcost, waits, sigs, geoms = P.busy, P.lat, P.dcost, P.waits, P.sigs, P.geoms
    sig_q, wait_q, touch = P.sig_q, P.wait_q, P.touch
    # semaphores are keyed by name; who signals / waits on each one is known statically
    signallers: dict[str, set[int]] = {}
    waiting: dict[str, set[int]] = {}
    for qi in range(nq):
        for k in sig_q[qi]:
            signallers.setdefault(k, set()).add(qi)
        for k in wait_q[qi]:
            waiting.setdefault(k, set()).add(qi)
    sem_all = set(signallers) | set(waiting)

    # ---- memory --------------------------------------------------------------------------
    mem: MachineMemory | None = None
    if functional:
        mem = MachineMemory(program, tgt, track=dynamic)
        given = dict(inputs or {})
        missing = [n for n in program.inputs if n not in given]
        if missing:
            raise InputError(f"functional simulation needs every program input; missing {missing}")
        for n, arr in given.items():
            if n not in program.inputs:
                raise InputError(f"{n!r} is not a program input; inputs are {list(program.inputs)}")
            mem.load(n, arr)

    rd: RaceDetector | None = None
    if dynamic:
        spaces: dict[object, tuple[int, set[int], set[int]]] = {}
        for sp, qi, is_w in touch:
            if sp not in spaces:
                size = (tgt.sbuf_bytes_per_partition if sp is Memory.SBUF else
                        tgt.psum_bytes_per_partition if sp is Memory.PSUM else bufs[sp[1]].bytes_per_partition)
                spaces[sp] = (size, set(), set())
            spaces[sp][2].add(qi)
            if is_w:
                spaces[sp][1].add(qi)
        rd = RaceDetector(qnames, streams, spaces)
    sem_clocks: dict[str, list] = {k: [] for k in sem_all}  # clocks of the signals, in time order
    sem_pj: dict[str, list] = {k: [] for k in sem_all}      # prefix joins of sem_clocks (lazy)
    # the one queue that signals a semaphore (-1: several). Clocks a queue publishes only grow,
    # so a waiter that has seen that queue's slot at the clock's value already dominates it.
    single = {k: next(iter(signallers[k])) if len(signallers.get(k, ())) == 1 else -1 for k in sem_all}
    slow = rd is not None or mem is not None or trace
    rd_join = rd.join if rd is not None else None
    rd_vc = rd.vc if rd is not None else None
    rd_access = rd.access if rd is not None else None

    # ---- the event loop ------------------------------------------------------------------
    INF = float("inf")
    heads = [0] * nq
    lens = [len(x) for x in streams]
    qfree = [0.0] * nq
    qwait = [0.0] * nq
    sched = [INF] * nq                   # time of the live heap entry of each queue
    sem_times: dict[str, list[float]] = {k: [] for k in sem_all}   # signal times, sorted
    waiters: dict[str, tuple[int, ...]] = {k: tuple(sorted(waiting.get(k, ()))) for k in sem_all}
    blocked_on: dict[str, dict[int, int]] = {k: {} for k in sem_all}  # sem -> {queue: count its head needs}
    is_dma = [e is EngineKind.DMA for e in engines]
    dma_model = DmaModel(tgt) if dma is None else dma
    dma_issue = dma_model.issue
    qlast = [0.0] * nq                   # DMA queues: completion time of the last DMA
    # dynamic compute costs: TensorE power ramp / exposed LoadStationary, NC-v2 shared ports
    ramps: list[TensorRamp] = []
    dyn: list = [None] * nq
    ports = SharedPorts()
    # a port matters only when both engines of its pair use it somewhere in the program
    users: dict[int, set] = {PORT_SBUF: set(), PORT_PSUM: set()}
    for q in range(nq):
        for bit in users:
            if P.port_mask[q] & bit:
                users[bit].add(engines[q])
    live = sum(bit for bit, es in users.items() if len(es) > 1)
    ramp_of: list[TensorRamp | None] = [None] * nq
    lanes: list[TensorLanes | None] = [None] * nq   # NC-v4 background transpose (costs.TensorLanes)
    masks: list[list | None] = [None] * nq     # per queue: [port masks of the current chunk]
    for q in range(nq):
        e = engines[q]
        if e is EngineKind.TENSOR and tgt.background_transpose and P.has_tr[q]:
            r = ramp_of[q] = lanes[q] = TensorLanes(tgt, P.ls[q], P.tr[q])
            ramps.append(r)
            dyn[q] = r.step
        elif e is EngineKind.TENSOR and (tgt.pe_ramp_start_speed < 1.0 or P.has_ls[q]):
            r = ramp_of[q] = TensorRamp(tgt, P.ls[q])
            ramps.append(r)
            dyn[q] = r.step
        elif P.port_mask[q] and live:
            masks[q] = [[x & live for x in P.ports[q]]]  # type: ignore[union-attr]
            dyn[q] = _port_step(ports, e, masks[q])
    # a looped stream's lists come in chunks: [cbase[q], cend[q]) are the positions loaded
    cbase = [0] * nq
    cend = [len(P.busy[q]) for q in range(nq)]
    chunks = P.chunks

    def next_chunk(q: int) -> None:
        P.load(q, next(chunks[q]))  # type: ignore[arg-type]
        cbase[q] = cend[q]
        cend[q] += len(busy[q])
        if ramp_of[q] is not None:
            ramp_of[q].ls = P.ls[q]  # type: ignore[union-attr]
        if lanes[q] is not None:
            lanes[q].tr = P.tr[q]  # type: ignore[union-attr]
        if masks[q] is not None:
            masks[q][0] = [x & live for x in P.ports[q]]  # type: ignore[union-attr, index]
    dma_iv: list[tuple[float, float]] = []
    events: list[TraceEvent] = []
    heap: list[tuple[float, int]] = []
    hpush, hpop = heapq.heappush, heapq.heappop
    sem_fns = SEMANTICS
    total = 0.0

    def ready_at(q: int, w, nt: float) -> float:
        """Earliest start of queue q's head with waits ``w``, not before ``nt``; INF (and q
        registered as blocked on the semaphore) while a wait cannot hold yet."""
        for s, n in w:
            ts = sem_times[s]
            if len(ts) < n:
                blocked_on[s][q] = n
                return INF
            if ts[n - 1] > nt:
                nt = ts[n - 1]
        return nt

    def arm(q: int) -> None:
        """Register queue q's head with the scheduler (heap entry, or waiters of its semaphores)."""
        i = heads[q]
        if i >= lens[q]:
            sched[q] = INF
            if rd is not None:
                rd.finish(q)
            return
        nt = ready_at(q, waits[q][i - cbase[q]], qfree[q])
        sched[q] = nt
        if nt < INF:
            hpush(heap, (nt, q))

    for q in range(nq):
        arm(q)

    while heap:
        t, q = hpop(heap)
        if t != sched[q]:
            continue                      # stale entry
        q_waits, q_sigs, q_busy, q_lat, q_dc = waits[q], sigs[q], busy[q], lat[q], dcost[q]
        q_dma, q_len, q_dyn, q_lanes = is_dma[q], lens[q], dyn[q], lanes[q]
        i = heads[q]
        ce = cend[q]
        j = i - cbase[q]                  # index in the current chunk's lists
        while True:
            w = q_waits[j]
            if w:
                if t > qfree[q]:
                    qwait[q] += t - qfree[q]
            # --- time ---
            if q_dma:
                qf, d0, d1, done = dma_issue(t, q_dc[j])  # type: ignore[index]
                if done < qlast[q]:
                    done = qlast[q]              # a queue's DMAs complete in order
                qlast[q] = done
                dma_iv.append((d0, d1))
                nf = qf
            else:
                if q_dyn is None:
                    qf = t + q_busy[j]
                else:
                    t, b = q_dyn(t, j, q_busy[j])
                    qf = t + b
                done = qf + q_lat[j]
                d0 = t
                nf = qf
                if q_lanes is not None:          # NC-v4: the next may start beside this one,
                    nf = q_lanes.free            # and completion stays in program order
                    if done < qlast[q]:
                        done = qlast[q]
                    qlast[q] = done
            qfree[q] = nf
            if done > total:
                total = done
            if slow:
                if rd is not None and mem is None and not trace:
                    # timing mode with checks: race bookkeeping only (inlined _execute)
                    try:
                        if w:
                            vq = rd_vc[q]
                            for s, n in w:
                                r = single[s]
                                if r >= 0:
                                    c = sem_clocks[s][n - 1]
                                    if vq[r] < c[r]:      # else already seen: c is dominated
                                        rd_join(q, c)
                                else:
                                    rd_join(q, _prefix_join(sem_pj[s], sem_clocks[s], n))
                        for g, is_w in geoms[q][i]:   # type: ignore[index]
                            rd_access(q, i, g, is_w)
                    except MachineError as e:
                        raise e.with_context(queues[q], i, streams[q][i]) from None
                else:
                    track = qnames[q] + ".bg" if q_lanes is not None and q_lanes.in_bg else qnames[q]
                    _execute(q, i, t, d0, qf, done, w, queues, streams, geoms, rd, mem, sem_fns, engines,
                             sem_clocks, sem_pj, single, heads, lens, qnames, track, trace, events, dma_iv)
            # --- signals ---
            sg = q_sigs[j]
            if sg:
                clk = rd.publish(q, i) if rd is not None else None
                for s in sg:
                    ts = sem_times[s]
                    if not ts or done >= ts[-1]:
                        # appended: the times of counts already reached do not change, so only
                        # heads blocked on s can move
                        ts.append(done)
                        if clk is not None:
                            sem_clocks[s].append(clk)
                        bq = blocked_on[s]
                        if not bq:
                            continue
                        cnt = len(ts)
                        todo = None
                        for wq, n in bq.items():
                            if cnt >= n:
                                if todo is None:
                                    todo = [wq]
                                else:
                                    todo.append(wq)
                        if todo is None:
                            continue
                        for wq in todo:
                            del bq[wq]
                    else:
                        # inserted before later signals (several signallers): the n-th time of
                        # any count may drop, so every head waiting on s is re-evaluated
                        k = bisect_right(ts, done)
                        ts.insert(k, done)
                        if clk is not None:
                            sem_clocks[s].insert(k, clk)
                            del sem_pj[s][k:]
                        bq = blocked_on[s]
                        cnt = len(ts)
                        for wq in [wq for wq, n in bq.items() if cnt >= n]:
                            del bq[wq]
                        todo = [wq for wq in waiters[s] if wq != q and wq not in bq]
                    for wq in todo:
                        # (waits lists end with a () sentinel, so a finished queue has no waits)
                        w2 = waits[wq][heads[wq] - cbase[wq]]
                        if not w2:
                            continue
                        nt = ready_at(wq, w2, qfree[wq])
                        if nt < sched[wq]:
                            sched[wq] = nt
                            hpush(heap, (nt, wq))
            i += 1
            j += 1
            heads[q] = i
            if i >= q_len:
                sched[q] = INF
                if rd is not None:
                    rd.finish(q)
                break
            if i >= ce:                   # the next chunk of a looped stream
                next_chunk(q)
                q_waits, q_sigs, q_busy, q_lat, q_dc = waits[q], sigs[q], busy[q], lat[q], dcost[q]
                ce = cend[q]
                j = 0
            # next head of this queue
            w = q_waits[j]
            nt = ready_at(q, w, nf) if w else nf
            sched[q] = nt
            if nt == INF:
                break
            # fast path: if it is still the globally earliest, issue it without the heap
            if heap:
                h0 = heap[0]
                if nt > h0[0] or (nt == h0[0] and q > h0[1]):
                    hpush(heap, (nt, q))
                    break
            t = nt

    blocked = [q for q in range(nq) if heads[q] < lens[q]]
    if blocked:
        raise _deadlock(blocked, queues, streams, heads, [_Window(waits[q], cbase[q]) for q in range(nq)],
                        sem_times, signallers)
    P.finish()

    # ---- statistics ------------------------------------------------------------------------
    wait_ns = dict.fromkeys(ENGINE_NAMES, 0.0)
    for q in range(nq):
        wait_ns[engines[q].value] += qwait[q]
    engine_busy = {k: v for k, v in P.static_busy.items() if k != "dma"}
    engine_busy["pe"] += sum(r.extra for r in ramps)
    engine_busy["dma"] = _union(dma_iv)
    # compulsory HBM bytes: each distinct input buffer read once, each distinct output written once
    min_hbm = sum(bufs[n].bytes_per_partition * bufs[n].partitions for n in set(program.inputs)) + \
        sum(bufs[n].bytes_per_partition * bufs[n].partitions for n in set(program.outputs))
    peaks = {Memory.SBUF: 0, Memory.PSUM: 0}
    for b in program.buffers:
        if b.memory in peaks:
            peaks[b.memory] = max(peaks[b.memory], ((b.offset or 0) + b.bytes_per_partition) * tgt.sbuf_partitions)
    hbm_floor = min_hbm / tgt.hbm_bytes_per_ns_per_core
    roof = max(P.tensor_ns, P.trans_ns, hbm_floor)
    stats = SimStats(
        target=tgt.name, total_ns=total, instructions=sum(heads), engine_busy_ns=engine_busy,
        semaphore_wait_ns=wait_ns, flops=P.flops, hbm_bytes=P.hbm_bytes, min_hbm_bytes=min_hbm,
        dma_count=P.dma_count, dma_bytes=P.dma_bytes, spill_bytes=P.spill_bytes,
        sbuf_peak_bytes=peaks[Memory.SBUF], psum_peak_bytes=peaks[Memory.PSUM], roofline_ns=roof,
        roofline_tensor_ns=P.tensor_ns, roofline_scalar_ns=P.trans_ns, roofline_hbm_ns=hbm_floor,
        transcendental_elements=P.trans,
        tensor_peak_flops_per_ns=tgt.tensor_peak_flops_per_ns, hbm_peak_bytes_per_ns=tgt.hbm_bytes_per_ns_per_core)
    outputs = {n: mem.dump(n) for n in program.outputs} if mem is not None else {}
    return SimResult(stats=stats, outputs=outputs, trace=events)


def _port_step(ports: SharedPorts, eng: EngineKind, holder: list[list[int]]):
    """The shared-port step of a queue whose current port masks are ``holder[0]``."""
    def step(t: float, i: int, b: float) -> tuple[float, float]:
        m = holder[0][i]
        return (ports.step(eng, t, m, b) if m else t), b
    return step


class _Window:
    """A chunk's list seen at absolute positions (for the deadlock report)."""

    def __init__(self, items: list, base: int) -> None:
        self.items, self.base = items, base

    def __getitem__(self, i: int):
        return self.items[i - self.base]


def _prefix_join(pj: list, cl: list, n: int) -> tuple:
    """Join of the first n signal clocks of a semaphore (``pj`` caches prefix joins)."""
    while len(pj) < n:
        k = len(pj)
        pj.append(cl[0] if k == 0 else tuple(map(max, pj[-1], cl[k])))
    return pj[n - 1]


def _execute(q, i, t, d0, busy_end, done, w, queues, streams, geoms, rd, mem, sem_fns, engines, sem_clocks,
             sem_pj, single, heads, lens, qnames, track, trace, events, dma_iv) -> None:
    """The slow part of issuing an instruction: race checks, semantics, trace (on ``track``:
    the queue's name, ``pe.bg`` for an NC-v4 background transpose)."""
    ins = streams[q][i]
    try:
        if rd is not None:
            for s, n in w:
                cl = sem_clocks[s]
                if single[s] >= 0:
                    rd.join(q, cl[n - 1])
                else:
                    rd.join(q, _prefix_join(sem_pj[s], cl, n))
            for g, is_w in geoms[q][i]:
                rd.access(q, i, g, is_w)
        if mem is not None:
            sem_fns[ins.op](ins, mem, engines[q])
    except UninitializedReadError as e:
        if geoms is not None:
            late = _late_writer(q, geoms[q][i], geoms, heads, lens, qnames, streams)
            if late is not None:
                raise late.with_context(queues[q], i, ins) from None
        raise e.with_context(queues[q], i, ins) from None
    except MachineError as e:
        raise e.with_context(queues[q], i, ins) from None
    if trace:
        a = _trace_args(ins, i)
        if engines[q] is EngineKind.DMA:
            d1 = dma_iv[-1][1]
            a["issued_ns"] = f"{t:.1f}"
            a["completed_ns"] = f"{done:.1f}"
            events.append(TraceEvent(qnames[q], ins.op.value, d0, d1 - d0, a))
        else:
            a["completed_ns"] = f"{done:.1f}"
            events.append(TraceEvent(track, ins.op.value, t, busy_end - t, a))


