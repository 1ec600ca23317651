"""Reductions: sum, mean, amax, amin over any dims (keepdim or not).

Engines: VectorE ``tensor_reduce`` along the free axis with the kept elements on partitions; a sum
over leading (row) dims of a row-major tensor uses TensorE instead (ones-vector matmul reduces over
partitions and accumulates in PSUM). Tiling: any shape; see ``tiling/reduce.py``.
"""
from __future__ import annotations

import torch

from lowering.frontend import LowerCtx
from lowering.kir import KKind, KOp, ReduceKAttrs, ReduceOp, TensorRef
from lowering.ops.elementwise import _torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry import register

aten = torch.ops.aten


def _norm_dims(dims, rank: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % rank if rank else 0 for d in dims}))


def emit_reduce(ctx: LowerCtx, x: TensorRef, op: ReduceOp, dims, keepdim: bool,
                mean: bool = False, out_val=None, divisor: float | None = None) -> TensorRef:
    """Reduce ``x`` over ``dims``; ``mean`` divides by the element count (or ``divisor``).
    The output's shape/dtype come from ``out_val`` (default: the node's value)."""
    rank = x.rank
    rd = _norm_dims(dims, rank)
    kshape = tuple(1 if d in rd else s for d, s in enumerate(x.shape))
    v = ctx.out_val if out_val is None else out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    count = 1
    for d in rd:
        count *= x.shape[d] if rank else 1
    if divisor is not None:
        count = divisor
    scale = 1.0 / count if mean and count > 0 else 1.0
    if mean and count <= 0:
        scale = float("nan")
    out_keep = apply_view(out, _torch_dtype_of(out), lambda t: t.view(kshape)) if rank else out
    xin = x if rank else apply_view(x, _torch_dtype_of(x), lambda t: t.view(1))
    if not rank:
        out_keep = apply_view(out, _torch_dtype_of(out), lambda t: t.view(1))
        rd = (0,)
    ctx.emit(KOp(KKind.REDUCE, (out_keep,), (xin,), ReduceKAttrs(op, rd, scale)))
    return out


@register(aten.sum.dim_IntList)
def _sum(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    return emit_reduce(ctx, x, ReduceOp.SUM, dim, keepdim)


@register(aten.sum.default)
def _sum_all(ctx, node, x, *, dtype=None):
    return emit_reduce(ctx, x, ReduceOp.SUM, None, False)


@register(aten.mean.dim)
def _mean(ctx, node, x, dim=None, keepdim=False, *, dtype=None):
    return emit_reduce(ctx, x, ReduceOp.SUM, dim, keepdim, mean=True)


@register(aten.mean.default)
def _mean_all(ctx, node, x, *, dtype=None):
    return emit_reduce(ctx, x, ReduceOp.SUM, None, False, mean=True)


@register(aten.amax.default)
def _amax(ctx, node, x, dim=(), keepdim=False):
    return emit_reduce(ctx, x, ReduceOp.MAX, dim, keepdim)


@register(aten.amin.default)
def _amin(ctx, node, x, dim=(), keepdim=False):
    return emit_reduce(ctx, x, ReduceOp.MIN, dim, keepdim)


@register(aten.var_mean.correction)
def _var_mean(ctx, node, x, dim=None, *, correction=None, keepdim=False):
    """mean = sum(x)/n; var = sum((x - mean)^2)/(n - correction): two reductions (VectorE or
    TensorE) around one fused elementwise kernel (the two-pass formula, as eager's)."""
    return _var_and_mean(ctx, x, dim, correction, keepdim)


@register(aten.var.correction)
def _var(ctx, node, x, dim=None, *, correction=None, keepdim=False):
    return _var_and_mean(ctx, x, dim, correction, keepdim, var_only=True)


def _var_and_mean(ctx, x, dim, correction, keepdim, var_only=False):
    from lowering.kir import EOp, Expr, PointwiseAttrs, load
    vals = ctx.out_val if not var_only else (ctx.out_val, ctx.out_val)
    rd = _norm_dims(dim, x.rank)
    n = 1
    for d in rd:
        n *= x.shape[d]
    corr = 1.0 if correction is None else float(correction)
    kshape = tuple(1 if d in rd else s for d, s in enumerate(x.shape))
    tdt = _torch_dtype_of(x)
    meta = torch.empty(kshape, dtype=vals[1].dtype, device="meta")
    mean_k = emit_reduce(ctx, x, ReduceOp.SUM, rd, True, mean=True, out_val=meta)
    mb = apply_view(mean_k, _torch_dtype_of(mean_k), lambda t: t.expand(x.shape))
    sq = ctx.new_tensor(x.shape, x.dtype)
    d = Expr(EOp.SUB, (load(0, x.dtype), load(1, mean_k.dtype)), x.dtype)
    ctx.emit(KOp(KKind.POINTWISE, (sq,), (x, mb), PointwiseAttrs(Expr(EOp.MUL, (d, d), x.dtype))))
    var = emit_reduce(ctx, sq, ReduceOp.SUM, rd, keepdim, mean=True, out_val=vals[0],
                      divisor=max(n - corr, 0.0))
    if var_only:
        return var
    mean = mean_k if keepdim else apply_view(mean_k, tdt, lambda t: t.view(tuple(vals[1].shape)))
    return (var, mean)
