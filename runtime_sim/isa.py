"""The machine program: buffers, access patterns, instructions and queues.

This module is the *grammar* of the NeuronCore ISA that the simulator executes. It is named after
NKI's ``nki.isa`` so that Neuron users recognise the vocabulary (partition, free, stationary,
moving, PSUM). It holds data only: what an instruction *means* lives in ``semantics.py`` and what
it *costs* in ``costs.py``; one function per op in each table.

Invariants
- Every instruction type is frozen; a program is an immutable value that can be printed, diffed
  and re-run.
- An access pattern (AP) addresses one buffer. For SBUF/PSUM the first (implicit) axis is the
  partition axis ``[partition_start, partition_start + partitions)``; the free axes are up to 4
  ``(stride, size)`` pairs in *elements* of ``dtype`` starting at ``byte_offset`` within each
  partition. HBM buffers have one partition; their whole layout is described by the free axes.
- An AP's logical shape is ``(partitions, *sizes)``; elements are visited in row-major order of
  that shape. DMA copies element ``i`` of the source to element ``i`` of the destination, so the
  two sides must hold the same number of elements (their shapes may differ).
- Queues run in order. Cross-queue ordering exists only through semaphores: an instruction may
  wait until a semaphore's count reaches a value, and increments the semaphores in ``signals`` by
  one when it completes.
- A queue's stream is a tuple of instructions or a loop nest (``loops.Stream``: loops over
  instructions whose offsets, wait counts and some attributes are expressions of the loop
  counters); a loop nest means exactly the straight-line sequence of its instances.
- Offsets of SBUF/PSUM buffers are decided by the memory planner (``Buffer.offset``), never by
  the code that emits the instructions.
- Indirect DMA (``dma_gather`` / ``dma_scatter``; NKI: ``dma_copy`` with a ``vector_offset``
  access pattern, software descriptor generation) has three operands: an *index* AP in SBUF
  (int32/int64) of shape ``(P, *I)``, one lookup per element, in row-major order; a *table* AP in
  HBM whose dims are, outermost first, the **lock-step dims** (one per index axis: the partition
  axis, then each free dim of the index, with the same sizes as the index AP's shape; stride 0
  when every lookup reads the same table), the **indexed dim** ``(stride, V)`` (``V`` is the
  bound: a lookup value must lie in ``[0, V)``), then the **row dims** (0-2, one row per lookup);
  and a *data* AP in SBUF of ``P`` partitions holding ``prod(I) x row`` elements per partition.
  Lookup ``(p, i)`` addresses the table element at ``byte_offset + (lockstep(p, i) + index[p, i]
  * indexed_stride + row offset) * itemsize``, so the table AP's bounding box is exactly the bytes
  the instruction may touch. gather: ``dst`` = data, ``srcs = (table, index)``; scatter:
  ``dst`` = table, ``srcs = (data, index)``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence, Union

import ml_dtypes
import numpy as np


class Memory(enum.Enum):
    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    HBM = "hbm"
    SBUF = "sbuf"
    PSUM = "psum"


class DType(enum.Enum):
    """Element types the machine knows. ``value`` is the numpy dtype name."""

    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    FP32 = "float32"
    BF16 = "bfloat16"
    FP16 = "float16"
    FP8_E4M3 = "float8_e4m3fn"
    FP8_E5M2 = "float8_e5m2"
    INT32 = "int32"
    INT64 = "int64"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"  # stored as one byte, 0 or 1
    UINT32 = "uint32"
    # NKI's x4 types (X4_ELEMENT): four values of K in one element, value j in bits [8j, 8j+8)
    # (fp8, 32-bit element) or [4j, 4j+4) (fp4, 16-bit element); no arithmetic, MX only
    FP8_E4M3_X4 = "float8_e4m3fn_x4"
    FP8_E5M2_X4 = "float8_e5m2_x4"
    FP4_E2M1_X4 = "float4_e2m1fn_x4"

    @property
    def np(self) -> np.dtype:
        return self._np  # type: ignore[attr-defined]

    @property
    def itemsize(self) -> int:
        return self._itemsize  # type: ignore[attr-defined]

    @property
    def is_float(self) -> bool:
        return self._is_float  # type: ignore[attr-defined]

    @staticmethod
    def from_numpy(dt: np.dtype) -> "DType":
        for k, v in _NP_DTYPES.items():
            if v == np.dtype(dt) and k not in X4_ELEMENT:
                return k
        raise ValueError(f"no machine dtype for numpy dtype {dt}")


_NP_DTYPES = {
    DType.FP32: np.dtype(np.float32),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.FP16: np.dtype(np.float16),
    DType.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.INT8: np.dtype(np.int8),
    DType.UINT8: np.dtype(np.uint8),
    DType.BOOL: np.dtype(np.uint8),
    DType.UINT32: np.dtype(np.uint32),
    DType.FP8_E4M3_X4: np.dtype(np.uint32),
    DType.FP8_E5M2_X4: np.dtype(np.uint32),
    DType.FP4_E2M1_X4: np.dtype(np.uint16),
}
X4_ELEMENT = {DType.FP8_E4M3_X4: np.dtype(ml_dtypes.float8_e4m3fn),
              DType.FP8_E5M2_X4: np.dtype(ml_dtypes.float8_e5m2),
              DType.FP4_E2M1_X4: np.dtype(ml_dtypes.float4_e2m1fn)}
for _d in DType:  # precomputed per member: these are read once per operand by the simulator
    _d._np = _NP_DTYPES[_d]
    _d._itemsize = _NP_DTYPES[_d].itemsize
    _d._is_float = _d in (DType.FP32, DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2)


class EngineKind(enum.Enum):
    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    TENSOR = "pe"      # TensorE: matmul, transpose
    VECTOR = "dve"     # VectorE: tensor_tensor, tensor_scalar, reductions, copies
    SCALAR = "act"     # ScalarE: activation functions
    GPSIMD = "pool"    # GpSimdE: iota, select, general elementwise
    DMA = "dma"        # one of the DMA engines' queues


_ENGINE_ORDER = {EngineKind.TENSOR: 0, EngineKind.VECTOR: 1, EngineKind.SCALAR: 2,
                 EngineKind.GPSIMD: 3, EngineKind.DMA: 4}


@dataclass(frozen=True)
class Queue:
    """An in-order instruction stream: a compute engine, or DMA queue ``index`` (0 <= index <
    dma_engines x dma_queues_per_engine). A DMA queue's transfers run on the DMA engines that
    serve the partitions they touch, whatever the index (costs.py). Queues sort as pe, dve, act,
    pool, then DMA queues by index."""

    engine: EngineKind
    index: int = 0

    def _key(self) -> tuple[int, int]:
        return (_ENGINE_ORDER[self.engine], self.index)

    def __lt__(self, other: "Queue") -> bool:
        return self._key() < other._key()

    def __le__(self, other: "Queue") -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: "Queue") -> bool:
        return self._key() > other._key()

    def __ge__(self, other: "Queue") -> bool:
        return self._key() >= other._key()

    @property
    def name(self) -> str:
        if self.engine is EngineKind.DMA:
            return f"dma{self.index}"
        return self.engine.value

    def __str__(self) -> str:
        return self.name


TENSOR = Queue(EngineKind.TENSOR)
VECTOR = Queue(EngineKind.VECTOR)
SCALAR = Queue(EngineKind.SCALAR)
GPSIMD = Queue(EngineKind.GPSIMD)


def dma_queue(i: int) -> Queue:
    return Queue(EngineKind.DMA, i)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named region of one memory. SBUF/PSUM buffers span partitions ``[0, partitions)`` and
    bytes ``[offset, offset + bytes_per_partition)`` of each; ``offset`` is assigned by the
    planner (None until then). HBM buffers have ``partitions == 1`` and offset 0 in their own
    address space."""

    name: str
    memory: Memory
    partitions: int
    bytes_per_partition: int
    offset: int | None = None

    def __str__(self) -> str:
        off = "?" if self.offset is None else self.offset
        return f"{self.memory.value}:{self.name}[{self.partitions}p x {self.bytes_per_partition}B @{off}]"


@dataclass(frozen=True, slots=True)
class AP:
    """Access pattern: ``buffer[partition_start : +partitions, byte_offset + sum(i_k*stride_k*itemsize)]``."""

    buffer: str
    memory: Memory
    partition_start: int
    partitions: int
    byte_offset: int
    dims: tuple[tuple[int, int], ...]  # (stride in elements, size), outermost first
    dtype: DType

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.partitions,) + tuple(s for _, s in self.dims)

    @property
    def free_size(self) -> int:
        n = 1
        for _, s in self.dims:
            n *= s
        return n

    @property
    def num_elements(self) -> int:
        return self.partitions * self.free_size

    @property
    def bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize

    def byte_extent(self) -> tuple[int, int]:
        """Half-open byte range ``[lo, hi)`` touched within each partition (bounding box)."""
        isz = self.dtype.itemsize
        lo = hi = self.byte_offset
        for stride, size in self.dims:
            if size == 0:
                return (self.byte_offset, self.byte_offset)
            span = stride * (size - 1) * isz
            if span >= 0:
                hi += span
            else:
                lo += span
        return (lo, hi + isz)

    def __str__(self) -> str:
        dims = ",".join(f"[{st},{sz}]" for st, sz in self.dims)
        return (f"{self.memory.value}:{self.buffer}[p{self.partition_start}:+{self.partitions}"
                f" @{self.byte_offset} {dims} {self.dtype.value}]")


class Op(enum.Enum):
    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    DMA_COPY = "dma_copy"
    MATMUL = "matmul"
    TRANSPOSE = "transpose"
    ACTIVATION = "activation"
    TENSOR_TENSOR = "tensor_tensor"
    TENSOR_TENSOR_SCAN = "tensor_tensor_scan"
    TENSOR_SCALAR = "tensor_scalar"
    TENSOR_REDUCE = "tensor_reduce"
    TENSOR_COPY = "tensor_copy"
    MEMSET = "memset"
    IOTA = "iota"
    SELECT = "select"
    BN_STATS = "bn_stats"
    BN_AGGR = "bn_aggr"
    DMA_GATHER = "dma_gather"    # indirect DMA: rows of an HBM table by an SBUF index
    DMA_SCATTER = "dma_scatter"  # indirect DMA: rows into an HBM table by an SBUF index
    MAX8 = "max8"                        # VectorE: the 8 largest values of each partition
    FIND_INDEX8 = "nc_find_index8"       # VectorE: positions of 8 given values per partition
    MATCH_REPLACE8 = "nc_match_replace8"  # VectorE: overwrite the first matches of 8 values
    RAND_PHILOX = "rand_philox"          # GpSimdE: counter-based uniform random numbers
    EXPONENTIAL = "exponential"          # VectorE (NC-v4): exp(src - max) and its row sum
    QUANTIZE_MX = "quantize_mx"          # VectorE (NC-v4): bf16/fp16 -> MXFP8 data and scales
    SEM = "sem"  # no datapath: waits and signals only (a barrier)


class AluOp(enum.Enum):
    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    BYPASS = "bypass"
    ADD = "add"
    SUBTRACT = "subtract"
    MULTIPLY = "multiply"
    DIVIDE = "divide"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    MOD = "mod"
    IS_EQUAL = "is_equal"
    NOT_EQUAL = "not_equal"
    IS_GT = "is_gt"
    IS_GE = "is_ge"
    IS_LT = "is_lt"
    IS_LE = "is_le"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    ABS_MAX = "abs_max"
    # bitvec operators (integer sources only; 32-bit patterns): nki.isa.tensor_tensor "For bitvec
    # operators, the input/output data types must be integer types and Vector Engine treats all
    # input elements as bit patterns without any data type casting"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LOGICAL_SHIFT_LEFT = "logical_shift_left"
    LOGICAL_SHIFT_RIGHT = "logical_shift_right"
    ARITH_SHIFT_RIGHT = "arith_shift_right"


BITVEC_OPS = frozenset({AluOp.BITWISE_AND, AluOp.BITWISE_OR, AluOp.BITWISE_XOR,
                        AluOp.LOGICAL_SHIFT_LEFT, AluOp.LOGICAL_SHIFT_RIGHT, AluOp.ARITH_SHIFT_RIGHT})
# integer types the 32-bit integer ALU reads exactly (int64 has no ALU datapath: it is two words)
ALU_INT_DTYPES = frozenset({DType.INT32, DType.INT8, DType.UINT8, DType.BOOL})


class ActFunc(enum.Enum):
    __hash__ = object.__hash__  # identity hash: members are singletons (fast dict keys)

    IDENTITY = "identity"
    COPY = "copy"
    EXP = "exp"
    LOG = "log"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"            # erf form
    GELU_TANH = "gelu_apprx_tanh"
    SILU = "silu"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    SQUARE = "square"
    ABS = "abs"
    SIGN = "sign"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    NEG = "neg"
    ARCTAN = "arctan"        # valid input [-pi/2, pi/2] (nki.api.shared.rst, activation functions)


# ---- typed attributes, one dataclass per op ------------------------------------------------

@dataclass(frozen=True)
class DmaAttrs:
    transpose: bool = False  # use the DMA engine's 2-byte transpose path (trn2+)


class MatmulPerfMode(enum.Enum):
    """nki.isa.matmul_perf_mode (aws-neuron-sdk@81ce03a ``nki/api/nki/isa/__init__.py``)."""

    NONE = "none"
    # "Double FP8 mode, 2x matmul throughput by packing two FP8 weight/ifmap element pairs"
    DOUBLE_ROW = "double_row"
    # NC-v4 MX matmul (NKI ``nc_matmul_mx``, a separate API there): MXFP8 operands with E8M0
    # scales, 4x the bf16 throughput (trainium3_arch.rst L70-122); attributes ``MatmulMxAttrs``
    MX = "mx"


FP8_DTYPES = frozenset({DType.FP8_E4M3, DType.FP8_E5M2})

# double_row packs this many K rows per partition: "The first free dimension must be 2"
# (nki.isa.nc_matmul, Layout); a definition of the instruction, not a hardware rate
DOUBLE_ROW_PACK = 2


@dataclass(frozen=True)
class MatmulAttrs:
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]``; srcs = (stationary, moving).
    ``accumulate=False`` starts an accumulation group (overwrite), True adds into it. ``dst`` is
    an fp32 PSUM tile of one bank (N <= 512); on NeuronCore-v4 (``Target.psum_bf16``,
    ``Target.matmul_psum_banks``) it may be bf16 (rounded RNE on every write, accumulated at
    fp32) and span up to 8 consecutive banks (N <= 4096 fp32 / 8192 bf16).

    ``perf_mode=DOUBLE_ROW`` (NKI ``perf_mode=matmul_perf_mode.double_row``, NeuronCore-v3+,
    fp8 operands): the contraction is split between the partitions and the outermost free
    axis, which has size ``DOUBLE_ROW_PACK`` = 2: stationary ``[P, 2, M]``, moving
    ``[P, 2, N]``, ``dst[m, n] = sum over p, j of stationary[p, j, m] * moving[p, j, n]``
    (K = 2P, up to 256; nki.isa.nc_matmul "Layout"; trainium2_arch.rst "Double FP8 Matmul
    Performance"). Which logical K row sits at (p, j) is the program's choice; the compiler
    puts the first half of a K tile at j = 0 and the second at j = 1, as the arch guide draws it."""

    accumulate: bool = False
    perf_mode: MatmulPerfMode = MatmulPerfMode.NONE


# MX (ISA3 = aws-neuron-sdk@81ce03a nki/api/nki/isa/__init__.py; ARCH3 = trainium3_arch.rst):
MX_PACK = 4               # x4: four fp8 values of K per (partition, free) element (ARCH3 L87)
MX_GROUP_PARTITIONS = 8   # a scaling group: 8 partitions x the 4 packed values (ISA3 L724-725)
MX_QUADRANT = 32          # scales sit in their group's quadrant, 4 rows per quadrant (ARCH3 L103-105)
MX_SCALE_OFFSETS = (0, 4, 8, 12)   # scale rows start 0/4/8/12 into each quadrant (mxfp-matmul.rst L227-228)
# E_max of the MXFP8 element types (ISA3 quantize_mx L2798-2799)
MX_EMAX = {DType.FP8_E4M3: 8, DType.FP8_E5M2: 15, DType.FP8_E4M3_X4: 8, DType.FP8_E5M2_X4: 15}


def mx_scale_rows(partitions: int, offset: int) -> list[tuple[int, int]]:
    """(first row, row count) of the scale rows of MX data on ``partitions`` partitions, per
    quadrant, relative to the data's (and the scale AP's) first partition: scaling group ``i``
    (data partitions 8i..8i+7) has its scales in row ``32 * (i // 4) + offset + i % 4``
    (mxfp-matmul.rst L221-228; AWS's golden model ``get_p_contiguous_scale``,
    nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py L47-55)."""
    groups = partitions // MX_GROUP_PARTITIONS
    per = MX_QUADRANT // MX_GROUP_PARTITIONS
    return [(MX_QUADRANT * q + offset, min(per, groups - per * q)) for q in range((groups + per - 1) // per)]


def matmul_kmn(ins: "Instr") -> tuple[int, int, int]:
    """(K, M, N) of a matmul: contraction size, stationary free size, moving free size
    (``double_row``: K = 2 x partitions, ``mx``: K = 4 x partitions, the packed axis excluded
    from M and N)."""
    st, mv = ins.srcs[0], ins.srcs[1]
    a = ins.attrs
    if isinstance(a, MatmulAttrs) and a.perf_mode is not MatmulPerfMode.NONE:
        pack = DOUBLE_ROW_PACK if a.perf_mode is MatmulPerfMode.DOUBLE_ROW else MX_PACK
        return (st.partitions * pack, st.free_size // (1 if st.dtype in X4_ELEMENT else pack),
                mv.free_size // (1 if mv.dtype in X4_ELEMENT else pack))
    return st.partitions, st.free_size, mv.free_size


@dataclass(frozen=True)
class MatmulMxAttrs(MatmulAttrs):
    """MX matmul (NKI ``nc_matmul_mx``, NeuronCore-v4): ``Op.MATMUL`` with ``srcs =
    (stationary, moving, stationary_scale, moving_scale)``; fp8 data with an innermost ``(1, 4)``
    dim or an x4 dtype (``DType.*_X4``; MXFP4 only so), K = 4P, uint8 E8M0 scales of 8-partition
    groups in rows ``mx_scale_rows`` (``*_scale_offset`` in 0/4/8/12); dst, ``accumulate`` and PSUM
    limits as ``MatmulAttrs``. Semantics, sources and cost: docs/simulator.md, "MX matmul"."""

    perf_mode: MatmulPerfMode = MatmulPerfMode.MX
    stationary_scale_offset: int = 0
    moving_scale_offset: int = 0


@dataclass(frozen=True)
class QuantizeMxAttrs:
    """VectorE MX quantization (NKI ``quantize_mx``, NeuronCore-v4): ``srcs = (src,)`` bf16/fp16
    ``[P, F]`` in SBUF; ``dst`` the fp8 data (e4m3fn/e5m2) in the source's layout with an
    innermost ``(1, 4)`` dim; ``Instr.accum`` the uint8 E8M0 scales laid out as for
    ``MatmulMxAttrs`` (free size F / 4, rows ``mx_scale_rows(P, scale_offset)``). The scale rule
    (the documented one, twice OCP's) and the cost: docs/simulator.md, "MX quantization"."""

    scale_offset: int = 0


@dataclass(frozen=True)
class TransposeAttrs:
    """``dst[F, P] = src[P, F].T``; on TENSOR the destination is PSUM (matmul against identity)."""


@dataclass(frozen=True)
class ActivationAttrs:
    """``dst = func(src * scale + bias)``; ``bias``/``scale`` are constants unless the
    corresponding ``*_from_src`` is set, in which case they are the next source APs (shape
    [P, 1], broadcast along the free axes) in the order (bias, scale). When ``reduce`` is set,
    the result is also reduced with it along all free axes into ``Instr.accum`` ([P, 1])."""

    func: ActFunc
    scale: float = 1.0
    bias: float = 0.0
    bias_from_src: bool = False
    scale_from_src: bool = False
    reduce: AluOp | None = None


@dataclass(frozen=True)
class TensorTensorAttrs:
    op: AluOp


@dataclass(frozen=True)
class TensorTensorScanAttrs:
    """Scan along the flattened free axis of each partition (NKI ``tensor_tensor_scan``):
    ``y[i] = (srcs[0][i] op0 y[i-1]) op1 srcs[1][i]`` with ``y[-1] = initial``. ``initial`` is
    the constant ``initial`` or, with ``initial_from_src``, the per-partition [P, 1] source
    ``srcs[2]``."""

    op0: AluOp = AluOp.MULTIPLY
    op1: AluOp = AluOp.ADD
    initial: float = 0.0
    initial_from_src: bool = False


@dataclass(frozen=True)
class TensorScalarAttrs:
    """``dst = (src op0 operand0) op1 operand1``; an operand is a constant or, when the matching
    ``*_from_src`` flag is set, a per-partition [P, 1] source AP (srcs[1], then srcs[2]).
    ``reverse`` swaps the operands (``operand op src``)."""

    op0: AluOp
    operand0: float = 0.0
    operand0_from_src: bool = False
    reverse0: bool = False
    op1: AluOp | None = None
    operand1: float = 0.0
    operand1_from_src: bool = False
    reverse1: bool = False


@dataclass(frozen=True)
class TensorReduceAttrs:
    """Reduce the innermost ``num_axes`` free axes of the source with ``op``; the destination has
    the source's shape without those axes (or with them of size 1)."""

    op: AluOp
    num_axes: int = 1
    negate: bool = False


@dataclass(frozen=True)
class TensorCopyAttrs:
    """Copy with cast to the destination dtype (PSUM evacuation, layout change)."""


@dataclass(frozen=True)
class MemsetAttrs:
    value: float


@dataclass(frozen=True)
class IotaAttrs:
    """``dst[p, i_0..i_k] = base + p * partition_step + sum(i_j * steps[j])``."""

    base: int = 0
    partition_step: int = 0
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class SelectAttrs:
    """``dst = where(srcs[0] != 0, srcs[1], srcs[2])``."""


@dataclass(frozen=True)
class BnStatsAttrs:
    """Per-partition mean and variance of the free axis: dst = [P, 2] (mean, var)."""


@dataclass(frozen=True)
class BnAggrAttrs:
    """Aggregate ``k`` (mean, var) pairs of equal counts into one: src [P, 2k] -> dst [P, 2]."""


@dataclass(frozen=True)
class BnStatsNkiAttrs(BnStatsAttrs):
    """NKI's layout: dst [P, 6] = (count, mean, var * count) of the even, then the odd elements."""
    layout: str = "nki6"


@dataclass(frozen=True)
class BnAggrNkiAttrs(BnAggrAttrs):
    """NKI's layout: src [P, 3k] of (count, mean, var * count) triples -> dst [P, 2] (mean, var)."""
    layout: str = "nki6"


@dataclass(frozen=True)
class DmaGatherAttrs:
    """``dst[p, i, row] = table[lockstep(p, i) + index[p, i] * indexed_stride + row]``; srcs =
    (table, index); an index outside ``[0, V)`` is a machine error (NKI ``oob_mode.error``)."""


@dataclass(frozen=True)
class DmaScatterAttrs:
    """``table[lockstep(p, i) + index[p, i] * indexed_stride + row] (+)= data[p, i, row]``;
    srcs = (data, index); lookups are applied in row-major (p, i) order. ``accumulate``: NKI's
    ``dst_rmw_op=add`` (fp32 in the DMA engine, rounded to the table dtype per lookup)."""

    accumulate: bool = False


@dataclass(frozen=True)
class Max8Attrs:
    """``dst[p, 0:8]`` = the 8 largest fp32 values of partition ``p`` of ``srcs[0]`` (all its free
    elements, 8 to 16384), in descending order; NaN orders above +inf (ASSUMED: the NKI docs do
    not say how NaN orders; this is torch.topk's order). NKI ``nki.isa.max8``."""


@dataclass(frozen=True)
class FindIndex8Attrs:
    """``dst[p, j]`` = the position (0-based, in the row-major order of the free elements) of the
    first element of ``srcs[0]`` (data) equal to ``srcs[1][p, j]`` (vals, 8 per partition); equal
    vals are paired with ascending positions (the k-th equal val with the k-th match); a val
    with no (remaining) match gives the all-ones sentinel (-1 in the int32 destination).
    Comparison in fp32; NaN matches NaN (ASSUMED). NKI ``nki.isa.nc_find_index8``."""


@dataclass(frozen=True)
class MatchReplace8Attrs:
    """``dst`` = ``srcs[0]`` (data) with the first match of each of the 8 ``srcs[1]`` vals of its
    partition replaced by ``imm`` (equal vals replace that many distinct matches; a val with no
    match replaces nothing); matching as ``FindIndex8Attrs``. NKI ``nki.isa.nc_match_replace8``
    (its optional index output is not modelled: ``nc_find_index8`` gives the same positions)."""

    imm: float = float("-inf")


@dataclass(frozen=True)
class RandPhiloxAttrs:
    """Uniform random numbers from Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers:
    as easy as 1, 2, 3"; the Random123 reference), a software generator on GpSimdE (the engines'
    own XORWOW state is not modelled). ``srcs = (key [P, 2] int32, counter [P, 1] int32/int64)``:
    element ``(p, i_0..)`` has counter ``e = counter[p] + sum(i_j * steps[j])``; its 32-bit word
    is word ``e % 4`` of Philox4x32-10(counter block ``(e // 4) mod 2**64`` as (lo, hi, 0, 0),
    key (key[p, 0], key[p, 1]) as uint32); the value is ``(word >> (32 - bits)) * 2**-bits``
    in [0, 1), rounded to the destination dtype (``bits`` <= its significand: exact)."""

    steps: tuple[int, ...] = (1,)
    bits: int = 24


# nki.isa.exponential "Supported dtypes" (ISA3 L2335-2338), restricted to the machine's dtypes
EXP_SRC_DTYPES = frozenset({DType.FP8_E4M3, DType.FP8_E5M2, DType.FP16, DType.BF16, DType.FP32,
                            DType.INT8, DType.INT32, DType.UINT8})
EXP_DST_DTYPES = EXP_SRC_DTYPES
EXP_ACCUM_DTYPES = frozenset({DType.FP8_E4M3, DType.FP8_E5M2, DType.FP16, DType.BF16, DType.FP32})


@dataclass(frozen=True)
class ExponentialAttrs:
    """VectorE fast exponential (NKI ``nki.isa.exponential``, NeuronCore-v4 only):
    ``dst[p, j] = exp(src[p, j] - max_value[p])`` in fp32, rounded to dst's dtype; ``max_value``
    the constant or (``max_from_src``) the fp32 [P, 1] ``srcs[1]``; with ``Instr.accum`` the fp32
    values are summed into it along the free axis from ``reduce_init`` (or, ``init_from_src``,
    the next source): NKI's ``reset_reduce`` / ``load_reduce``. ``srcs = (src, [max_value],
    [reduce_init])``. Sources, dtypes and what is not modelled: docs/simulator.md, "Fast
    exponential"."""

    max_value: float = 0.0
    max_from_src: bool = False
    reduce_init: float = 0.0
    init_from_src: bool = False


@dataclass(frozen=True)
class SemAttrs:
    """No datapath."""


OpAttrs = Union[DmaAttrs, MatmulAttrs, TransposeAttrs, ActivationAttrs, TensorTensorAttrs,
                TensorTensorScanAttrs, TensorScalarAttrs, TensorReduceAttrs, TensorCopyAttrs,
                MemsetAttrs, IotaAttrs, SelectAttrs, BnStatsAttrs, BnAggrAttrs, DmaGatherAttrs,
                DmaScatterAttrs, Max8Attrs, FindIndex8Attrs, MatchReplace8Attrs, RandPhiloxAttrs,
                ExponentialAttrs, QuantizeMxAttrs, SemAttrs]

ATTRS_OF_OP: dict[Op, type] = {
    Op.DMA_COPY: DmaAttrs, Op.MATMUL: MatmulAttrs, Op.TRANSPOSE: TransposeAttrs,
    Op.ACTIVATION: ActivationAttrs, Op.TENSOR_TENSOR: TensorTensorAttrs,
    Op.TENSOR_TENSOR_SCAN: TensorTensorScanAttrs, Op.TENSOR_SCALAR: TensorScalarAttrs,
    Op.TENSOR_REDUCE: TensorReduceAttrs,
    Op.TENSOR_COPY: TensorCopyAttrs, Op.MEMSET: MemsetAttrs, Op.IOTA: IotaAttrs,
    Op.SELECT: SelectAttrs, Op.BN_STATS: BnStatsAttrs, Op.BN_AGGR: BnAggrAttrs,
    Op.DMA_GATHER: DmaGatherAttrs, Op.DMA_SCATTER: DmaScatterAttrs, Op.MAX8: Max8Attrs,
    Op.FIND_INDEX8: FindIndex8Attrs, Op.MATCH_REPLACE8: MatchReplace8Attrs,
    Op.RAND_PHILOX: RandPhiloxAttrs, Op.EXPONENTIAL: ExponentialAttrs,
    Op.QUANTIZE_MX: QuantizeMxAttrs, Op.SEM: SemAttrs,
}

# Which queues may run which op (the engines that have the datapath).
ENGINES_OF_OP: dict[Op, frozenset[EngineKind]] = {
    Op.DMA_COPY: frozenset({EngineKind.DMA}),
    Op.MATMUL: frozenset({EngineKind.TENSOR}),
    Op.TRANSPOSE: frozenset({EngineKind.TENSOR, EngineKind.VECTOR}),
    Op.ACTIVATION: frozenset({EngineKind.SCALAR}),
    Op.TENSOR_TENSOR: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD}),
    Op.TENSOR_TENSOR_SCAN: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD}),
    Op.TENSOR_SCALAR: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD, EngineKind.SCALAR}),
    Op.TENSOR_REDUCE: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD}),
    Op.TENSOR_COPY: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD, EngineKind.SCALAR}),
    Op.MEMSET: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD}),
    Op.IOTA: frozenset({EngineKind.GPSIMD}),
    Op.SELECT: frozenset({EngineKind.VECTOR, EngineKind.GPSIMD}),
    Op.BN_STATS: frozenset({EngineKind.VECTOR}),
    Op.BN_AGGR: frozenset({EngineKind.VECTOR}),
    Op.DMA_GATHER: frozenset({EngineKind.DMA}), Op.DMA_SCATTER: frozenset({EngineKind.DMA}),
    Op.MAX8: frozenset({EngineKind.VECTOR}), Op.FIND_INDEX8: frozenset({EngineKind.VECTOR}),
    Op.MATCH_REPLACE8: frozenset({EngineKind.VECTOR}),
    Op.RAND_PHILOX: frozenset({EngineKind.GPSIMD}),
    Op.EXPONENTIAL: frozenset({EngineKind.VECTOR}),   # ISA3 L2310 "Supported engines: Vector"
    Op.QUANTIZE_MX: frozenset({EngineKind.VECTOR}),   # ISA3 L2742 "using Vector Engine"
    Op.SEM: frozenset(EngineKind),
}


@dataclass(frozen=True, slots=True)
class Instr:
    """One instruction of one queue. ``waits``: (semaphore, count) pairs that must all hold
    before it starts; ``signals``: semaphores incremented by one when it completes. ``tag`` is a
    free-form label for traces (e.g. the ATen node it came from)."""

    op: Op
    dst: AP | None
    srcs: tuple[AP, ...]
    attrs: OpAttrs
    waits: tuple[tuple[str, int], ...] = ()
    signals: tuple[str, ...] = ()
    tag: str = ""
    accum: AP | None = None  # second destination: the [P, 1] free-axis reduction (activation,
    #                          exponential), or quantize_mx's scales

    @property
    def writes(self) -> tuple[AP, ...]:
        return tuple(a for a in (self.dst, self.accum) if a is not None)

    def __str__(self) -> str:
        a = self.attrs
        attrs = ", ".join(f"{k}={getattr(a, k).value if isinstance(getattr(a, k), enum.Enum) else getattr(a, k)}"
                          for k in a.__dataclass_fields__)
        s = f"{self.op.value}({attrs}) {self.dst} <- {', '.join(map(str, self.srcs))}"
        if self.accum is not None:
            s += f" accum {self.accum}"
        if self.waits:
            s += " waits " + ",".join(f"{n}>={c}" for n, c in self.waits)
        if self.signals:
            s += " signals " + ",".join(self.signals)
        if self.tag:
            s += f"  # {self.tag}"
        return s


@dataclass(frozen=True)
class Program:
    """A complete machine program for one NeuronCore.

    ``inputs``/``outputs`` name HBM buffers that the host fills / reads. ``streams`` maps each
    queue to its in-order instructions: a tuple of ``Instr``, or a ``loops.Stream`` (a loop nest
    that is a ``Sequence[Instr]`` of its instances; the program's size then follows its static
    instructions, not its trip counts). ``target`` names the target description
    (``runtime_sim.targets.get_target``)."""

    target: str
    buffers: tuple[Buffer, ...]
    streams: dict[Queue, Sequence[Instr]] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"program has no buffer named {name!r}")

    @property
    def num_instructions(self) -> int:
        """Instructions executed (instances: a loop body counts once per iteration)."""
        return sum(len(s) for s in self.streams.values())

    @property
    def num_static(self) -> int:
        """Instructions written in the program (a loop body counts once)."""
        return sum(sum(1 for _ in s.statics()) if hasattr(s, "statics") else len(s)
                   for s in self.streams.values())

    def flat(self) -> "Program":
        """The same program with every stream written out straight-line (equal APs shared)."""
        aps: dict = {}
        return Program(self.target, self.buffers,
                       {q: s.written_out(aps) if hasattr(s, "written_out") else tuple(s)
                        for q, s in self.streams.items()}, self.inputs, self.outputs)

    def __str__(self) -> str:
        lines = [f"program target={self.target} inputs={list(self.inputs)} outputs={list(self.outputs)}"]
        lines += [f"  buffer {b}" for b in self.buffers]
        for q in sorted(self.streams):
            s = self.streams[q]
            if hasattr(s, "lines"):             # a loops.Stream: its loop nest
                lines.append(f"  queue {q.name}: {len(s)} instructions")
                lines += s.lines()  # type: ignore[attr-defined]
            else:
                lines.append(f"  queue {q.name}:")
                lines += [f"    {i:4d}: {ins}" for i, ins in enumerate(s)]
        return "\n".join(lines)


# ---- convenience constructors (used by tests and lowerings alike) ---------------------------

def ap(buf: Buffer, dtype: DType, dims: tuple[tuple[int, int], ...] | list, *,
       partition_start: int = 0, partitions: int | None = None, byte_offset: int = 0) -> AP:
    """An AP on ``buf``. For HBM ``partitions`` is 1 and ``dims`` covers the whole layout."""
    if partitions is None:
        partitions = 1 if buf.memory is Memory.HBM else buf.partitions
    return AP(buf.name, buf.memory, partition_start, partitions, byte_offset,
              tuple((int(st), int(sz)) for st, sz in dims), dtype)


def indirect_layout(table: AP, index: AP) -> tuple[tuple[tuple[int, int], ...], tuple[int, int],
                                                     tuple[tuple[int, int], ...]]:
    """Split an indirect DMA's table dims into (lock-step dims, indexed dim, row dims) for the
    index AP ``index`` (see the module docstring); no validation (checks.py does that)."""
    n = 1 + len(index.dims)
    return table.dims[:n], table.dims[n], table.dims[n + 1:]


def tile_ap(buf: Buffer, dtype: DType, partitions: int, free: int, *, partition_start: int = 0,
            elem_offset: int = 0) -> AP:
    """A contiguous [partitions, free] tile of an SBUF/PSUM buffer."""
    return AP(buf.name, buf.memory, partition_start, partitions, elem_offset * dtype.itemsize,
              ((1, free),), dtype)
