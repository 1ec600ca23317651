"""The tile-IR builder: what every tiler writes into.

A tiler opens loops (``with b.loop(n, "k") as k:``; ``k`` is an ``Affine`` variable), takes
tiles (``b.tile(...)``: a pool of ``bufs`` slots whose scope is the innermost open loop, so every
iteration gets the next slot), and emits instructions whose access patterns are affine in the
open loop variables. The tiler's Python code runs once per *static* statement: a loop of 64
iterations is one ``Loop`` node, not 64 copies. It never chooses addresses, queues or semaphores:
the schedule, plan and sync passes do.

Invariants
- Statements are appended in program order; statement ids increase in that order.
- An SBUF/PSUM tile may only be touched inside the loop it was taken in (its scope): using it
  after that loop closed is a ``LoweringError`` (its slot belongs to newer allocations).
- ``tiled(n, step)`` covers ``0 .. n-1`` exactly once: a loop over the full steps, then a tail.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterator

from lowering.errors import LoweringError
from lowering.tir.affine import Affine, AffineLike, aff
from lowering.tir.ir import Loop, Stmt, TAP, TBuf, TInstr, TProgram
from lowering.tir.resident import NotResident
from runtime_sim.checks import alignment_error
from runtime_sim.isa import (ActivationAttrs, BnAggrAttrs, BnStatsAttrs, DmaAttrs, DType,
                             EngineKind, ExponentialAttrs, IotaAttrs, MatmulAttrs, Memory,
                             MemsetAttrs, Op, OpAttrs, SelectAttrs, TensorCopyAttrs,
                             TensorReduceAttrs, TensorScalarAttrs, TensorTensorAttrs,
                             TransposeAttrs)
from runtime_sim.targets import Target

ELEMENTWISE = (EngineKind.VECTOR, EngineKind.GPSIMD)
COPY_ENGINES = (EngineKind.VECTOR, EngineKind.GPSIMD, EngineKind.SCALAR)
# SBUF bytes per partition (all slots) below which a tail tile does not alias its loop's tile
# (``TirBuilder._variant_of``): sharing a small tile's bytes saves little SBUF and adds a false
# dependency (a projection's last cell's bias add waited for the cell before's residual add)
ALIAS_MIN_BYTES = 4096


@dataclass(frozen=True)
class Tile:
    """The current allocation of an SBUF/PSUM buffer: a ``[partitions, *free]`` array."""

    buf: TBuf

    @property
    def name(self) -> str:
        return self.buf.name

    @property
    def partitions(self) -> int:
        return self.buf.partitions

    @property
    def free(self) -> tuple[int, ...]:
        return self.buf.free

    @property
    def free_size(self) -> int:
        return math.prod(self.buf.free)

    @property
    def dtype(self) -> DType:
        return self.buf.dtype

    @property
    def memory(self) -> Memory:
        return self.buf.memory

    def ap(self, partitions: int | None = None, *, partition_start: int = 0,
           elem_offset: AffineLike = 0, dims: tuple[tuple[int, int], ...] | None = None,
           dtype: DType | None = None) -> TAP:
        """The whole tile (default) or a sub-block; ``elem_offset`` and ``dims`` are in elements
        of the tile's dtype."""
        if dims is None:
            dims = ((1, self.free_size),)
        return TAP(self.buf.name, partition_start,
                   self.buf.partitions if partitions is None else partitions,
                   aff(elem_offset) * self.buf.dtype.itemsize, tuple(dims), dtype or self.buf.dtype)


def hbm_ap(buf: str, dtype: DType, elem_offset: AffineLike, p: int, row_stride: int,
           free: tuple[tuple[int, int], ...]) -> TAP:
    """An HBM access over a ``[p, *free]`` block in partition-major element order (like an SBUF
    tile); ``free`` is (size, stride) per free axis, in elements; size-1 axes are dropped."""
    dims: list[tuple[int, int]] = []
    if p > 1:
        dims.append((row_stride, p))
    for size, stride in free:
        if size > 1:
            dims.append((stride, size))
    if not dims:
        dims.append((1, 1))
    return TAP(buf, 0, 1, aff(elem_offset) * dtype.itemsize, tuple(dims), dtype)


class TirBuilder:
    def __init__(self, target: Target):
        self.target = target
        self.buffers: dict[str, TBuf] = {}
        self.tag = ""
        self.prefix = ""
        self._stack: list[list[Stmt]] = [[]]
        self._open: list[str] = []          # open loop variables, outermost first
        self._single_scopes: set[str] = set()   # loops whose tiles get one slot (_single_slot)
        self._replicas: dict[str, list[tuple[int, Op]]] = {}   # key -> first copy's (sid, op)
        self._copying: list = []                # open replica blocks: [first copy, position]
        self._counts: dict[str, int] = {}
        self._sid = 0
        self._nvar = 0
        self._variants: list[dict] = []     # open tiled() sequences (see tile())
        self.live: set[str] = set()         # HBM tensors that something reads or returns
        self.resident: dict[str, tuple[object, str]] = {}   # tensor -> (Residency, SBUF buffer)
        self.notes: list[str] = []          # decisions worth a line in the dump (e.g. blockings)

    # -- buffers ------------------------------------------------------------------------------
    def hbm_tensor(self, name: str, nbytes: int, dtype: DType, role: str, resident=None) -> TBuf:
        """A tensor in HBM; with ``resident`` (a ``passes.residency.Residency``) it lives in an
        SBUF buffer ``r.<name>`` instead, and accesses are mapped onto it (``tir.resident``)."""
        b = TBuf(name, Memory.HBM, 1, (max(1, nbytes),), DType.UINT8, 1, None, role)
        self.buffers[name] = b
        if resident is not None:
            rb = TBuf(f"r.{name}", Memory.SBUF, min(128, resident.rows),
                      (resident.tiles * resident.cols,), dtype, 1, None)
            self.buffers[rb.name] = rb
            self.resident[name] = (resident, rb.name)
        return b

    def is_resident(self, name: str) -> bool:
        return name in self.resident

    def resident_view(self, a: TAP, partitions: int) -> TAP | None:
        """For an HBM access of a resident tensor laid out as ``partitions`` rows (its outermost
        axis), the same elements in the tensor's SBUF buffer with that shape (use it directly as
        an operand or destination: no copy); None for any other access (load or store it)."""
        if a.buf not in self.resident:
            return None
        m = self.map_resident(a)
        free = math.prod(s for _, s in m.dims)
        want = math.prod(s for _, s in a.dims) // max(1, partitions)
        return m if m.partitions == partitions and free == want else None

    def map_resident(self, a: TAP) -> TAP:
        """``a`` itself, or its access of the resident tensor's SBUF buffer."""
        if a.buf not in self.resident:
            return a
        from lowering.tir.resident import map_ap
        res, rb = self.resident[a.buf]
        return map_ap(res, rb, a, self._counts)

    def tile(self, name: str, memory: Memory, partitions: int, free: tuple[int, ...] | int,
             dtype: DType, bufs: int = 2) -> Tile:
        """A new buffer of ``bufs`` slots allocated per iteration of the innermost open loop
        (once, when no loop is open)."""
        if isinstance(free, int):
            free = (free,)
        if partitions > self.target.sbuf_partitions or partitions < 1:
            raise LoweringError(f"{self.tag}: tile {name} of {partitions} partitions (limit "
                                f"{self.target.sbuf_partitions})")
        scope = self._open[-1] if self._open else None
        base = self.prefix + name
        n, i = base, 0
        while n in self.buffers:
            i += 1
            n = f"{base}_{i}"
        if scope in self._single_scopes:
            bufs = 1
        b = TBuf(n, memory, partitions, tuple(int(f) for f in free), dtype,
                 bufs if scope is not None else 1, scope)
        b = self._variant_of(base, b)
        self.buffers[n] = b
        return Tile(b)

    def _variant_of(self, base: str, b: TBuf) -> TBuf:
        """Inside ``tiled()``: a tile taken in the partial-tile part reuses the bytes of the
        k-th tile of the same name taken in the loop part (an alias), when it fits and, in
        SBUF, is at least ``ALIAS_MIN_BYTES`` per partition over its slots (an alias orders
        the tail's first write after the loop's last access of the tile: a small epilogue
        tile saves a few hundred bytes and puts that wait on the way to the next kernel)."""
        root_of = None
        for ctx in reversed(self._variants):
            k = (base, ctx["seen"][base])
            ctx["seen"][base] += 1
            if ctx["tail"] and root_of is None:
                root_of = ctx["main"].get(k)
            elif not ctx["tail"]:
                ctx["main"][k] = b.name
        if root_of is None:
            return b
        if b.memory is Memory.SBUF and b.slot_bytes * b.bufs < ALIAS_MIN_BYTES:
            return b
        r = self.buffers[root_of]
        root = self.buffers[r.alias] if r.alias else r
        if (root.memory is b.memory and b.partitions <= root.partitions and b.bufs <= root.bufs
                and b.slot_bytes <= root.slot_bytes):
            return replace(b, alias=root.name)
        return b

    def note(self, text: str) -> None:
        self.notes.append(f"{self.tag}: {text}" if self.tag else text)

    # -- loops --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def loop(self, count: int, hint: str = "i") -> Iterator[Affine]:
        """``for var in 0 .. count-1`` around the statements emitted inside the block. A count of
        one yields the constant 0 (no loop); a count below one is an error."""
        if count < 1:
            raise LoweringError(f"{self.tag}: loop {hint} of {count} iterations")
        if count == 1:
            yield aff(0)
            return
        var = f"{hint}{self._nvar}"
        self._nvar += 1
        self._stack.append([])
        self._open.append(var)
        self._counts[var] = count
        try:
            yield Affine.var(var)
        finally:
            body = self._stack.pop()
            self._open.pop()
            if body:
                self._stack[-1].append(Loop(var, count, tuple(body)))

    # -- the pipelining construct's hooks (lowering/tir/pipelined.py alone calls them; a tiler
    # -- pipelines through the construct, tests/lowering/test_pipelined.py checks) ------------
    @contextlib.contextmanager
    def _replica(self, key: str) -> Iterator[None]:
        """The instructions emitted inside repeat, in order, those emitted inside the first block
        under the same ``key`` (a hand-unrolled iteration of one body): each gets
        ``copy_of`` = its counterpart's sid, so the schedule pass treats them as one loop body
        would (the same engine in every copy, instead of a fresh greedy choice that lets the
        balance drift from copy to copy). Instructions past the first copy's length, or of
        another op than their counterpart, are scheduled on their own."""
        first = self._replicas.get(key)
        rec: list = [None if first is None else first, 0, []]
        self._copying.append(rec)
        try:
            yield
        finally:
            self._copying.pop()
            if first is None:
                self._replicas[key] = rec[2]

    @contextlib.contextmanager
    def _single_slot(self) -> Iterator[None]:
        """Inside the block, tiles allocated directly in the loops open at its start, or in loops
        opened by ``_single_slot_loop``, get one slot whatever they ask for: for bodies unrolled
        so that a tile's uses in consecutive iterations are far apart (a second slot would only
        cost SBUF). Loops opened otherwise inside the block keep their tiles' slots."""
        added = set(self._open) - self._single_scopes
        self._single_scopes |= added
        try:
            yield
        finally:
            self._single_scopes -= added

    @contextlib.contextmanager
    def _single_slot_loop(self, count: int, hint: str = "i") -> Iterator[Affine]:
        """``loop`` whose directly allocated tiles get one slot (see ``_single_slot``)."""
        with self.loop(count, hint) as v:
            mine = self._open[-1] if count > 1 else None
            if mine is not None:
                self._single_scopes.add(mine)
            try:
                yield v
            finally:
                self._single_scopes.discard(mine)

    def tiled(self, n: int, step: int, hint: str = "i") -> Iterator[tuple[Affine, int]]:
        """Yield ``(start, size)`` covering ``0 .. n-1``: inside a loop over the full steps, then
        the tail (if any) outside it."""
        full, tail = divmod(n, step)
        ctx = {"tail": False, "main": {}, "seen": Counter()}
        self._variants.append(ctx)
        try:
            if full:
                with self.loop(full, hint) as v:
                    yield v * step, step
            if tail:
                ctx["tail"], ctx["seen"] = True, Counter()
                yield aff(full * step), tail
        finally:
            self._variants.pop()

    @property
    def open_loops(self) -> tuple[str, ...]:
        return tuple(self._open)

    def loop_count(self, var: str) -> int:
        return self._counts[var]

    # -- instructions -------------------------------------------------------------------------
    def _check(self, a: TAP) -> None:
        b = self.buffers.get(a.buf)
        if b is None:
            raise LoweringError(f"{self.tag}: access to unknown buffer {a.buf}")
        if a.buf in self.resident:
            # its bytes live in SBUF: only ``dma`` maps an HBM access onto them; an instruction
            # that addresses the HBM tensor itself (an indirect DMA's table) would read bytes
            # nobody wrote, so the tensor goes back to HBM and the partition is tiled again
            raise NotResident(a.buf, f"{self.tag} addresses it in HBM")
        if b.memory is not Memory.HBM:
            why = alignment_error(a.partition_start, a.partitions)
            if why is not None:
                owner = next((t for t, (_, rb) in self.resident.items() if rb == a.buf), None)
                if owner is not None:     # rows of a resident tensor that start mid-group
                    raise NotResident(owner, f"{self.tag} reads rows from partition "
                                             f"{a.partition_start}: {why}")
                raise LoweringError(f"{self.tag}: access {a}: {why}")
        if b.memory is not Memory.HBM and b.scope is not None and b.scope not in self._open:
            raise LoweringError(f"{self.tag}: uses tile {b.name} outside its loop {b.scope} "
                                f"(its slot belongs to newer allocations); give the value a "
                                f"tile taken in an enclosing loop")
        for v in a.offset.vars:
            if v not in self._open:
                raise LoweringError(f"{self.tag}: access {a} uses loop variable {v} outside its loop")

    def emit(self, op: Op, dst: TAP | None, srcs, attrs: OpAttrs, *,
             engines: tuple[EngineKind, ...], accum: TAP | None = None,
             start_when: tuple[AffineLike, ...] = (),
             dyn_attrs: tuple[tuple[str, AffineLike], ...] = ()) -> TInstr:
        srcs = tuple(srcs)
        for a in (dst, accum, *srcs):
            if a is not None:
                self._check(a)
        if EngineKind.GPSIMD in engines and any(
                a is not None and self.buffers[a.buf].memory is Memory.PSUM for a in (dst, accum, *srcs)):
            # GpSimdE cannot access PSUM (runtime_sim.checks): the other engines keep their order
            engines = tuple(e for e in engines if e is not EngineKind.GPSIMD)
            if not engines:
                raise LoweringError(f"{self.tag}: {op.value} touches PSUM and may run only on GpSimdE")
        sw = tuple(aff(v) for v in start_when)
        for v in sw:
            for var in v.vars:
                if var not in self._open:
                    raise LoweringError(f"{self.tag}: start_when {v} uses loop variable {var} "
                                        f"outside its loop")
        dyn = []
        for f, e in dyn_attrs:
            e = aff(e)
            if e.is_const:
                attrs = replace(attrs, **{f: e.const})
            else:
                for v in e.vars:
                    if v not in self._open:
                        raise LoweringError(f"{self.tag}: attribute {f}={e} uses loop variable {v} "
                                            f"outside its loop")
                dyn.append((f, e))
        copy_of = None
        if self._copying:
            rec = self._copying[-1]
            first, pos = rec[0], rec[1]
            if first is None:
                rec[2].append((self._sid, op))
            elif pos < len(first) and first[pos][1] is op:
                copy_of = first[pos][0]
            rec[1] = pos + 1
        ins = TInstr(self._sid, op, dst, srcs, attrs, accum, engines, sw, tuple(dyn), self.tag,
                     copy_of)
        self._sid += 1
        self._stack[-1].append(ins)
        return ins

    def program(self, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> TProgram:
        if len(self._stack) != 1:
            raise LoweringError("program() inside an open loop")
        return TProgram(self.target.name, tuple(self.buffers.values()), tuple(self._stack[0]),
                        tuple(inputs), tuple(outputs))

    # -- one method per ISA op (engine options in preference order) ---------------------------
    def dma(self, dst: TAP, src: TAP, transpose: bool = False) -> TInstr:
        if dst.buf in self.resident or src.buf in self.resident:
            from lowering.tir import resident
            return resident.dma(self, dst, src, transpose)
        return self.emit_dma(dst, src, transpose)

    def emit_dma(self, dst: TAP, src: TAP, transpose: bool = False) -> TInstr:
        return self.emit(Op.DMA_COPY, dst, (src,), DmaAttrs(transpose), engines=(EngineKind.DMA,))

    def matmul(self, dst: TAP, stationary: TAP, moving: TAP, *,
               start_when: tuple[AffineLike, ...] = (0,)) -> TInstr:
        """``dst (+)= stationary.T @ moving``: a new accumulation group starts in the iterations
        where every ``start_when`` expression is 0 (default: always, a single product); the
        others accumulate. Pass the K-tile offsets of the enclosing K loops."""
        sw = tuple(aff(v) for v in start_when)
        if all(v.is_const for v in sw):
            start = all(v.const == 0 for v in sw)
            return self.emit(Op.MATMUL, dst, (stationary, moving), MatmulAttrs(not start),
                             engines=(EngineKind.TENSOR,))
        if any(v.is_const and v.const != 0 for v in sw):   # never all zero: always accumulates
            return self.emit(Op.MATMUL, dst, (stationary, moving), MatmulAttrs(True),
                             engines=(EngineKind.TENSOR,))
        return self.emit(Op.MATMUL, dst, (stationary, moving), MatmulAttrs(True),
                         engines=(EngineKind.TENSOR,), start_when=tuple(v for v in sw if not v.is_const))

    def transpose(self, dst: TAP, src: TAP) -> TInstr:
        return self.emit(Op.TRANSPOSE, dst, (src,), TransposeAttrs(), engines=(EngineKind.TENSOR,))

    def activation(self, dst: TAP, src: TAP, func, *, scale: float = 1.0, bias: float = 0.0,
                   bias_ap: TAP | None = None, scale_ap: TAP | None = None, reduce=None,
                   accum: TAP | None = None) -> TInstr:
        srcs = (src,) + tuple(a for a in (bias_ap, scale_ap) if a is not None)
        attrs = ActivationAttrs(func, scale, bias, bias_ap is not None, scale_ap is not None, reduce)
        return self.emit(Op.ACTIVATION, dst, srcs, attrs, engines=(EngineKind.SCALAR,), accum=accum)

    def exponential(self, dst: TAP, src: TAP, max_ap: TAP, *, accum: TAP | None = None) -> TInstr:
        """VectorE ``dst = exp(src - max_ap)`` (NC-v4 only: ``Target.vector_exp_speedup``), with
        the row sum of the fp32 values into ``accum`` ([P, 1]) when given."""
        return self.emit(Op.EXPONENTIAL, dst, (src, max_ap), ExponentialAttrs(max_from_src=True),
                         engines=(EngineKind.VECTOR,), accum=accum)

    def tensor_tensor(self, dst: TAP, a: TAP, b: TAP, op, engines=ELEMENTWISE) -> TInstr:
        return self.emit(Op.TENSOR_TENSOR, dst, (a, b), TensorTensorAttrs(op), engines=engines)

    def tensor_scalar(self, dst: TAP, src: TAP, op0, operand0: float | TAP = 0.0, *, reverse0=False,
                      op1=None, operand1: float | TAP = 0.0, reverse1=False,
                      engines=ELEMENTWISE) -> TInstr:
        srcs = [src]
        o0_ap = isinstance(operand0, TAP)
        o1_ap = isinstance(operand1, TAP)
        if o0_ap:
            srcs.append(operand0)
        if o1_ap:
            srcs.append(operand1)
        attrs = TensorScalarAttrs(op0, 0.0 if o0_ap else float(operand0), o0_ap, reverse0,
                                  op1, 0.0 if o1_ap else float(operand1), o1_ap, reverse1)
        return self.emit(Op.TENSOR_SCALAR, dst, srcs, attrs, engines=engines)

    def tensor_reduce(self, dst: TAP, src: TAP, op, num_axes: int = 1, engines=ELEMENTWISE,
                      negate: bool = False) -> TInstr:
        return self.emit(Op.TENSOR_REDUCE, dst, (src,), TensorReduceAttrs(op, num_axes, negate),
                         engines=engines)

    def tensor_copy(self, dst: TAP, src: TAP, engines=COPY_ENGINES) -> TInstr:
        return self.emit(Op.TENSOR_COPY, dst, (src,), TensorCopyAttrs(), engines=engines)

    def memset(self, dst: TAP, value: float, engines=ELEMENTWISE) -> TInstr:
        return self.emit(Op.MEMSET, dst, (), MemsetAttrs(float(value)), engines=engines)

    def iota(self, dst: TAP, base: AffineLike, partition_step: int, steps: tuple[int, ...]) -> TInstr:
        return self.emit(Op.IOTA, dst, (), IotaAttrs(0, partition_step, steps),
                         engines=(EngineKind.GPSIMD,), dyn_attrs=(("base", base),))

    def select(self, dst: TAP, pred: TAP, on_true: TAP, on_false: TAP) -> TInstr:
        return self.emit(Op.SELECT, dst, (pred, on_true, on_false), SelectAttrs(), engines=ELEMENTWISE)

    def bn_stats(self, dst: TAP, src: TAP) -> TInstr:
        return self.emit(Op.BN_STATS, dst, (src,), BnStatsAttrs(), engines=(EngineKind.VECTOR,))

    def bn_aggr(self, dst: TAP, src: TAP) -> TInstr:
        return self.emit(Op.BN_AGGR, dst, (src,), BnAggrAttrs(), engines=(EngineKind.VECTOR,))
