"""Facts about a tile program's structure that the schedule, plan, sync and emit passes share.

For every instruction (by statement id): its enclosing loops, its position path in the statement
tree, how many times it executes, its *flat index* (the number of its executions before the
current one, an affine function of its loop variables) and the top-level statement it belongs
to. For every SBUF/PSUM buffer: the loop that allocates it and the *allocation number* of an
access (executions of the scope loop's body so far, over all enclosing loops).

``without_cyclic_gc`` runs a pass with Python's cyclic garbage collector paused: the passes
after tiling build many small long-lived objects and no reference cycles, so a collection
would only rescan the process's heap (in a process holding a model and Dynamo's graphs, a
full collection costs about a second).

Invariants
- ``flat`` of an instruction is ``sum(var_l * prod(count_m for m inner to l))`` over its loops:
  the n-th execution (0-based) has flat index n, so its semaphore count after it completes is n+1.
- Program order of two instances is the lexicographic order of (path position, loop value)
  pairs; ``precedes_in_body`` compares the static part.
"""
from __future__ import annotations

import functools
import gc
import math
from dataclasses import dataclass
from functools import cached_property

from lowering.tir.affine import Affine
from lowering.tir.ir import Loop, Stmt, TBuf, TInstr, TProgram
from runtime_sim.isa import Memory


def without_cyclic_gc(fn):
    """``fn`` with the cyclic GC paused while it runs (re-enabled after, if it was on); it
    changes no result: only when unreachable cycles are freed (none are made here)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return run


@dataclass(frozen=True)
class InstrInfo:
    ins: TInstr
    loops: tuple[Loop, ...]
    path: tuple[int, ...]          # index in each enclosing body, root first (len(loops) + 1)
    top: int                       # index of its top-level statement

    @property
    def count(self) -> int:
        return math.prod(lp.count for lp in self.loops)

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(lp.var for lp in self.loops)

    def counts(self) -> dict[str, int]:
        return {lp.var: lp.count for lp in self.loops}


def flat_of(loops: tuple[Loop, ...]) -> Affine:
    """Flat iteration index over ``loops`` (outermost first)."""
    out = Affine(0)
    stride = 1
    for lp in reversed(loops):
        out = out + Affine.var(lp.var) * stride
        stride *= lp.count
    return out


class Structure:
    """Index of a tile program: ``info[sid]``, loop lookup, allocation numbers."""

    def __init__(self, tp: TProgram):
        self.tp = tp
        self.info: dict[int, InstrInfo] = {}
        self.loop_of_var: dict[str, Loop] = {}
        self.top_count = len(tp.body)
        self._walk(tp.body, (), ())
        self._flat: dict[int, Affine] = {}
        self._gens: dict[tuple[int, str], Affine] = {}   # (sid, scope var) -> allocation number

    def _walk(self, body: tuple[Stmt, ...], loops: tuple[Loop, ...], path: tuple[int, ...]) -> None:
        for i, s in enumerate(body):
            p = path + (i,)
            if isinstance(s, Loop):
                self.loop_of_var[s.var] = s
                self._walk(s.body, loops + (s,), p)
            else:
                self.info[s.sid] = InstrInfo(s, loops, p, p[0])

    @cached_property
    def weight_loads(self) -> frozenset[int]:
        """Loads into SBUF/PSUM of HBM data that no instruction writes before them: weights,
        graph inputs, and data the program writes only in later top-level statements (a decode
        step's KV cache read before its one-row update, ``passes/decode_cache.py``): what may
        prefetch (schedule) and stream ahead (plan). Such a load reads the values the program
        started with; the sync pass orders the later writes after it."""
        tp = self.tp
        first_write: dict[str, int] = {}     # HBM buffer -> its first writer's top-level statement
        for inf in self.info.values():
            for a in inf.ins.writes:
                if tp.buffer(a.buf).memory is Memory.HBM:
                    first_write[a.buf] = min(first_write.get(a.buf, inf.top), inf.top)
        return frozenset(
            sid for sid, inf in self.info.items()
            if inf.ins.dst is not None and tp.buffer(inf.ins.dst.buf).memory is not Memory.HBM
            and inf.ins.srcs and all(tp.buffer(a.buf).memory is Memory.HBM
                                     and first_write.get(a.buf, inf.top + 1) > inf.top
                                     for a in inf.ins.srcs))

    @cached_property
    def written_later(self) -> frozenset[str]:
        """HBM buffers that ``weight_loads`` read and the program writes (after those loads):
        a decode step's KV cache, not weights."""
        read = {a.buf for sid in self.weight_loads for a in self.info[sid].ins.srcs}
        return frozenset(a.buf for inf in self.info.values() for a in inf.ins.writes
                         if a.buf in read)

    def flat(self, sid: int) -> Affine:
        f = self._flat.get(sid)
        if f is None:
            f = self._flat[sid] = flat_of(self.info[sid].loops)
        return f

    def gen(self, buf: TBuf, sid: int) -> Affine:
        """Allocation number of ``buf`` seen by instruction ``sid`` (0 for an unscoped buffer)."""
        if buf.scope is None:
            return Affine(0)
        key = (sid, buf.scope)
        g = self._gens.get(key)
        if g is not None:
            return g
        loops = self.info[sid].loops
        for k, lp in enumerate(loops):
            if lp.var == buf.scope:
                g = self._gens[key] = flat_of(loops[:k + 1])
                return g
        raise AssertionError(f"instruction {sid} uses {buf.name} outside its scope {buf.scope}")

    def gen_stride(self, buf: TBuf, sid: int) -> int:
        """Executions of ``sid`` per allocation of ``buf`` (its loops inside the scope)."""
        if buf.scope is None:
            return self.info[sid].count
        loops = self.info[sid].loops
        for k, lp in enumerate(loops):
            if lp.var == buf.scope:
                return math.prod(x.count for x in loops[k + 1:])
        raise AssertionError(f"instruction {sid} uses {buf.name} outside its scope {buf.scope}")


def kernel_key(ins: TInstr) -> str:
    """The kernel an instruction belongs to: the ``k<i>`` prefix of its tag."""
    return (ins.tag or "").split(":", 1)[0]


def common_loops(a: InstrInfo, b: InstrInfo) -> int:
    """Number of enclosing loops ``a`` and ``b`` share (same Loop nodes, outermost first)."""
    n = 0
    for la, lb in zip(a.loops, b.loops):
        if la is not lb:
            break
        n += 1
    return n


def precedes_in_body(a: InstrInfo, b: InstrInfo, c: int) -> bool:
    """Within one iteration of their ``c`` common loops, does ``a``'s statement come before
    ``b``'s? (They diverge at path level ``c``.)"""
    return a.path[c] < b.path[c]
