"""Row-wise normalisations: _softmax, _log_softmax, native_layer_norm.

Engines: VectorE ``tensor_reduce`` (row max / mean), ScalarE ``activation`` with a per-partition
bias and a fused free-axis sum (exp(x - max) and its row sum in one instruction; (x - mean)^2 and
its row sum), VectorE ``tensor_scalar`` with per-partition operands for the normalisation.
Tiling: rows on partitions in tiles of 128; a whole row must fit one SBUF tile (checked on concrete
sizes: a longer row raises ``Unsupported`` with the limit). See ``tiling/rowwise.py``.
"""
from __future__ import annotations

import torch

from lowering.frontend import LowerCtx
from lowering.kir import KKind, KOp, LayerNormKAttrs, SoftmaxKAttrs
from lowering.ops.elementwise import _torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry import register

aten = torch.ops.aten


def _softmax_like(ctx: LowerCtx, x, dim: int, log: bool):
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    d = dim % x.rank if x.rank else 0
    if x.rank == 0:
        x = apply_view(x, _torch_dtype_of(x), lambda t: t.view(1))
        out_v = apply_view(out, _torch_dtype_of(out), lambda t: t.view(1))
    else:
        out_v = out
    ctx.emit(KOp(KKind.SOFTMAX, (out_v,), (x,), SoftmaxKAttrs(d, log)))
    return out


@register(aten._softmax.default)
def _softmax(ctx, node, x, dim, half_to_float):
    return _softmax_like(ctx, x, dim, log=False)


@register(aten._log_softmax.default)
def _log_softmax(ctx, node, x, dim, half_to_float):
    return _softmax_like(ctx, x, dim, log=True)


@register(aten.native_layer_norm.default)
def _layer_norm(ctx, node, x, normalized_shape, weight, bias, eps):
    vals = ctx.out_val
    y = ctx.new_tensor(tuple(vals[0].shape), vals[0].dtype)
    mean = ctx.new_tensor(tuple(vals[1].shape), vals[1].dtype)
    rstd = ctx.new_tensor(tuple(vals[2].shape), vals[2].dtype)
    ins = (x,) + tuple(t for t in (weight, bias) if t is not None)
    attrs = LayerNormKAttrs(len(normalized_shape), float(eps), weight is not None, bias is not None)
    ctx.emit(KOp(KKind.LAYER_NORM, (y, mean, rstd), ins, attrs))
    return (y, mean, rstd)
