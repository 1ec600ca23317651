"""Upsampling: nearest (1-d, 2-d, 3-d) and bilinear (2-d), forward and backward.

- ``upsample_nearestNd(.vec)``: one RESAMPLE kernel (``tiling/resample.py``) of pure-gather
  maps: each run of equal phase is one strided copy (a 2x upsample is two copies per axis, the
  source walked with stride 1 and the destination with stride 2), in the input dtype.
- ``upsample_bilinear2d(.vec)``: per axis each output mixes two inputs,
  ``x[i0] * l0 + x[i1] * l1`` (W first, then H, as eager's CPU kernel nests them), each run of
  equal weights one ``tensor_scalar`` multiply (+ one add) over 128 planes; fp32 in between.
- The backward ops are the transposed maps (each input sums the weighted gradients of the
  outputs that read it).

Source positions and weights are computed at compile time exactly as ATen's CPU kernels do, in
fp32 (``compute_scales_value``, ``area_pixel_compute_source_index``, ``nearest_idx``): a scale
factor given by the caller is used as ``1/scale``, else ``in/out``.

Note: under ``torch.compile`` these ops are decomposed by torch's Python dispatcher (Autograd
key) before any backend sees them, into ``index`` gathers (and ``index_put`` for the backward);
these rules lower them when a graph carries them whole (``make_fx``, export).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.fx as fx

from lowering.kir import AxisMap, ReduceOp, ResampleKAttrs, TensorRef
from lowering.lower_ctx import LowerCtx
from lowering.ops.pooling import emit_resample, transpose_map
from lowering.registry_table import register

aten = torch.ops.aten
f32 = np.float32


def _scale_value(scale, n_in: int, n_out: int) -> np.float32:
    if scale is not None and scale > 0:
        return f32(1.0 / scale)
    return f32(n_in) / f32(n_out)


def nearest_map(n_in: int, n_out: int, scale=None) -> AxisMap:
    """ATen's ``nearest_idx``: ``min(floor(o * scale), n_in - 1)`` in fp32."""
    if n_in == n_out:
        src = list(range(n_out))
    elif n_out == 2 * n_in:
        src = [o >> 1 for o in range(n_out)]
    else:
        s = _scale_value(scale, n_in, n_out)
        src = [min(int(math.floor(f32(o) * s)), n_in - 1) for o in range(n_out)]
    return AxisMap(n_in, n_out, tuple((o, i, 1.0, 0) for o, i in enumerate(src)))


def linear_map(n_in: int, n_out: int, align_corners: bool, scale=None) -> AxisMap:
    """ATen's linear interpolation indices and weights (``compute_indices_weights_linear``)."""
    if align_corners:
        s = f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else f32(0)
    else:
        s = _scale_value(scale, n_in, n_out)
    ent = []
    for o in range(n_out):
        if align_corners:
            real = s * f32(o)
        else:
            real = f32(s * (f32(o) + f32(0.5)) - f32(0.5))
            real = max(real, f32(0))
        i0 = min(int(math.floor(real)), n_in - 1)
        lam = f32(min(max(f32(real - f32(i0)), f32(0)), f32(1)))
        i1 = i0 + (1 if i0 < n_in - 1 else 0)
        for i, w, c in ((i0, f32(1) - lam, 0), (i1, lam, 1)):
            if w != 0:
                ent.append((o, i, float(w), c))
    return AxisMap(n_in, n_out, tuple(ent))


def _check(nsp: int, name: str):
    def check(node: fx.Node) -> str | None:
        x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if not isinstance(x, torch.Tensor) or x.dim() != nsp + 2:
            got = x.dim() if isinstance(x, torch.Tensor) else type(x).__name__
            return f"{name} takes a {nsp + 2}-d input, got rank {got}"
        return None
    check.__doc__ = f"{nsp + 2}-d input; any output size or scale factors"
    return check


def _scales(args, nsp: int):
    """The per-axis scale arguments (``scales_h, scales_w`` or a ``scale_factors`` list)."""
    args = list(args)
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return list(args[0])
    if len(args) == 1 and args[0] is None:
        return [None] * nsp
    return (args + [None] * nsp)[:nsp]


def _nearest(nsp: int, backward: bool = False):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, *args):
        v = ctx.out_val
        if backward:                 # (grad_out, output_size, input_size, *scales)
            sin, sout = tuple(int(s) for s in args[1])[-nsp:], x.shape[-nsp:]
            scales = _scales(args[2:], nsp)
        else:                        # (x, output_size, *scales) or (x, output_size, scale_factors)
            sin, sout = x.shape[-nsp:], tuple(v.shape[-nsp:])
            scales = _scales(args[1:], nsp)
        maps = tuple(nearest_map(sin[j], sout[j], scales[j]) for j in range(nsp))
        if backward:
            maps = tuple(transpose_map(m) for m in maps)
        return emit_resample(ctx, x, nsp, v.shape, v.dtype, ResampleKAttrs(maps, ReduceOp.SUM))[0]
    return lower


def _bilinear(backward: bool = False):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, *args):
        v = ctx.out_val
        if backward:                 # (grad_out, output_size, input_size, align_corners, sh, sw)
            sin, sout = tuple(int(s) for s in args[1])[-2:], x.shape[-2:]
            align, scales = bool(args[2]), _scales(args[3:], 2)
        else:                        # (x, output_size, align_corners, sh, sw | scale_factors)
            sin, sout = x.shape[-2:], tuple(v.shape[-2:])
            align, scales = bool(args[1]), _scales(args[2:], 2)
        maps = tuple(linear_map(sin[j], sout[j], align, scales[j]) for j in range(2))
        if backward:
            maps = tuple(transpose_map(m) for m in maps)
        return emit_resample(ctx, x, 2, v.shape, v.dtype, ResampleKAttrs(maps, ReduceOp.SUM))[0]
    return lower


for _n in (1, 2, 3):
    _p = getattr(aten, f"upsample_nearest{_n}d")
    register(_p.default, _p.vec, check=_check(_n, f"upsample_nearest{_n}d"))(_nearest(_n))
    register(getattr(aten, f"upsample_nearest{_n}d_backward").default,
             check=_check(_n, f"upsample_nearest{_n}d_backward"))(_nearest(_n, backward=True))
register(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec,
         check=_check(2, "upsample_bilinear2d"))(_bilinear())
register(aten.upsample_bilinear2d_backward.default,
         check=_check(2, "upsample_bilinear2d_backward"))(_bilinear(backward=True))
