"""Chrome trace-event export (opens in Perfetto / chrome://tracing).

Invariants
- One process per SimResult, one thread (track) per queue, named by ``thread_name`` metadata
  events; tracks sort pe, dve, act, pool, dma0, dma1, ... On NC-v4 a TensorE transpose that ran
  beside another TensorE instruction (background transpose, costs.TensorLanes) is on its own
  track ``pe.bg``, after ``pe``.
- Each executed instruction is one complete (``ph: "X"``) event; ``ts`` and ``dur`` are in
  microseconds of simulated time. Compute instructions span their busy time (start until the
  queue may issue again); DMAs span their data phase. Completion (and for DMAs issue) times are
  in ``args``. So events on one track never overlap.
- ``args`` carry the operands, waits, signals and tag as strings.
- A logical core of several physical cores (``runtime_sim.multicore``, LNC=2) has its tracks
  named ``core<k>/<queue>``: sorted by core, then as above.
- Track names are the queue names (``pe``, ``dma3``); with ``engine_labels=True`` each is
  followed by the name AWS's Neuron profiler gives that engine (``pe (TensorE)``, ``dve
  (VectorE)``, ``act (ScalarE)``, ``pool (GpSimdE)``, ``dma3 (DMA queue 3)``), so the first word
  is always the queue name.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from .stats import SimResult

_ORDER = {"pe": 0, "pe.bg": 0, "dve": 1, "act": 2, "pool": 3}
ENGINE_LABELS = {"pe": "TensorE", "pe.bg": "TensorE background transpose", "dve": "VectorE",
                 "act": "ScalarE", "pool": "GpSimdE"}


def track_label(queue: str) -> str:
    """``pe`` -> ``pe (TensorE)``, ``dma3`` -> ``dma3 (DMA queue 3)``, ``core1/pe`` -> ``core1/pe
    (TensorE)``; others unchanged."""
    core, sep, rest = queue.partition("/")
    if sep and core.startswith("core"):
        return f"{core}/{track_label(rest)}"
    if queue in ENGINE_LABELS:
        return f"{queue} ({ENGINE_LABELS[queue]})"
    if queue.startswith("dma") and queue[3:].isdigit():
        return f"{queue} (DMA queue {queue[3:]})"
    return queue


def _tid_key(name: str) -> tuple[int, int, int, str]:
    core, sep, rest = name.partition("/")
    if sep and core.startswith("core") and core[4:].isdigit():
        return (int(core[4:]),) + _tid_key(rest)[1:]
    if name in _ORDER:
        return (0, _ORDER[name], int(name.endswith(".bg")), name)
    if name.startswith("dma") and name[3:].isdigit():
        return (0, 4, int(name[3:]), name)
    return (0, 5, 0, name)


def to_chrome_trace(result: SimResult, process_name: str = "neuron", pid: int = 1,
                    engine_labels: bool = False) -> dict:
    names = sorted({e.queue for e in result.trace}, key=_tid_key)
    label = track_label if engine_labels else str
    tid = {n: k + 1 for k, n in enumerate(names)}
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{process_name} ({result.stats.target})"}}]
    for n in names:
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid[n],
                   "args": {"name": label(n)}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid[n],
                   "args": {"sort_index": tid[n]}})
    for e in result.trace:
        ev.append({"name": e.name, "cat": e.queue, "ph": "X", "pid": pid, "tid": tid[e.queue],
                   "ts": e.start_ns / 1000.0, "dur": e.dur_ns / 1000.0, "args": dict(e.args)})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"target": result.stats.target, "total_ns": result.stats.total_ns}}


def write_chrome_trace(path: str | Path,
                       results: SimResult | Iterable[SimResult] | Mapping[str, SimResult],
                       engine_labels: bool = False) -> Path:
    """Write one or several results (a mapping gives each process its name) as one JSON file."""
    if isinstance(results, SimResult):
        items: list[tuple[str, SimResult]] = [("neuron", results)]
    elif isinstance(results, Mapping):
        items = list(results.items())
    else:
        items = [(f"neuron{k}", r) for k, r in enumerate(results)]
    events: list[dict] = []
    for k, (name, r) in enumerate(items):
        events += to_chrome_trace(r, process_name=name, pid=k + 1,
                                  engine_labels=engine_labels)["traceEvents"]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    return p
