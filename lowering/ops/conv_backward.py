"""``aten.convolution_backward`` (1-d and 2-d, any stride/padding/dilation/groups), honouring
``output_mask``:

- grad_input: the transposed convolution, as ``stride_h * stride_w`` *phase* convolutions (the
  sub-pixel decomposition): the input rows ``ih = rh + sh*m`` of phase ``rh`` receive only the
  kernel rows with ``(rh + ph - kh*dh) % sh == 0``, each reading gradient row ``m + e(kh)``, so
  each phase is a stride-1 CONV kernel over the gradient (implicit GEMM on TensorE,
  ``tiling/conv.py`` with ``ConvKAttrs.dgrad``: the forward weight's rows are the contraction,
  no weight transpose, taps flipped by index) writing a strided view of grad_input. No zero is
  inserted into the gradient and no product multiplies one. A phase that no tap reaches (stride
  larger than the kernel) is a memset fill.
- grad_weight: one CONV_WGRAD kernel (``tiling/conv_backward.py``): pixels on partitions, TensorE
  transposes of the gradient and of each tap's input window, products accumulated in PSUM over
  every image and pixel block; depthwise weights on VectorE (multiply + reduce per tap).
- grad_bias: a REDUCE of the gradient over batch and spatial axes.

Falls back (with the reason): ``transposed=True`` (the backward of a transposed convolution),
3-d convolutions, mixed dtypes, and (from the tilers, on concrete sizes) weight blocks or input
tiles that exceed their SBUF share.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (AxisMap, ConvKAttrs, ConvWgradKAttrs, EOp, Expr, KKind, KOp,
                          PointwiseAttrs, ReduceOp, ResampleKAttrs, TensorRef, const, view_as)
from lowering.lower_ctx import LowerCtx
from lowering.ops.conv_common import conv_pairs, node_val
from lowering.ops.pooling import emit_resample
from lowering.ops.reduction import emit_reduce
from lowering.ops.views import materialize
from lowering.registry_table import FLOAT_DTYPES, register

aten = torch.ops.aten


def _check(node: fx.Node) -> str | None:
    """1-d and 2-d convolutions (3-d or 4-d input), ``transposed=False``, one dtype"""
    x = node_val(node.args[1])
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        rank = x.dim() if isinstance(x, torch.Tensor) else type(x).__name__
        return (f"only 1-d and 2-d convolutions are lowered, got input rank {rank}"
                + (f" (a {x.dim() - 2}-d convolution)" if isinstance(x, torch.Tensor) else ""))
    if node.args[7]:
        return "the backward of a transposed convolution (transposed=True) is not lowered"
    dts = {v.dtype for v in (node_val(node.args[0]), x, node_val(node.args[2])) if isinstance(v, torch.Tensor)}
    if len(dts) > 1:
        return f"grad_output, input and weight must share a dtype, got {sorted(map(str, dts))}"
    return None


def as_2d(r: TensorRef) -> TensorRef:
    """A 1-d conv operand [A, B, L] as [A, B, 1, L]."""
    return TensorRef(r.buffer, r.dtype, r.shape[:2] + (1,) + r.shape[2:],
                     r.strides[:2] + (0,) + r.strides[2:], r.offset)


def flat_spatial(ctx: LowerCtx, r: TensorRef) -> TensorRef:
    """[A, B, H, W] as the 3-d view [A, B, H*W] (copied contiguous when no view exists)."""
    shape = (r.shape[0], r.shape[1], r.shape[2] * r.shape[3])
    v = view_as(r, shape)
    return v if v is not None else view_as(materialize(ctx, r), shape)


def phase_taps(r: int, p: int, k: int, s: int, d: int) -> list[int]:
    """Forward taps that reach input positions ``r + s*m``, ordered by the gradient position they
    read (``m + (r + p - kh*d) / s``, increasing): kernel index decreasing."""
    return sorted((kh for kh in range(k) if (r + p - kh * d) % s == 0), reverse=True)


def _zero(ctx: LowerCtx, view: TensorRef) -> None:
    if view.numel:
        ctx.emit(KOp(KKind.POINTWISE, (view,), (), PointwiseAttrs(Expr(EOp.CAST, (const(0.0),), view.dtype))))


def _fill_bias(ctx: LowerCtx, view: TensorRef, bias: TensorRef) -> None:
    """view[n, c, h, w] = bias[c] (a phase no kernel tap reaches, of a transposed convolution)."""
    src = TensorRef(bias.buffer, bias.dtype, view.shape, (0, bias.strides[0], 0, 0), bias.offset)
    expr = Expr(EOp.CAST, (Expr(EOp.LOAD, (), bias.dtype, 0),), view.dtype)
    ctx.emit(KOp(KKind.POINTWISE, (view,), (src,), PointwiseAttrs(expr)))


def grad_input_phases(ctx: LowerCtx, g3: TensorRef, w: TensorRef, v, xshape, ohw, st, pd, dl, G: int,
                bias: TensorRef | None = None):
    """The phase convolutions. One phase (stride 1) writes grad_input directly; with strides each
    phase writes its rows contiguously into a phase-major tensor ``[N, Ci, sh, Mh, sw, Mw]``
    (a strided store of single elements would cost one DMA descriptor chunk per element), and
    one RESAMPLE kernel of strided copies interleaves the phases into grad_input. ``bias`` (a
    transposed convolution's, per output channel) is added by every phase's evacuation, and is
    the value of a phase that no tap reaches."""
    N, Ci, H, W = xshape
    sh, sw = st
    Mh, Mw = -(-H // sh), -(-W // sw)
    phased = sh * sw > 1
    if phased:
        pt = ctx.new_tensor((N, Ci, sh, Mh, sw, Mw), v.dtype, hint="phases")
        pst = (Ci * sh * Mh * sw * Mw, sh * Mh * sw * Mw, sw * Mw, 1)
    else:
        gi = ctx.new_tensor(tuple(v.shape), v.dtype, hint="dgrad")
    for rh in range(sh):
        for rw in range(sw):
            mh, mw = len(range(rh, H, sh)), len(range(rw, W, sw))
            if phased:
                base = rh * Mh * sw * Mw + rw * Mw
                view = TensorRef(pt.buffer, pt.dtype, (N, Ci, mh, mw), pst, base)
                if mh < Mh:          # the phase's unused last row / column: never left unwritten
                    _zero(ctx, TensorRef(pt.buffer, pt.dtype, (N, Ci, Mh - mh, Mw), pst,
                                         base + mh * pst[2]))
                if mw < Mw:
                    _zero(ctx, TensorRef(pt.buffer, pt.dtype, (N, Ci, mh, Mw - mw), pst, base + mw))
            else:
                view = TensorRef(gi.buffer, gi.dtype, (N, Ci, H, W), (Ci * H * W, H * W, W, 1))
            if not (mh and mw):
                continue
            khs = phase_taps(rh, pd[0], w.shape[2], sh, dl[0])
            kws = phase_taps(rw, pd[1], w.shape[3], sw, dl[1])
            if not (khs and kws):
                if bias is None:
                    _zero(ctx, view)
                else:
                    _fill_bias(ctx, view, bias)
                continue
            eh = [(rh + pd[0] - kh * dl[0]) // sh for kh in khs]
            ew = [(rw + pd[1] - kw * dl[1]) // sw for kw in kws]
            attrs = ConvKAttrs(ohw, (mh, mw), (len(khs), len(kws)), (1, 1), (-eh[0], -ew[0]),
                               (eh[1] - eh[0] if len(eh) > 1 else 1, ew[1] - ew[0] if len(ew) > 1 else 1),
                               G, bias is not None, dgrad=(tuple(khs), tuple(kws)))
            ctx.emit(KOp(KKind.CONV, (view,), (g3, w) + ((bias,) if bias is not None else ()), attrs))
    if not phased:
        return gi
    maps = (AxisMap(sh * Mh, H, tuple((i, (i % sh) * Mh + i // sh, 1.0, i % sh) for i in range(H))),
            AxisMap(sw * Mw, W, tuple((i, (i % sw) * Mw + i // sw, 1.0, i % sw) for i in range(W))))
    src = TensorRef(pt.buffer, pt.dtype, (N * Ci, sh * Mh, sw * Mw), (sh * Mh * sw * Mw, sw * Mw, 1))
    gi = emit_resample(ctx, src, 2, (N, Ci, H, W), v.dtype,
                       ResampleKAttrs(tuple(m if sz > 1 else None for m, sz in zip(maps, st)),
                                      ReduceOp.SUM))[0]
    return view_as(gi, tuple(v.shape))


@register(aten.convolution_backward.default, dtypes=FLOAT_DTYPES, check=_check)
def convolution_backward(ctx: LowerCtx, node: fx.Node, g: TensorRef, x: TensorRef, w: TensorRef,
                         bias_sizes, stride, padding, dilation, transposed: bool, output_padding,
                         groups: int, output_mask):
    if transposed:
        raise Unsupported(ctx.op, "the backward of a transposed convolution (transposed=True) is not lowered")
    vals = ctx.out_val
    nsp = x.rank - 2
    g0 = g
    st, pd, dl = conv_pairs(stride, nsp, 1), conv_pairs(padding, nsp, 0), conv_pairs(dilation, nsp, 1)
    if nsp == 1:
        g, x, w = as_2d(g), as_2d(x), as_2d(w)
    N, Ci, H, W = x.shape
    Co, _, Kh, Kw = w.shape
    Ho, Wo = g.shape[2:]
    G = int(groups)
    outs: list[TensorRef | None] = [None, None, None]
    g3 = flat_spatial(ctx, g) if (output_mask[0] or output_mask[1]) else None
    if output_mask[0]:
        outs[0] = grad_input_phases(ctx, g3, w, vals[0], (N, Ci, H, W), (Ho, Wo), st, pd, dl, G)
    if output_mask[1]:
        v = vals[1]
        gw = ctx.new_tensor(tuple(v.shape), v.dtype, hint="wgrad")
        gw4 = TensorRef(gw.buffer, gw.dtype, (Co, w.shape[1], Kh, Kw),
                        (w.shape[1] * Kh * Kw, Kh * Kw, Kw, 1))
        attrs = ConvWgradKAttrs((H, W), (Ho, Wo), (Kh, Kw), st, pd, dl, G)
        ctx.emit(KOp(KKind.CONV_WGRAD, (gw4,), (flat_spatial(ctx, x), g3), attrs))
        outs[1] = gw
    if output_mask[2]:
        outs[2] = emit_reduce(ctx, g0, ReduceOp.SUM, [0] + list(range(2, g0.rank)), False,
                              out_val=vals[2])
    return tuple(outs)
