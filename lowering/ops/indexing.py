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
addresses, never computed with on an engine, so no fp32 rounding can touch it (arithmetic on it
before the lookup is exact too: the elementwise rules' integer ALU path, ``tiling/intgen.py``).
A lookup outside ``[0, V)`` is a machine BoundsError in functional mode (eager raises an
IndexError), never a silent read of another row.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (EOp, Expr, GatherKAttrs, KKind, KOp, PointwiseAttrs, ReduceKAttrs, ReduceOp,
                          ScanKAttrs, ScanOp, ScatterKAttrs, TensorRef, const, contiguous_strides, load,
                          view_as)
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
# tables may hold any type the machine copies (bytes); indices are int32/int64
GATHER_DTYPES = FLOAT_DTYPES | INDEX_DTYPES | MASK_DTYPES


def node_dtype(arg: object) -> torch.dtype | None:
    v = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return v.dtype if isinstance(v, torch.Tensor) else None


def _check_embedding(node: fx.Node) -> str | None:
    w = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return f"weight must be a 2-d tensor [num_embeddings, embedding_dim], got {getattr(w, 'shape', w)}"
    idt = node_dtype(node.args[1])
    if idt not in INDEX_DTYPES:
        return f"indices must be int32 or int64, got {idt}"
    return None


def _check_gather(node: fx.Node) -> str | None:
    """gather(x, dim, index) and index_select(x, dim, index): the index is argument 2."""
    idt = node_dtype(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    return None


def emit_gather(ctx: LowerCtx, table: TensorRef, index: TensorRef, out_shape: tuple[int, ...]) -> TensorRef:
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
    return emit_gather(ctx, table, indices, lead + (D,))


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
    out = emit_gather(ctx, table, index, index.shape)
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
    out = emit_gather(ctx, table, idx, lead + (k,) + rest)
    shape = tuple(ctx.out_val.shape)
    if out.shape != shape:                # 0-d input
        out = TensorRef(out.buffer, out.dtype, shape, (1,) * len(shape), out.offset)
    return out


# ---- advanced indexing and scatters ---------------------------------------------------------
# Scatters are a copy (or fill) of the result followed by a SCATTER kernel that updates it in
# place by indirect DMA (``tiling/scatter.py``); the slice/select scatters are two copy kernels.
WRAP_LIMIT = 2 ** 24      # bound below which a negative index can be wrapped exactly in fp32


def _one_index(node: fx.Node) -> str | None:
    """Integer index tensors (int32/int64) at adjacent positions of the index list, the other
    entries None: they broadcast together and address the merged dims as one (the flat position
    computed on VectorE, exact in fp32: the merged dims hold < 2**24 elements; an index out of
    its own dim makes the whole lookup out of range, so the DMA still reports it); negative
    indices wrap. Index tensors separated by None and bool masks (data-dependent shapes) fall
    back."""
    idx = node.args[1]
    pos = [k for k, i in enumerate(idx) if i is not None]
    for k in pos:
        dt = node_dtype(idx[k])
        if dt in (torch.bool, torch.uint8):
            return (f"a {dt} mask index selects a data-dependent number of elements (the result's "
                    "shape is only known at run time)")
        if dt not in INDEX_DTYPES:
            return f"index must be int32 or int64, got {dt}"
    if not pos:
        return "no index tensor"
    if pos != list(range(pos[0], pos[-1] + 1)):
        return f"index tensors at positions {pos} are not adjacent (the result's dims move first)"
    x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(x, torch.Tensor) and all(isinstance(x.shape[k], int) for k in pos):
        n = math.prod(x.shape[k] for k in pos)
        if n >= WRAP_LIMIT:
            return f"indexed dims of {n} elements >= 2**24 (positions are computed in fp32)"
    return None


def _flat_index(ctx: LowerCtx, indices, sizes: tuple[int, ...]) -> TensorRef:
    """One int32 index into ``sizes`` merged row-major from the index tensors ``indices`` (each
    wrapped if negative, broadcast together); a lookup with any index outside its dim becomes
    -1 (out of range for the DMA)."""
    if len(indices) == 1:
        return _wrapped(ctx, indices[0], sizes[0])
    shape = tuple(torch.broadcast_shapes(*(i.shape for i in indices)))
    F = DType.FP32
    flat, ok = const(0.0), None
    for k, (ix, n) in enumerate(zip(indices, sizes)):
        v = Expr(EOp.CAST, (load(k, ix.dtype),), F)
        w = Expr(EOp.WHERE, (Expr(EOp.LT, (v, const(0.0)), F), Expr(EOp.ADD, (v, const(float(n))), F), v), F)
        inside = Expr(EOp.AND, (Expr(EOp.GE, (w, const(0.0)), F), Expr(EOp.LT, (w, const(float(n))), F)), F)
        ok = inside if ok is None else Expr(EOp.AND, (ok, inside), F)
        flat = Expr(EOp.ADD, (Expr(EOp.MUL, (flat, const(float(n))), F), w), F)
    out = ctx.new_tensor(shape, DType.INT32, hint="ix")
    ctx.emit(KOp(KKind.POINTWISE, (out,), tuple(expand_to(i, shape) for i in indices), PointwiseAttrs(
        Expr(EOp.CAST, (Expr(EOp.WHERE, (ok, flat, const(-1.0)), F),), DType.INT32))))
    return out


def _merged(ctx: LowerCtx, x: TensorRef, indices) -> tuple[TensorRef, int, TensorRef]:
    """``(x with the indexed dims merged into one, that dim, the flat index)``."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    d, e = pos[0], pos[-1] + 1
    sizes = x.shape[d:e]
    shape = x.shape[:d] + (math.prod(sizes),) + x.shape[e:]
    if len(pos) > 1:
        x = view_as(x, shape) or view_as(_contiguous(ctx, x), shape)
    return x, d, _flat_index(ctx, [indices[k] for k in pos], sizes)


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
    x, d, index = _merged(ctx, x, indices)
    idx, table = _index_layout(x, d, index)
    out = emit_gather(ctx, table, idx, idx.shape + x.shape[d + 1:])
    shape = tuple(ctx.out_val.shape)
    if out.shape != shape:
        out = TensorRef(out.buffer, out.dtype, shape, contiguous_strides(shape), out.offset)
    return out


def emit_copy(ctx: LowerCtx, dst: TensorRef, src: TensorRef | float) -> None:
    """A POINTWISE copy (or fill) kernel writing the view ``dst``."""
    if isinstance(src, TensorRef):
        expr = Expr(EOp.CAST, (load(0, src.dtype),), dst.dtype)
        ctx.emit(KOp(KKind.POINTWISE, (dst,), (src,), PointwiseAttrs(expr)))
    else:
        ctx.emit(KOp(KKind.POINTWISE, (dst,), (), PointwiseAttrs(Expr(EOp.CAST, (const(src),), dst.dtype))))


def expand_to(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    return apply_view(ref, torch_dtype_of(ref), lambda t: t.expand(shape))


def emit_scatter(ctx: LowerCtx, table: TensorRef, index: TensorRef, data: TensorRef,
                    accumulate: bool) -> None:
    if data.dtype != table.dtype:        # DMA copies bytes: bring the data to the table's type
        c = ctx.new_tensor(data.shape, table.dtype, hint="sv")
        emit_copy(ctx, c, data)
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
    duplicate indices keep the last value in index order. Or one bool mask (``x[mask] = v``):
    a select on the engines, float/bool tensors; values broadcast over the selected
    positions, or one row per true element when the mask indexes the leading dims (the rows
    found by a running count of the mask: a SCAN, then a row gather)."""
    acc = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    masks = [i for i in node.args[1] if i is not None and node_dtype(i) in (torch.bool, torch.uint8)]
    if masks:
        return _check_mask_put(node, bool(acc))
    return _one_index(node) or _accumulate_float(node, bool(acc))


def _check_mask_put(node: fx.Node, acc: bool) -> str | None:
    idx = node.args[1]
    tensors = [i for i in idx if i is not None]
    if len(tensors) != 1:
        return f"{len(tensors)} index tensors with a bool mask (only the mask alone is supported)"
    if node_dtype(tensors[0]) is not torch.bool:
        return f"mask must be bool, got {node_dtype(tensors[0])}"
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and v.dtype not in FLOAT_DTYPES | MASK_DTYPES:
        return f"{v.dtype} tensor: a masked put selects through fp32 (float/bool tensors only)"
    if acc and isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"accumulate into {v.dtype} (float tensors only)"
    return _mask_limit(tensors[0])


def _mask_limit(mask: object) -> str | None:
    m = mask.meta.get("val") if isinstance(mask, fx.Node) else None
    if isinstance(m, torch.Tensor) and all(isinstance(s, int) for s in m.shape) \
            and m.numel() >= WRAP_LIMIT:
        return f"mask of {m.numel()} elements >= 2**24 (its running count is kept in fp32)"
    return None


def _mask_positions(ctx: LowerCtx, mask: TensorRef, shape: tuple[int, ...]) -> tuple[TensorRef, TensorRef]:
    """``(m, pos)`` over ``shape`` (the mask broadcast to it): ``m`` the fp32 0/1 mask, ``pos``
    (int32) the number of true elements before each true element in row-major order (0 where
    false): m by a POINTWISE kernel, its running count by a SCAN (VectorE tensor_tensor_scan,
    exact in fp32 below 2**24 elements), pos by a POINTWISE kernel."""
    F = DType.FP32
    L = math.prod(shape)
    m = ctx.new_tensor(shape, F, hint="mk")
    ctx.emit(KOp(KKind.POINTWISE, (m,), (expand_to(mask, shape),), PointwiseAttrs(
        Expr(EOp.NE, (load(0, mask.dtype), const(0.0)), F))))
    c = ctx.new_tensor((L,), F, hint="mk")
    ctx.emit(KOp(KKind.SCAN, (c,), (TensorRef(m.buffer, F, (L,), (1,), 0),), ScanKAttrs(0, ScanOp.SUM)))
    pos = ctx.new_tensor(shape, DType.INT32, hint="mk")
    cv = TensorRef(c.buffer, F, shape, contiguous_strides(shape), 0)
    mv = load(0, F)
    ctx.emit(KOp(KKind.POINTWISE, (pos,), (m, cv), PointwiseAttrs(Expr(EOp.CAST, (Expr(
        EOp.WHERE, (Expr(EOp.GT, (mv, const(0.0)), F), Expr(EOp.SUB, (load(1, F), const(1.0)), F),
                    const(0.0)), F),), DType.INT32))))
    return m, pos


def _masked_select_into(ctx: LowerCtx, x: TensorRef, m: TensorRef, vals: TensorRef,
                        accumulate: bool) -> TensorRef:
    """``where(m, vals, x)`` (``x + where(m, vals, 0)`` with ``accumulate``), one POINTWISE
    kernel over ``x``'s shape (``m`` and ``vals`` views of it)."""
    F = DType.FP32
    out = ctx.new_tensor(x.shape, x.dtype, hint="mp")
    xs, hit, v = load(0, x.dtype), Expr(EOp.NE, (load(1, m.dtype), const(0.0)), F), load(2, vals.dtype)
    e = (Expr(EOp.ADD, (xs, Expr(EOp.WHERE, (hit, v, const(0.0)), F)), F) if accumulate
         else Expr(EOp.WHERE, (hit, v, xs), F))
    ctx.emit(KOp(KKind.POINTWISE, (out,), (x, m, vals), PointwiseAttrs(Expr(EOp.CAST, (e,), x.dtype))))
    return out


def _mask_put(ctx: LowerCtx, x: TensorRef, p: int, mask: TensorRef, values: TensorRef,
              accumulate: bool) -> TensorRef:
    mr = mask.rank
    lead, rest = x.shape[:p], x.shape[p + mr:]
    tgt = len(lead) + 1 + len(rest)
    if values.rank > tgt:
        raise Unsupported(ctx.op, f"values of rank {values.rank} for a selection of rank {tgt}")
    pad = (1,) * (tgt - values.rank) + values.shape
    mshape = (1,) * p + mask.shape + (1,) * len(rest)
    mask_b = expand_to(apply_view(mask, torch.bool, lambda t: t.view(mshape)), x.shape)
    vt = apply_view(values, torch_dtype_of(values), lambda t: t.view(pad))
    if pad[p] == 1:                       # the same values at every selected position
        vb = apply_view(vt, torch_dtype_of(vt), lambda t: t.view(pad[:p] + (1,) * mr + pad[p + 1:]))
        return _masked_select_into(ctx, x, mask_b, expand_to(vb, x.shape), accumulate)
    if p != 0:
        raise Unsupported(ctx.op, f"a mask at index position {p} with one row of values per "
                          "true element (only a mask over the leading dims)")
    _, pos = _mask_positions(ctx, mask, mask.shape)
    rows = expand_to(vt, (pad[0],) + rest)
    table = TensorRef(rows.buffer, rows.dtype, mask.shape + rows.shape, (0,) * mr + rows.strides,
                      rows.offset)
    g = emit_gather(ctx, table, pos, mask.shape + rest)
    return _masked_select_into(ctx, x, mask_b, g, accumulate)


@register(aten.index_put.default, dtypes=GATHER_DTYPES, check=_check_index_put)
def index_put(ctx: LowerCtx, node: fx.Node, x: TensorRef, indices, values: TensorRef,
              accumulate: bool = False) -> TensorRef:
    d = next(k for k, i in enumerate(indices) if i is not None)
    if indices[d].dtype is DType.BOOL:
        return _mask_put(ctx, x, d, indices[d], values, bool(accumulate))
    out = ctx.new_tensor(x.shape, x.dtype, hint="ip")
    emit_copy(ctx, out, x)
    merged, d, index = _merged(ctx, out, indices)
    idx, table = _index_layout(merged, d, index)
    if idx.numel == 0:
        return out
    data = expand_to(values, idx.shape + merged.shape[d + 1:])
    emit_scatter(ctx, table, idx, data, bool(accumulate))
    return out


def _check_masked_scatter(node: fx.Node) -> str | None:
    """Float/bool tensors, a bool mask of fewer than 2**24 elements: the source element of each
    true position is found by a running count of the mask (SCAN on VectorE) and gathered by
    indirect DMA; a select writes the result. More true elements than source elements is a
    machine BoundsError (eager raises too)."""
    if node_dtype(node.args[1]) is not torch.bool:
        return f"mask must be bool, got {node_dtype(node.args[1])}"
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and v.dtype not in FLOAT_DTYPES | MASK_DTYPES:
        return f"{v.dtype} tensor: the select runs through fp32 (float/bool tensors only)"
    return _mask_limit(node.args[1])


@register(aten.masked_scatter.default, dtypes=GATHER_DTYPES, check=_check_masked_scatter)
def masked_scatter(ctx: LowerCtx, node: fx.Node, x: TensorRef, mask: TensorRef,
                   source: TensorRef) -> TensorRef:
    shape = tuple(ctx.out_val.shape)
    if source.numel == 0:
        raise Unsupported(ctx.op, "an empty source (nothing to gather from)")
    flat = view_as(source, (source.numel,)) or view_as(_contiguous(ctx, source), (source.numel,))
    m, pos = _mask_positions(ctx, mask, shape)
    table = TensorRef(flat.buffer, flat.dtype, shape + (flat.numel,), (0,) * len(shape) + flat.strides,
                      flat.offset)
    g = emit_gather(ctx, table, pos, shape)
    return _masked_select_into(ctx, expand_to(x, shape), m, g, False)


def _check_scatter(node: fx.Node) -> str | None:
    """Element scatter (one indirect-DMA lookup per index element); index int32/int64 in
    ``[0, size)`` (torch rejects negative ones too); scatter_add into float tensors only."""
    idt = node_dtype(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    if node.kwargs.get("reduce") is not None:
        return f"reduce={node.kwargs['reduce']!r} is not supported"
    return _accumulate_float(node, node.target is aten.scatter_add.default)


def scatter_into(ctx: LowerCtx, out: TensorRef, dim: int, index: TensorRef,
                  src: TensorRef | float, accumulate: bool) -> None:
    """``out[I with I[dim] := index[I]] (+)= src[I]`` for every lookup ``I`` of the index, by
    indirect DMA into ``out`` (already written whole by an earlier kernel)."""
    if index.numel == 0:
        return
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
        one = ctx.new_tensor((1,), out.dtype, hint="sv")
        emit_copy(ctx, one, float(src))
        data = TensorRef(one.buffer, one.dtype, index.shape, (0,) * index.rank, 0)
    emit_scatter(ctx, table, index, data, accumulate)


def _element_scatter(ctx: LowerCtx, x: TensorRef, dim: int, index: TensorRef,
                     src: TensorRef | float, accumulate: bool) -> TensorRef:
    out = ctx.new_tensor(x.shape, x.dtype, hint="sc")
    emit_copy(ctx, out, x)
    scatter_into(ctx, out, dim, index, src, accumulate)
    return out


@register(aten.scatter.src, aten.scatter.value, dtypes=GATHER_DTYPES, check=_check_scatter)
def scatter(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef, src) -> TensorRef:
    return _element_scatter(ctx, x, dim, index, src, False)


@register(aten.scatter_add.default, dtypes=GATHER_DTYPES, check=_check_scatter)
def scatter_add(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef,
                src: TensorRef) -> TensorRef:
    """Indirect-DMA accumulation into an fp32 copy of ``x`` (eager's scatter_add accumulates in
    fp32 and rounds once), then one rounding to ``x``'s dtype."""
    return emit_scatter_reduce(ctx, x, dim, index, src, "sum", True)


# ---- scatter_reduce ------------------------------------------------------------------------------
# sum / mean: indirect-DMA accumulation (as scatter_add). prod / amax / amin: no DMA engine
# multiplies or compares while writing, so the reduction is dense on the engines: a POINTWISE
# kernel builds T[..., v, k, ...] = src[..., k, ...] where index[..., k, ...] == v (else the
# identity) over every target position v of the indexed dim, and a REDUCE over k combines them
# (VectorE). Every variant also counts the lookups per target by indirect-DMA accumulation of
# ones: the count decides include_self=False and the mean, and the DMA checks every index
# against the dim (an out-of-range index is a machine BoundsError, as eager raises).
SCATTER_REDUCE_OPS = ("sum", "prod", "mean", "amax", "amin")
DENSE_LIMIT = 1 << 22          # elements of the dense [..., V, K, ...] tensor of prod/amax/amin
_DENSE = {"prod": (ReduceOp.PROD, EOp.MUL, 1.0), "amax": (ReduceOp.MAX, EOp.MAX, -math.inf),
          "amin": (ReduceOp.MIN, EOp.MIN, math.inf)}


def _check_scatter_reduce(node: fx.Node) -> str | None:
    """reduce in sum/prod/mean/amax/amin, include_self either way, float tensors, index int32/
    int64 below 2**24 targets; prod/amax/amin build a dense [index x dim] tensor on the engines
    (at most 2**22 elements, else the op falls back)."""
    idt = node_dtype(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    reduce = node.args[4] if len(node.args) > 4 else node.kwargs.get("reduce")
    if reduce not in SCATTER_REDUCE_OPS:
        return f"reduce={reduce!r} is not supported (only {', '.join(SCATTER_REDUCE_OPS)})"
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"{v.dtype} result: the reductions run in fp32 (float tensors only)"
    x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(x, torch.Tensor) and x.dim():
        size = x.shape[node.args[1] % x.dim()]
        if isinstance(size, int) and size >= WRAP_LIMIT:
            return f"indexed dim of size {size} >= 2**24 (lookups are compared in fp32)"
    return None


def _lookup_count(ctx: LowerCtx, shape: tuple[int, ...], dim: int, index: TensorRef) -> TensorRef:
    """fp32 ``count[p]`` = how many lookups of ``index`` along ``dim`` hit position ``p``."""
    cnt = ctx.new_tensor(shape, DType.FP32, hint="cnt")
    emit_copy(ctx, cnt, 0.0)
    scatter_into(ctx, cnt, dim, index, 1.0, True)
    return cnt


def _dense_reduce(ctx: LowerCtx, x: TensorRef, d: int, index: TensorRef, src: TensorRef,
                  reduce: str) -> TensorRef:
    """``R[..., v, ...]`` = reduce of ``src[..., k, ...]`` over the k with ``index[..., k, ...]
    == v`` (the identity where none): the region ``index.shape`` with dim ``d`` of size V."""
    rop, _, ident = _DENSE[reduce]
    I, V = index.shape, x.shape[d]
    K = I[d]
    tshape = I[:d] + (V, K) + I[d + 1:]
    if math.prod(tshape) > DENSE_LIMIT:
        raise Unsupported(ctx.op, f"reduce={reduce!r} builds a dense {list(tshape)} tensor of "
                          f"{math.prod(tshape)} elements (limit {DENSE_LIMIT})")
    spread = lambda r: TensorRef(r.buffer, r.dtype, tshape, r.strides[:d] + (0, r.strides[d])
                                 + r.strides[d + 1:], r.offset)
    hit = Expr(EOp.EQ, (Expr(EOp.CAST, (load(0, index.dtype),), DType.FP32),
                        Expr(EOp.INDEX, (), DType.FP32, d)), DType.FP32)
    t = ctx.new_tensor(tshape, src.dtype, hint="sr")
    ctx.emit(KOp(KKind.POINTWISE, (t,), (spread(index), spread(src)), PointwiseAttrs(
        Expr(EOp.WHERE, (hit, load(1, src.dtype), const(ident)), src.dtype))))
    rshape = I[:d] + (V,) + I[d + 1:]
    r = ctx.new_tensor(rshape, DType.FP32, hint="sr")
    keep = TensorRef(r.buffer, r.dtype, I[:d] + (V, 1) + I[d + 1:],
                     contiguous_strides(I[:d] + (V, 1) + I[d + 1:]), 0)
    ctx.emit(KOp(KKind.REDUCE, (keep,), (t,), ReduceKAttrs(rop, (d + 1,), 1.0)))
    return r


def _src_view(src, index: TensorRef) -> TensorRef:
    """``src`` restricted to the index's extents (torch reads only those)."""
    if src.rank == 0:
        src = TensorRef(src.buffer, src.dtype, (1,) * max(1, index.rank), (0,) * max(1, index.rank), src.offset)
    return TensorRef(src.buffer, src.dtype, index.shape, src.strides, src.offset)


def emit_scatter_reduce(ctx: LowerCtx, x: TensorRef, dim: int, index: TensorRef, src: TensorRef,
                        reduce: str, include_self: bool) -> TensorRef:
    out = ctx.new_tensor(x.shape, x.dtype, hint="sr")
    if index.numel == 0:
        emit_copy(ctx, out, x)
        return out
    if x.rank == 0:                      # a 0-d self scatters like a 1-element vector
        x = TensorRef(x.buffer, x.dtype, (1,), (1,), x.offset)
        out = TensorRef(out.buffer, out.dtype, (1,), (1,), out.offset)
    if index.rank == 0:
        index = TensorRef(index.buffer, index.dtype, (1,), (1,), index.offset)
    d = dim % x.rank
    src = _src_view(src, index)
    F = DType.FP32
    if reduce in ("sum", "mean"):
        # eager accumulates in fp32 and rounds once: so does the DMA, into an fp32 tensor
        counted = reduce == "mean" or not include_self
        cnt = _lookup_count(ctx, x.shape, d, index) if counted else None
        hit = Expr(EOp.GT, (load(1, F), const(0.0)), F)
        xs = load(0, x.dtype)
        base = xs if include_self else Expr(EOp.WHERE, (hit, const(0.0), xs), F)
        direct = x.dtype is F and reduce == "sum"
        acc = out if direct else ctx.new_tensor(x.shape, F, hint="sr")
        ctx.emit(KOp(KKind.POINTWISE, (acc,), (x,) + ((cnt,) if counted else ()),
                     PointwiseAttrs(Expr(EOp.CAST, (base,), F))))
        scatter_into(ctx, acc, d, index, src, True)
        if direct:
            return out
        s = load(0, F)
        if reduce == "sum":
            ctx.emit(KOp(KKind.POINTWISE, (out,), (acc,), PointwiseAttrs(Expr(EOp.CAST, (s,), x.dtype))))
            return out
        div = Expr(EOp.ADD, (load(1, F), const(1.0 if include_self else 0.0)), F)
        ctx.emit(KOp(KKind.POINTWISE, (out,), (acc, cnt), PointwiseAttrs(Expr(EOp.CAST, (Expr(
            EOp.WHERE, (Expr(EOp.GT, (div, const(0.0)), F), Expr(EOp.DIV, (s, div), F), s), F),),
            x.dtype))))
        return out
    cnt = _lookup_count(ctx, x.shape, d, index)
    xs = load(0, x.dtype)
    hit = Expr(EOp.GT, (load(1, F), const(0.0)), F)
    r = _dense_reduce(ctx, x, d, index, src, reduce)
    region = index.shape[:d] + (x.shape[d],) + index.shape[d + 1:]
    sub = lambda ref: TensorRef(ref.buffer, ref.dtype, region, ref.strides, ref.offset)
    if region != x.shape:
        emit_copy(ctx, out, x)
    comb = Expr(_DENSE[reduce][1], (xs, load(2, F)), F) if include_self else load(2, F)
    if not include_self:
        comb = Expr(EOp.WHERE, (hit, comb, xs), F)
    ctx.emit(KOp(KKind.POINTWISE, (sub(out),), (sub(x), sub(cnt), r),
                 PointwiseAttrs(Expr(EOp.CAST, (comb,), x.dtype))))
    return out


@register(aten.scatter_reduce.two, dtypes=GATHER_DTYPES, check=_check_scatter_reduce)
def scatter_reduce(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef,
                   src: TensorRef, reduce: str, *, include_self: bool = True) -> TensorRef:
    """Lookup counts by indirect-DMA accumulation; sum/mean by indirect-DMA accumulation,
    prod/amax/amin by a dense compare-and-reduce on VectorE (see above)."""
    return emit_scatter_reduce(ctx, x, dim, index, src, reduce, include_self)


def _check_scatter_legacy_reduce(node: fx.Node) -> str | None:
    """scatter(..., reduce='add' | 'multiply'): scatter_reduce sum / prod with include_self."""
    idt = node_dtype(node.args[2])
    if idt not in INDEX_DTYPES:
        return f"index must be int32 or int64, got {idt}"
    reduce = node.kwargs.get("reduce", node.args[4] if len(node.args) > 4 else None)
    if reduce not in ("add", "multiply"):
        return f"reduce={reduce!r} is not supported (only 'add', 'multiply')"
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"{v.dtype} result: the reductions run in fp32 (float tensors only)"
    return None


@register(aten.scatter.reduce, aten.scatter.value_reduce, dtypes=GATHER_DTYPES,
          check=_check_scatter_legacy_reduce)
def scatter_legacy_reduce(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, index: TensorRef,
                          src, *, reduce: str) -> TensorRef:
    """As scatter_reduce(sum | prod, include_self=True); a scalar ``value`` is a stride-0 src."""
    if not isinstance(src, TensorRef):
        one = ctx.new_tensor((1,), x.dtype, hint="sv")
        emit_copy(ctx, one, float(src))
        src = TensorRef(one.buffer, one.dtype, index.shape, (0,) * index.rank, 0)
    return emit_scatter_reduce(ctx, x, dim, index, src, "sum" if reduce == "add" else "prod", True)


def _view_scatter(ctx: LowerCtx, x: TensorRef, src: TensorRef, view) -> TensorRef:
    out = ctx.new_tensor(x.shape, x.dtype, hint="vs")
    emit_copy(ctx, out, x)
    part = apply_view(out, torch_dtype_of(out), view)
    if part.numel:
        emit_copy(ctx, part, expand_to(src, part.shape))
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
    idt = node_dtype(node.args[1])
    if idt not in INDEX_DTYPES:
        return f"indices must be int32 or int64, got {idt}"
    return None


@register(aten.embedding_dense_backward.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES,
          check=_check_embedding_backward)
def embedding_dense_backward(ctx: LowerCtx, node: fx.Node, grad: TensorRef, indices: TensorRef,
                             num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> TensorRef:
    D = grad.shape[-1]
    out = ctx.new_tensor((int(num_weights), D), grad.dtype, hint="eb")
    emit_copy(ctx, out, 0.0)
    lead = indices.shape
    if indices.numel:
        table = TensorRef(out.buffer, out.dtype, lead + (int(num_weights), D),
                          (0,) * len(lead) + out.strides, 0)
        data = view_as(grad, lead + (D,)) or view_as(_contiguous(ctx, grad), lead + (D,))
        emit_scatter(ctx, table, indices, data, True)
    if 0 <= padding_idx < num_weights:
        emit_copy(ctx, TensorRef(out.buffer, out.dtype, (1, D), out.strides, padding_idx * D), 0.0)
    return out


def _contiguous(ctx: LowerCtx, ref: TensorRef) -> TensorRef:
    c = ctx.new_tensor(ref.shape, ref.dtype, hint="c")
    emit_copy(ctx, c, ref)
    return c


# ---- col2im (fold) ----------------------------------------------------------------------------
def _check_col2im(node: fx.Node) -> str | None:
    """Float tensors; every column element is added into its output position by one
    indirect-DMA accumulation (fp32 adds, rounded per lookup), the positions computed on the
    engines from the coordinates (exact in fp32: H * W < 2**24); padding positions go to a spare
    element past each output plane."""
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"{v.dtype} result: the DMA adds in fp32 (float tensors only)"
    hw = node.args[1]
    if isinstance(hw, (list, tuple)) and all(isinstance(s, int) for s in hw) and hw[0] * hw[1] >= WRAP_LIMIT:
        return f"output plane of {hw[0] * hw[1]} elements >= 2**24"
    return None


@register(aten.col2im.default, dtypes=FLOAT_DTYPES, check=_check_col2im)
def col2im(ctx: LowerCtx, node: fx.Node, cols: TensorRef, output_size, kernel_size, dilation,
           padding, stride) -> TensorRef:
    batched = cols.rank == 3
    if not batched:
        cols = TensorRef(cols.buffer, cols.dtype, (1,) + cols.shape, (0,) + cols.strides, cols.offset)
    (H, W), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (tuple(int(a) for a in t) for t in
                                                     (output_size, kernel_size, dilation, padding, stride))
    N, CK, L = cols.shape
    KK = kh * kw
    C = CK // KK
    Lh = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    Lw = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if Lh * Lw != L:
        raise Unsupported(ctx.op, f"{L} columns for {Lh} x {Lw} blocks")
    HW = H * W
    plane = ctx.new_tensor((N, C, HW + 1), cols.dtype, hint="ci")
    emit_copy(ctx, plane, 0.0)
    F = DType.FP32
    # position of column element (ki, kj, lh, lw): h = lh*sh - ph + ki*dh, w = lw*sw - pw + kj*dw
    ki, kj = Expr(EOp.INDEX, (), F, 0), Expr(EOp.INDEX, (), F, 1)
    lh, lw = Expr(EOp.INDEX, (), F, 2), Expr(EOp.INDEX, (), F, 3)
    ax = lambda l, s, p, k, d: Expr(EOp.ADD, (Expr(EOp.MUL, (l, const(float(s))), F),
                                              Expr(EOp.MUL, (k, const(float(d))), F)), F) \
        if not p else Expr(EOp.SUB, (ax(l, s, 0, k, d), const(float(p))), F)
    h, w = ax(lh, sh, ph, ki, dh), ax(lw, sw, pw, kj, dw)
    inside = lambda v, n: Expr(EOp.AND, (Expr(EOp.GE, (v, const(0.0)), F),
                                         Expr(EOp.LT, (v, const(float(n))), F)), F)
    pos = Expr(EOp.ADD, (Expr(EOp.MUL, (h, const(float(W))), F), w), F)
    ok = Expr(EOp.AND, (inside(h, H), inside(w, W)), F)
    idx = ctx.new_tensor((kh, kw, Lh, Lw), DType.INT32, hint="ci")
    ctx.emit(KOp(KKind.POINTWISE, (idx,), (), PointwiseAttrs(Expr(EOp.CAST, (Expr(
        EOp.WHERE, (ok, pos, const(float(HW))), F),), DType.INT32))))
    lookups = (N, C, KK, L)
    index = TensorRef(idx.buffer, DType.INT32, lookups, (0, 0, L, 1), 0)
    data = TensorRef(cols.buffer, cols.dtype, lookups, (cols.strides[0], KK * cols.strides[1],
                                                        cols.strides[1], cols.strides[2]), cols.offset)
    table = TensorRef(plane.buffer, plane.dtype, lookups + (HW + 1,),
                      (C * (HW + 1), HW + 1, 0, 0, 1), 0)
    emit_scatter(ctx, table, index, data, True)
    out = TensorRef(plane.buffer, plane.dtype, (N, C, H, W), (C * (HW + 1), HW + 1, W, 1), 0)
    return out if batched else TensorRef(out.buffer, out.dtype, (C, H, W), out.strides[1:], 0)
