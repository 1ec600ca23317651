"""Several physical NeuronCores run together: one program per core, one HBM stack shared.

``simulate_cores(programs, inputs=None, *, mode="functional", checks=True, trace=False)``
runs ``programs[k]`` on physical core ``k`` of one logical NeuronCore (LNC=2 on trn2/trn3) and
returns a ``MultiCoreResult``: the merged result of the logical core plus each core's own.

The model
- Each core is a whole ``simulator.simulate`` of its own program: its own engines, SBUF, PSUM,
  DMA queues and engines, semaphores, checks and (functional mode) values. Nothing but HBM is
  shared: no semaphore, buffer or SBUF byte crosses cores (a program for one core cannot name
  another core's memory), so values are independent and computed as on one core.
- HBM: the cores of a logical core share one HBM stack. Sources: trn2 has "four 24GB HBM banks.
  Each bank is shared by two physical NeuronCore-v3" (aws-neuron-sdk
  ``about-neuron/arch/neuron-features/logical-neuroncore-config.rst`` L65; shared/
  hardware-sources.md table 2.3 "Stacks"); trn3 has 4 stacks (DRV4 ``V4_NUM_HBMS 4``) for its 8
  cores, so also 2 cores per stack. ``Target.hbm_bytes_per_ns_per_core`` is the chip's
  bandwidth / cores per chip (a [derived] figure, hardware-sources.md "Per core"): a stack is
  therefore ``CORES_PER_STACK`` x that share, and both cores' DMAs go through ONE fluid HBM
  server at that pooled rate (``costs.DmaModel``'s server, each DMA occupying
  ``Cost.hbm_ns / CORES_PER_STACK`` of it). One core alone may so use more than its even share
  (its 16 DMA engines still limit it); two busy cores split the stack. ASSUMED: the stack's
  bandwidth is pooled evenly (no document gives per-core arbitration).
- Order: the shared server must see the DMAs of both cores in order of issue time, as one core's
  simulator does. The cores run as threads in lockstep at their DMAs (``_Clock``): a core about
  to issue a DMA at time t waits until every other core has either finished or is itself waiting
  to issue one at a later time (ties: lower core first). This is a conservative parallel
  discrete-event simulation: exact, since a core's issue times never decrease (simulator.py).
- Statistics of the logical core (``MultiCoreResult.stats``): ``total_ns`` = the last core's
  completion; ``flops``, ``hbm_bytes``, ``min_hbm_bytes`` (an input both cores read whole
  counts twice: each core's program reads it), DMA counts, spills, instructions, semaphore
  waits: sums; ``engine_busy_ns``: the mean over the cores (so a busy fraction is the
  logical core's, in [0, 1]); SBUF/PSUM peaks: the larger core's (each core has its own);
  peaks and the roofline: of the logical core (TensorE peak and HBM share x cores; each floor
  term is the sum of the cores' work over the summed rate).
- Trace: each core's events on tracks ``core<k>/<queue>`` (``trace.py`` sorts them per core).

Invariants
- ``runtime_sim`` only: numpy, threading; no torch.
- A machine error of one core is raised with ``core <k>:`` before its message; the other core
  is released (it runs on alone) so nothing hangs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .costs import Cost, DmaModel
from .errors import MachineError
from .isa import Program
from .simulator import simulate
from .stats import SimResult, SimStats, TraceEvent
from .targets import Target, get_target

# physical NeuronCores per HBM stack (trn2: logical-neuroncore-config.rst L65; trn3: 8 cores,
# V4_NUM_HBMS 4): see the module docstring
CORES_PER_STACK = 2
INF = float("inf")


class _Clock:
    """Lockstep of the cores at their DMA issues (module docstring, "Order")."""

    def __init__(self, n: int) -> None:
        self.cv = threading.Condition()
        # per core: None = running (its next issue time unknown), a time = waiting to issue a
        # DMA at that time, INF = finished
        self.at: list[float | None] = [None] * n

    def turn(self, core: int, t: float) -> None:
        with self.cv:
            self.at[core] = t
            self.cv.notify_all()
            while not self._mine(core, t):
                self.cv.wait()
            self.at[core] = None

    def _mine(self, core: int, t: float) -> bool:
        for k, a in enumerate(self.at):
            if k != core and (a is None or (a, k) < (t, core)):
                return False
        return True

    def done(self, core: int) -> None:
        with self.cv:
            self.at[core] = INF
            self.cv.notify_all()


class _Hbm:
    """The one HBM server of a stack: the time its backlog ends."""

    def __init__(self) -> None:
        self.free = 0.0


class SharedHbmDma(DmaModel):
    """``costs.DmaModel`` of one core whose HBM server is shared with the other cores of its
    stack (``Cost.hbm_ns`` scaled by 1 / ``CORES_PER_STACK``: the pooled rate)."""

    def __init__(self, t: Target, core: int, clock: _Clock, hbm: _Hbm) -> None:
        self._hbm = hbm
        super().__init__(t)
        self.core, self.clock = core, clock
        self.scale = 1.0 / CORES_PER_STACK

    @property   # type: ignore[override]
    def hbm_free(self) -> float:
        return self._hbm.free

    @hbm_free.setter
    def hbm_free(self, v: float) -> None:
        self._hbm.free = v

    def issue(self, start: float, c: Cost) -> tuple[float, float, float, float]:
        self.clock.turn(self.core, start)
        if c.hbm_ns:
            c = c._replace(hbm_ns=c.hbm_ns * self.scale)
        return super().issue(start, c)


@dataclass
class MultiCoreResult(SimResult):
    """The logical core's merged result; ``cores[k]`` is physical core k's own."""

    cores: list[SimResult] = field(default_factory=list)
    core_outputs: list[dict[str, np.ndarray]] = field(default_factory=list)


def simulate_cores(programs: list[Program], inputs: list[dict[str, np.ndarray]] | None = None,
                   *, mode: str = "functional", checks: bool | str = True,
                   trace: bool = False) -> MultiCoreResult:
    """Run ``programs[k]`` on physical core k, together, sharing one HBM stack (module
    docstring). ``inputs[k]`` feeds program k in functional mode."""
    n = len(programs)
    if n < 1 or n > CORES_PER_STACK:
        raise ValueError(f"simulate_cores runs 1 to {CORES_PER_STACK} programs (the cores of "
                         f"one HBM stack), got {n}")
    targets = {p.target for p in programs}
    if len(targets) != 1:
        raise ValueError(f"the programs of one logical core must have one target, got "
                         f"{sorted(targets)}")
    tgt = get_target(programs[0].target)
    clock, hbm = _Clock(n), _Hbm()
    results: list[SimResult | None] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def run(k: int) -> None:
        try:
            results[k] = simulate(programs[k], None if inputs is None else inputs[k], mode=mode,
                                  target=tgt, checks=checks, trace=trace,
                                  dma=SharedHbmDma(tgt, k, clock, hbm))
        except BaseException as e:   # noqa: BLE001 - re-raised below, in the caller's thread
            errors[k] = e
        finally:
            clock.done(k)

    threads = [threading.Thread(target=run, args=(k,), name=f"neuron-core{k}", daemon=True)
               for k in range(1, n)]
    for th in threads:
        th.start()
    run(0)
    for th in threads:
        th.join()
    for k, e in enumerate(errors):
        if e is None:
            continue
        if isinstance(e, MachineError):
            e.message = f"core {k}: {e.message}"
        raise e
    done = [r for r in results if r is not None]
    assert len(done) == n
    return merge_results(done, tgt)


def merge_results(results: list[SimResult], tgt: Target) -> MultiCoreResult:
    """The logical core's statistics and trace from its physical cores' results (module
    docstring, "Statistics")."""
    n = len(results)
    ss = [r.stats for r in results]
    busy: dict[str, float] = {}
    waits: dict[str, float] = {}
    for s in ss:
        for k, v in s.engine_busy_ns.items():
            busy[k] = busy.get(k, 0.0) + v / n
        for k, v in s.semaphore_wait_ns.items():
            waits[k] = waits.get(k, 0.0) + v
    tensor_peak = tgt.tensor_peak_flops_per_ns * n
    hbm_bw = tgt.hbm_bytes_per_ns_per_core * n
    min_hbm = sum(s.min_hbm_bytes for s in ss)
    tensor_ns = sum(s.roofline_tensor_ns for s in ss) / n
    scalar_ns = sum(s.roofline_scalar_ns for s in ss) / n
    hbm_ns = min_hbm / hbm_bw
    stats = SimStats(
        target=tgt.name, total_ns=max(s.total_ns for s in ss),
        instructions=sum(s.instructions for s in ss), engine_busy_ns=busy,
        semaphore_wait_ns=waits, flops=sum(s.flops for s in ss),
        hbm_bytes=sum(s.hbm_bytes for s in ss), min_hbm_bytes=min_hbm,
        dma_count=sum(s.dma_count for s in ss), dma_bytes=sum(s.dma_bytes for s in ss),
        spill_bytes=sum(s.spill_bytes for s in ss),
        sbuf_peak_bytes=max(s.sbuf_peak_bytes for s in ss),
        psum_peak_bytes=max(s.psum_peak_bytes for s in ss),
        roofline_ns=max(tensor_ns, scalar_ns, hbm_ns), roofline_tensor_ns=tensor_ns,
        roofline_scalar_ns=scalar_ns, roofline_hbm_ns=hbm_ns,
        transcendental_elements=sum(s.transcendental_elements for s in ss),
        tensor_peak_flops_per_ns=tensor_peak, hbm_peak_bytes_per_ns=hbm_bw)
    events = [TraceEvent(f"core{k}/{e.queue}", e.name, e.start_ns, e.dur_ns, e.args)
              for k, r in enumerate(results) for e in r.trace]
    return MultiCoreResult(stats=stats, outputs={}, trace=events, cores=list(results),
                           core_outputs=[r.outputs for r in results])
