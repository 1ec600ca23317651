"""The tile-program builder: what every tiled lowering writes into.

A lowering allocates *pools* (a rotating set of ``bufs`` equal slots in SBUF or PSUM, as NKI's
``tile_pool(bufs=N)``), takes tiles from them, and emits machine instructions in program order.
It never chooses addresses or queues and never writes a semaphore: the memory planner assigns each
pool an offset, the scheduler picks a queue for each instruction among the engines that have the
datapath, and the synchroniser derives every wait from the bytes the instructions touch.

Invariants
- Program order (the order of ``instrs``) is a valid sequential execution; every later pass
  preserves its meaning.
- Taking a tile from a pool returns the next slot round-robin; with ``bufs >= 2`` the load of the
  next tile can overlap the compute on the current one (double buffering), and the synchroniser
  adds the write-after-read wait that makes slot reuse safe.
- Every AP built here refers to a pool or HBM buffer by name with offsets relative to that buffer.
- A tile is used only while it owns its slot: an instruction touching a tile whose slot was
  handed to a newer tile is a ``LoweringError`` (checked on every emit).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from lowering.errors import LoweringError
from runtime_sim.isa import (AP, ActivationAttrs, DmaAttrs, DType, EngineKind, Instr, IotaAttrs,
                             MatmulAttrs, Memory, MemsetAttrs, Op, OpAttrs, Queue, SelectAttrs,
                             TensorCopyAttrs, TensorReduceAttrs, TensorScalarAttrs,
                             TensorTensorAttrs, TransposeAttrs)
from runtime_sim.targets import Target

SBUF_ALIGN = 64


@dataclass
class Pool:
    name: str
    memory: Memory
    bufs: int
    slot_bytes: int             # per partition
    partitions: int = 128
    first: int = -1             # first / last instruction index using it (lifetime)
    last: int = -1
    offset: int | None = None   # planned byte offset within the partition
    next_slot: int = 0

    @property
    def bytes_per_partition(self) -> int:
        return self.bufs * self.slot_bytes


@dataclass(frozen=True)
class TileAP(AP):
    """An AP taken from a tile, remembering which allocation of its slot it belongs to, so the
    builder can refuse a use after the slot was handed to a newer tile (a lowering bug that
    would otherwise read someone else's values silently). The machine sees a plain AP."""

    gen: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class Tile:
    """One slot of a pool holding a [partitions, *free] array of ``dtype``, row-major."""

    pool: str
    memory: Memory
    slot_offset: int            # bytes within the pool
    partitions: int
    free: tuple[int, ...]
    dtype: DType
    gen: int = -1               # allocation number of this slot

    @property
    def free_size(self) -> int:
        return math.prod(self.free)

    def ap(self, partitions: int | None = None, *, partition_start: int = 0,
           elem_offset: int = 0, dims: tuple[tuple[int, int], ...] | None = None,
           dtype: DType | None = None) -> AP:
        """The whole tile (default) or a sub-block: ``dims`` in elements of the tile's dtype."""
        if dims is None:
            dims = ((1, self.free_size),)
        dt = dtype or self.dtype
        return TileAP(self.pool, self.memory, partition_start,
                      self.partitions if partitions is None else partitions,
                      self.slot_offset + elem_offset * self.dtype.itemsize, tuple(dims), dt,
                      gen=self.gen)


@dataclass
class PInstr:
    """An instruction before synchronisation: a chosen queue, no waits yet."""

    op: Op
    dst: AP | None
    srcs: tuple[AP, ...]
    attrs: OpAttrs
    queue: Queue
    tag: str = ""
    accum: AP | None = None

    def to_instr(self, waits=(), signals=()) -> Instr:
        return Instr(self.op, self.dst, self.srcs, self.attrs, tuple(waits), tuple(signals),
                     self.tag, self.accum)


@dataclass
class TileBuilder:
    target: Target
    pools: dict[str, Pool] = field(default_factory=dict)
    instrs: list[PInstr] = field(default_factory=list)
    tag: str = ""
    prefix: str = ""                  # pool-name prefix of the kernel being tiled (e.g. "k3.")
    scheduler: object | None = None   # lowering.tiling.schedule.ListScheduler
    _allocs: int = 0
    _owner: dict[tuple[str, int], int] = field(default_factory=dict)  # (pool, slot) -> tile #

    # -- memory ---------------------------------------------------------------------------
    def pool(self, name: str, memory: Memory, bufs: int, slot_bytes: int) -> Pool:
        if memory is Memory.PSUM:
            bank = self.target.psum_bank_bytes
            slot_bytes = -(-slot_bytes // bank) * bank
        else:
            slot_bytes = -(-slot_bytes // SBUF_ALIGN) * SBUF_ALIGN
        name = self.prefix + name
        base, i = name, 0
        while name in self.pools:
            i += 1
            name = f"{base}_{i}"
        p = Pool(name, memory, bufs, slot_bytes)
        self.pools[name] = p
        return p

    def tile(self, pool: Pool, partitions: int, free: tuple[int, ...] | int, dtype: DType) -> Tile:
        if isinstance(free, int):
            free = (free,)
        need = math.prod(free) * dtype.itemsize
        if need > pool.slot_bytes:
            raise ValueError(f"tile of {need} B/partition does not fit pool {pool.name} "
                             f"slots of {pool.slot_bytes} B")
        if partitions > pool.partitions:
            raise ValueError(f"tile of {partitions} partitions exceeds {pool.partitions}")
        slot = pool.next_slot
        pool.next_slot = (slot + 1) % pool.bufs
        self._allocs += 1
        self._owner[(pool.name, slot)] = self._allocs
        return Tile(pool.name, pool.memory, slot * pool.slot_bytes, partitions, free, dtype,
                    self._allocs)

    def _check_live(self, a: AP) -> None:
        if not isinstance(a, TileAP) or a.gen < 0:
            return
        slot = a.byte_offset // self.pools[a.buffer].slot_bytes
        owner = self._owner.get((a.buffer, slot))
        if owner != a.gen:
            raise LoweringError(f"{self.tag}: uses tile #{a.gen} of pool {a.buffer} slot {slot} "
                                f"after the slot was given to tile #{owner} ({a}); the pool needs "
                                f"more slots or the value a longer-lived pool")

    # -- instructions ---------------------------------------------------------------------
    def emit(self, op: Op, dst: AP | None, srcs: tuple[AP, ...] | list, attrs: OpAttrs, *,
             engines: tuple[EngineKind, ...], accum: AP | None = None) -> PInstr:
        srcs = tuple(srcs)
        assert self.scheduler is not None, "TileBuilder needs a scheduler"
        for a in (dst, accum, *srcs):
            if a is not None:
                self._check_live(a)
        queue = self.scheduler.choose(self, op, dst, srcs, attrs, engines, accum)
        ins = PInstr(op, dst, srcs, attrs, queue, self.tag, accum)
        idx = len(self.instrs)
        self.instrs.append(ins)
        for a in (dst, accum, *srcs):
            if a is not None and a.memory is not Memory.HBM:
                p = self.pools[a.buffer]
                if p.first < 0:
                    p.first = idx
                p.last = idx
        self.scheduler.commit(self, ins, idx)
        return ins

    # -- one method per ISA op (engine options in preference order) ------------------------
    def dma(self, dst: AP, src: AP, transpose: bool = False) -> PInstr:
        return self.emit(Op.DMA_COPY, dst, (src,), DmaAttrs(transpose), engines=(EngineKind.DMA,))

    def matmul(self, dst: AP, stationary: AP, moving: AP, accumulate: bool) -> PInstr:
        return self.emit(Op.MATMUL, dst, (stationary, moving), MatmulAttrs(accumulate),
                         engines=(EngineKind.TENSOR,))

    def transpose(self, dst: AP, src: AP) -> PInstr:
        return self.emit(Op.TRANSPOSE, dst, (src,), TransposeAttrs(), engines=(EngineKind.TENSOR,))

    def activation(self, dst: AP, src: AP, func, *, scale: float = 1.0, bias: float = 0.0,
                   bias_ap: AP | None = None, scale_ap: AP | None = None, reduce=None,
                   accum: AP | None = None) -> PInstr:
        srcs = (src,) + tuple(a for a in (bias_ap, scale_ap) if a is not None)
        attrs = ActivationAttrs(func, scale, bias, bias_ap is not None, scale_ap is not None, reduce)
        return self.emit(Op.ACTIVATION, dst, srcs, attrs, engines=(EngineKind.SCALAR,), accum=accum)

    def tensor_tensor(self, dst: AP, a: AP, b: AP, op) -> PInstr:
        return self.emit(Op.TENSOR_TENSOR, dst, (a, b), TensorTensorAttrs(op),
                         engines=(EngineKind.VECTOR, EngineKind.GPSIMD))

    def tensor_scalar(self, dst: AP, src: AP, op0, operand0: float | AP = 0.0, *, reverse0=False,
                      op1=None, operand1: float | AP = 0.0, reverse1=False,
                      engines=(EngineKind.VECTOR, EngineKind.GPSIMD)) -> PInstr:
        srcs = [src]
        o0_ap = isinstance(operand0, AP)
        o1_ap = isinstance(operand1, AP)
        if o0_ap:
            srcs.append(operand0)
        if o1_ap:
            srcs.append(operand1)
        attrs = TensorScalarAttrs(op0, 0.0 if o0_ap else float(operand0), o0_ap, reverse0,
                                  op1, 0.0 if o1_ap else float(operand1), o1_ap, reverse1)
        return self.emit(Op.TENSOR_SCALAR, dst, srcs, attrs, engines=engines)

    def tensor_reduce(self, dst: AP, src: AP, op, num_axes: int = 1) -> PInstr:
        return self.emit(Op.TENSOR_REDUCE, dst, (src,), TensorReduceAttrs(op, num_axes),
                         engines=(EngineKind.VECTOR, EngineKind.GPSIMD))

    def tensor_copy(self, dst: AP, src: AP,
                    engines=(EngineKind.VECTOR, EngineKind.GPSIMD, EngineKind.SCALAR)) -> PInstr:
        return self.emit(Op.TENSOR_COPY, dst, (src,), TensorCopyAttrs(), engines=engines)

    def memset(self, dst: AP, value: float) -> PInstr:
        return self.emit(Op.MEMSET, dst, (), MemsetAttrs(float(value)),
                         engines=(EngineKind.VECTOR, EngineKind.GPSIMD))

    def iota(self, dst: AP, base: int, partition_step: int, steps: tuple[int, ...]) -> PInstr:
        return self.emit(Op.IOTA, dst, (), IotaAttrs(base, partition_step, steps),
                         engines=(EngineKind.GPSIMD,))

    def select(self, dst: AP, pred: AP, on_true: AP, on_false: AP) -> PInstr:
        return self.emit(Op.SELECT, dst, (pred, on_true, on_false), SelectAttrs(),
                         engines=(EngineKind.VECTOR, EngineKind.GPSIMD))
