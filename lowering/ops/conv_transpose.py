"""Transposed convolutions: ``aten.convolution`` with ``transposed=True`` (``conv_transpose1d``,
``conv_transpose2d``, ``nn.ConvTranspose1d/2d``), any stride, padding, output_padding, dilation
and groups, on TensorE.

A transposed convolution of ``x [N, Ci, H, W]`` with ``w [Ci, Co/groups, Kh, Kw]`` is the data
gradient of the forward convolution whose weight is ``w`` (``Ci`` its output channels) and whose
input has the transposed convolution's output size: ``conv_backward.grad_input_phases`` lowers it as
``stride_h * stride_w`` stride-1 *phase* convolutions over ``x`` (sub-pixel decomposition: no
zero is inserted into ``x``, no product multiplies one; the forward weight's rows are the
contraction, taps flipped by index), interleaved by one RESAMPLE kernel when strided.
``output_padding`` only enlarges the output: its rows read past ``x``'s edge, as zeros. The
bias is added per output channel by each phase's PSUM evacuation (ScalarE), and is the value of
a phase no tap reaches (stride larger than the dilated kernel).

Invariants
- The phases cover every output element exactly once (``grad_input_phases``).
- Falls back (with the reason) when a phase's weights or input tiles cannot fit the smallest
  target's SBUF even split (``tiling/conv_plan.py``), like the forward convolution.
"""
from __future__ import annotations

import math

import torch.fx as fx

from lowering.kir import TensorRef
from lowering.lower_ctx import LowerCtx
from lowering.ops.conv_backward import as_2d, flat_spatial, grad_input_phases, phase_taps
from lowering.ops.conv_common import conv_pairs, conv_shapes, plan_reason


def phase_kernel(k: int, s: int, p: int, d: int) -> tuple[int, int]:
    """The largest phase kernel (taps) along an axis and the gap between its taps' reads."""
    taps = max(len(phase_taps(r, p, k, s, d)) for r in range(s))
    return taps, d // math.gcd(s, d)


def transposed_fit_reason(node: fx.Node, x, w, stride, padding, dilation, groups: int) -> str | None:
    """Why the largest phase convolution of a transposed convolution cannot be tiled within the
    smallest target's SBUF, or None (see ``ops/convolution.fit_reason``)."""
    shapes = conv_shapes(node, x, w)
    if shapes is None:
        return None
    xs, ws, ys = shapes
    nsp = x.dim() - 2
    st, pd, dl = conv_pairs(stride, nsp, 1), conv_pairs(padding, nsp, 0), conv_pairs(dilation, nsp, 1)
    (kh, gh), (kw, gw) = (phase_kernel(ws[2 + i], st[i], pd[i], dl[i]) for i in range(2))
    if not (kh and kw):
        return None
    return plan_reason(node, x.element_size(), Co=ws[1] * groups, Cig=ws[0] // groups, Kh=kh,
                       Kw=kw, Ho=-(-ys[2] // st[0]), Wo=-(-ys[3] // st[1]), W=xs[3],
                       stride=(1, 1), dilation=(gh, gw), groups=groups, dgrad_taps=ws[2] * ws[3])


def convolution_transposed(ctx: LowerCtx, x: TensorRef, w: TensorRef, bias: TensorRef | None,
                           stride, padding, dilation, groups: int) -> TensorRef:
    """``conv_transpose(x, w, bias)``: the phase convolutions of ``grad_input_phases`` over ``x``."""
    nsp = x.rank - 2
    st, pd, dl = conv_pairs(stride, nsp, 1), conv_pairs(padding, nsp, 0), conv_pairs(dilation, nsp, 1)
    v = ctx.out_val
    if nsp == 1:
        x, w = as_2d(x), as_2d(w)
    N, _, H, W = x.shape
    Co = w.shape[1] * int(groups)
    Hout, Wout = (1, int(v.shape[2])) if nsp == 1 else (int(v.shape[2]), int(v.shape[3]))
    return grad_input_phases(ctx, flat_spatial(ctx, x), w, v, (N, Co, Hout, Wout), (H, W), st, pd, dl,
                       int(groups), bias=bias)
