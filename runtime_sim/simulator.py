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
  heuristic. Functional semantics run at issue time, which is correct for race-free programs
  (a consumer ordered by a semaphore is always issued after its producer).
- Compute instructions occupy their queue for ``Cost.busy_ns`` and complete ``latency_ns``
  later; DMAs follow ``costs.DmaModel`` (descriptor stage on the queue, data phase on the DMA
  engine and HBM, then the fixed latency). See costs.py.
- No startable head while some queue still has instructions -> DeadlockError naming every
  blocked instruction and each semaphore it waits on with its current count.

Modes
- ``functional``: memories hold bytes; every name in ``program.inputs`` must be given in
  ``inputs`` (``{name: array}``, any dtype/shape, its bytes are copied in, at most the buffer's
  size); ``SimResult.outputs`` maps each ``program.outputs`` name to the buffer's bytes (uint8).
- ``timing``: no memory contents or semantics (``outputs`` is empty, ``inputs`` ignored); every
  instruction is still timed and the static and race checks still run.

Checks (``checks=True``): the static rules of checks.py before running; at run time races
(races.py) in both modes, reads of never-written bytes and PSUM accumulation rules in functional
mode. ``checks=False`` skips them all (memory bounds are still guarded in functional mode).

Statistics (SimStats): ``total_ns`` = last completion; ``engine_busy_ns`` per engine name (pe,
dve, act, pool: sum of busy time; dma: union of the DMA data phases of all queues);
``semaphore_wait_ns`` per engine name: time a queue was free but its head waited on semaphores;
``flops`` = sum of 2*K*M*N over matmuls; ``hbm_bytes`` = bytes DMAs read from or wrote to HBM;
``dma_count``/``dma_bytes``; ``spill_bytes`` = DMA bytes whose source or destination buffer name
starts with "spill"; ``sbuf_peak_bytes``/``psum_peak_bytes`` = max over that memory's buffers of
(offset + bytes_per_partition) x 128 partitions (the planner's high-water mark, whether or not
every byte is used); ``min_hbm_bytes`` = sizes of the input buffers + sizes of the output buffers;
``roofline_ns`` = max(sum over matmuls of FLOPs / TensorE peak for their dtype, min_hbm_bytes /
the core's HBM share, per Vector/Scalar/GpSimd engine the sum of its streaming time
``Cost.work_ns``, i.e. the element work at the rate that engine runs it, without fixed costs).
"""
from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np

from .checks import (DeadlockError, InputError, MachineError, RaceError, UninitializedReadError,
                     check_buffers, check_instr, check_psum_bank)
from .costs import Cost, DmaModel, instr_cost
from .isa import EngineKind, Instr, Memory, Op, Program, Queue
from .memory import MachineMemory
from .races import RaceDetector, exact_overlap
from .semantics import SEMANTICS
from .stats import SimResult, SimStats, TraceEvent
from .targets import Target, get_target

MODES = ("functional", "timing")
ENGINE_NAMES = ("pe", "dve", "act", "pool", "dma")


def _trace_args(ins: Instr, index: int) -> dict[str, str]:
    a = {"index": str(index), "instr": str(ins)}
    if ins.dst is not None:
        a["dst"] = str(ins.dst)
    for k, s in enumerate(ins.srcs):
        a[f"src{k}"] = str(s)
    if ins.waits:
        a["waits"] = ",".join(f"{n}>={c}" for n, c in ins.waits)
    if ins.signals:
        a["signals"] = ",".join(ins.signals)
    if ins.tag:
        a["tag"] = ins.tag
    return a


def simulate(program: Program, inputs: dict[str, np.ndarray] | None = None, *,
             mode: str = "functional", target: Target | str | None = None, checks: bool = True,
             trace: bool = False) -> SimResult:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
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
    streams: list[tuple[Instr, ...]] = [tuple(program.streams[q]) for q in queues]
    qnames = [q.name for q in queues]
    eng_of = [q.engine.value for q in queues]
    is_dma = [q.engine is EngineKind.DMA for q in queues]

    # ---- precompute: semaphores, costs, static checks, static statistics --------------------
    sem_id: dict[str, int] = {}
    busy: list[list[float]] = []
    lat: list[list[float]] = []
    dcost: list[list[Cost] | None] = []
    waits: list[list[tuple]] = []
    sigs: list[list[tuple]] = []
    geoms: list[list[tuple]] | None = [] if checks else None
    signallers: dict[int, set[int]] = {}
    flops = 0
    tensor_ns = 0.0
    work: dict[str, float] = {}
    dma_count = dma_bytes = hbm_bytes = spill_bytes = 0
    static_busy = dict.fromkeys(ENGINE_NAMES, 0.0)
    for qi, (q, stream) in enumerate(zip(queues, streams)):
        eng = q.engine
        b_l, l_l, w_l, s_l = [], [], [], []
        d_l: list[Cost] | None = [] if eng is EngineKind.DMA else None
        g_l: list[tuple] = []
        prev: Instr | None = None
        wsum = 0.0
        for i, ins in enumerate(stream):
            if checks:
                try:
                    g = check_instr(ins, q, bufs, tgt)
                    if eng is EngineKind.TENSOR and ins.op is not Op.SEM:
                        check_psum_bank(g[0], tgt, ins.op.value)
                except MachineError as e:
                    raise e.with_context(q, i, ins) from None
                nw = len(ins.writes)
                g_l.append(tuple((g[k], k < nw) for k in range(len(g))))
            c = instr_cost(ins, q, tgt, prev)
            prev = ins
            b_l.append(c.busy_ns)
            l_l.append(c.latency_ns)
            wsum += c.work_ns
            if d_l is not None:
                d_l.append(c)
            w_l.append(tuple((sem_id.setdefault(s, len(sem_id)), n) for s, n in ins.waits) if ins.waits else ())
            if ins.signals:
                t_ = tuple(sem_id.setdefault(s, len(sem_id)) for s in ins.signals)
                for s in t_:
                    signallers.setdefault(s, set()).add(qi)
                s_l.append(t_)
            else:
                s_l.append(())
            op = ins.op
            if op is Op.MATMUL:
                st, mv = ins.srcs
                f = 2 * st.partitions * st.free_size * mv.free_size
                flops += f
                tensor_ns += f / tgt.peak_flops_per_ns(st.dtype.itemsize)
            elif op is Op.DMA_COPY:
                s0, d0 = ins.srcs[0], ins.dst
                nb = s0.bytes
                dma_count += 1
                dma_bytes += nb
                hbm_bytes += nb * ((s0.memory is Memory.HBM) + (d0.memory is Memory.HBM))
                if s0.buffer.startswith("spill") or d0.buffer.startswith("spill"):
                    spill_bytes += nb
        busy.append(b_l)
        lat.append(l_l)
        waits.append(w_l)
        sigs.append(s_l)
        dcost.append(d_l)
        if geoms is not None:
            geoms.append(g_l)
        if eng is not EngineKind.DMA:
            static_busy[eng.value] += sum(b_l)
            work[eng.value] = work.get(eng.value, 0.0) + wsum
    nsem = len(sem_id)
    sem_names = [""] * nsem
    for s, k in sem_id.items():
        sem_names[k] = s

    # ---- memory --------------------------------------------------------------------------
    mem: MachineMemory | None = None
    if functional:
        mem = MachineMemory(program, tgt, track=checks)
        given = dict(inputs or {})
        missing = [n for n in program.inputs if n not in given]
        if missing:
            raise InputError(f"functional simulation needs every program input; missing {missing}")
        for n, arr in given.items():
            if n not in program.inputs:
                raise InputError(f"{n!r} is not a program input; inputs are {list(program.inputs)}")
            mem.load(n, arr)

    rd = RaceDetector(qnames, streams) if checks else None
    sem_clocks: list[list] = [[] for _ in range(nsem)]
    single = [len(signallers.get(s, ())) <= 1 for s in range(nsem)]

    # ---- the event loop ------------------------------------------------------------------
    heads = [0] * nq
    lens = [len(s) for s in streams]
    qfree = [0.0] * nq
    sched = [float("inf")] * nq          # time of the live heap entry of each queue
    sem_times: list[list[float]] = [[] for _ in range(nsem)]
    sem_waiters: list[set[int]] = [set() for _ in range(nsem)]
    wait_ns = dict.fromkeys(ENGINE_NAMES, 0.0)
    dma_model = DmaModel(tgt)
    dma_iv: list[tuple[float, float]] = []
    events: list[TraceEvent] = []
    heap: list[tuple[float, int]] = []
    total = 0.0
    executed = 0
    hpush, hpop = heapq.heappush, heapq.heappop
    sem_fns = SEMANTICS
    engines = [q.engine for q in queues]

    def head_ready(q: int) -> float | None:
        t = qfree[q]
        for s, n in waits[q][heads[q]]:
            ts = sem_times[s]
            if len(ts) < n:
                return None
            v = ts[n - 1]
            if v > t:
                t = v
        return t

    def arm(q: int) -> None:
        """Make queue q's (new) head known to the scheduler."""
        i = heads[q]
        if i >= lens[q]:
            sched[q] = float("inf")
            if rd is not None:
                rd.finish(q)
            return
        w = waits[q][i]
        if w:
            for s, _ in w:
                sem_waiters[s].add(q)
            t = head_ready(q)
            if t is None:
                sched[q] = float("inf")
                return
        else:
            t = qfree[q]
        sched[q] = t
        hpush(heap, (t, q))

    for q in range(nq):
        arm(q)

    while heap:
        t, q = hpop(heap)
        if t != sched[q]:
            continue                      # stale entry
        i = heads[q]
        ins = streams[q][i]
        w = waits[q][i]
        if w:
            for s, _ in w:
                sem_waiters[s].discard(q)
            if t > qfree[q]:
                wait_ns[eng_of[q]] += t - qfree[q]
        # --- time ---
        if is_dma[q]:
            c = dcost[q][i]               # type: ignore[index]
            qf, d0, d1, done = dma_model.issue(t, queues[q].index, c)
            qfree[q] = qf
            dma_iv.append((d0, d1))
            ev_start, ev_dur = d0, d1 - d0
        else:
            end = t + busy[q][i]
            done = end + lat[q][i]
            qfree[q] = end
            ev_start, ev_dur = t, done - t
        if done > total:
            total = done
        # --- checks and values ---
        try:
            if rd is not None:
                for s, n in w:
                    cl = sem_clocks[s]
                    if single[s]:
                        rd.join(q, cl[n - 1])
                    else:
                        for k in range(n):
                            rd.join(q, cl[k])
                for g, is_w in geoms[q][i]:   # type: ignore[index]
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
            if is_dma[q]:
                a["issued_ns"] = f"{t:.1f}"
                a["completed_ns"] = f"{done:.1f}"
            events.append(TraceEvent(qnames[q], ins.op.value, ev_start, ev_dur, a))
        executed += 1
        # --- signals ---
        sg = sigs[q][i]
        if sg:
            clk = rd.publish(q, i) if rd is not None else None
            for s in sg:
                ts = sem_times[s]
                if not ts or done >= ts[-1]:
                    ts.append(done)
                    if clk is not None:
                        sem_clocks[s].append(clk)
                else:
                    k = bisect_right(ts, done)
                    ts.insert(k, done)
                    if clk is not None:
                        sem_clocks[s].insert(k, clk)
                for wq in sem_waiters[s]:
                    nt = head_ready(wq)
                    if nt is not None and nt < sched[wq]:
                        sched[wq] = nt
                        hpush(heap, (nt, wq))
        heads[q] = i + 1
        arm(q)

    blocked = [q for q in range(nq) if heads[q] < lens[q]]
    if blocked:
        raise _deadlock(blocked, queues, streams, heads, waits, sem_times, sem_names, signallers)

    # ---- statistics ------------------------------------------------------------------------
    engine_busy = {k: v for k, v in static_busy.items() if k != "dma"}
    engine_busy["dma"] = _union(dma_iv)
    min_hbm = sum(bufs[n].bytes_per_partition for n in program.inputs) + \
        sum(bufs[n].bytes_per_partition for n in program.outputs)
    peaks = {Memory.SBUF: 0, Memory.PSUM: 0}
    for b in program.buffers:
        if b.memory in peaks:
            peaks[b.memory] = max(peaks[b.memory], ((b.offset or 0) + b.bytes_per_partition) * tgt.sbuf_partitions)
    roof = max([tensor_ns, min_hbm / tgt.hbm_bytes_per_ns_per_core] + list(work.values()))
    stats = SimStats(
        target=tgt.name, total_ns=total, instructions=executed, engine_busy_ns=engine_busy,
        semaphore_wait_ns=wait_ns, flops=flops, hbm_bytes=hbm_bytes, min_hbm_bytes=min_hbm,
        dma_count=dma_count, dma_bytes=dma_bytes, spill_bytes=spill_bytes,
        sbuf_peak_bytes=peaks[Memory.SBUF], psum_peak_bytes=peaks[Memory.PSUM], roofline_ns=roof)
    outputs = {n: mem.dump(n) for n in program.outputs} if mem is not None else {}
    return SimResult(stats=stats, outputs=outputs, trace=events)


def _late_writer(q: int, mine: tuple, geoms: list[list[tuple]], heads: list[int], lens: list[int],
                 qnames: list[str], streams: list[tuple[Instr, ...]]) -> RaceError | None:
    """An instruction read never-written bytes: if a not-yet-issued instruction of another queue
    writes them, nothing orders the two (it would have been issued first), so report the race."""
    for g, is_w in mine:
        if is_w:
            continue
        for r in range(len(heads)):
            if r == q:
                continue
            for j in range(heads[r], lens[r]):
                for g2, w2 in geoms[r][j]:
                    if w2 and g2.space == g.space and g2.p0 < g.p1 and g.p0 < g2.p1 and g2.lo < g.hi \
                            and g.lo < g2.hi and (g.dense and g2.dense or exact_overlap(g, g2)):
                        return RaceError(
                            f"it reads bytes that were never written when it ran; {qnames[r]} #{j} "
                            f"({streams[r][j]}) writes them, and no semaphore path orders the write "
                            f"before this read")
    return None


def _union(iv: list[tuple[float, float]]) -> float:
    if not iv:
        return 0.0
    a = np.array(iv, dtype=np.float64)
    a = a[np.argsort(a[:, 0], kind="stable")]
    ends = np.maximum.accumulate(a[:, 1])
    total = 0.0
    # merge: a new run starts where start > max end so far
    starts = a[:, 0]
    prev_end = np.concatenate([[-np.inf], ends[:-1]])
    new = starts > prev_end
    run_id = np.cumsum(new) - 1
    run_start = starts[new]
    run_end = np.zeros(len(run_start))
    np.maximum.at(run_end, run_id, a[:, 1])
    total = float(np.sum(run_end - run_start))
    return total


def _deadlock(blocked: list[int], queues: list[Queue], streams: list[tuple[Instr, ...]],
              heads: list[int], waits: list[list[tuple]], sem_times: list[list[float]],
              sem_names: list[str], signallers: dict[int, set[int]]) -> DeadlockError:
    lines = []
    for q in blocked:
        i = heads[q]
        unmet = []
        for s, n in waits[q][i]:
            have = len(sem_times[s])
            if have < n:
                who = sorted(queues[x].name for x in signallers.get(s, ()))
                src = f"signalled by {', '.join(who)}" if who else "no instruction signals it"
                unmet.append(f"{sem_names[s]!r} >= {n} (count is {have}; {src})")
        lines.append(f"{queues[q].name} #{i}: {streams[q][i]}\n    waits on {'; '.join(unmet) or '?'}")
    return DeadlockError(f"{len(blocked)} queue(s) can never proceed:\n  " + "\n  ".join(lines))
