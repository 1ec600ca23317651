"""``aten.convolution_backward`` on the device against eager through the simulator.

grad_input runs as ``stride_h * stride_w`` phase convolutions (CONV kernels with
``ConvKAttrs.dgrad``), grad_weight as a CONV_WGRAD kernel (TensorE, or VectorE for depthwise),
grad_bias as a REDUCE. Shapes cross the edges that matter: channels 129/130 (two contraction
chunks, two output-channel blocks), more than 128 output pixels (several pixel blocks in one
PSUM accumulation group), 5x5 taps over 130 channels (more taps than four PSUM banks hold, so
several tap passes), strides larger than the kernel (phases no tap reaches: a fill), dilation,
groups, depthwise with a channel multiplier, 1-d. Every case runs through
``lowering_helpers.check``: it fails unless every ATen node is lowered and instructions ran.

``test_tolerance_catches_wrong_results`` feeds known-wrong gradients (halved, one phase of
grad_input zeroed, one tap of grad_weight dropped) to the same comparison and requires it to
fail, in fp32 and bf16.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering.api import why_unsupported
from lowering_helpers import assert_close, check, rand, trace

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16)
ids = lambda d: str(d)[6:]        # noqa: E731


def _bwd(xs, ws, kw, mask=(True, True, True)):
    nd = len(xs) - 2
    L = lambda v: [v] * nd if isinstance(v, int) else list(v)     # noqa: E731
    st, pd, dl, gr = (kw.get(k, d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1),
                                                  ("groups", 1)))
    def fn(g, x, w):     # eager CPU may return a gradient it was not asked for: keep the mask's
        outs = aten.convolution_backward(g, x, w, [ws[0]], L(st), L(pd), L(dl), False, [0] * nd,
                                         gr, list(mask))
        return [t for t, m in zip(outs, mask) if m]
    return fn


def _inputs(xs, ws, kw, dtype):
    f = F.conv2d if len(xs) == 4 else F.conv1d
    fan = 1
    for s in ws[1:]:
        fan *= s
    x = rand(*xs, dtype=dtype, seed=1)
    w = (rand(*ws, seed=2) / fan ** 0.5).to(dtype)
    y = f(x.float(), w.float(), None, **kw)
    return rand(*y.shape, dtype=dtype, seed=3), x, w


def run(xs, ws, kw, dtype=torch.float32, mask=(True, True, True)):
    return check(_bwd(xs, ws, kw, mask), *_inputs(xs, ws, kw, dtype))


CASES = [
    ((2, 5, 9, 11), (7, 5, 3, 3), dict(padding=1)),
    ((2, 5, 9, 11), (7, 5, 3, 3), dict(stride=2, padding=1)),
    ((1, 4, 10, 9), (6, 4, 3, 3), dict(stride=(2, 3), padding=(0, 2), dilation=(2, 1))),
    ((2, 4, 6, 6), (4, 4, 2, 2), dict(stride=3)),                     # phases no tap reaches
    ((1, 3, 13, 13), (5, 3, 7, 7), dict(stride=2, padding=3)),        # a stem
    ((2, 12, 6, 6), (6, 4, 3, 3), dict(padding=1, groups=3)),
    ((2, 130, 5, 5), (129, 130, 1, 1), dict()),
    ((2, 3, 20), (4, 3, 3), dict(stride=2, padding=1)),               # 1-d
]
CASE_IDS = ["3x3", "s2", "asym_dil", "s3k2", "stem7x7", "groups3", "130ch_1x1", "conv1d"]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("xs,ws,kw", CASES, ids=CASE_IDS)
def test_convolution_backward(xs, ws, kw, dtype):
    run(xs, ws, kw, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("c,mult,kw", [(8, 1, dict(padding=1)), (8, 2, dict(stride=2, padding=1)),
                                       (130, 1, dict(padding=1))], ids=["dw", "dw_mult2_s2", "dw130"])
def test_depthwise_backward(c, mult, kw, dtype):
    """Depthwise weight gradients on VectorE (output channel co reads input channel co // mult)."""
    run((2, c, 7, 7), (c * mult, 1, 3, 3), dict(kw, groups=c), dtype)


def test_many_pixels_and_taps():
    """132 output pixels (2 blocks of one accumulation group) and 25 taps x 130 channels (two
    tap passes of 4 PSUM banks: 16 taps of 128 channels each), 130 output channels (2 blocks)."""
    run((1, 130, 12, 11), (130, 130, 5, 5), dict(padding=2))


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True)], ids=["input", "weight", "bias", "wb"])
def test_output_mask(mask):
    low = run((2, 5, 9, 11), (7, 5, 3, 3), dict(padding=1), mask=mask)
    assert len(low.outputs) == sum(mask)
    kinds = low.dumps["ir_pre_fusion.txt"]
    assert ("= conv[" in kinds) == mask[0] and ("conv_wgrad[" in kinds) == mask[1]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_grad_input_weight_passes(dtype):
    """grad_input whose stationaries (300 outputs x 49 taps of the forward weight's rows) exceed
    the rows share: weight passes over the output channels (``tiling/conv_plan.py``), the
    note says so; and a 16x16/16 patch embedding's input and weight gradients."""
    low = run((1, 300, 9, 9), (129, 300, 7, 7), dict(padding=3), dtype, mask=(True, False, False))
    note = next(ln for ln in low.dumps["tir.txt"].splitlines() if "conv [" in ln)
    assert ("7 weight passes of 43" if dtype == torch.float32 else "4 weight passes of 75") in note
    run((1, 3, 32, 32), (768, 3, 16, 16), dict(stride=16), dtype, mask=(True, True, False))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_tolerance_catches_wrong_results(dtype):
    xs, ws, kw = (2, 5, 9, 11), (130, 5, 3, 3), dict(stride=2, padding=1)
    g, x, w = _inputs(xs, ws, kw, dtype)
    fn = _bwd(xs, ws, kw)
    got = check(fn, g, x, w).outputs
    want = fn(g, x, w)
    phase = got[0].clone()
    phase[..., 1::2, 1::2] = 0
    tap = got[1].clone()
    tap[..., 2, 2] = 0
    for wrong, ref, what in ((got[0] / 2, want[0], "halved grad_input"),
                             (phase, want[0], "a phase of grad_input zeroed"),
                             (got[1] / 2, want[1], "halved grad_weight"),
                             (tap, want[1], "a tap of grad_weight dropped"),
                             (got[2] / 2, want[2], "halved grad_bias")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, ref, what=what)


def test_fallback_reasons():
    x, w = torch.randn(1, 4, 5, 5, requires_grad=True), torch.randn(4, 4, 3, 3, requires_grad=True)

    def nodes(fn, *args):
        gm = trace(lambda *a: torch.autograd.grad(fn(*a).sum(), a), *args)
        return [n for n in gm.graph.nodes if n.target is aten.convolution_backward.default]

    n = nodes(lambda x, w: F.conv_transpose2d(x, w), x, w)
    assert n and "transposed convolution (transposed=True)" in why_unsupported(n[0])
    n = nodes(lambda x, w: F.conv3d(x, w), torch.randn(1, 2, 4, 4, 4, requires_grad=True),
              torch.randn(3, 2, 2, 2, 2, requires_grad=True))
    assert n and "3-d convolution" in why_unsupported(n[0])
    n = nodes(lambda x, w: F.conv2d(x, w), x, w)
    assert n and why_unsupported(n[0]) is None
