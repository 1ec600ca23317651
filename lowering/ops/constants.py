"""Tensors made on the device: full, zeros, ones, scalar_tensor, arange.

Engine: VectorE/GpSimdE (``memset``), GpSimdE (``iota``) for arange; then a store by DMA.
Integer results go through fp32 (see ``elementwise``), so ``arange`` requires every value below
2**24 in magnitude; that bound is checked on concrete sizes.
"""
from __future__ import annotations

import torch

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, const
from lowering.lower_ctx import machine_dtype
from lowering.registry_table import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
ALL = FLOAT_DTYPES | INDEX_DTYPES | MASK_DTYPES
EXACT_INT_LIMIT = 2 ** 24


def _fill(ctx, node, value: float):
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    dt = machine_dtype(v.dtype, ctx.op)
    expr = Expr(EOp.CAST, (const(float(value)),), dt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (), PointwiseAttrs(expr)))
    return out


@register(aten.full.default, dtypes=ALL)
def _full(ctx, node, size, fill_value, **kwargs):
    return _fill(ctx, node, fill_value)


@register(aten.scalar_tensor.default, dtypes=ALL)
def _scalar_tensor(ctx, node, value, **kwargs):
    return _fill(ctx, node, value)


@register(aten.zeros.default, dtypes=ALL)
def _zeros(ctx, node, size, **kwargs):
    return _fill(ctx, node, 0.0)


@register(aten.ones.default, dtypes=ALL)
def _ones(ctx, node, size, **kwargs):
    return _fill(ctx, node, 1.0)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default, dtypes=ALL)
def _arange(ctx, node, *args, **kwargs):
    nums = [a for a in args if isinstance(a, (int, float))]
    if node.target == aten.arange.default:
        start, step = 0, 1
    elif node.target == aten.arange.start:
        start, step = nums[0], 1
    else:
        start, step = nums[0], (nums[2] if len(nums) > 2 else kwargs.get("step", 1))
    v = ctx.out_val
    n = int(v.shape[0])
    dt = machine_dtype(v.dtype, ctx.op)
    last = start + step * max(n - 1, 0)
    if not dt.is_float and max(abs(start), abs(last)) >= EXACT_INT_LIMIT:
        raise Unsupported(ctx.op, f"integer arange values up to {last} exceed the exact fp32 "
                                  f"range {EXACT_INT_LIMIT}")
    out = ctx.new_tensor((n,), v.dtype)
    idx = Expr(EOp.INDEX, (), DType.FP32, 0)
    expr = Expr(EOp.ADD, (Expr(EOp.MUL, (idx, const(step))), const(start)), dt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (), PointwiseAttrs(expr)))
    return out



@register(aten.full_like.default, dtypes=ALL)
def _full_like(ctx, node, x, fill_value, **kwargs):
    return _fill(ctx, node, fill_value)


@register(aten.zeros_like.default, dtypes=ALL)
def _zeros_like(ctx, node, x, **kwargs):
    return _fill(ctx, node, 0.0)


@register(aten.ones_like.default, dtypes=ALL)
def _ones_like(ctx, node, x, **kwargs):
    return _fill(ctx, node, 1.0)
