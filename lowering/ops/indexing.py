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
from lowering.kir import GatherKAttrs, KKind, KOp, TensorRef
from lowering.registry import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register

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
