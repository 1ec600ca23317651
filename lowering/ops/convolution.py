"""Convolutions and padding: ``aten.convolution.default`` (forward, 1-d and 2-d) and
``aten.constant_pad_nd.default``.

- ``convolution(x, w, bias?, stride, padding, dilation, transposed, output_padding, groups)``
  with ``x`` [N, Ci, L] or [N, Ci, H, W]: one CONV kernel (``kir.ConvKAttrs``), tiled by
  ``tiling/conv.py`` as an implicit GEMM on TensorE: the input tile (with its halo) is loaded
  into SBUF once per output block, zero padding is a memset of the tile's border (never an HBM
  copy), and each kernel tap is one matmul whose moving operand is a strided window of that
  tile, accumulated in PSUM over taps and 128-channel chunks; the bias is added per partition
  on ScalarE while PSUM is evacuated. Any stride, padding, dilation and groups (depthwise
  included: groups are packed block-diagonally into one 128x128 stationary). A 1-d conv is the
  2-d one with H = 1. The patch (im2col) matrix is never materialised.
- ``transposed=True`` (``conv_transpose1d/2d``): ``ops/conv_transpose.py``, the data-gradient
  phase convolutions of ``ops/conv_backward.py`` over the input, plus the bias.
- Falls back (with the reason): 3-d convolutions (5-d input), and a convolution whose blocking
  cannot fit the smallest target's SBUF even split (``tiling/conv_plan.py``: weight passes,
  weight-row groups, per-chunk input tiles; checked here on concrete sizes). ``padding_mode='reflect'/'replicate'/'circular'`` in ``nn.Conv`` are separate pad ops
  before a zero-padding convolution: the convolution still runs on the device.
- ``constant_pad_nd(x, pad, value)``: the output's border slabs are filled with ``value`` by
  POINTWISE constant kernels (each element written once) and ``x`` (cropped by negative pads,
  a view) is copied into the interior view: VectorE/GpSimdE memset, DMA.

Invariants
- The CONV kernel's views are 3-d ``[N, C, spatial]``; the input's spatial axis is a
  row-major (H, W) walk with one stride (a non-mergeable input is first copied contiguous).
- ``y`` is a fresh contiguous buffer ``[N, Co, Ho, Wo]`` (the rule returns the 3-d/4-d view
  the graph expects).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (ConvKAttrs, EOp, Expr, KKind, KOp, PointwiseAttrs, TensorRef, const,
                          contiguous_strides, view_as)
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.conv_common import conv_pairs, conv_shapes, node_val, plan_reason
from lowering.ops.conv_transpose import convolution_transposed, transposed_fit_reason
from lowering.ops.elementwise import EW_DTYPES
from lowering.ops.views import apply_view, materialize
from lowering.registry_table import FLOAT_DTYPES, register

aten = torch.ops.aten


def _check_convolution(node: fx.Node) -> str | None:
    """1-d/2-d convolutions, forward and transposed, any stride/padding/dilation/groups (and
    output_padding); 3-d convolutions and those that cannot fit SBUF even split fall back."""
    x = node_val(node.args[0])
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        dim = x.dim() if isinstance(x, torch.Tensor) else x
        kind = f"{x.dim() - 2}-d convolution" if isinstance(x, torch.Tensor) and x.dim() > 2 else "input"
        return (f"only 1-d and 2-d convolutions (3-d or 4-d input) are lowered, got a {kind} "
                f"(input rank {dim})")
    transposed = node.args[6] if len(node.args) > 6 else node.kwargs.get("transposed", False)
    if transposed:
        return transposed_fit_reason(node, x, node_val(node.args[1]), node.args[3], node.args[4],
                                     node.args[5], int(node.args[8]))
    return fit_reason(node, x, node_val(node.args[1]), node.args[3], node.args[5], int(node.args[8]))


def fit_reason(node: fx.Node, x, w, stride, dilation, groups: int) -> str | None:
    """Why the CONV kernel of a forward convolution (input ``x``, weight ``w`` [Co, Ci/groups,
    k...]) cannot be tiled within the smallest target's SBUF (``plan_reason``), or None."""
    shapes = conv_shapes(node, x, w)
    if shapes is None:
        return None
    xs, ws, ys = shapes
    nsp = x.dim() - 2
    return plan_reason(node, x.element_size(), Co=ws[0], Cig=ws[1], Kh=ws[2], Kw=ws[3],
                       Ho=ys[2], Wo=ys[3], W=xs[3], stride=conv_pairs(stride, nsp, 1),
                       dilation=conv_pairs(dilation, nsp, 1), groups=groups)


@register(aten.convolution.default, dtypes=FLOAT_DTYPES, check=_check_convolution)
def convolution(ctx: LowerCtx, node: fx.Node, x: TensorRef, w: TensorRef, bias: TensorRef | None,
                stride, padding, dilation, transposed: bool, output_padding, groups: int) -> TensorRef:
    nsp = x.rank - 2
    if w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise Unsupported(ctx.op, f"input, weight and bias must share a dtype, got {x.dtype.value}, "
                          f"{w.dtype.value}, {bias.dtype.value if bias is not None else '-'}")
    if transposed:
        return convolution_transposed(ctx, x, w, bias, stride, padding, dilation, groups)
    st, pd, dl = conv_pairs(stride, nsp, 1), conv_pairs(padding, nsp, 0), conv_pairs(dilation, nsp, 1)
    if nsp == 1:
        x = TensorRef(x.buffer, x.dtype, x.shape[:2] + (1,) + x.shape[2:],
                      x.strides[:2] + (0,) + x.strides[2:], x.offset)
        w = TensorRef(w.buffer, w.dtype, w.shape[:2] + (1,) + w.shape[2:],
                      w.strides[:2] + (0,) + w.strides[2:], w.offset)
    N, Ci, H, W = x.shape
    Co, _, Kh, Kw = w.shape
    v = ctx.out_val
    Ho, Wo = (1, v.shape[2]) if nsp == 1 else tuple(v.shape[2:])
    x3 = view_as(x, (N, Ci, H * W))
    if x3 is None:                   # spatial axes not one strided walk: copy it contiguous first
        x3 = view_as(materialize(ctx, x), (N, Ci, H * W))
    out = ctx.new_tensor(tuple(v.shape), v.dtype, hint="conv")
    out3 = TensorRef(out.buffer, out.dtype, (N, Co, Ho * Wo), contiguous_strides((N, Co, Ho * Wo)))
    attrs = ConvKAttrs((H, W), (Ho, Wo), (Kh, Kw), st, pd, dl, int(groups), bias is not None)
    ins = (x3, w) + ((bias,) if bias is not None else ())
    ctx.emit(KOp(KKind.CONV, (out3,), ins, attrs))
    return out


@register(aten.constant_pad_nd.default, dtypes=EW_DTYPES)
def constant_pad_nd(ctx: LowerCtx, node: fx.Node, x: TensorRef, pad, value: float = 0) -> TensorRef:
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    tdt = torch_dtype_of(out)
    rank = x.rank
    # pad lists (before, after) pairs from the last axis backwards
    pads = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        pads[rank - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    src = x
    for d, (lo, hi) in enumerate(pads):       # negative pads crop the input (a view)
        if lo < 0 or hi < 0:
            a, e = max(0, -lo), x.shape[d] - max(0, -hi)
            src = apply_view(src, tdt, lambda t, d=d, a=a, e=e: t.narrow(d, a, e - a))
    inner = [(max(0, lo), max(0, lo) + src.shape[d]) for d, (lo, _) in enumerate(pads)]
    fill = Expr(EOp.CAST, (const(float(value)),), out.dtype)
    for d in range(rank):                     # border slabs: dims < d interior, d padding, > d whole
        for a, e in ((0, inner[d][0]), (inner[d][1], out.shape[d])):
            if e <= a:
                continue

            def slab(t, d=d, a=a, e=e):
                for k in range(d):
                    t = t.narrow(k, inner[k][0], inner[k][1] - inner[k][0])
                return t.narrow(d, a, e - a)
            piece = apply_view(out, tdt, slab)
            if piece.numel:
                ctx.emit(KOp(KKind.POINTWISE, (piece,), (), PointwiseAttrs(fill)))
    if src.numel:
        body = apply_view(out, tdt, lambda t: _narrow_all(t, inner))
        expr = Expr(EOp.CAST, (Expr(EOp.LOAD, (), src.dtype, 0),), out.dtype)
        ctx.emit(KOp(KKind.POINTWISE, (body,), (src,), PointwiseAttrs(expr)))
    return out


def _narrow_all(t: torch.Tensor, ranges) -> torch.Tensor:
    for k, (a, e) in enumerate(ranges):
        t = t.narrow(k, a, e - a)
    return t
