"""Indexing ATen ops -> GATHER kernels (rows or elements of a table looked up by an index).

- ``aten.embedding.default(weight [V, D], indices, padding_idx, scale_grad_by_freq, sparse)``:
  a row gather, ``out[I, :] = weight[indices[I], :]`` for indices of any shape. ``padding_idx``,
  ``scale_grad_by_freq`` and ``sparse`` only change the backward, so the forward ignores them.
- ``aten.gather.default(x, dim, index, sparse_grad)``: an element gather,
  ``out[I] = x[I with I[dim] := index[I]]``; the other axes of ``x`` walk in lock-step with the
  index (``index.size(d) <= x.size(d)`` for ``d != dim``, as torch requires).
- ``aten.index_select.default(x, dim, index)``: ``out[A, k, B] = x[A, index[k], B]``, a gather
  of the blocks ``x[A, i, :]`` whose lookups are ``(A, k)`` (the index broadcast over ``A``).

Engine: DMA only -- index tiles loaded by DMA, one indirect DMA (``dma_gather``) per tile of up
to 128 lookups, the rows stored by DMA (``tiling/gather.py``); any index shape, any row length
(column chunks), any table dtype (bytes are copied exactly).

Integers: the index may come straight from a graph input (token ids): it is only used as DMA
addresses, never computed with on an engine, so no fp32 rounding can touch it (unlike the
elementwise rules, which refuse integer graph inputs; ``elementwise.int_inputs_generated_on_device``).
A lookup outside ``[0, V)`` is a machine BoundsError in functional mode (eager raises an
IndexError), never a silent read of another row.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.frontend import LowerCtx
from lowering.kir import (EOp, Expr, GatherKAttrs, KKind, KOp, PointwiseAttrs, ScatterKAttrs, TensorRef,
                          const, contiguous_strides, load, view_as)
from lowering.ops.elementwise import _torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
# tables may hold any type the machine copies (bytes); indices are int32/int64
GATHER_DTYPES = FLOAT_DTYPES | INDEX_DTYPES | MASK_DTYPES


def _dtype_of(arg: object) -> torch.dtype | None:
    v = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return v.dtype if isinstance(v, torch.Tensor) else None


def _check_embedding(node: fx.Node) -> str | None:
    w = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return f"weight must be a 2-d tensor [num_embeddings, embedding_dim], got {getattr(w, 'shape', w)}"
    idt = _dtype_of(node.args[1])
    if idt not in INDEX_DTYPES:
        return f"indices must be int32 or int64, got {idt}"
    return None


def _check_gather(node: fx.Node) -> str | None:
    """gather(x, dim, index) and index_select(x, dim, index): the index is argument 2."""
    idt = _dtype_of(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    return None


def _gather_kernel(ctx: LowerCtx, table: TensorRef, index: TensorRef, out_shape: tuple[int, ...]) -> TensorRef:
    out = ctx.new_tensor(out_shape, table.dtype, hint="g")
    ctx.emit(KOp(KKind.GATHER, (out,), (table, index), GatherKAttrs(index.rank, table.shape[index.rank])))
    return out


@register(aten.embedding.default, dtypes=GATHER_DTYPES, check=_check_embedding)
def embedding(ctx: LowerCtx, node: fx.Node, weight: TensorRef, indices: TensorRef,
              padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> TensorRef:
    V, D = weight.shape
    lead = indices.shape
    table = TensorRef(weight.buffer, weight.dtype, lead + (V, D), (0,) * len(lead) + weight.strides,
                      weight.offset)
    return _gather_kernel(ctx, table, indices, lead + (D,))


@register(aten.gather.default, dtypes=GATHER_DTYPES, check=_check_gather)
def gather(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef,
           sparse_grad: bool = False) -> TensorRef:
    if x.rank == 0:                       # a 0-d input gathers like a 1-element vector
        x = TensorRef(x.buffer, x.dtype, (1,), (1,), x.offset)
    rank = x.rank
    d = dim % rank
    shape = tuple(ctx.out_val.shape)
    if index.rank == 0:
        index = TensorRef(index.buffer, index.dtype, (1,), (1,), index.offset)
    lock = tuple(0 if a == d else x.strides[a] for a in range(rank))
    table = TensorRef(x.buffer, x.dtype, index.shape + (x.shape[d],), lock + (x.strides[d],), x.offset)
    out = _gather_kernel(ctx, table, index, index.shape)
    if out.shape != shape:                # 0-d result
        out = TensorRef(out.buffer, out.dtype, shape, (), out.offset)
    return out


@register(aten.index_select.default, dtypes=GATHER_DTYPES, check=_check_gather)
def index_select(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef) -> TensorRef:
    if x.rank == 0:
        x = TensorRef(x.buffer, x.dtype, (1,), (1,), x.offset)
    d = dim % x.rank
    k = index.numel
    lead, rest = x.shape[:d], x.shape[d + 1:]
    ist = index.strides[0] if index.rank == 1 else 1
    idx = TensorRef(index.buffer, index.dtype, lead + (k,), (0,) * d + (ist,), index.offset)
    table = TensorRef(x.buffer, x.dtype, lead + (k, x.shape[d]) + rest,
                      x.strides[:d] + (0, x.strides[d]) + x.strides[d + 1:], x.offset)
    out = _gather_kernel(ctx, table, idx, lead + (k,) + rest)
    shape = tuple(ctx.out_val.shape)
    if out.shape != shape:                # 0-d input
        out = TensorRef(out.buffer, out.dtype, shape, (1,) * len(shape), out.offset)
    return out


# ---- advanced indexing and scatters ---------------------------------------------------------
# Scatters are a copy (or fill) of the result followed by a SCATTER kernel that updates it in
# place by indirect DMA (``tiling/scatter.py``); the slice/select scatters are two copy kernels.
WRAP_LIMIT = 2 ** 24      # bound below which a negative index can be wrapped exactly in fp32


def _one_index(node: fx.Node) -> str | None:
    """One integer index tensor (int32/int64) in the index list, the other entries None: an
    index that may be negative is wrapped on VectorE (exact: the dim is < 2**24); several index
    tensors and bool masks (data-dependent shapes) fall back."""
    idx = node.args[1]
    tensors = [i for i in idx if i is not None]
    if len(tensors) != 1:
        return f"{len(tensors)} index tensors (only one, the others None, is supported)"
    dt = _dtype_of(tensors[0])
    if dt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {dt}"
    x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    d = next(k for k, i in enumerate(idx) if i is not None)
    if isinstance(x, torch.Tensor) and isinstance(x.shape[d], int) and x.shape[d] >= WRAP_LIMIT:
        return f"indexed dim of size {x.shape[d]} >= 2**24 (negative indices wrap through fp32)"
    return None


def _wrapped(ctx: LowerCtx, index: TensorRef, bound: int) -> TensorRef:
    """``index + bound`` where negative (Python/torch indexing), as a new int32 tensor. Exact:
    the engines compute through fp32, and every value that can be in range is below 2**24;
    values out of range stay out of range, so the DMA still reports them."""
    out = ctx.new_tensor(index.shape, DType.INT32, hint="ix")
    x = Expr(EOp.CAST, (load(0, index.dtype),), DType.FP32)
    w = Expr(EOp.WHERE, (Expr(EOp.LT, (x, const(0.0))), Expr(EOp.ADD, (x, const(float(bound)))), x))
    ctx.emit(KOp(KKind.POINTWISE, (out,), (index,), PointwiseAttrs(Expr(EOp.CAST, (w,), DType.INT32))))
    return out


def _index_layout(ref: TensorRef, d: int, index: TensorRef):
    """For a lookup space ``A + I`` (A = ref's axes before ``d``, I = the index's shape): the
    index broadcast over A, and ``ref`` as the ``(A + I, V, R)`` table view."""
    lead, rest = ref.shape[:d], ref.shape[d + 1:]
    idx = TensorRef(index.buffer, index.dtype, lead + index.shape, (0,) * d + index.strides, index.offset)
    table = TensorRef(ref.buffer, ref.dtype, lead + index.shape + (ref.shape[d],) + rest,
                      ref.strides[:d] + (0,) * index.rank + (ref.strides[d],) + ref.strides[d + 1:],
                      ref.offset)
    return idx, table


@register(aten.index.Tensor, dtypes=GATHER_DTYPES, check=_one_index)
def index_tensor(ctx: LowerCtx, node: fx.Node, x: TensorRef, indices) -> TensorRef:
    d = next(k for k, i in enumerate(indices) if i is not None)
    index = _wrapped(ctx, indices[d], x.shape[d])
    idx, table = _index_layout(x, d, index)
    out = _gather_kernel(ctx, table, idx, idx.shape + x.shape[d + 1:])
    shape = tuple(ctx.out_val.shape)
    if out.shape != shape:
        out = TensorRef(out.buffer, out.dtype, shape, contiguous_strides(shape), out.offset)
    return out


def _copy_into(ctx: LowerCtx, dst: TensorRef, src: TensorRef | float) -> None:
    """A POINTWISE copy (or fill) kernel writing the view ``dst``."""
    if isinstance(src, TensorRef):
        expr = Expr(EOp.CAST, (load(0, src.dtype),), dst.dtype)
        ctx.emit(KOp(KKind.POINTWISE, (dst,), (src,), PointwiseAttrs(expr)))
    else:
        ctx.emit(KOp(KKind.POINTWISE, (dst,), (), PointwiseAttrs(Expr(EOp.CAST, (const(src),), dst.dtype))))


def _expand(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    return apply_view(ref, _torch_dtype_of(ref), lambda t: t.expand(shape))


def _scatter_kernel(ctx: LowerCtx, table: TensorRef, index: TensorRef, data: TensorRef,
                    accumulate: bool) -> None:
    if data.dtype != table.dtype:        # DMA copies bytes: bring the data to the table's type
        c = ctx.new_tensor(data.shape, table.dtype, hint="sv")
        _copy_into(ctx, c, data)
        data = c
    ctx.emit(KOp(KKind.SCATTER, (table,), (data, index),
                 ScatterKAttrs(index.rank, table.shape[index.rank], accumulate)))


def _accumulate_float(node: fx.Node, accumulate: bool) -> str | None:
    v = node.meta.get("val")
    if accumulate and isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"accumulate into {v.dtype}: the DMA engine adds in fp32 (float tensors only)"
    return None


def _check_index_put(node: fx.Node) -> str | None:
    """One integer index tensor (as index.Tensor); accumulate=True into float tensors only
    (the DMA's read-modify-write adds in fp32 and rounds per lookup); without accumulate,
    duplicate indices keep the last value in index order."""
    acc = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    return _one_index(node) or _accumulate_float(node, bool(acc))


@register(aten.index_put.default, dtypes=GATHER_DTYPES, check=_check_index_put)
def index_put(ctx: LowerCtx, node: fx.Node, x: TensorRef, indices, values: TensorRef,
              accumulate: bool = False) -> TensorRef:
    d = next(k for k, i in enumerate(indices) if i is not None)
    out = ctx.new_tensor(x.shape, x.dtype, hint="ip")
    _copy_into(ctx, out, x)
    index = _wrapped(ctx, indices[d], x.shape[d])
    idx, table = _index_layout(out, d, index)
    if idx.numel == 0:
        return out
    data = _expand(values, idx.shape + x.shape[d + 1:])
    _scatter_kernel(ctx, table, idx, data, bool(accumulate))
    return out


def _check_scatter(node: fx.Node) -> str | None:
    """Element scatter (one indirect-DMA lookup per index element); index int32/int64 in
    ``[0, size)`` (torch rejects negative ones too); scatter_add into float tensors only."""
    idt = _dtype_of(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    if node.kwargs.get("reduce") is not None:
        return f"reduce={node.kwargs['reduce']!r} is not supported"
    return _accumulate_float(node, node.target is aten.scatter_add.default)


def _element_scatter(ctx: LowerCtx, x: TensorRef, dim: int, index: TensorRef,
                     src: TensorRef | float, accumulate: bool) -> TensorRef:
    out = ctx.new_tensor(x.shape, x.dtype, hint="sc")
    _copy_into(ctx, out, x)
    if index.numel == 0:
        return out
    if out.rank == 0:
        out = TensorRef(out.buffer, out.dtype, (1,), (1,), out.offset)
    if index.rank == 0:
        index = TensorRef(index.buffer, index.dtype, (1,), (1,), index.offset)
    d = dim % out.rank
    lock = tuple(0 if a == d else out.strides[a] for a in range(out.rank))
    table = TensorRef(out.buffer, out.dtype, index.shape + (out.shape[d],), lock + (out.strides[d],),
                      out.offset)
    if isinstance(src, TensorRef):
        if src.rank == 0:
            src = TensorRef(src.buffer, src.dtype, (1,), (1,), src.offset)
        data = TensorRef(src.buffer, src.dtype, index.shape, src.strides, src.offset)
    else:                                  # a scalar: one element, read with stride 0
        one = ctx.new_tensor((1,), x.dtype, hint="sv")
        _copy_into(ctx, one, float(src))
        data = TensorRef(one.buffer, one.dtype, index.shape, (0,) * index.rank, 0)
    _scatter_kernel(ctx, table, index, data, accumulate)
    return TensorRef(out.buffer, out.dtype, x.shape, contiguous_strides(x.shape), 0)


@register(aten.scatter.src, aten.scatter.value, dtypes=GATHER_DTYPES, check=_check_scatter)
def scatter(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef, src) -> TensorRef:
    return _element_scatter(ctx, x, dim, index, src, False)


@register(aten.scatter_add.default, dtypes=GATHER_DTYPES, check=_check_scatter)
def scatter_add(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef,
                src: TensorRef) -> TensorRef:
    return _element_scatter(ctx, x, dim, index, src, True)


def _view_scatter(ctx: LowerCtx, x: TensorRef, src: TensorRef, view) -> TensorRef:
    out = ctx.new_tensor(x.shape, x.dtype, hint="vs")
    _copy_into(ctx, out, x)
    part = apply_view(out, _torch_dtype_of(out), view)
    if part.numel:
        _copy_into(ctx, part, _expand(src, part.shape))
    return out


@register(aten.slice_scatter.default, dtypes=GATHER_DTYPES)
def slice_scatter(ctx: LowerCtx, node: fx.Node, x: TensorRef, src: TensorRef, dim: int = 0,
                  start=None, end=None, step: int = 1) -> TensorRef:
    """Two copy kernels (DMA through SBUF): ``x`` into the result, then ``src`` into its slice."""
    d = dim % max(1, x.rank)
    sl = slice(start, end, step)
    return _view_scatter(ctx, x, src, lambda t: t[(slice(None),) * d + (sl,)])


@register(aten.select_scatter.default, dtypes=GATHER_DTYPES)
def select_scatter(ctx: LowerCtx, node: fx.Node, x: TensorRef, src: TensorRef, dim: int,
                   index: int) -> TensorRef:
    """Two copy kernels: ``x`` into the result, then ``src`` into its ``select(dim, index)``."""
    return _view_scatter(ctx, x, src, lambda t: t.select(dim, index))


def _check_embedding_backward(node: fx.Node) -> str | None:
    """Rows of grad accumulated by indirect DMA (fp32 adds, rounded per lookup) into a zero
    fill, then the padding row zeroed; scale_grad_by_freq=True falls back."""
    if len(node.args) > 4 and node.args[4]:
        return "scale_grad_by_freq=True is not supported"
    idt = _dtype_of(node.args[1])
    if idt not in INDEX_DTYPES:
        return f"indices must be int32 or int64, got {idt}"
    return None


@register(aten.embedding_dense_backward.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES,
          check=_check_embedding_backward)
def embedding_dense_backward(ctx: LowerCtx, node: fx.Node, grad: TensorRef, indices: TensorRef,
                             num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> TensorRef:
    D = grad.shape[-1]
    out = ctx.new_tensor((int(num_weights), D), grad.dtype, hint="eb")
    _copy_into(ctx, out, 0.0)
    lead = indices.shape
    if indices.numel:
        table = TensorRef(out.buffer, out.dtype, lead + (int(num_weights), D),
                          (0,) * len(lead) + out.strides, 0)
        data = view_as(grad, lead + (D,)) or view_as(_contiguous(ctx, grad), lead + (D,))
        _scatter_kernel(ctx, table, indices, data, True)
    if 0 <= padding_idx < num_weights:
        _copy_into(ctx, TensorRef(out.buffer, out.dtype, (1, D), out.strides, padding_idx * D), 0.0)
    return out


def _contiguous(ctx: LowerCtx, ref: TensorRef) -> TensorRef:
    c = ctx.new_tensor(ref.shape, ref.dtype, hint="c")
    _copy_into(ctx, c, ref)
    return c
