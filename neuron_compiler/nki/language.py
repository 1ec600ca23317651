"""``nki.language`` (``nl``): tiles, indices, loops and element-wise math, as both NKI API
generations spell them (``neuronxcc.nki.language`` of SDK 2.26 and the newer ``nki.language``;
signatures from the stored NKI API reference, behaviour from the machine in runtime_sim).

Every function here builds instructions through ops.py; none computes values itself (values
come from the simulator running the traced program). The math functions double as operator
identifiers for ``nisa.*`` (``op=nl.add``, ``op=nl.exp``): ``ALU_OF`` / ``ACT_OF`` map them,
and numpy's ufuncs, to the machine's ALU ops and activation functions.

Invariants: loops are Python ranges (a kernel's loops run at trace time: ``affine_range``,
``sequential_range`` and ``static_range`` differ in what the NKI compiler may reorder, not in
meaning); ``program_id`` is the traced SPMD instance's index.
"""
from __future__ import annotations

import builtins

import ml_dtypes
import numpy as np

from runtime_sim.isa import ActFunc, AluOp, DType, Memory

import neuron_compiler.nki.ops as ops
from .index import arange, ds, mgrid  # noqa: F401  (public nl names)
from .tensor import (NkiTensor, hbm, np_dtype, par_dim, private_hbm, psum, sbuf,  # noqa: F401
                     shared_hbm, to_dtype)
from .ops import ALU_BY_NAME  # noqa: F401  (nl.ALU_BY_NAME, as before)
from .tracer import active, current

# ---- dtypes -----------------------------------------------------------------------------------
float32 = np.float32
float16 = np.float16
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e4m3fn = float8_e4m3
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
int32 = np.int32
int8 = np.int8
uint8 = np.uint8
int16 = np.int16       # no machine type: using it in a tile is an error naming the supported types
uint16 = np.uint16
uint32 = np.uint32
int64 = np.int64
bool_ = np.bool_
tfloat32 = np.dtype("V4")


class _MxDtype:
    """NKI's packed MX types: four fp8 (32-bit element) or fp4 (16-bit) values per element,
    machine ``DType.*_X4`` (runtime_sim.isa.X4_ELEMENT); only DMA, quantize_mx, nc_matmul_mx and
    memset(0) take them."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"


float8_e4m3fn_x4 = _MxDtype("float8_e4m3fn_x4")
float8_e5m2_x4 = _MxDtype("float8_e5m2_x4")
float4_e2m1fn_x4 = _MxDtype("float4_e2m1fn_x4")
float8_e8m0fnu = _MxDtype("float8_e8m0fnu")     # E8M0 MX scales: one byte, stored as uint8


class _TileSize:
    """``nl.tile_size``: the machine's tile limits on the active target (trn2 outside a kernel)."""

    def _t(self):
        from runtime_sim.targets import get_target
        t = active()
        return t.target if t is not None else get_target("trn2")

    @property
    def pmax(self) -> int:
        return self._t().sbuf_partitions

    @property
    def psum_fmax(self) -> int:
        return self._t().psum_bank_bytes // 4

    @property
    def gemm_stationary_fmax(self) -> int:
        return self._t().pe_cols

    @property
    def gemm_moving_fmax(self) -> int:
        return self._t().moving_free_max

    @property
    def bn_stats_fmax(self) -> int:
        return 512

    @property
    def psum_min_align(self) -> int:
        return 4

    @property
    def sbuf_min_align(self) -> int:
        return 1

    @property
    def total_available_sbuf_size(self) -> int:
        return self._t().sbuf_bytes_per_partition


tile_size = _TileSize()


# ---- loops and SPMD -------------------------------------------------------------------------------

def _range(*args, **kwargs) -> range:
    start = kwargs.pop("start", None)
    stop = kwargs.pop("stop", None)
    step = kwargs.pop("step", 1)
    if args:
        return range(*[int(a) for a in args])
    return range(int(start or 0), int(stop), int(step)) if stop is not None else range(int(start))


def affine_range(*args, **kwargs) -> range:
    """Iterations with no loop-carried dependency (other than accumulation)."""
    return _range(*args, **kwargs)


def sequential_range(*args, **kwargs) -> range:
    return _range(*args, **kwargs)


def static_range(*args, **kwargs) -> range:
    return _range(*args, **kwargs)


def program_id(axis: int = 0) -> int:
    pid = current().program_id
    if not pid:
        return 0
    if not 0 <= axis < len(pid):
        raise IndexError(f"nl.program_id({axis}): the launch grid has {len(pid)} dimensions")
    return pid[axis]


def num_programs(axes=None) -> int | tuple[int, ...]:
    grid = current().grid or (1,)
    if axes is None:
        return int(np.prod(grid))
    if isinstance(axes, (tuple, list)):
        return tuple(grid[a] for a in axes)
    return grid[axes] if axes < len(grid) else 1


def program_ndim() -> int:
    return len(current().grid)


class nc:
    """``nl.nc(n)`` / ``nl.spmd_dim``: a launch-grid dimension (all instances run on one core)."""

    def __init__(self, n: int, *_) -> None:
        self.n = int(n)

    def __index__(self) -> int:
        return self.n


class spmd_dim(nc):
    """``nl.spmd_dim(*dims)``: one launch-grid dimension of ``prod(dims)`` instances
    (``kernel[nl.spmd_dim(2, nl.nc(2)), 4]`` is ``kernel[4, 4]``: NKI shards the first over two
    cores; here all run on one core, in launch order)."""

    def __init__(self, *dims) -> None:
        n = 1
        for d in dims:
            n *= int(d.__index__() if hasattr(d, "__index__") else d)
        self.n = n


# ---- tensors -----------------------------------------------------------------------------------

def ndarray(shape, dtype, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    """A tensor in ``buffer`` (default ``nl.sbuf``), uninitialised."""
    buffer = buffer or sbuf
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if buffer.memory is Memory.HBM:
        role = "shared" if buffer is shared_hbm else "private"
        return current().hbm(tuple(int(s) for s in shape), to_dtype(dtype), name or "out", role).view()
    return ops.new_tile(shape, dtype, buffer.memory, name, getattr(buffer, "place", None),
                        getattr(buffer, "how", ""))


def zeros(shape, dtype, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    return full(shape, 0.0, dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    return full(shape, 1.0, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    if t.memory is Memory.HBM:
        raise NotImplementedError("nl.zeros/ones/full in HBM: fill an SBUF tile and nl.store it")
    return ops.memset(t, fill_value)


def zeros_like(a, dtype=None, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    return zeros(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def empty_like(a, dtype=None, buffer=None, name: str = "", **kwargs) -> NkiTensor:
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def load(src, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """HBM -> a new SBUF tile (DMA); the first dimension becomes the partitions."""
    return ops.load(src, dtype, mask)


def store(dst, value, mask=None, **kwargs) -> NkiTensor:
    """A tile -> HBM (DMA; a PSUM tile or another dtype is copied to SBUF first)."""
    return ops.store(dst, value, mask)


def load_transpose2d(src, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``src[K, M]`` -> an SBUF tile ``[M, K]`` by a DMA with a transposed (strided) source."""
    (src,) = ops.apply_mask(mask, src)
    if src.ndim != 2:
        raise ValueError(f"nl.load_transpose2d takes a 2-D tensor, got {src.shape}")
    flipped = src._with(axes=(src.axes[1], src.axes[0]))
    tile = ops.tile_like((src.shape[1], src.shape[0]), src.mdtype, "loadT")
    ops.dma(tile, flipped)
    return ops.tensor_copy(ops.tile_like(tile.shape, dtype), tile) if dtype is not None else tile


def copy(x, dtype=None, mask=None, **kwargs) -> NkiTensor:
    x = ops.materialize(x)
    (x,) = ops.apply_mask(mask, x)
    return ops.tensor_copy(ops.tile_like(x.shape, dtype or x.mdtype), x)


def broadcast_to(x, shape, dtype=None, **kwargs) -> NkiTensor:
    return ops.broadcast_to(x, tuple(int(s) for s in shape))


def expand_dims(x, axis) -> NkiTensor:
    axes = list(x.axes)
    axes.insert(axis if axis >= 0 else len(axes) + 1 + axis, (0, 1, False, frozenset()))
    return x._with(axes=tuple(axes))


def transpose(x, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """A 2-D tile transposed on TensorE (into PSUM)."""
    (x,) = ops.apply_mask(mask, ops.materialize(x))
    return ops.transpose_tile(x, dtype)


def matmul(x, y, transpose_x: bool = False, mask=None, **kwargs):
    """``x @ y`` (``transpose_x``: ``x.T @ y``, x given as [K, M]); the result is a pending
    matmul: ``psum_tile += nl.matmul(...)`` accumulates in PSUM, any other use lands it in a new
    fp32 PSUM tile."""
    x, y = ops.materialize(x), ops.materialize(y)
    x, y = ops.apply_mask(mask, x, y)
    if not transpose_x:
        x = ops.transpose_tile(x)
        x = ops.tensor_copy(ops.tile_like(x.shape, x.mdtype), x)
    y = y if y.memory is Memory.SBUF else ops.tensor_copy(ops.tile_like(y.shape, y.mdtype), y)
    return ops.PendingMatmul(x, y)


# ---- element-wise math ---------------------------------------------------------------------------

def _bin(op: AluOp, out: DType | None = None):
    def f(x, y, dtype=None, mask=None, **kwargs):
        return ops.binary(op, x, y, dtype, mask, out)
    f.__name__ = op.value
    f.__doc__ = f"``x {op.value} y`` element-wise (VectorE; GpSimdE for integers)."
    return f


add = _bin(AluOp.ADD)
subtract = _bin(AluOp.SUBTRACT)
multiply = _bin(AluOp.MULTIPLY)
divide = _bin(AluOp.DIVIDE)
maximum = _bin(AluOp.MAX)
minimum = _bin(AluOp.MIN)
power = _bin(AluOp.POW)
mod = _bin(AluOp.MOD)
fmod = mod
abs_max = _bin(AluOp.ABS_MAX)
equal = _bin(AluOp.IS_EQUAL, DType.BOOL)
not_equal = _bin(AluOp.NOT_EQUAL, DType.BOOL)
greater = _bin(AluOp.IS_GT, DType.BOOL)
greater_equal = _bin(AluOp.IS_GE, DType.BOOL)
less = _bin(AluOp.IS_LT, DType.BOOL)
less_equal = _bin(AluOp.IS_LE, DType.BOOL)
logical_and = _bin(AluOp.LOGICAL_AND)
logical_or = _bin(AluOp.LOGICAL_OR)
logical_xor = _bin(AluOp.LOGICAL_XOR)
bitwise_and = _bin(AluOp.BITWISE_AND)
bitwise_or = _bin(AluOp.BITWISE_OR)
bitwise_xor = _bin(AluOp.BITWISE_XOR)
left_shift = _bin(AluOp.LOGICAL_SHIFT_LEFT)
right_shift = _bin(AluOp.LOGICAL_SHIFT_RIGHT)


def _un(func: ActFunc):
    def f(x, dtype=None, mask=None, **kwargs):
        return ops.unary(func, x, dtype, mask)
    f.__name__ = func.value
    f.__doc__ = f"``{func.value}(x)`` element-wise (ScalarE activation)."
    return f


exp = _un(ActFunc.EXP)
log = _un(ActFunc.LOG)
sqrt = _un(ActFunc.SQRT)
rsqrt = _un(ActFunc.RSQRT)
tanh = _un(ActFunc.TANH)
sigmoid = _un(ActFunc.SIGMOID)
relu = _un(ActFunc.RELU)
gelu = _un(ActFunc.GELU)
gelu_apprx_tanh = _un(ActFunc.GELU_TANH)
silu = _un(ActFunc.SILU)
square = _un(ActFunc.SQUARE)
abs = _un(ActFunc.ABS)
sign = _un(ActFunc.SIGN)
erf = _un(ActFunc.ERF)
sin = _un(ActFunc.SIN)
cos = _un(ActFunc.COS)
arctan = _un(ActFunc.ARCTAN)
reciprocal = _un(ActFunc.RECIPROCAL)
identity = _un(ActFunc.IDENTITY)


def negative(x, dtype=None, mask=None, **kwargs) -> NkiTensor:
    return ops.binary(AluOp.MULTIPLY, x, -1.0, dtype, mask)


def _red(op: AluOp):
    def f(x, axis, dtype=None, mask=None, keepdims: bool = False, **kwargs):
        return ops.reduce(op, x, axis, dtype, keepdims, mask)
    f.__name__ = op.value
    f.__doc__ = f"Reduce with {op.value} over the innermost free ``axis`` (VectorE tensor_reduce)."
    return f


sum = _red(AluOp.ADD)
max = _red(AluOp.MAX)
min = _red(AluOp.MIN)
prod = _red(AluOp.MULTIPLY)
all = _red(AluOp.LOGICAL_AND)


def mean(x, axis, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> NkiTensor:
    x = ops.materialize(x)
    axes = axis if isinstance(axis, (list, tuple)) else (axis,)
    n = int(np.prod([x.shape[a] for a in axes]))
    s = ops.reduce(AluOp.ADD, x, axis, DType.FP32, keepdims, mask)
    return ops.binary(AluOp.MULTIPLY, s, 1.0 / n, dtype or x.dtype)


def softmax(x, axis=-1, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """exp(x - max) / sum, over the innermost free axis (VectorE + ScalarE)."""
    x = ops.materialize(x)
    m = ops.reduce(AluOp.MAX, x, axis, DType.FP32, True, mask)
    e = ops.tile_like(x.shape, DType.FP32)
    ops.activation(e, ActFunc.EXP, x, bias=negative(m))
    s = ops.reduce(AluOp.ADD, e, axis, DType.FP32, True)
    return ops.binary(AluOp.DIVIDE, e, s, dtype or x.dtype)


def shared_constant(constant, dtype=None, **kwargs) -> NkiTensor:
    """An HBM tensor holding ``constant`` (a host array), converted to ``dtype``."""
    data = np.asarray(constant)
    if dtype is not None:
        data = data.astype(np.float32 if data.dtype.kind == "b" else data.dtype).astype(np_dtype(to_dtype(dtype)))
    t = current()
    st = t.hbm(tuple(data.shape), to_dtype(data.dtype), "const", role="constant")
    t.constants[st.name] = np.ascontiguousarray(data)
    return st.view()


def shared_identity_matrix(n, dtype=np.uint8, **kwargs) -> NkiTensor:
    return shared_constant(np.identity(int(n)), dtype)


def static_cast(x, dtype):
    """A host array (numpy) converted to ``dtype`` (NKI's test helper; not a kernel op)."""
    return np.asarray(x).astype(np_dtype(to_dtype(dtype)))


def device_print(*args, **kwargs) -> None:
    """Accepted and ignored (values exist only after the simulator runs)."""


# ---- operator identifiers (nisa op= arguments) -----------------------------------------------------

ALU_OF: dict = {}
for _f, _op in ((add, AluOp.ADD), (subtract, AluOp.SUBTRACT), (multiply, AluOp.MULTIPLY),
                (divide, AluOp.DIVIDE), (maximum, AluOp.MAX), (minimum, AluOp.MIN),
                (power, AluOp.POW), (mod, AluOp.MOD), (abs_max, AluOp.ABS_MAX),
                (equal, AluOp.IS_EQUAL), (not_equal, AluOp.NOT_EQUAL), (greater, AluOp.IS_GT),
                (greater_equal, AluOp.IS_GE), (less, AluOp.IS_LT), (less_equal, AluOp.IS_LE),
                (logical_and, AluOp.LOGICAL_AND), (logical_or, AluOp.LOGICAL_OR),
                (logical_xor, AluOp.LOGICAL_XOR), (bitwise_and, AluOp.BITWISE_AND),
                (bitwise_or, AluOp.BITWISE_OR), (bitwise_xor, AluOp.BITWISE_XOR),
                (left_shift, AluOp.LOGICAL_SHIFT_LEFT), (right_shift, AluOp.LOGICAL_SHIFT_RIGHT),
                (sum, AluOp.ADD), (max, AluOp.MAX), (min, AluOp.MIN), (prod, AluOp.MULTIPLY),
                (np.add, AluOp.ADD), (np.subtract, AluOp.SUBTRACT), (np.multiply, AluOp.MULTIPLY),
                (np.divide, AluOp.DIVIDE), (np.maximum, AluOp.MAX), (np.minimum, AluOp.MIN),
                (np.power, AluOp.POW), (np.mod, AluOp.MOD), (np.equal, AluOp.IS_EQUAL),
                (np.not_equal, AluOp.NOT_EQUAL), (np.greater, AluOp.IS_GT),
                (np.greater_equal, AluOp.IS_GE), (np.less, AluOp.IS_LT), (np.less_equal, AluOp.IS_LE),
                (np.logical_and, AluOp.LOGICAL_AND), (np.logical_or, AluOp.LOGICAL_OR),
                (np.logical_xor, AluOp.LOGICAL_XOR), (np.bitwise_and, AluOp.BITWISE_AND),
                (np.bitwise_or, AluOp.BITWISE_OR), (np.bitwise_xor, AluOp.BITWISE_XOR),
                (np.sum, AluOp.ADD), (np.max, AluOp.MAX), (np.amax, AluOp.MAX), (np.min, AluOp.MIN),
                (np.amin, AluOp.MIN), (np.prod, AluOp.MULTIPLY), (builtins.max, AluOp.MAX),
                (builtins.min, AluOp.MIN)):
    ALU_OF[_f] = _op

ACT_OF: dict = {exp: ActFunc.EXP, log: ActFunc.LOG, sqrt: ActFunc.SQRT, rsqrt: ActFunc.RSQRT,
                tanh: ActFunc.TANH, sigmoid: ActFunc.SIGMOID, relu: ActFunc.RELU, gelu: ActFunc.GELU,
                gelu_apprx_tanh: ActFunc.GELU_TANH, silu: ActFunc.SILU, square: ActFunc.SQUARE,
                abs: ActFunc.ABS, sign: ActFunc.SIGN, erf: ActFunc.ERF, sin: ActFunc.SIN,
                cos: ActFunc.COS, arctan: ActFunc.ARCTAN, reciprocal: ActFunc.RECIPROCAL,
                copy: ActFunc.COPY, identity: ActFunc.IDENTITY,
                np.exp: ActFunc.EXP, np.log: ActFunc.LOG, np.sqrt: ActFunc.SQRT,
                np.tanh: ActFunc.TANH, np.square: ActFunc.SQUARE, np.abs: ActFunc.ABS,
                np.sign: ActFunc.SIGN, np.sin: ActFunc.SIN, np.cos: ActFunc.COS,
                np.arctan: ActFunc.ARCTAN, np.reciprocal: ActFunc.RECIPROCAL}


def alu_of(op) -> AluOp:
    if isinstance(op, AluOp):
        return op
    if op in ALU_OF:
        return ALU_OF[op]
    name = getattr(op, "__name__", str(op))
    for a in AluOp:
        if a.value == name:
            return a
    raise ValueError(f"{name!r} is not an ALU operator the machine has "
                     f"({', '.join(a.value for a in AluOp)})")


def act_of(op) -> ActFunc:
    if isinstance(op, ActFunc):
        return op
    if op in ACT_OF:
        return ACT_OF[op]
    name = getattr(op, "__name__", str(op))
    for a in ActFunc:
        if a.value == name:
            return a
    raise ValueError(f"{name!r} is not an activation function the machine has "
                     f"({', '.join(a.value for a in ActFunc)})")


bypass = identity
__all__ = [n for n in dir() if not n.startswith("_") and n not in ("builtins", "np", "ml_dtypes", "annotations")]
_ = np_dtype
