"""Reductions: sum, mean, prod, amax, amin, any, all over any dims (keepdim or not); max and min
of every element.

Engines: VectorE ``tensor_reduce`` along the free axis with the kept elements on partitions; a sum
over leading (row) dims of a row-major tensor uses TensorE instead (ones-vector matmul reduces over
partitions and accumulates in PSUM). Tiling: any shape; see ``tiling/reduce.py``.

``any``/``all`` are a max/min REDUCE over 0/1 truth values: a bool input is reduced as it is, any
other input first goes through one POINTWISE ``x != 0`` kernel (bool; NaN != 0 is true, as in
torch). The reduce accumulates in fp32 and casts the 0.0/1.0 result to the output dtype (bool, or
uint8 for uint8 inputs as torch does), so every step is exact.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import LoweringError
from lowering.kir import (EOp, Expr, KKind, KOp, PointwiseAttrs, ReduceKAttrs, ReduceOp,
                          TensorRef, const, load)
from lowering.lower_ctx import LowerCtx, machine_dtype
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

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
    out_keep = apply_view(out, torch_dtype_of(out), lambda t: t.view(kshape)) if rank else out
    xin = x if rank else apply_view(x, torch_dtype_of(x), lambda t: t.view(1))
    if not rank:
        out_keep = apply_view(out, torch_dtype_of(out), lambda t: t.view(1))
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


def _float_only(node: fx.Node) -> str | None:
    """Float inputs only: an integer product (int64 in eager) leaves fp32's exact range."""
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"input dtype {v.dtype} (integer products fall back; float inputs only)"
    dt = node.kwargs.get("dtype")
    if dt is not None and dt != v.dtype:
        return f"dtype={dt} differs from the input's {v.dtype} (not lowered)"
    return None


@register(aten.prod.dim_int, check=_float_only)
def _prod(ctx, node, x, dim, keepdim=False, *, dtype=None):
    """prod over one dim: VectorE ``tensor_reduce`` multiply per chunk, partials multiplied in
    fp32 (the product's rounding order is the chunking's, not eager's)."""
    return emit_reduce(ctx, x, ReduceOp.PROD, dim, keepdim)


@register(aten.prod.default, check=_float_only)
def _prod_all(ctx, node, x, *, dtype=None):
    return emit_reduce(ctx, x, ReduceOp.PROD, None, False)


@register(aten.amax.default)
def _amax(ctx, node, x, dim=(), keepdim=False):
    return emit_reduce(ctx, x, ReduceOp.MAX, dim, keepdim)


@register(aten.amin.default)
def _amin(ctx, node, x, dim=(), keepdim=False):
    return emit_reduce(ctx, x, ReduceOp.MIN, dim, keepdim)


@register(aten.max.default)
def _max_all(ctx, node, x):
    """max of every element (a 0-d result), as amax over all dims."""
    return emit_reduce(ctx, x, ReduceOp.MAX, None, False)


@register(aten.min.default)
def _min_all(ctx, node, x):
    return emit_reduce(ctx, x, ReduceOp.MIN, None, False)


@register(aten.var_mean.correction)
def _var_mean(ctx, node, x, dim=None, *, correction=None, keepdim=False):
    """mean = sum(x)/n; var = sum((x - mean)^2)/(n - correction): two reductions (VectorE or
    TensorE) around one fused elementwise kernel (the two-pass formula, as eager's)."""
    return var_and_mean(ctx, x, dim, correction, keepdim)


@register(aten.var.correction)
def _var(ctx, node, x, dim=None, *, correction=None, keepdim=False):
    return var_and_mean(ctx, x, dim, correction, keepdim, var_only=True)


def var_and_mean(ctx, x, dim, correction, keepdim, var_only=False, out_vals=None):
    """``out_vals``: (var, mean) values giving the outputs' shapes and dtypes (default: the
    node's)."""
    vals = out_vals if out_vals is not None else (ctx.out_val if not var_only else (ctx.out_val, ctx.out_val))
    rd = _norm_dims(dim, x.rank)
    n = 1
    for d in rd:
        n *= x.shape[d]
    corr = 1.0 if correction is None else float(correction)
    kshape = tuple(1 if d in rd else s for d, s in enumerate(x.shape))
    tdt = torch_dtype_of(x)
    meta = torch.empty(kshape, dtype=vals[1].dtype, device="meta")
    mean_k = emit_reduce(ctx, x, ReduceOp.SUM, rd, True, mean=True, out_val=meta)
    mb = apply_view(mean_k, torch_dtype_of(mean_k), lambda t: t.expand(x.shape))
    sq = ctx.new_tensor(x.shape, x.dtype)
    d = Expr(EOp.SUB, (load(0, x.dtype), load(1, mean_k.dtype)), x.dtype)
    ctx.emit(KOp(KKind.POINTWISE, (sq,), (x, mb), PointwiseAttrs(Expr(EOp.MUL, (d, d), x.dtype))))
    var = emit_reduce(ctx, sq, ReduceOp.SUM, rd, keepdim, mean=True, out_val=vals[0],
                      divisor=max(n - corr, 0.0))
    if var_only:
        return var
    mean = mean_k if keepdim else apply_view(mean_k, tdt, lambda t: t.view(tuple(vals[1].shape)))
    return (var, mean)


# ---- any / all ----------------------------------------------------------------------------
# Zero-ness survives the engines' fp32 conversion for every integer width (a non-zero integer
# never rounds to 0.0), so integer inputs are accepted from anywhere, unlike arithmetic.
ANY_ALL_DTYPES = FLOAT_DTYPES | MASK_DTYPES | INDEX_DTYPES | frozenset({torch.uint8, torch.int8})


def _reduced_dims(dims, rank: int) -> tuple[int, ...]:
    """ATen's any/all dims: None reduces every dim; an empty list reduces none (unlike amax's
    ``dim=()``); a 0-d tensor has nothing to reduce."""
    if rank == 0:
        return ()
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % rank for d in dims}))


def _truth(ctx: LowerCtx, x: TensorRef, dtype: DType) -> TensorRef:
    """``x != 0`` as ``dtype`` (one POINTWISE kernel)."""
    out = ctx.new_tensor(x.shape, dtype)
    expr = Expr(EOp.NE, (load(0, x.dtype), const(0.0)), dtype)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (x,), PointwiseAttrs(expr)))
    return out


def emit_any_all(ctx: LowerCtx, x: TensorRef, dims, keepdim: bool, is_all: bool) -> TensorRef:
    """any = max(x != 0), all = min(x != 0) over ``dims``. An empty input is filled with the
    identity (any: False, all: True) by a POINTWISE kernel: that is the value of an empty
    reduction, and an empty output gets no element at all."""
    v = ctx.out_val
    odt = machine_dtype(v.dtype, ctx.op)
    rd = _reduced_dims(dims, x.rank)
    shape = tuple(1 if (d in rd and keepdim) else s for d, s in enumerate(x.shape)
                  if d not in rd or keepdim)
    if shape != tuple(v.shape):
        raise LoweringError(f"{ctx.op}: reducing {list(x.shape)} over {list(rd)} (keepdim="
                            f"{keepdim}) gives {list(shape)}, but ATen says {list(v.shape)}")
    if not rd:                       # nothing reduced: the truth values themselves
        return _truth(ctx, x, odt)
    if x.numel == 0:                 # empty reduction (or empty output): the identity
        out = ctx.new_tensor(shape, odt)
        fill = Expr(EOp.CAST, (const(1.0 if is_all else 0.0),), odt)
        ctx.emit(KOp(KKind.POINTWISE, (out,), (), PointwiseAttrs(fill)))
        return out
    t = x if x.dtype is DType.BOOL else _truth(ctx, x, DType.BOOL)
    return emit_reduce(ctx, t, ReduceOp.MIN if is_all else ReduceOp.MAX, rd, keepdim)


def _any_all_rule(is_all: bool, with_dims: bool):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim=None, keepdim: bool = False):
        return emit_any_all(ctx, x, dim if with_dims else None, keepdim, is_all)
    lower.__doc__ = (f"{'all' if is_all else 'any'}: ``x != 0`` on VectorE/GpSimdE (skipped for "
                     f"bool inputs), then a VectorE ``tensor_reduce`` {'min' if is_all else 'max'}"
                     "; any shape (see ``tiling/reduce.py``).")
    return lower


for _is_all, _ov in ((False, aten.any), (True, aten.all)):
    register(_ov.default, dtypes=ANY_ALL_DTYPES)(_any_all_rule(_is_all, with_dims=False))
    register(_ov.dim, _ov.dims, dtypes=ANY_ALL_DTYPES)(_any_all_rule(_is_all, with_dims=True))
