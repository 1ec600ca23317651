"""Software pipelining as a construct of the tile IR: a tiler writes one iteration's work as
named stages, and the construct owns the issue order, the unrolling and the slot rotation.

A pipelined loop over ``n`` iterations has stages, each with a *lag*; in step ``t`` the stage
``(name, lag)`` works on iteration ``t - lag`` (when that is in ``0 .. n-1``), and within a step
the stages are issued in the order given. So with ``[("A", 0), ("C", 1), ("I", -1)]`` step
``t`` issues A(t) C(t-1) I(t+1): iteration t-1's last stage behind, iteration t+1's loads one
step ahead (into the set C(t-1) has just released), and every in-order engine finds the next
iteration's early work queued before the instructions that wait. Steps run from ``min(lag)`` to ``n - 1 + max(lag)``:

    prologue   the steps where some stage has no iteration yet (unrolled)
    steady     every stage active: a loop of ``depth`` steps per trip (``loop=True``), each copy
               with static slots; the steps left over after the whole trips are unrolled
    epilogue   the steps where some stage has run out of iterations (unrolled)

The body: ``body(i, slot)`` returns the stages of iteration ``i`` as ``{name: callable}``; ``i``
is an ``int`` in unrolled steps and an ``Affine`` in the loop, ``slot = i % depth`` is always a
static int, so a tile that crosses stages is taken from one of ``depth`` sets the tiler made,
and a set is reused by iteration ``i + depth`` only after
iteration ``i``'s last stage: every stage of iteration ``i`` is issued before any stage of
iteration ``i + depth`` (checked; ``depth = max(lag) - min(lag)`` is enough when the latest
stage comes first in the step, as I(t+1) after C(t-1) above).

Invariants
- Every stage of every iteration in ``0 .. n-1`` is issued exactly once, in step order, and
  within a step in the given stage order.
- ``body`` is called once per iteration and static copy: the stages of one iteration issued in
  the same unrolled step sequence (or the same copy of the loop body) share one call, so
  closures may carry state from an early stage to a later one; a stage issued in another
  static copy than its iteration's earlier stages gets a call of its own.
- Every copy of a stage is scheduled as its first copy (``TirBuilder._replica``, keyed per
  construct and stage) unless the stage says ``same_schedule=False``; tiles allocated inside the
  construct get one slot (``TirBuilder._single_slot``): the stage sets rotate, not the pools.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

from lowering.errors import LoweringError
from lowering.tir.affine import Affine, aff

_ids = itertools.count()
# body(iteration, slot) -> {stage name: the callable that issues that stage of that iteration}
Body = Callable[[int | Affine, int], Mapping[str, Callable[[], None]]]


@dataclass(frozen=True)
class Stage:
    """One stage of a pipelined body: in step ``t`` it works on iteration ``t - lag``."""

    name: str
    lag: int
    same_schedule: bool = True


def _step(n: int, stages: Sequence[Stage], t: int) -> list[tuple[Stage, int]]:
    """Step ``t``: (stage, iteration) of every stage with an iteration in ``0 .. n-1``."""
    return [(s, t - s.lag) for s in stages if 0 <= t - s.lag < n]


def _filled(n: int, stages: Sequence[Stage], t0: int, t1: int) -> list[tuple[Stage, int]]:
    """Steps ``t0 .. t1 - 1`` in fill order: stage by stage, the most negative lag first."""
    return [(s, t - s.lag) for s in sorted(stages, key=lambda s: s.lag)
            for t in range(t0, t1) if 0 <= t - s.lag < n]


def steps(n: int, stages: Sequence[Stage], fill: bool = False) -> list[list[tuple[Stage, int]]]:
    """The issue order as a list of steps, each a list of (stage, iteration): the construct's
    order with every step unrolled (what ``pipelined`` emits, before any loop is formed); with
    ``fill`` the prologue's steps are one list, in ``phases``' fill order."""
    lo, hi = min(s.lag for s in stages), max(s.lag for s in stages)
    out = [_step(n, stages, t) for t in range(lo, n + hi)]
    if not fill:
        return out
    p_end = min(hi, n + lo)
    return [_filled(n, stages, lo, p_end)] + out[p_end - lo:]


class Phases(NamedTuple):
    """The three parts of a pipelined loop, to be issued in this order (a stage of an enclosing
    pipeline may take one of them, as a group's key-block pipeline is split into the group's
    stages)."""

    prologue: Callable[[], None]
    steady: Callable[[], None]
    epilogue: Callable[[], None]


def pipelined(b, n: int, stages: Sequence[Stage], body: Body, **kw) -> None:
    """Emit the pipelined loop (module docstring) into the builder ``b``: ``phases`` issued at
    once."""
    p = phases(b, n, stages, body, **kw)
    p.prologue()
    p.steady()
    p.epilogue()


def phases(b, n: int, stages: Sequence[Stage], body: Body, *, depth: int = 2, hint: str = "p",
           loop: bool = True, uniform: int | None = None, loop_from: int = 0,
           one_slot: bool = True, fill: bool = False) -> Phases:
    """The pipelined loop (module docstring) as its prologue (the steps before every stage is
    active), steady state (the loop of ``depth`` static copies per trip, when ``loop`` and at
    least one trip, then the leftover steps) and epilogue (the steps after the first stage has
    run out). Only iterations in ``loop_from .. uniform - 1`` have one body whatever their
    index (default all): the loop covers no step with an iteration outside them, the steps
    before it are unrolled. ``one_slot``: tiles allocated directly in the
    construct (and its loop) get one slot, the stage sets rotating instead; else they keep
    their pools' slots and the loop is a plain one. ``fill``: the prologue fills the pipeline
    from its leading stage, each stage (most negative lag first) issuing all its prologue
    iterations before the next stage, instead of step by step (so the first iterations' early
    work is all queued before any later stage waits on it)."""
    if n < 1:
        raise LoweringError(f"{b.tag}: pipelined loop {hint} of {n} iterations")
    names = [s.name for s in stages]
    if not stages or len(set(names)) != len(names):
        raise LoweringError(f"{b.tag}: pipelined loop {hint}: stage names must be distinct and "
                            f"at least one, got {names}")
    lo, hi = min(s.lag for s in stages), max(s.lag for s in stages)
    late = [(s.lag, x, s.name) for x, s in enumerate(stages)]
    clash = [(a, c) for a in late for c in late if a[:2] >= (depth + c[0], c[1])]
    if clash:
        (_, _, a), (_, _, c) = clash[0]
        raise LoweringError(f"{b.tag}: pipelined loop {hint}: depth {depth} does not cover the "
                            f"lags {lo} .. {hi}: stage {c} of iteration i + {depth} (its set) "
                            f"would be issued before stage {a} of iteration i")
    key = f"{b.prefix}pipe{next(_ids)}"
    memo: dict[object, Mapping[str, Callable[[], None]]] = {}

    def issue(s: Stage, i: int | Affine, slot: int) -> None:
        fns = memo.get(i)
        if fns is None:
            fns = memo[i] = body(i, slot)
        if s.same_schedule:
            with b._replica(f"{key}/{s.name}"):
                fns[s.name]()
        else:
            fns[s.name]()

    def run(order: list[tuple[Stage, int]]) -> None:
        with b._single_slot() if one_slot else nullcontext():
            for s, i in order:
                issue(s, i, i % depth)

    def unrolled(t0: int, t1: int) -> None:
        run([x for t in range(t0, t1) for x in _step(n, stages, t)])

    p_end = min(hi, n + lo)                    # the prologue: steps lo .. p_end - 1
    e_start = max(p_end, n + lo)               # the epilogue: steps e_start .. n + hi - 1
    # loop-eligible steps: loop_from + hi .. every iteration of each in loop_from .. uniform - 1
    steady = min(n, n if uniform is None else uniform) + lo - hi - loop_from
    trips = steady // depth if loop and steady > 0 else 0
    t0 = loop_from + hi                        # the loop's first step (p_end <= hi)

    def middle() -> None:
        if trips:
            unrolled(p_end, t0)
            opened = b._single_slot_loop if one_slot else b.loop
            with b._single_slot() if one_slot else nullcontext(), opened(trips, hint) as v:
                for j in range(depth):         # one static copy per step of a trip
                    memo.clear()
                    for s in stages:
                        c = t0 + j - s.lag     # iteration = depth * v + c
                        issue(s, aff(v) * depth + c, c % depth)
            memo.clear()
            unrolled(t0 + trips * depth, e_start)
        else:
            unrolled(p_end, e_start)

    def prologue() -> None:
        if fill:
            run(_filled(n, stages, lo, p_end))
        else:
            unrolled(lo, p_end)

    return Phases(prologue, middle, lambda: unrolled(e_start, n + hi))
