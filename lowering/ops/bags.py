"""Embedding bags: ``_embedding_bag`` / ``_embedding_bag_forward_only`` (``F.embedding_bag``).

``(weight [V, D], indices [L], offsets [B (+1)], scale_grad_by_freq, mode, sparse,
per_sample_weights, include_last_offset, padding_idx)`` -> ``output [B, D]`` (sum, mean or max
of each bag's rows; an empty bag gives zeros). Bag ``b`` holds the lookups ``offsets[b] <= k <
offsets[b + 1]``.

Engines and kernels:
- the bag of each lookup: ones added at ``offsets`` by indirect-DMA accumulation into an
  [L + 1] zero row, then its running count by a SCAN (VectorE), minus one (exact in fp32 below
  2**24 lookups); lookups of ``padding_idx`` go to a spare bag B;
- the rows: one indirect-DMA gather of ``weight[indices]`` (times ``per_sample_weights`` on
  VectorE, sum mode);
- sum / mean: whole rows accumulated into their bags by indirect DMA into an fp32 tensor (one
  rounding at the end, as eager), the lookups per bag counted the same way for the mean; max:
  the dense compare-and-reduce of ``scatter_reduce`` (``indexing.emit_scatter_reduce``).

Only the output is lowered: the auxiliary outputs (offset2bag, bag_size, max_indices, which the
backward reads and whose eager values depend on the CPU kernel's path) fall back when used.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, ScanKAttrs, ScanOp, TensorRef, const, load
from lowering.lower_ctx import LowerCtx
from lowering.ops.indexing import (GATHER_DTYPES, WRAP_LIMIT, emit_copy, emit_gather, emit_scatter,
                                   emit_scatter_reduce, expand_to, node_dtype, scatter_into)
from lowering.registry_table import INDEX_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
F32 = DType.FP32
MODES = {0: "sum", 1: "mean", 2: "amax"}


def _arg(node: fx.Node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _check_embedding_bag(node: fx.Node) -> str | None:
    """1-d int32/int64 indices and offsets, float weight; modes sum, mean, max; only the output
    is used (the auxiliary outputs the backward reads fall back); at most 2**24 lookups."""
    for i, name in ((1, "indices"), (2, "offsets")):
        dt = node_dtype(node.args[i])
        if dt not in INDEX_DTYPES:
            return f"{name} must be int32 or int64, got {dt}"
    w = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.dtype.is_floating_point:
        return f"weight must be a 2-d float tensor, got {getattr(w, 'shape', w)}"
    ind = node.args[1].meta.get("val")
    if ind.dim() != 1:
        return f"indices of rank {ind.dim()} (1-d with offsets only)"
    if isinstance(ind.shape[0], int) and ind.shape[0] >= WRAP_LIMIT:
        return f"{ind.shape[0]} lookups >= 2**24 (their bags are counted in fp32)"
    mode = _arg(node, 4, "mode", 0)
    if mode not in MODES:
        return f"mode={mode!r} (only 0 sum, 1 mean, 2 max)"
    if _arg(node, 3, "scale_grad_by_freq", False):
        return "scale_grad_by_freq=True is not supported"
    if _arg(node, 6, "per_sample_weights", None) is not None and mode != 0:
        return "per_sample_weights with mode != sum"
    if any(not (u.target is operator.getitem and u.args[1] == 0) for u in node.users):
        return "the auxiliary outputs (offset2bag, bag_size, max_indices) are used (training)"
    return None


@register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default,
          dtypes=GATHER_DTYPES, check=_check_embedding_bag)
def embedding_bag(ctx: LowerCtx, node: fx.Node, weight: TensorRef, indices: TensorRef,
                  offsets: TensorRef, scale_grad_by_freq: bool = False, mode: int = 0,
                  sparse: bool = False, per_sample_weights: TensorRef | None = None,
                  include_last_offset: bool = False, padding_idx: int = -1):
    V, D = weight.shape
    L = indices.numel
    B = offsets.numel - (1 if include_last_offset else 0)
    out_val = ctx.out_val[0]
    if L == 0 or B <= 0:
        zeros = ctx.new_tensor(tuple(out_val.shape), weight.dtype, hint="eb")
        if zeros.numel:
            emit_copy(ctx, zeros, 0.0)
        return (zeros,) + (None,) * 3
    if B + 1 >= WRAP_LIMIT:
        raise Unsupported(ctx.op, f"{B} bags >= 2**24 (bag numbers are computed in fp32)")
    # bag of each lookup: ones at the offsets, a running count, minus one
    marks = ctx.new_tensor((L + 1,), F32, hint="eb")
    emit_copy(ctx, marks, 0.0)
    offs = TensorRef(offsets.buffer, offsets.dtype, (B,), offsets.strides, offsets.offset)
    scatter_into(ctx, marks, 0, offs, 1.0, True)
    count = ctx.new_tensor((L + 1,), F32, hint="eb")
    ctx.emit(KOp(KKind.SCAN, (count,), (marks,), ScanKAttrs(0, ScanOp.SUM)))
    bag = ctx.new_tensor((L,), DType.INT32, hint="eb")
    c = Expr(EOp.SUB, (load(0, F32), const(1.0)), F32)
    if padding_idx is not None and padding_idx >= 0:
        pad = Expr(EOp.EQ, (Expr(EOp.CAST, (load(1, indices.dtype),), F32), const(float(padding_idx))), F32)
        c = Expr(EOp.WHERE, (pad, const(float(B)), c), F32)
    ctx.emit(KOp(KKind.POINTWISE, (bag,), (TensorRef(count.buffer, F32, (L,), (1,), 0), indices),
                 PointwiseAttrs(Expr(EOp.CAST, (c,), DType.INT32))))
    table = TensorRef(weight.buffer, weight.dtype, (L, V, D), (0,) + weight.strides, weight.offset)
    rows = emit_gather(ctx, table, indices, (L, D))
    if per_sample_weights is not None:
        scaled = ctx.new_tensor((L, D), weight.dtype, hint="eb")
        psw = expand_to(TensorRef(per_sample_weights.buffer, per_sample_weights.dtype, (L, 1),
                                (per_sample_weights.strides[0], 0), per_sample_weights.offset), (L, D))
        ctx.emit(KOp(KKind.POINTWISE, (scaled,), (rows, psw), PointwiseAttrs(Expr(EOp.CAST, (Expr(
            EOp.MUL, (load(0, rows.dtype), load(1, psw.dtype)), F32),), weight.dtype))))
        rows = scaled
    if MODES[int(mode)] == "amax":
        base = ctx.new_tensor((B + 1, D), weight.dtype, hint="eb")   # row B: the padding lookups
        emit_copy(ctx, base, 0.0)
        index = TensorRef(bag.buffer, DType.INT32, (L, D), (1, 0), 0)
        red = emit_scatter_reduce(ctx, base, 0, index, rows, "amax", False)
        return (TensorRef(red.buffer, red.dtype, (B, D), (D, 1), 0),) + (None,) * 3
    # sum / mean: whole rows accumulated into their bag by indirect DMA, in fp32 (eager
    # accumulates in fp32 and rounds once)
    acc = ctx.new_tensor((B + 1, D), F32, hint="eb")
    emit_copy(ctx, acc, 0.0)
    emit_scatter(ctx, TensorRef(acc.buffer, F32, (L, B + 1, D), (0, D, 1), 0), bag, rows, True)
    ins, e = (acc,), load(0, F32)
    if MODES[int(mode)] == "mean":
        cnt = ctx.new_tensor((B + 1, 1), F32, hint="eb")
        emit_copy(ctx, cnt, 0.0)
        one = ctx.new_tensor((1, 1), F32, hint="eb")
        emit_copy(ctx, one, 1.0)
        emit_scatter(ctx, TensorRef(cnt.buffer, F32, (L, B + 1, 1), (0, 1, 1), 0), bag,
                        TensorRef(one.buffer, F32, (L, 1), (0, 0), 0), True)
        ins += (TensorRef(cnt.buffer, F32, (B + 1, D), (1, 0), 0),)
        c = load(1, F32)
        e = Expr(EOp.WHERE, (Expr(EOp.GT, (c, const(0.0)), F32), Expr(EOp.DIV, (e, c), F32), const(0.0)), F32)
    out = ctx.new_tensor((B, D), weight.dtype, hint="eb")
    ctx.emit(KOp(KKind.POINTWISE, (out,), tuple(TensorRef(r.buffer, r.dtype, (B, D), r.strides, 0) for r in ins),
                 PointwiseAttrs(Expr(EOp.CAST, (e,), weight.dtype))))
    return (out,) + (None,) * 3
