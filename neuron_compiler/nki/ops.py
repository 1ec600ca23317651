"""The instructions behind the NKI API: one function per machine operation, shared by both API
generations (``language.py``: ``nl.*``; ``isa.py``: ``nisa.*`` old and new style).

Each function takes views (``tensor.NkiTensor``), constants and enums, writes its destination
view, and returns it. Engine choices follow the NKI documentation: DMA for load/store/dma_copy,
TensorE for matmul and transposes of up to 128 x 128, VectorE for tensor_tensor /
tensor_scalar / reductions / copies / memset / scans (GpSimdE when every operand is an integer,
"When all input/output tiles are int32 or uint32, the operation defaults to GpSimd Engine",
nki.isa.tensor_tensor), ScalarE for activation functions. ``engine=`` overrides where NKI lets it.

Broadcasting: a size-1 free axis broadcasts by a stride-0 access pattern (no instruction); a
per-partition column ``[P, 1]`` against ``[P, F]`` becomes a ``tensor_scalar`` with the column as
its operand (as NKI kernels write it); a one-partition row ``[1, F]`` against ``[P, F]`` is
copied to P partitions by a K=1 TensorE matmul against ones (``broadcast_partitions``), the way
the tutorial Mamba kernels are timed in runtime_sim/calibration.

PSUM accumulation: ``matmul(accumulate=None)`` accumulates onto a destination a matmul wrote
and nothing has read since (NKI: "first write overwrites, subsequent writes accumulate"); ``+=``
of a matmul onto a PSUM view accumulates onto earlier matmul results, overwrites a tile
``nl.zeros`` made, and otherwise adds through a temporary (VectorE).
"""
from __future__ import annotations

import numpy as np

from runtime_sim.isa import (GPSIMD, SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp,
                             ALU_INT_DTYPES, BnAggrNkiAttrs, MatmulMxAttrs, QuantizeMxAttrs, BnStatsNkiAttrs, DmaAttrs, DType, EngineKind, MatmulAttrs, Memory,
                             MemsetAttrs, Op, Queue, TensorCopyAttrs, TensorReduceAttrs,
                             TensorScalarAttrs, TensorTensorAttrs, TensorTensorScanAttrs,
                             TransposeAttrs, IotaAttrs)

from .index import Mask
from .tensor import NkiTensor, par_dim, to_dtype
from .tracer import current

ENGINES = {"vector": VECTOR, "gpsimd": GPSIMD, "scalar": SCALAR, "activation": SCALAR,
           "tensor": TENSOR, "pe": TENSOR, "pool": GPSIMD, "act": SCALAR, "dve": VECTOR}


def engine_queue(engine, default: Queue) -> Queue:
    """``engine=nisa.engine.vector`` (or a name) -> its queue; unknown/None -> ``default``."""
    name = getattr(engine, "name", engine)
    if name is None or str(name).lower() in ("unknown", "none"):
        return default
    return ENGINES.get(str(name).lower(), default)


# ---- tiles --------------------------------------------------------------------------------------

def new_tile(shape, dtype, memory: Memory = Memory.SBUF, name: str = "", place=None,
             how: str = "") -> NkiTensor:
    """A new on-chip tile; the partition dimension is the ``nl.par_dim`` one, else the first.
    ``place``: an allocation function (placement.py; ``how`` names it in errors)."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    pdim = next((i for i, s in enumerate(shape) if isinstance(s, par_dim)), 0)
    dims = tuple(int(s) for s in shape) or (1,)
    if place is not None:
        return current().placed(memory, dims, to_dtype(dtype), pdim, name, place, how).view()
    return current().onchip(memory, dims, to_dtype(dtype), pdim, name).view()


def tile_like(shape, dtype, name: str = "") -> NkiTensor:
    return new_tile(tuple(shape) if shape else (1,), dtype, Memory.SBUF, name)


def promote(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.itemsize != b.itemsize:
        return a if a.itemsize > b.itemsize else b
    return DType.FP32 if a.is_float else a


def column(v: NkiTensor) -> bool:
    """Is ``v`` a per-partition scalar ([P] or [P, 1, ...])?"""
    return all(n == 1 for s, n, isp, _ in v.axes if not isp)


# ---- masks and shapes ---------------------------------------------------------------------------

def apply_mask(mask: Mask | None, *views):
    """Every view restricted by ``mask`` (index.py): axes driven by a masked arange are clipped,
    and an unindexed operand is clipped at the same positions (same size)."""
    if mask is None:
        return views
    clips: dict[int, tuple[int, int, int]] = {}
    out = []
    for v in views:
        if not isinstance(v, NkiTensor):
            out.append(v)
            continue
        for k, (s, n, isp, ids) in enumerate(v.axes):
            b = mask.of(ids)
            if b is not None:
                clips[k] = (n, b[0], b[1])
        out.append(v)
    res = []
    for v in out:
        if isinstance(v, NkiTensor):
            for k, (n, lo, hi) in clips.items():
                if k < v.ndim and v.axes[k][1] == n:
                    v = v.clip(k, lo, hi)
        res.append(v)
    return tuple(res)


def expand(v: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    """``v`` broadcast to ``shape`` along free axes (stride 0); a one-partition row goes to
    ``shape[0]`` partitions through ``broadcast_partitions``."""
    if v.shape == shape:
        return v
    axes = list(v.axes)
    while len(axes) < len(shape):           # [P] against [P, F]: NKI's 1-D tiles are columns
        axes.append((0, 1, False, frozenset()))
    if len(axes) != len(shape):
        raise ValueError(f"cannot broadcast {v.shape} to {shape}")
    if axes[0][2] and axes[0][1] == 1 and shape[0] > 1 and v.memory is not Memory.HBM:
        return expand(broadcast_partitions(v, shape[0]), shape)
    out = []
    for (s, n, isp, ids), m in zip(axes, shape):
        if n == m:
            out.append((s, n, isp, ids))
        elif n == 1 and not isp:
            out.append((0, m, False, ids))
        else:
            raise ValueError(f"cannot broadcast {v.shape} to {shape}")
    return v._with(axes=tuple(out))


def broadcast_shape(*shapes) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    padded = [tuple(s) + (1,) * (nd - len(s)) for s in shapes]
    out = []
    for dims in zip(*padded):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(big.pop() if big else 1)
    return tuple(out)


# ---- data movement ------------------------------------------------------------------------------

def dma(dst: NkiTensor, src: NkiTensor) -> NkiTensor:
    """``dst <- src`` by DMA. NKI's dma_copy casts ("The DMA engines automatically handle data
    type conversion", nki.isa.dma_copy); the machine's DMA does not (runtime_sim), so a cast is
    a VectorE tensor_copy through an SBUF tile on the on-chip side."""
    t = current()
    if dst.mdtype is not src.mdtype:
        if src.memory is not Memory.HBM:
            return dma(dst, tensor_copy(tile_like(src.shape, dst.mdtype), src))
        if dst.memory is not Memory.HBM:
            return tensor_copy(dst, dma(tile_like(dst.shape, src.mdtype), src))
    t.emit(t.dma_queue_for(dst, src), Op.DMA_COPY, dst, (src,), DmaAttrs())
    return dst


def load(src: NkiTensor, dtype=None, mask: Mask | None = None) -> NkiTensor:
    full = src
    (src,) = apply_mask(mask, src)
    shape = src.shape or (1,)
    tile = tile_like(shape, src.mdtype, name="load")
    if src.ndim and full.ndim == src.ndim and src.shape[0] < full.shape[0]:
        tile.storage.nominal = (full.shape[0], next((lo for i, lo, hi in src.clips
                                                     if i in full.axes[0][3]), 0))
    dma(tile, src)
    if dtype is not None and to_dtype(dtype) is not src.mdtype:
        return tensor_copy(tile_like(shape, dtype), tile)
    return tile


def store(dst: NkiTensor, value, mask: Mask | None = None) -> NkiTensor:
    value = materialize(value)
    dst, value = apply_mask(mask, dst, value)
    if not isinstance(value, NkiTensor):
        raise TypeError(f"nl.store value must be a tile, got {type(value).__name__}")
    if value.memory is Memory.PSUM or value.mdtype is not dst.mdtype:
        value = tensor_copy(tile_like(value.shape, dst.mdtype), value)   # DMA neither casts nor reads PSUM
    return dma(dst, value)


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine=None) -> NkiTensor:
    t = current()
    src = _fit(src, dst)
    t.emit(engine_queue(engine, VECTOR), Op.TENSOR_COPY, dst, (src,), TensorCopyAttrs())
    _psum_written(dst, matmul=False)
    _psum_read(src)
    return dst


def memset(dst: NkiTensor, value: float, engine=None) -> NkiTensor:
    t = current()
    t.emit(engine_queue(engine, VECTOR), Op.MEMSET, dst, (), MemsetAttrs(float(value)))
    _psum_written(dst, matmul=False)
    if float(value) == 0.0:
        dst.storage.zeroed = True
    return dst


def iota(dst: NkiTensor, base: int, partition_step: int, steps: tuple[int, ...]) -> NkiTensor:
    current().emit(GPSIMD, Op.IOTA, dst, (), IotaAttrs(int(base), int(partition_step), tuple(int(s) for s in steps)))
    return dst


def _fit(src: NkiTensor, dst: NkiTensor) -> NkiTensor:
    """``src`` against ``dst``: broadcast when the shapes differ but broadcast."""
    if src.shape == dst.shape or int(np.prod(src.shape)) == int(np.prod(dst.shape)) and src.partitions == dst.partitions:
        return src
    return expand(src, dst.shape)


# ---- compute --------------------------------------------------------------------------------------

def _int_all(*vs) -> bool:
    return all(v.mdtype in ALU_INT_DTYPES for v in vs if isinstance(v, NkiTensor))


def tensor_tensor(dst: NkiTensor, a: NkiTensor, b: NkiTensor, op: AluOp, engine=None) -> NkiTensor:
    t = current()
    default = GPSIMD if _int_all(dst, a, b) else VECTOR
    t.emit(engine_queue(engine, default), Op.TENSOR_TENSOR, dst, (_fit(a, dst), _fit(b, dst)), TensorTensorAttrs(op))
    _psum_written(dst, matmul=False)
    _psum_read(a, b)
    return dst


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: AluOp, operand0, reverse0: bool = False,
                  op1: AluOp | None = None, operand1=None, reverse1: bool = False, engine=None) -> NkiTensor:
    """``dst = (data op0 operand0) op1 operand1``; an operand is a number or a [P, 1] tile."""
    t = current()
    srcs = [_fit(data, dst)]
    kw: dict = {"op0": op0, "reverse0": bool(reverse0)}
    for k, (o, opnd) in enumerate(((op0, operand0), (op1, operand1))):
        if o is None:
            continue
        if isinstance(opnd, NkiTensor):
            kw[f"operand{k}_from_src"] = True
            srcs.append(_col_ap(materialize(opnd), dst.partitions))
        elif opnd is not None:
            kw[f"operand{k}"] = float(opnd)
    if op1 is not None:
        kw["op1"], kw["reverse1"] = op1, bool(reverse1)
    default = GPSIMD if _int_all(dst, data) and not any(isinstance(x, float) for x in (operand0, operand1)) else VECTOR
    t.emit(engine_queue(engine, default), Op.TENSOR_SCALAR, dst, tuple(srcs), TensorScalarAttrs(**kw))
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def _col_ap(v: NkiTensor, parts: int) -> NkiTensor:
    """A per-partition operand as a [P, 1] view (a [1, 1] one broadcast to P partitions)."""
    if not column(v):
        raise ValueError(f"expected a per-partition scalar tile [{parts}, 1], got shape {v.shape}")
    if v.partitions == 1 and parts > 1:
        v = broadcast_partitions(v, parts)
    return v


def activation(dst: NkiTensor, func: ActFunc, data: NkiTensor, bias=None, scale=1.0,
               reduce_op: AluOp | None = None, reduce_res: NkiTensor | None = None) -> NkiTensor:
    t = current()
    srcs = [_fit(data, dst)]
    kw: dict = {"func": func}
    if isinstance(bias, NkiTensor):
        kw["bias_from_src"] = True
        srcs.append(_col_ap(materialize(bias), dst.partitions))
    elif bias is not None:
        kw["bias"] = float(bias)
    if isinstance(scale, NkiTensor):
        kw["scale_from_src"] = True
        srcs.append(_col_ap(materialize(scale), dst.partitions))
    else:
        kw["scale"] = float(scale)
    if reduce_res is not None:
        kw["reduce"] = reduce_op or AluOp.ADD
    t.emit(SCALAR, Op.ACTIVATION, dst, tuple(srcs), ActivationAttrs(**kw), accum=reduce_res)
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def bn_stats(dst: NkiTensor, data: NkiTensor) -> NkiTensor:
    """NKI's bn_stats on VectorE: dst [P, 6] = (count, mean, variance * count) of the even, then
    the odd free elements of ``data`` (at most 512 per partition)."""
    current().emit(VECTOR, Op.BN_STATS, dst, (data,), BnStatsNkiAttrs())
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def bn_aggr(dst: NkiTensor, data: NkiTensor) -> NkiTensor:
    """NKI's bn_aggr on VectorE: (mean, variance) [P, 2] of the bn_stats triples in ``data``."""
    current().emit(VECTOR, Op.BN_AGGR, dst, (data,), BnAggrNkiAttrs())
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def tensor_reduce(dst: NkiTensor, op: AluOp, data: NkiTensor, axis, negate: bool = False) -> NkiTensor:
    """Reduce ``data`` over ``axis`` (the trailing free axes) into ``dst``."""
    t = current()
    axes = sorted({a % data.ndim for a in (axis if isinstance(axis, (list, tuple)) else (axis,))})
    if not axes or axes[0] == 0 and data.axes[0][2]:
        raise ValueError(f"reduce over axis {axis} of {data.shape}: the partition axis (0) cannot "
                         f"be reduced by tensor_reduce (reduce across partitions with a matmul or "
                         f"a transpose)")
    if axes != list(range(data.ndim - len(axes), data.ndim)):   # reduced free axes last
        keep = [a for k, a in enumerate(data.axes) if k not in axes]
        data = data._with(axes=tuple(keep) + tuple(data.axes[k] for k in axes))
    src = _unmerged(data)
    t.emit(VECTOR, Op.TENSOR_REDUCE, dst, (src,), TensorReduceAttrs(op, len(axes), bool(negate)))
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def _unmerged(v: NkiTensor) -> NkiTensor:
    """``v`` whose access pattern keeps one dim per free axis (reductions count dims)."""
    return _Unmerged(v.storage, v.offset, v.pstart, v.axes, v.box, checks=v.checks, clips=v.clips)


class _Unmerged(NkiTensor):
    def ap(self):
        from runtime_sim.isa import AP
        base = NkiTensor.ap(self)
        free = [(s, n) for s, n, isp, _ in self.axes if not isp]
        return AP(base.buffer, base.memory, base.partition_start, base.partitions, base.byte_offset,
                  tuple(free) or ((1, 1),), base.dtype)


def tensor_tensor_scan(dst: NkiTensor, d0: NkiTensor, d1: NkiTensor, initial, op0: AluOp, op1: AluOp) -> NkiTensor:
    t = current()
    srcs = [_fit(d0, dst), _fit(d1, dst)]
    kw: dict = {"op0": op0, "op1": op1}
    if isinstance(initial, NkiTensor):
        kw["initial_from_src"] = True
        srcs.append(_col_ap(initial, dst.partitions))
    else:
        kw["initial"] = float(initial)
    t.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, dst, tuple(srcs), TensorTensorScanAttrs(**kw))
    _psum_written(dst, matmul=False)
    _psum_read(d0, d1)
    return dst


def transpose(dst: NkiTensor, data: NkiTensor, engine=None) -> NkiTensor:
    t = current()
    q = engine_queue(engine, TENSOR if dst.memory is Memory.PSUM else VECTOR)
    t.emit(q, Op.TRANSPOSE, dst, (data,), TransposeAttrs())
    _psum_written(dst, matmul=False)
    _psum_read(data)
    return dst


def transpose_tile(data: NkiTensor, dtype=None, engine=None) -> NkiTensor:
    """A new tile holding ``data.T`` (TensorE into PSUM; VectorE 32 x 32 into SBUF)."""
    data = materialize(data)
    p, f = data.shape[0], int(np.prod(data.shape[1:])) if data.ndim > 1 else 1
    q = engine_queue(engine, TENSOR)
    mem = Memory.PSUM if q is TENSOR else Memory.SBUF
    dt = to_dtype(dtype) if dtype is not None else data.mdtype
    if data.memory is not Memory.SBUF:     # TensorE reads SBUF: evacuate first
        data = tensor_copy(tile_like(data.shape, data.mdtype), data)
    return transpose(new_tile((f, p), dt, mem, "transpose"), data, engine)


def matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, accumulate=None,
           transpose: bool = False) -> NkiTensor:
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on TensorE (module docstring for
    ``accumulate=None``). ``transpose`` (``nc_matmul(is_transpose=True)``): TensorE's transpose
    mode, ``dst = stationary.T`` bit-accurate (NaN/Inf kept), from NeuronCore-v3 on (trn2+): a
    TensorE TRANSPOSE (``moving``, the identity, is not read); on NeuronCore-v2 (trn1) the mode
    does not exist and the instruction is the plain matmul with the identity (NKI docs)."""
    st = dst.storage
    if transpose and current().target.neuron_core != "NeuronCore-v2":
        if accumulate:
            raise ValueError(f"nc_matmul(is_transpose=True) into {dst!r}: transpose mode "
                             f"overwrites its destination; accumulate=True is not allowed")
        current().emit(TENSOR, Op.TRANSPOSE, dst, (stationary,), TransposeAttrs())
        _psum_written(dst, matmul=False)
        return dst
    key = dst.key()
    acc = (key in st.mm_open) if accumulate is None else bool(accumulate)
    current().emit(TENSOR, Op.MATMUL, dst, (stationary, moving), MatmulAttrs(accumulate=acc))
    st.mm_open.add(key)
    st.mm_written.add(key)
    st.zeroed = False
    return dst


def matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, st_scale: NkiTensor,
              mv_scale: NkiTensor, accumulate=None) -> NkiTensor:
    """NKI ``nc_matmul_mx`` (NeuronCore-v4): the MX matmul on TensorE (runtime_sim
    ``MatmulMxAttrs``: x4 data, E8M0 scales in their quadrants); ``accumulate`` as ``matmul``."""
    st = dst.storage
    key = dst.key()
    acc = (key in st.mm_open) if accumulate is None else bool(accumulate)
    current().emit(TENSOR, Op.MATMUL, dst, (stationary, moving, st_scale, mv_scale),
                   MatmulMxAttrs(accumulate=acc))
    st.mm_open.add(key)
    st.mm_written.add(key)
    st.zeroed = False
    return dst


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor) -> NkiTensor:
    """NKI ``quantize_mx`` (NeuronCore-v4, VectorE): bf16/fp16 ``src`` [P, 4F] -> MXFP8 x4
    ``dst`` [P, F] and its E8M0 scales (runtime_sim ``QuantizeMxAttrs``)."""
    current().emit(VECTOR, Op.QUANTIZE_MX, dst, (src,), QuantizeMxAttrs(), accum=dst_scale)
    _psum_read(src)
    return dst


def _overlap_box(a, b) -> bool:
    return all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b))


def _psum_written(dst: NkiTensor, matmul: bool) -> None:
    st = dst.storage
    if st.memory is Memory.PSUM and not matmul:
        st.mm_open.clear()
        st.mm_written.clear()
        st.zeroed = False


def _psum_read(*views) -> None:
    for v in views:
        if isinstance(v, NkiTensor) and v.memory is Memory.PSUM:
            v.storage.mm_open.clear()


def broadcast_partitions(row: NkiTensor, parts: int) -> NkiTensor:
    """``row`` (one partition, float) copied to ``parts`` partitions: a K=1 matmul against a
    ones row into PSUM per bank of the result (copied to SBUF when it spans several banks)."""
    row = materialize(row)
    if row.memory is not Memory.SBUF:
        row = tensor_copy(tile_like(row.shape, row.mdtype), row)
    if not row.mdtype.is_float:
        raise ValueError(f"broadcasting an integer row {row.shape} across partitions is not supported")
    f = int(np.prod(row.shape[1:])) if row.ndim > 1 else 1
    flat = row.reshape((1, f)) if row.ndim != 2 else row
    ones = memset(new_tile((1, parts), row.mdtype, Memory.SBUF, "ones"), 1.0)
    bank = current().target.psum_bank_bytes // 4
    if f <= bank:
        out = new_tile((parts, f), DType.FP32, Memory.PSUM, "bcast")
        matmul(out, ones, flat, accumulate=False)
    else:
        out = new_tile((parts, f), row.mdtype, Memory.SBUF, "bcast")
        for c0 in range(0, f, bank):
            n = min(bank, f - c0)
            ps = new_tile((parts, n), DType.FP32, Memory.PSUM, "bcast")
            matmul(ps, ones, flat[:, c0:c0 + n], accumulate=False)
            tensor_copy(out[:, c0:c0 + n], ps)
    return out.reshape((parts,) + tuple(row.shape[1:])) if row.ndim > 2 else out


def broadcast_to(v: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    return expand(materialize(v), shape)


# ---- element-wise with new results ----------------------------------------------------------------

def binary(op: AluOp, x, y, dtype=None, mask: Mask | None = None, out_dtype: DType | None = None) -> NkiTensor:
    """``x op y`` for tiles and numbers into a new SBUF tile (module docstring: broadcasting)."""
    x, y = materialize(x), materialize(y)
    x, y = apply_mask(mask, x, y)
    if not isinstance(x, NkiTensor) and not isinstance(y, NkiTensor):
        raise TypeError("an nl element-wise op needs at least one tile")
    if not isinstance(x, NkiTensor) or not isinstance(y, NkiTensor):
        tile, num, rev = (x, y, False) if isinstance(x, NkiTensor) else (y, x, True)
        dt = to_dtype(dtype) if dtype is not None else (out_dtype or tile.mdtype)
        dst = tile_like(tile.shape, dt)
        return tensor_scalar(dst, tile, op, float(num), reverse0=rev)
    x, y = _align_masked(x, y)
    shape = broadcast_shape(x.shape, y.shape)
    dt = to_dtype(dtype) if dtype is not None else (out_dtype or promote(x.mdtype, y.mdtype))
    dst = tile_like(shape, dt)
    if column(y) and not column(x) and y.partitions == x.partitions:
        return tensor_scalar(dst, x, op, y)
    if column(x) and not column(y) and y.partitions == x.partitions:
        return tensor_scalar(dst, y, op, x, reverse0=True)
    return tensor_tensor(dst, expand(x, shape), expand(y, shape), op)


def _align_masked(x: NkiTensor, y: NkiTensor):
    """A tile cut by a mask (``Storage.nominal``: a masked load keeps only the rows inside
    the mask) against a whole tile of the partitions it stands for: NKI computes on every
    partition and the masked rows are garbage the kernel never stores; here the whole tile is
    cut to the kept rows instead."""
    for a, b, swap in ((x, y, False), (y, x, True)):
        nom = a.storage.nominal
        if (nom and a.ndim and b.ndim and a.axes[0][2] and b.axes[0][2] and a.shape[0] > 1
                and b.shape[0] == nom[0] and a.shape[0] < nom[0]):
            b = b.clip(0, nom[1], nom[1] + a.shape[0])
            return (b, a) if swap else (a, b)
    return x, y


def unary(func: ActFunc, x, dtype=None, mask: Mask | None = None) -> NkiTensor:
    (x,) = apply_mask(mask, materialize(x))
    dst = tile_like(x.shape, to_dtype(dtype) if dtype is not None else x.mdtype)
    return activation(dst, func, x)


def reduce(op: AluOp, x, axis, dtype=None, keepdims: bool = False, mask: Mask | None = None,
           negate: bool = False) -> NkiTensor:
    (x,) = apply_mask(mask, materialize(x))
    axes = {a % x.ndim for a in (axis if isinstance(axis, (list, tuple)) else (axis,))}
    shape = tuple(1 if k in axes else n for k, n in enumerate(x.shape)) if keepdims else \
        tuple(n for k, n in enumerate(x.shape) if k not in axes)
    dst = tile_like(shape or (1,), to_dtype(dtype) if dtype is not None else x.mdtype)
    return tensor_reduce(dst, op, x, sorted(axes), negate)


# ---- assignment -----------------------------------------------------------------------------------

class PendingMatmul:
    """``nl.matmul`` / old ``nisa.nc_matmul`` result before it lands: ``psum += m`` accumulates
    it in place; any other use writes it to a new fp32 PSUM tile first (``materialize``)."""

    def __init__(self, stationary: NkiTensor, moving: NkiTensor, transpose: bool = False) -> None:
        self.stationary, self.moving, self.transpose = stationary, moving, transpose
        m = int(np.prod(stationary.shape[1:])) if stationary.ndim > 1 else 1
        n = int(np.prod(moving.shape[1:])) if moving.ndim > 1 else 1
        self.shape = (m, n)
        self.dtype = np.dtype(np.float32)
        self._tile: NkiTensor | None = None

    def materialize(self) -> NkiTensor:
        if self._tile is None:
            self._tile = matmul(new_tile(self.shape, DType.FP32, Memory.PSUM, "matmul"),
                                self.stationary, self.moving, accumulate=False,
                                transpose=self.transpose)
        return self._tile

    def __getattr__(self, name):
        return getattr(self.materialize(), name)


def _fwd(name):
    def f(self, *a):
        return getattr(self.materialize(), name)(*a)
    return f


for _n in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
           "__rtruediv__", "__neg__", "__getitem__", "__gt__", "__lt__", "__ge__", "__le__"):
    setattr(PendingMatmul, _n, _fwd(_n))


def materialize(x):
    return x.materialize() if isinstance(x, PendingMatmul) else x


def assign(dst: NkiTensor, value) -> None:
    """``dst[...] = value``: a matmul lands (overwrite), a tile is copied (DMA when HBM is on
    either side), a number is a memset."""
    if isinstance(value, PendingMatmul):
        if value._tile is None and dst.memory is Memory.PSUM:
            matmul(dst, value.stationary, value.moving, accumulate=False, transpose=value.transpose)
            return
        value = value.materialize()
    if isinstance(value, NkiTensor):
        if value.key() == dst.key():
            return                          # ``t[k] += x`` writes back the view it updated
        if Memory.HBM in (dst.memory, value.memory):
            dma(dst, value if value.memory is not Memory.PSUM else tensor_copy(tile_like(value.shape, value.mdtype), value))
        else:
            tensor_copy(_cut_dst(dst, value), value)
        return
    memset(dst, float(value))


def _cut_dst(dst: NkiTensor, value: NkiTensor) -> NkiTensor:
    """A tile a mask cut (``Storage.nominal``) assigned to a whole tile of the partitions it
    stands for: only its rows are written, and the destination tile remembers which
    (``Storage.valid``: reads of it through a full index grid see those rows)."""
    nom = value.storage.nominal
    st = dst.storage
    if (nom and value.ndim and dst.ndim and value.axes[0][2] and dst.axes[0][2] and dst.pstart == 0
            and dst.shape[0] == nom[0] == st.shape[st.pdim] and value.shape[0] < nom[0]
            and st.valid in (None, (nom[1], value.shape[0]))):
        st.valid = (nom[1], value.shape[0])
        return dst.clip(0, nom[1], nom[1] + value.shape[0])
    return dst


# the in-place operators' names (``a += b``: ``update(a, b, "add")``, operators.py)
ALU_BY_NAME = {"add": AluOp.ADD, "subtract": AluOp.SUBTRACT, "multiply": AluOp.MULTIPLY,
               "divide": AluOp.DIVIDE}


def update(dst: NkiTensor, value, op: str) -> None:
    """``dst op= value`` in place (module docstring for matmuls into PSUM)."""
    alu = ALU_BY_NAME[op]
    if (isinstance(value, PendingMatmul) and value._tile is None and dst.memory is Memory.PSUM
            and alu is AluOp.ADD and not value.transpose):
        st = dst.storage
        if dst.key() in st.mm_written or st.zeroed:
            matmul(dst, value.stationary, value.moving, accumulate=not st.zeroed)
            return
        box = dst.footprint()[1]
        fresh = (st.placement.block_of(dst) not in st.placement.written
                 if st.placement is not None else
                 not any(_overlap_box(box, b) for b in st.written_boxes))
        if fresh:                           # nothing to add to: the matmul starts the group
            matmul(dst, value.stationary, value.moving, accumulate=False)
            return
    value = materialize(value)
    if isinstance(value, NkiTensor):
        if column(value) and not column(dst) and value.partitions == dst.partitions:
            tensor_scalar(dst, dst, alu, value)
        else:
            tensor_tensor(dst, dst, expand(value, dst.shape) if value.shape != dst.shape else value, alu)
    else:
        tensor_scalar(dst, dst, alu, float(value))
