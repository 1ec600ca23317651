"""Normalisations: _softmax, _log_softmax, native_layer_norm and its backward,
native_group_norm, batch norm (``_native_batch_norm_legit``, ``.no_stats``, ``_no_training``).

Engines: VectorE ``tensor_reduce`` (row max / mean), ScalarE ``activation`` with a per-partition
bias and a fused free-axis sum (exp(x - max) and its row sum in one instruction; (x - mean)^2 and
its row sum), VectorE ``tensor_scalar`` with per-partition operands for the normalisation.
Tiling: rows on partitions in tiles of 128; a whole row must fit one SBUF tile (checked on concrete
sizes: a longer row raises ``Unsupported`` with the limit). See ``tiling/rowwise.py``.

- group norm: the LAYER_NORM kernel over ``[N * G, C / G * HxW]`` rows (statistics per group),
  then one POINTWISE kernel ``y * w[c] + b[c]`` (the normalised rows kept in fp32 in between, so
  bf16 rounds once, as eager's fp32 opmath).
- batch norm: inference (running statistics) is one POINTWISE kernel per element
  ``(x - rm) * rsqrt(rv + eps) * w + b``; training without running statistics computes the
  per-channel biased variance and mean with the var_mean kernels (REDUCE + POINTWISE), then the
  same POINTWISE normalisation. Training WITH running statistics updates them in place: it falls
  back (the backend decomposes the functional form before lowering).
- layer norm backward: grad_input by one LAYER_NORM_BWD kernel (``tiling/norm_backward.py``:
  rows on partitions, the row sums on VectorE); grad_weight / grad_bias by a POINTWISE product
  and REDUCE sums over the rows (TensorE ones-vector matmuls for row-major inputs).

Invariants
- Statistics (mean, variance, rstd) are computed in fp32 whatever the input dtype; outputs are
  rounded once to eager's dtypes.
"""
from __future__ import annotations

import torch

import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (EOp, Expr, KKind, KOp, LayerNormBwdKAttrs, LayerNormKAttrs, PointwiseAttrs,
                          ReduceOp, SoftmaxKAttrs, TensorRef, const, load, view_as)
from lowering.lower_ctx import LowerCtx, machine_dtype
from lowering.ops.common import torch_dtype_of
from lowering.ops.reduction import emit_reduce, var_and_mean
from lowering.ops.views import apply_view, materialize
from lowering.registry_table import register
from runtime_sim.isa import DType

F32 = DType.FP32

aten = torch.ops.aten


def _softmax_like(ctx: LowerCtx, x, dim: int, log: bool):
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    d = dim % x.rank if x.rank else 0
    if x.rank == 0:
        x = apply_view(x, torch_dtype_of(x), lambda t: t.view(1))
        out_v = apply_view(out, torch_dtype_of(out), lambda t: t.view(1))
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


# ---- shared pieces ----------------------------------------------------------------------------
def _e(op: EOp, *args: Expr, dtype: DType = F32) -> Expr:
    return Expr(op, tuple(args), dtype)


def _channel(ref: TensorRef, shape: tuple[int, ...], axis: int = 1) -> TensorRef:
    """A per-channel vector ``[C]`` broadcast to ``shape`` along ``axis`` (stride-0 view)."""
    vshape = tuple(s if d == axis else 1 for d, s in enumerate(shape))
    return apply_view(ref, torch_dtype_of(ref), lambda t: t.view(vshape).expand(shape))


def _affine(ctx: LowerCtx, ins: list[TensorRef], core: Expr, weight, bias, shape, odt: DType,
            axis: int = 1) -> TensorRef:
    """``out = core * w + b`` (w, b per channel along ``axis``, each optional), one POINTWISE
    kernel; ``core`` indexes ``ins`` and is fp32."""
    ins = list(ins)
    for ref, op in ((weight, EOp.MUL), (bias, EOp.ADD)):
        if ref is not None:
            core = _e(op, core, load(len(ins), ref.dtype))
            ins.append(_channel(ref, shape, axis))
    out = ctx.new_tensor(shape, odt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), tuple(ins), PointwiseAttrs(_e(EOp.CAST, core, dtype=odt))))
    return out


def _cast(ctx: LowerCtx, ref: TensorRef, odt: DType, shape=None) -> TensorRef:
    if ref.dtype is odt and shape is None:
        return ref
    src = ref if shape is None else apply_view(ref, torch_dtype_of(ref), lambda t: t.view(shape))
    out = ctx.new_tensor(tuple(src.shape), odt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (src,), PointwiseAttrs(_e(EOp.CAST, load(0, ref.dtype), dtype=odt))))
    return out


def _contiguous_view(ctx: LowerCtx, x: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    v = view_as(x, shape)
    return v if v is not None else view_as(materialize(ctx, x), shape)


# ---- group norm --------------------------------------------------------------------------------
@register(aten.native_group_norm.default)
def _group_norm(ctx, node, x, weight, bias, N, C, HxW, group, eps):
    """group norm: the LAYER_NORM kernel (VectorE/ScalarE statistics) over [N*G, C/G*HxW] rows,
    then a POINTWISE per-channel affine; rows as long as one SBUF partition holds, longer ones
    streamed in chunks."""
    vals = ctx.out_val
    N, C, HxW, G = int(N), int(C), int(HxW), int(group)
    odt = machine_dtype(vals[0].dtype, ctx.op)
    mean = ctx.new_tensor(tuple(vals[1].shape), vals[1].dtype)
    rstd = ctx.new_tensor(tuple(vals[2].shape), vals[2].dtype)
    rows = _contiguous_view(ctx, x, (N * G, (C // G) * HxW))
    affine = weight is not None or bias is not None
    yn = ctx.new_tensor(rows.shape, F32 if affine else odt)
    stat = lambda r: view_as(r, (N * G, 1))
    ctx.emit(KOp(KKind.LAYER_NORM, (yn, stat(mean), stat(rstd)), (rows,),
                 LayerNormKAttrs(1, float(eps), False, False)))
    y = view_as(yn, tuple(x.shape))
    if affine:
        y = _affine(ctx, [y], load(0, F32), weight, bias, tuple(x.shape), odt)
    return (y, mean, rstd)


# ---- batch norm ----------------------------------------------------------------------------------
def _bn_apply(ctx, x, mean, var_or_invstd, weight, bias, eps, odt, is_var: bool) -> TensorRef:
    """``(x - mean) * rsqrt(var + eps) * w + b`` (``is_var``) or ``(x - mean) * invstd * w + b``,
    the statistics per channel (axis 1)."""
    shape = tuple(x.shape)
    ins = [x, _channel(mean, shape), _channel(var_or_invstd, shape)]
    scale = load(2, var_or_invstd.dtype)
    if is_var:
        scale = _e(EOp.RSQRT, _e(EOp.ADD, scale, const(eps)))
    core = _e(EOp.MUL, _e(EOp.SUB, load(0, x.dtype), load(1, mean.dtype)), scale)
    return _affine(ctx, ins, core, weight, bias, shape, odt)


def _bn_channels(x: TensorRef) -> int:
    if x.rank < 2:
        raise Unsupported("batch_norm", f"input of rank {x.rank}; batch norm needs [N, C, ...]")
    return x.shape[1]


@register(aten._native_batch_norm_legit_no_training.default)
def _bn_inference(ctx, node, x, weight, bias, running_mean, running_var, momentum, eps):
    """batch norm with running statistics: one POINTWISE kernel (VectorE, ScalarE rsqrt)."""
    vals = ctx.out_val
    _bn_channels(x)
    y = _bn_apply(ctx, x, running_mean, running_var, weight, bias, float(eps),
                  machine_dtype(vals[0].dtype, ctx.op), True)
    return (y, ctx.new_tensor((0,), vals[1].dtype), ctx.new_tensor((0,), vals[2].dtype))


def _bn_training(ctx, x, weight, bias, eps):
    vals = ctx.out_val
    C = _bn_channels(x)
    dims = tuple(d for d in range(x.rank) if d != 1)
    kshape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    meta = torch.empty(kshape, dtype=torch.float32, device="meta")
    var, mean = var_and_mean(ctx, x, dims, 0, True, out_vals=(meta, meta))
    inv = ctx.new_tensor(kshape, F32)
    ctx.emit(KOp(KKind.POINTWISE, (inv,), (var,),
                 PointwiseAttrs(_e(EOp.RSQRT, _e(EOp.ADD, load(0, F32), const(float(eps)))))))
    mean_c, inv_c = view_as(mean, (C,)), view_as(inv, (C,))
    y = _bn_apply(ctx, x, mean_c, inv_c, weight, bias, float(eps), machine_dtype(vals[0].dtype, ctx.op), False)
    sdt = machine_dtype(vals[1].dtype, ctx.op)
    return (y, _cast(ctx, mean_c, sdt, (C,)), _cast(ctx, inv_c, sdt, (C,)))


def _bn_legit_check(node: fx.Node) -> str | None:
    """training=True with running statistics updates them in place: falls back (the backend
    decomposes the functional form before lowering)."""
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training")
    if training:
        return "training=True updates running_mean/running_var in place (not lowered)"
    return None


@register(aten._native_batch_norm_legit.default, check=_bn_legit_check)
def _bn_legit(ctx, node, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """batch norm, training=False: as ``_native_batch_norm_legit_no_training``."""
    return _bn_inference(ctx, node, x, weight, bias, running_mean, running_var, momentum, eps)


@register(aten._native_batch_norm_legit.no_stats)
def _bn_legit_no_stats(ctx, node, x, weight, bias, training, momentum, eps):
    """batch norm from the batch's statistics: per-channel var_mean (REDUCE + POINTWISE, fp32),
    rsqrt, then one POINTWISE normalisation; returns (y, mean, invstd)."""
    return _bn_training(ctx, x, weight, bias, eps)


# ---- layer norm backward ----------------------------------------------------------------------
@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(ctx, node, grad_out, x, normalized_shape, mean, rstd, weight, bias,
                         output_mask):
    """grad_input: one LAYER_NORM_BWD kernel (rows on partitions, VectorE row sums);
    grad_weight / grad_bias: POINTWISE dy * xhat and REDUCE sums over the rows."""
    vals = ctx.out_val
    nd = len(normalized_shape)
    lead = x.rank - nd
    kshape = tuple(x.shape[:lead]) + (1,) * nd
    mean_k = view_as(mean, kshape) if tuple(mean.shape) != kshape else mean
    rstd_k = view_as(rstd, kshape) if tuple(rstd.shape) != kshape else rstd
    outs: list = [None, None, None]
    if output_mask[0]:
        dx = ctx.new_tensor(tuple(vals[0].shape), vals[0].dtype)
        ins = (grad_out, x, mean_k, rstd_k) + ((weight,) if weight is not None else ())
        ctx.emit(KOp(KKind.LAYER_NORM_BWD, (dx,), ins, LayerNormBwdKAttrs(nd, weight is not None)))
        outs[0] = dx
    rows = tuple(range(lead))
    if output_mask[1] and weight is not None:
        shape = tuple(x.shape)
        bc = lambda r: apply_view(r, torch_dtype_of(r), lambda t: t.expand(shape))
        xhat = _e(EOp.MUL, _e(EOp.SUB, load(1, x.dtype), load(2, mean.dtype)), load(3, rstd.dtype))
        prod = ctx.new_tensor(shape, F32)
        ctx.emit(KOp(KKind.POINTWISE, (prod,), (grad_out, x, bc(mean_k), bc(rstd_k)),
                     PointwiseAttrs(_e(EOp.MUL, load(0, grad_out.dtype), xhat))))
        outs[1] = emit_reduce(ctx, prod, ReduceOp.SUM, rows, False, out_val=vals[1])
    if output_mask[2] and bias is not None:
        outs[2] = emit_reduce(ctx, grad_out, ReduceOp.SUM, rows, False, out_val=vals[2])
    return tuple(outs)


# ---- group norm backward ----------------------------------------------------------------------
@register(aten.native_group_norm_backward.default)
def _group_norm_backward(ctx, node, grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    """grad_input: a POINTWISE ``g = dy * w[c]`` (fp32), then the LAYER_NORM_BWD kernel over the
    ``[N * G, C / G * HxW]`` group rows (VectorE row sums; a row must fit one SBUF partition);
    grad_weight / grad_bias: a POINTWISE ``dy * xhat`` and REDUCE sums over N and HxW."""
    vals = ctx.out_val
    N, C, HxW, G = int(N), int(C), int(HxW), int(group)
    Cg = C // G
    dy3 = _contiguous_view(ctx, grad_out, (N, C, HxW))
    x3 = _contiguous_view(ctx, x, (N, C, HxW))
    stat4 = lambda r: apply_view(_contiguous_view(ctx, r, (N, G)), torch_dtype_of(r),
                                 lambda t: t.view(N, G, 1, 1).expand(N, G, Cg, HxW))
    outs: list = [None, None, None]
    if output_mask[0]:
        dx = ctx.new_tensor(tuple(vals[0].shape), vals[0].dtype)
        g = dy3
        if weight is not None:
            g = ctx.new_tensor((N, C, HxW), F32)
            ctx.emit(KOp(KKind.POINTWISE, (g,), (dy3, _channel(weight, (N, C, HxW))), PointwiseAttrs(
                _e(EOp.MUL, load(0, dy3.dtype), load(1, weight.dtype)))))
        rows = lambda r: view_as(r, (N * G, Cg * HxW))
        stat = lambda r: view_as(_contiguous_view(ctx, r, (N, G)), (N * G, 1))
        ctx.emit(KOp(KKind.LAYER_NORM_BWD, (rows(dx),), (rows(g), rows(x3), stat(mean), stat(rstd)),
                     LayerNormBwdKAttrs(1, False)))
        outs[0] = dx
    if output_mask[1] and vals[1] is not None:
        x4 = view_as(x3, (N, G, Cg, HxW))
        prod = ctx.new_tensor((N, G, Cg, HxW), F32)
        xhat = _e(EOp.MUL, _e(EOp.SUB, load(1, x.dtype), load(2, mean.dtype)), load(3, rstd.dtype))
        ctx.emit(KOp(KKind.POINTWISE, (prod,), (view_as(dy3, (N, G, Cg, HxW)), x4, stat4(mean), stat4(rstd)),
                     PointwiseAttrs(_e(EOp.MUL, load(0, grad_out.dtype), xhat))))
        outs[1] = emit_reduce(ctx, view_as(prod, (N, C, HxW)), ReduceOp.SUM, (0, 2), False, out_val=vals[1])
    if output_mask[2] and vals[2] is not None:
        outs[2] = emit_reduce(ctx, dy3, ReduceOp.SUM, (0, 2), False, out_val=vals[2])
    return tuple(outs)
