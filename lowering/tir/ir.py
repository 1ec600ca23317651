"""The tile IR: loop nests over tiles, between the kernel IR and the machine program.

Grammar
```
TProgram = (target, buffers: TBuf*, body: Stmt*, inputs: name*, outputs: name*)
TBuf     = (name, memory: HBM|SBUF|PSUM, partitions, free: int*, dtype, bufs, scope: var?,
            alias: name?)
Stmt     = Loop(var, count, body: Stmt*) | TInstr
TInstr   = (sid, op: Op, dst: TAP?, srcs: TAP*, attrs: OpAttrs, accum: TAP?,
            engines: EngineKind*, start_when: Affine*, dyn_attrs: (field, Affine)*, tag)
TAP      = (buf, partition_start, partitions, offset: Affine (bytes), dims: (stride, size)*, dtype)
```
``Op``, its attribute classes and ``EngineKind`` are runtime_sim's (the machine's vocabulary).

Semantics
- A ``Loop`` runs its body for ``var = 0 .. count-1`` in order; any start/step lives in the
  expressions that use the variable. Statements run in program order (depth first).
- An HBM ``TBuf`` is a tensor in device memory (``free = (bytes,)`` of one partition). An SBUF
  or PSUM ``TBuf`` is a pool of ``bufs`` slots, each a ``[partitions, *free]`` tile of ``dtype``.
  Every execution of the body of loop ``scope`` allocates the next slot round-robin (allocation
  number = number of earlier executions of that body, counted over all enclosing loops);
  ``scope=None`` allocates once, for the whole program. Every access to the buffer lies inside
  its scope's body and touches the current allocation, so with ``bufs >= 2`` the next iteration's
  writes may overlap this iteration's reads (double buffering) once synchronised.
- ``alias``: the buffer occupies the bytes of buffer ``alias`` (the same offset and slot
  stride; never more partitions, slot bytes or slots). Buffers of one alias group are never live
  in the same iteration (the partial tile after a loop reuses the loop's tiles); the sync pass
  orders every write of one member after the latest preceding access of every other member.
- A ``TAP`` addresses one buffer: partitions ``[partition_start, +partitions)``, byte ``offset``
  (affine in the enclosing loop variables; within the slot for SBUF/PSUM), free dims
  ``(stride in elements, size)`` outermost first, as the machine's AP.
- ``start_when`` (matmul only): the instruction starts a new PSUM accumulation group
  (``accumulate=False``) in the iterations where every expression is 0, and accumulates in the
  others (a K loop's first product starts the group).
- ``dyn_attrs`` overrides integer attribute fields per iteration (e.g. an ``iota`` base that
  follows the tile's position): field ``f`` takes the value of its affine expression.
- ``engines`` lists the engines that may run the instruction, in preference order; the
  schedule pass chooses one queue per instruction (the same for every iteration).

Invariants (checked by ``tir.verify``)
- Statement ids are unique and increase in program order; loop variables are unique.
- Every TAP's buffer exists; SBUF/PSUM accesses lie inside their buffer's scope loop.
- Every TAP stays within its slot (SBUF/PSUM) or tensor (HBM) for every iteration.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Iterator, Union

from lowering.tir.affine import Affine
from runtime_sim.isa import DType, EngineKind, Memory, Op, OpAttrs


@dataclass(frozen=True)
class TBuf:
    name: str
    memory: Memory
    partitions: int
    free: tuple[int, ...]
    dtype: DType
    bufs: int = 1
    scope: str | None = None
    role: str = "temp"          # HBM: input | output | temp
    alias: str | None = None

    @property
    def slot_bytes(self) -> int:
        """Bytes per partition of one slot (before the planner's alignment)."""
        return max(1, math.prod(self.free)) * self.dtype.itemsize

    def __str__(self) -> str:
        if self.memory is Memory.HBM:
            return f"hbm  {self.name}: {self.free[0]} B ({self.role})"
        shape = "x".join(map(str, (self.partitions,) + self.free))
        scope = f" per {self.scope}" if self.scope else ""
        alias = f" in {self.alias}" if self.alias else ""
        return f"{self.memory.value} {self.name}: [{shape}] {self.dtype.value} bufs={self.bufs}{scope}{alias}"


@dataclass(frozen=True)
class TAP:
    buf: str
    partition_start: int
    partitions: int
    offset: Affine
    dims: tuple[tuple[int, int], ...]
    dtype: DType

    @property
    def free_size(self) -> int:
        return math.prod(s for _, s in self.dims)

    def byte_span(self) -> tuple[int, int]:
        """(lo, hi) bytes touched relative to ``offset`` (bounding box of the free dims)."""
        isz = self.dtype.itemsize
        lo = hi = 0
        for stride, size in self.dims:
            if size == 0:
                return (0, 0)
            span = stride * (size - 1) * isz
            if span >= 0:
                hi += span
            else:
                lo += span
        return lo, hi + isz

    def __str__(self) -> str:
        dims = ",".join(f"[{st},{sz}]" for st, sz in self.dims)
        return (f"{self.buf}[p{self.partition_start}:+{self.partitions} @{self.offset} {dims} "
                f"{self.dtype.value}]")


@dataclass(frozen=True)
class TInstr:
    sid: int
    op: Op
    dst: TAP | None
    srcs: tuple[TAP, ...]
    attrs: OpAttrs
    accum: TAP | None = None
    engines: tuple[EngineKind, ...] = ()
    start_when: tuple[Affine, ...] = ()
    dyn_attrs: tuple[tuple[str, Affine], ...] = ()
    tag: str = ""
    # the instruction of an earlier unrolled copy of the same code (TirBuilder._replica) that
    # this one repeats: the schedule pass gives both the same engine, as one loop body would
    copy_of: int | None = None

    @property
    def writes(self) -> tuple[TAP, ...]:
        return tuple(a for a in (self.dst, self.accum) if a is not None)

    def accesses(self) -> Iterator[tuple[TAP, bool]]:
        """Every operand as (tap, is_write)."""
        for a in self.writes:
            yield a, True
        for a in self.srcs:
            yield a, False

    def __str__(self) -> str:
        a = self.attrs
        fields = []
        dyn = dict(self.dyn_attrs)
        for k in a.__dataclass_fields__:
            v = dyn.get(k, getattr(a, k))
            fields.append(f"{k}={v.value if isinstance(v, enum.Enum) else v}")
        s = f"{self.op.value}({', '.join(fields)}) {self.dst} <- {', '.join(map(str, self.srcs))}"
        if self.accum is not None:
            s += f" accum {self.accum}"
        if self.start_when:
            s += f" start_when {','.join(f'{v}==0' for v in self.start_when)}"
        return s


@dataclass(frozen=True)
class Loop:
    var: str
    count: int
    body: tuple["Stmt", ...]


Stmt = Union[Loop, TInstr]


@dataclass(frozen=True)
class TProgram:
    target: str
    buffers: tuple[TBuf, ...]
    body: tuple[Stmt, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    def buffer(self, name: str) -> TBuf:
        if not self._index:
            self._index.update({b.name: b for b in self.buffers})
        return self._index[name]

    def instrs(self) -> Iterator[tuple[TInstr, tuple[Loop, ...]]]:
        """Every instruction with its enclosing loops (outermost first), in program order."""
        yield from walk(self.body, ())

    @property
    def num_statements(self) -> int:
        return sum(1 for _ in self.instrs())

    def __str__(self) -> str:
        lines = [f"tprogram target={self.target} inputs={list(self.inputs)} outputs={list(self.outputs)}"]
        lines += [f"  {b}" for b in self.buffers]
        _print(self.body, 1, lines)
        return "\n".join(lines)


def walk(body: tuple[Stmt, ...], loops: tuple[Loop, ...]) -> Iterator[tuple[TInstr, tuple[Loop, ...]]]:
    for s in body:
        if isinstance(s, Loop):
            yield from walk(s.body, loops + (s,))
        else:
            yield s, loops


def _print(body: tuple[Stmt, ...], depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    for s in body:
        if isinstance(s, Loop):
            lines.append(f"{pad}for {s.var} in 0..{s.count}:")
            _print(s.body, depth + 1, lines)
        else:
            tag = f"  # {s.tag}" if s.tag else ""
            lines.append(f"{pad}{s.sid:4d}: {s}{tag}")
