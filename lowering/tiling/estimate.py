"""Engine-time estimates of a tile body from the simulator's own cost table.

Tilers use them to choose between ways of spreading one tile's work over the engines (a
blocking choice, like matmul's): emit each candidate body into a scratch builder
(``scratch``), score it with ``profile`` and keep the cheapest. Nothing here runs the
simulator.

``profile(b)`` returns ``(busy, makespan)``:
- ``busy``: nanoseconds per compute engine of one execution of the body, each instruction on
  the queue the schedule pass gives it (loops weighted by their trip counts), with the
  dependent-instruction penalty against the previous instruction of the same engine
  (``runtime_sim.costs.instr_cost``) -- the throughput of a pipelined loop body;
- ``makespan``: the time one execution takes on its own: instructions issue in program order
  on their engines, each after the instructions that wrote bytes it reads have completed (busy
  plus the access latency) -- the latency of a body that nothing overlaps.

Invariants
- DMA transfers are not counted: their time does not depend on how compute is spread.
- On a target with shared SBUF ports (NC-v2: VectorE and GpSimdE cannot touch SBUF at the same
  time) both engines report their sum in ``busy`` (``runtime_sim.costs.static_busy``).
- Every cost comes from ``runtime_sim.costs``; nothing here prices an instruction itself.
- A scratch builder shares nothing with the builder of the program being tiled.
"""
from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Iterator

from lowering.tir.builder import TirBuilder
from lowering.tir.ir import TAP, walk
from lowering.tir.schedule import probe_instr, schedule
from runtime_sim.costs import instr_cost, static_busy
from runtime_sim.isa import EngineKind, Instr, Queue
from runtime_sim.targets import Target


@contextlib.contextmanager
def scratch(target: Target) -> Iterator[TirBuilder]:
    """A builder to emit one candidate body into (then score it with ``profile``). The body
    sits inside a loop of two iterations, so that the schedule pass places it as the steady
    state of a loop (its choices for a lone statement differ)."""
    b = TirBuilder(target)
    with b.loop(2, "est"):
        yield b


def _extent(a: TAP) -> tuple[int, int, int, int]:
    """(first partition, end partition, first byte, end byte) touched; a loop-dependent offset
    covers the whole buffer."""
    p0, p1 = a.partition_start, a.partition_start + a.partitions
    if not a.offset.is_const:
        return p0, p1, 0, 1 << 62
    lo, hi = a.byte_span()
    return p0, p1, a.offset.const + lo, a.offset.const + hi


def _overlap(x: tuple[int, int, int, int], y: tuple[int, int, int, int]) -> bool:
    return x[0] < y[1] and y[0] < x[1] and x[2] < y[3] and y[2] < x[3]


def profile(b: TirBuilder) -> tuple[dict[EngineKind, float], float]:
    """(busy ns per compute engine, makespan ns) of everything emitted into ``b`` so far."""
    return program_profile(b.program((), ()), b.target, outer=1)


def program_profile(tp, target: Target, outer: int = 0,
                    upto: int | None = None) -> tuple[dict[EngineKind, float], float]:
    """``profile`` of a whole tile program (its top-level statements before ``upto``): every
    loop's trips counted except the ``outer`` outermost ones of each instruction (1: the
    scratch builder's own loop)."""
    queues = schedule(tp, target)
    busy: dict[EngineKind, float] = defaultdict(float)
    prev: dict[EngineKind, Instr] = {}
    free: dict[EngineKind, float] = defaultdict(float)
    done: dict[str, list[tuple[tuple[int, int, int, int], float]]] = defaultdict(list)
    makespan = 0.0
    for top, s in enumerate(tp.body):
        if upto is not None and top >= upto:
            break
        for ins, loops in walk((s,), ()):
            eng = queues[ins.sid].engine
            if eng is EngineKind.DMA:
                continue
            probe = probe_instr(tp, ins)
            n = math.prod(lp.count for lp in loops[outer:])
            c = instr_cost(probe, Queue(eng), target, prev.get(eng))
            busy[eng] += n * c.busy_ns
            prev[eng] = probe
            start = free[eng]
            for a in ins.srcs:
                ext = _extent(a)
                for w, t in done[a.buf]:
                    if t > start and _overlap(ext, w):
                        start = t
            free[eng] = start + n * c.busy_ns
            end = free[eng] + c.latency_ns
            makespan = max(makespan, end)
            for a in ins.writes:
                done[a.buf].append((_extent(a), end))
    return static_busy(busy, target), makespan
