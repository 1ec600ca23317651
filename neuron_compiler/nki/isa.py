"""``nki.isa`` (``nisa``): one function per machine instruction, in both API generations.

- SDK 2.26 (``neuronxcc.nki.isa``): an instruction returns its result, a new tile
  (``nisa.tensor_tensor(a, b, op=nl.add)``, ``nisa.nc_matmul(stationary, moving)``).
- Newer NKI (``nki.isa``): the destination comes first (``nisa.tensor_tensor(dst=t, data1=a,
  data2=b, op=nl.add)``, ``nisa.nc_matmul(dst=psum, stationary=..., moving=...)``) and nothing
  is returned.

Each function tells the generations apart by its arguments: ``dst=`` given, or one more
leading tile than the old signature takes, means the newer form. Operators (``op=``) are
``nl.*`` functions or numpy ufuncs (language.alu_of / act_of).
"""
from __future__ import annotations

import enum

from runtime_sim.isa import ActFunc, DType, Memory

import neuron_compiler.nki.ops as ops
from .index import IndexExpr
from .language import act_of, alu_of
from .tensor import NkiTensor, to_dtype
from .tracer import current


class engine(enum.Enum):
    unknown = "unknown"
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    activation = "activation"
    dma = "dma"
    sync = "sync"


# SDK 2.26 spelling of the engines
tensor_engine, vector_engine, scalar_engine, gpsimd_engine, unknown_engine = (
    engine.tensor, engine.vector, engine.scalar, engine.gpsimd, engine.unknown)


class reduce_cmd(enum.Enum):
    idle = 0
    reset = 1
    reset_reduce = 2
    reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """NeuronCore generation of the active target (trn1: v2, trn2: v3, trn3: v4)."""
    core = current().target.neuron_core
    return nc_version(int("".join(ch for ch in core if ch.isdigit()) or 3))


def _split(args, kwargs, names: tuple[str, ...], new: bool):
    """Bind positional args to ``names`` (prefixed by ``dst`` for the newer form)."""
    names = (("dst",) + names) if new else names
    out = dict(zip(names, args))
    for k in out:
        if k in kwargs:
            raise TypeError(f"argument {k!r} given twice")
    out.update(kwargs)
    return out


def _is_new(args, kwargs, old_leading_tiles: int) -> bool:
    if "dst" in kwargs:
        return True
    lead = 0
    for a in args:
        if not isinstance(a, (NkiTensor, ops.PendingMatmul)):
            break
        lead += 1
    return lead > old_leading_tiles


def _result(shape, dtype, like: NkiTensor, buffer=None) -> NkiTensor:
    mem = buffer.memory if buffer is not None else Memory.SBUF
    return ops.new_tile(shape, dtype if dtype is not None else like.mdtype, mem)


def _dst_and_data(a: dict, new: bool) -> tuple[NkiTensor, NkiTensor]:
    """The masked destination and ``data`` source of a one-source instruction: the given
    ``dst`` (newer form) or a new SBUF tile of ``data``'s shape and ``dtype=`` (SDK 2.26)."""
    data = ops.materialize(a["data"])
    if new:
        return tuple(ops.apply_mask(a.get("mask"), a["dst"], data))
    (data,) = ops.apply_mask(a.get("mask"), data)
    dt = to_dtype(a["dtype"]) if a.get("dtype") is not None else None
    return _result(data.shape, dt, data), data


# ---- data movement --------------------------------------------------------------------------------

def dma_copy(*args, **kwargs):
    """``dst <- src`` by DMA (both generations take ``dst=``, ``src=``)."""
    a = _split(args, kwargs, ("src",), new=True)
    dst, src = a["dst"], ops.materialize(a["src"])
    dst, src = ops.apply_mask(a.get("mask"), dst, src)
    if a.get("dst_rmw_op") is not None:
        raise NotImplementedError("nisa.dma_copy(dst_rmw_op=...) is not modelled")
    ops.dma(dst, src)
    return dst


def tensor_copy(*args, **kwargs):
    """Copy (with cast) on VectorE (``engine=`` may choose ScalarE/GpSimdE)."""
    new = _is_new(args, kwargs, 1)
    a = _split(args, kwargs, ("src",), new)
    src = ops.materialize(a["src"])
    if new:
        dst = a["dst"]
        dst, src = ops.apply_mask(a.get("mask"), dst, src)
        ops.tensor_copy(dst, src, a.get("engine"))
        return dst
    (src,) = ops.apply_mask(a.get("mask"), src)
    return ops.tensor_copy(_result(src.shape, to_dtype(a["dtype"]) if a.get("dtype") is not None else None, src),
                           src, a.get("engine"))


def memset(*args, **kwargs):
    new = _is_new(args, kwargs, 0)
    if new:
        a = _split(args, kwargs, ("value",), True)
        return ops.memset(a["dst"], a["value"], a.get("engine"))
    a = _split(args, kwargs, ("shape", "value", "dtype"), False)
    t = ops.new_tile(a["shape"], a["dtype"], Memory.SBUF, "memset")
    return ops.memset(t, a["value"], a.get("engine"))


def iota(*args, **kwargs):
    """Old: ``iota(expr, dtype)`` over an index grid; new: ``iota(dst, pattern, offset,
    channel_multiplier)`` with ``pattern = [[step, size], ...]`` over the free axes."""
    if args and isinstance(args[0], IndexExpr) or isinstance(kwargs.get("expr"), IndexExpr):
        a = _split(args, kwargs, ("expr", "dtype"), False)
        e: IndexExpr = a["expr"]
        coefs = e.by_position()
        shape = e.shape if e.ndim > 1 else (1,) + e.shape
        t = ops.new_tile(shape, a["dtype"], Memory.SBUF, "iota")
        if e.ndim > 1:
            steps = tuple(coefs.get(p, 0) for p in range(1, e.ndim))
            return ops.iota(t, e.const, coefs.get(0, 0), steps)
        return ops.iota(t, e.const, 0, (coefs.get(0, 0),))
    a = _split(args, kwargs, ("pattern", "offset", "channel_multiplier"), True)
    steps = tuple(s for s, _ in a["pattern"])
    return ops.iota(a["dst"], a.get("offset", 0), a.get("channel_multiplier", 0), steps)


# ---- TensorE ------------------------------------------------------------------------------------------

def nc_matmul(*args, **kwargs):
    """``stationary[K, M].T @ moving[K, N]`` on TensorE into an fp32 PSUM tile ``[M, N]``."""
    new = _is_new(args, kwargs, 2)
    a = _split(args, kwargs, ("stationary", "moving"), new)
    # is_*_onezero: a hint that an operand holds only 0/1 (no effect on values or on the cost
    # model); is_transpose: TensorE's transpose mode (ops.matmul)
    tr = bool(a.get("is_transpose"))
    perf = a.get("perf_mode")
    if perf is not None and getattr(perf, "value", perf) not in ("none", None):
        raise NotImplementedError("nisa.nc_matmul(perf_mode=...) is not modelled by the NKI front end yet")
    st, mv = ops.materialize(a["stationary"]), ops.materialize(a["moving"])
    st, mv = ops.apply_mask(a.get("mask"), st, mv)
    if new:
        return ops.matmul(a["dst"], st, mv, a.get("accumulate"), transpose=tr)
    return ops.PendingMatmul(st, mv, transpose=tr)


def nc_matmul_mx(*args, **kwargs):
    """MX matmul (NeuronCore-v4): ``dst[M, N] (+)= sum over K = (partition, x4 value) of
    stationary * its scale x moving * its scale``; x4 data (``nl.float8_*_x4``,
    ``nl.float4_e2m1fn_x4``) and uint8 / float8_e8m0fnu scales in SBUF, dst fp32 or bf16 PSUM."""
    a = _split(args, kwargs, ("stationary", "moving", "stationary_scale", "moving_scale"), True)
    pos, size = a.get("tile_position"), a.get("tile_size")
    if pos not in (None, (0, 0), [0, 0]) or size not in (None, (128, 128), [128, 128]):
        raise NotImplementedError("nisa.nc_matmul_mx(tile_position/tile_size=...) row tiling is not modelled")
    st, mv = ops.materialize(a["stationary"]), ops.materialize(a["moving"])
    return ops.matmul_mx(a["dst"], st, mv, a["stationary_scale"], a["moving_scale"], a.get("accumulate"))


def quantize_mx(*args, **kwargs):
    """bf16/fp16 ``src`` [P, 4F] -> MXFP8 ``dst`` [P, F] (``nl.float8_*_x4``) and ``dst_scale``
    (one E8M0 scale per 8 partitions x 4 values, in the quadrant of its group), on VectorE."""
    a = _split(args, kwargs, ("src", "dst_scale"), True)
    return ops.quantize_mx(a["dst"], ops.materialize(a["src"]), a["dst_scale"])


def nc_transpose(*args, **kwargs):
    """Transpose a 2-D tile: TensorE (into PSUM, up to 128 x 128) or VectorE (32 x 32, SBUF)."""
    new = _is_new(args, kwargs, 1)
    a = _split(args, kwargs, ("data",), new)
    data = ops.materialize(a["data"])
    if new:
        return ops.transpose(a["dst"], data, a.get("engine"))
    (data,) = ops.apply_mask(a.get("mask"), data)
    return ops.transpose_tile(data, a.get("dtype"), a.get("engine"))


# ---- VectorE / ScalarE / GpSimdE -------------------------------------------------------------------------

def tensor_tensor(*args, **kwargs):
    """``dst = data1 op data2`` (VectorE; GpSimdE for integers)."""
    new = _is_new(args, kwargs, 2)
    a = _split(args, kwargs, ("data1", "data2", "op"), new)
    x, y = ops.materialize(a["data1"]), ops.materialize(a["data2"])
    op = alu_of(a["op"])
    if new:
        dst = a["dst"]
        dst, x, y = ops.apply_mask(a.get("mask"), dst, x, y)
        return ops.tensor_tensor(dst, x, y, op, a.get("engine"))
    x, y = ops.apply_mask(a.get("mask"), x, y)
    shape = ops.broadcast_shape(x.shape, y.shape)
    dt = to_dtype(a["dtype"]) if a.get("dtype") is not None else ops.promote(x.mdtype, y.mdtype)
    dst = ops.tile_like(shape, dt)
    return ops.tensor_tensor(dst, ops.expand(x, shape), ops.expand(y, shape), op, a.get("engine"))


def tensor_scalar(*args, **kwargs):
    """``dst = (data op0 operand0) op1 operand1``; operands are numbers or [P, 1] tiles."""
    new = "dst" in kwargs or (len(args) >= 2 and isinstance(args[1], NkiTensor))
    a = _split(args, kwargs, ("data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1"), new)
    op1 = alu_of(a["op1"]) if a.get("op1") is not None else None
    dst, data = _dst_and_data(a, new)
    return ops.tensor_scalar(dst, data, alu_of(a["op0"]), a["operand0"], a.get("reverse0", False),
                             op1, a.get("operand1"), a.get("reverse1", False), a.get("engine"))


def tensor_scalar_reduce(*args, **kwargs):
    """``dst = data op0 operand0`` and ``reduce_res = reduce_op(dst)`` over every free axis
    (VectorE). Emitted as a tensor_scalar then a tensor_reduce of its result, both on the
    chosen engine: NKI's values; the time counts a second pass over ``dst`` where the machine
    reduces in the same pass (``runtime_sim``'s tensor_scalar has no reduce output). Only
    ``reduce_cmd=reset_reduce`` (the default) is modelled."""
    new = "dst" in kwargs or (len(args) >= 2 and isinstance(args[1], NkiTensor))
    a = _split(args, kwargs, ("data", "op0", "operand0", "reduce_op", "reduce_res"), new)
    cmd = a.get("reduce_cmd")
    if cmd is not None and getattr(cmd, "name", cmd) != "reset_reduce":
        raise NotImplementedError(f"nisa.tensor_scalar_reduce(reduce_cmd={cmd}) is not modelled "
                                  f"(only reduce_cmd.reset_reduce)")
    dst, data = _dst_and_data(a, new)
    ops.tensor_scalar(dst, data, alu_of(a["op0"]), a["operand0"], a.get("reverse0", False),
                      engine=a.get("engine"))
    res = a.get("reduce_res")
    if res is not None:
        ops.tensor_reduce(res, alu_of(a["reduce_op"]), dst, tuple(range(1, dst.ndim)) or 1,
                          a.get("reduce_res_negate", False))
    return dst


def activation(*args, **kwargs):
    """``dst = op(data * scale + bias)`` on ScalarE; with ``reduce_res`` the rows are also
    reduced (``reduce_op``, default add) into it."""
    new = "dst" in kwargs or (bool(args) and isinstance(args[0], NkiTensor))
    a = _split(args, kwargs, ("op", "data", "bias", "scale", "reduce_op", "reduce_res"), new)
    func = act_of(a["op"])
    dst, data = _dst_and_data(a, new)
    rop = alu_of(a["reduce_op"]) if a.get("reduce_op") is not None else None
    ops.activation(dst, func, data, a.get("bias"), a.get("scale", 1.0), rop, a.get("reduce_res"))
    return dst


def activation_reduce(*args, **kwargs):
    return activation(*args, **kwargs)


def tensor_reduce(*args, **kwargs):
    """Reduce ``data`` over its innermost free ``axis`` with ``op`` (VectorE)."""
    new = "dst" in kwargs or (bool(args) and isinstance(args[0], NkiTensor))
    a = _split(args, kwargs, ("op", "data", "axis"), new)
    data = ops.materialize(a["data"])
    op = alu_of(a["op"])
    if new:
        return ops.tensor_reduce(a["dst"], op, data, a["axis"], a.get("negate", False))
    (data,) = ops.apply_mask(a.get("mask"), data)
    r = ops.reduce(op, data, a["axis"], a.get("dtype"), a.get("keepdims", False), negate=a.get("negate", False))
    return r


def _stats(args, kwargs, cols: int, emit):
    new = _is_new(args, kwargs, 1)
    a = _split(args, kwargs, ("data",), new)
    data = ops.materialize(a["data"])
    if new:
        dst, data = ops.apply_mask(a.get("mask"), a["dst"], data)
    else:
        (data,) = ops.apply_mask(a.get("mask"), data)
        dt = to_dtype(a["dtype"]) if a.get("dtype") is not None else data.mdtype
        dst = ops.tile_like((data.shape[0], cols), dt, emit.__name__)
    return emit(dst, data)


def bn_stats(*args, **kwargs):
    """Mean/variance statistics of each partition on VectorE: 6 values per partition, (count,
    mean, variance * count) of the even then the odd elements (at most
    ``nl.tile_size.bn_stats_fmax`` = 512 elements per partition); feed them to ``bn_aggr``."""
    return _stats(args, kwargs, 6, ops.bn_stats)


def bn_aggr(*args, **kwargs):
    """(mean, variance) of each partition [P, 2] from one or more ``bn_stats`` outputs side by
    side in ``data`` [P, 6k] (VectorE)."""
    return _stats(args, kwargs, 2, ops.bn_aggr)


def tensor_tensor_scan(*args, **kwargs):
    """``y[i] = (data0[i] op0 y[i-1]) op1 data1[i]`` along each partition's free axis, from
    ``initial`` (a number or a [P, 1] tile), on VectorE."""
    new = _is_new(args, kwargs, 2)
    a = _split(args, kwargs, ("data0", "data1", "initial", "op0", "op1"), new)
    d0, d1 = ops.materialize(a["data0"]), ops.materialize(a["data1"])
    if a.get("reverse0") or a.get("reverse1"):
        raise NotImplementedError("nisa.tensor_tensor_scan(reverse0/reverse1=True) is not modelled")
    if new:
        dst = a["dst"]
    else:
        d0, d1 = ops.apply_mask(a.get("mask"), d0, d1)
        dt = to_dtype(a["dtype"]) if a.get("dtype") is not None else ops.promote(d0.mdtype, d1.mdtype)
        dst = ops.tile_like(d0.shape, dt)
    return ops.tensor_tensor_scan(dst, d0, d1, a["initial"], alu_of(a["op0"]), alu_of(a["op1"]))


def reciprocal(*args, **kwargs):
    new = _is_new(args, kwargs, 1)
    a = _split(args, kwargs, ("data",), new)
    data = ops.materialize(a["data"])
    dst = a["dst"] if new else _result(data.shape, to_dtype(a["dtype"]) if a.get("dtype") is not None else None, data)
    return ops.activation(dst, ActFunc.RECIPROCAL, data)


_ = DType
