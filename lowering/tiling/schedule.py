"""List scheduling: which queue runs each instruction.

While a lowering emits instructions in program order, the scheduler keeps an estimate of when
each queue becomes free and when each tile's last write / reads finish (from the simulator's own
cost table). An instruction that several engines can run goes to the one where it would finish
first; DMA transfers are spread over the DMA queues the same way. Program order inside a queue is
preserved, so the result is still a valid in-order stream per queue.

Invariants
- The scheduler only chooses queues; correctness never depends on its estimates (the
  synchroniser derives waits from the bytes touched after memory planning).
- Estimates use pool-relative addresses, i.e. they ignore waits that memory reuse adds later.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime_sim.costs import instr_cost
from runtime_sim.isa import AP, EngineKind, Instr, Queue, dma_queue
from runtime_sim.targets import Target

Rect = tuple[int, int, int, int]


def rect_of(ap: AP, base: int = 0) -> Rect:
    lo, hi = ap.byte_extent()
    return (ap.partition_start, ap.partition_start + ap.partitions, base + lo, base + hi)


def overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def covers(a: Rect, b: Rect) -> bool:
    return a[0] <= b[0] and a[1] >= b[1] and a[2] <= b[2] and a[3] >= b[3]


@dataclass
class ListScheduler:
    target: Target
    dma_queue_count: int = 16
    queue_free: dict[Queue, float] = field(default_factory=dict)
    history: dict[str, list[tuple[Rect, bool, float]]] = field(default_factory=dict)
    _pending: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        n = min(self.dma_queue_count, self.target.dma_engines)
        self.dma_queues = [dma_queue(e * self.target.dma_queues_per_engine) for e in range(n)]

    def _queues(self, engines: tuple[EngineKind, ...]) -> list[Queue]:
        out: list[Queue] = []
        for e in engines:
            out.extend(self.dma_queues if e is EngineKind.DMA else [Queue(e)])
        return out

    def _ready(self, reads: tuple[AP, ...], writes: tuple[AP, ...]) -> float:
        t = 0.0
        for a, is_w in [(r, False) for r in reads] + [(w, True) for w in writes]:
            r = rect_of(a)
            for (r2, w2, fin) in self.history.get(a.buffer, ()):
                if (is_w or w2) and fin > t and overlaps(r, r2):
                    t = fin
        return t

    def choose(self, builder, op, dst, srcs, attrs, engines, accum) -> Queue:
        writes = tuple(a for a in (dst, accum) if a is not None)
        ready = self._ready(srcs, writes)
        best: tuple[float, int, Queue, float] | None = None
        for i, q in enumerate(self._queues(engines)):
            c = instr_cost(Instr(op, dst, srcs, attrs, accum=accum), q, self.target)
            occupancy = c.busy_ns + c.issue_ns
            start = max(ready, self.queue_free.get(q, 0.0))
            key = (start + occupancy + c.latency_ns, i, q, start, occupancy)
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None, f"no queue can run {op}"
        self._pending = (best[3], best[4], best[0])
        return best[2]

    def commit(self, builder, ins, idx: int) -> None:
        start, occupancy, fin = self._pending
        self.queue_free[ins.queue] = start + occupancy
        for a in ins.srcs:
            self._record(a, False, fin)
        for a in (ins.dst, ins.accum):
            if a is not None:
                self._record(a, True, fin)

    def _record(self, a: AP, is_w: bool, fin: float) -> None:
        r = rect_of(a)
        h = self.history.setdefault(a.buffer, [])
        if is_w:
            h[:] = [e for e in h if not covers(r, e[0])]
        else:
            h[:] = [e for e in h if not (e[0] == r and not e[1])]
        h.append((r, is_w, fin))
        if len(h) > 64:  # an estimate: forget the oldest entries
            del h[: len(h) - 64]

