"""Transposed convolutions (``aten.convolution`` with ``transposed=True``) on the device, against
eager through the simulator (fp32, bf16): 1-d and 2-d, stride, padding, output_padding,
dilation, groups and depthwise, with and without bias, over 128-channel edges (contraction
and output chunks) and output maps larger than one PSUM bank (512 pixels). Every case runs
through ``lowering_helpers.check`` (all nodes lowered, instructions executed);
``test_tolerance_catches_wrong_results`` feeds known-wrong results to the same comparison.
Through ``torch.compile``: ``tests/test_cnn_models.py::test_inference_convolutions_fit_on_device``
(a decoder of transposed convolutions, every node on the device).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering.api import why_unsupported
from lowering_helpers import assert_close, check, rand, trace

DTYPES = (torch.float32, torch.bfloat16)


def _args(xs, ws, groups, dtype, bias=True, seed=0):
    fan = ws[0] * (ws[2] if len(ws) > 2 else 1) * (ws[3] if len(ws) > 3 else 1) // groups
    x = rand(*xs, dtype=dtype, seed=seed)
    w = (rand(*ws, seed=seed + 1) / max(1, fan) ** 0.5).to(dtype)
    return (x, w, rand(ws[1] * groups, dtype=dtype, seed=seed + 2)) if bias else (x, w)


def _fn(nd: int, bias: bool, **kw):
    f = F.conv_transpose2d if nd == 2 else F.conv_transpose1d
    return (lambda x, w, b: f(x, w, b, **kw)) if bias else (lambda x, w: f(x, w, None, **kw))


def run(xs, ws, dtype, bias=True, **kw):
    args = _args(xs, ws, kw.get("groups", 1), dtype, bias)
    return check(_fn(len(xs) - 2, bias, **kw), *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("xs,ws,kw", [
    ((1, 3, 7, 6), (3, 4, 3, 3), dict(padding=1)),                                 # stride 1
    ((2, 5, 7, 6), (5, 6, 3, 3), dict(stride=2, padding=1, output_padding=1)),     # 4 phases
    ((1, 8, 6, 5), (8, 3, 2, 2), dict(stride=2)),                                  # upsampling 2x
    ((1, 4, 5, 5), (4, 2, 4, 4), dict(stride=(3, 2), padding=(2, 1), dilation=2,
                                      output_padding=(1, 0))),
    ((1, 8, 9, 9), (8, 4, 1, 1), dict(stride=3)),                  # phases no tap reaches: bias
    ((1, 6, 5, 5), (6, 2, 4, 4), dict(stride=3, groups=3, dilation=2, padding=2,
                                      output_padding=1)),
    ((1, 129, 6, 5), (129, 1, 3, 3), dict(stride=2, padding=1, groups=129)),       # depthwise
], ids=["s1", "s2op1", "up2", "asym", "k1s3", "groups", "dw129"])
def test_conv_transpose2d(xs, ws, kw, dtype):
    run(xs, ws, dtype, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("ci,co", [(127, 129), (128, 128), (130, 3), (3, 130)])
def test_conv_transpose2d_channels_cross_tile_edges(ci, co, dtype):
    run((1, ci, 5, 6), (ci, co, 2, 2), dtype, stride=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_conv_transpose2d_large_map(dtype):
    """A 2x upsampling to 48x46 (per phase 24x23 = 552 pixels: two PSUM blocks)."""
    run((2, 16, 24, 23), (16, 8, 4, 4), dtype, stride=2, padding=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("L,ci,co,kw", [
    (513, 3, 5, dict(padding=2)),
    (300, 4, 6, dict(stride=2, padding=1, output_padding=1)),
    (40, 129, 127, dict(stride=4, padding=3, dilation=2)),
], ids=["513", "s2op1", "129ch"])
def test_conv_transpose1d(L, ci, co, kw, dtype):
    run((2, ci, L), (ci, co, 5), dtype, **kw)


def test_conv_transpose_without_bias():
    run((1, 6, 7, 5), (6, 5, 3, 3), torch.float32, bias=False, stride=2, padding=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_tolerance_catches_wrong_results(dtype):
    """A result without the bias on one phase, with one output channel lost, or from a weight
    whose taps were not flipped (the forward convolution's correlation order) must fail."""
    x, w, b = _args((1, 130, 5, 6), (130, 129, 3, 3), 1, dtype)
    fn = _fn(2, True, stride=2, padding=1)
    got = check(fn, x, w, b).outputs[0]
    want = fn(x, w, b)
    phase = got.clone()
    phase[..., ::2, ::2] -= b.view(-1, 1, 1)
    lost = got.clone()
    lost[:, 128] = 0
    for wrong, what in ((phase, "phase without bias"), (lost, "lost channel"),
                        (fn(x, w.flip(-1, -2), b), "unflipped taps")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, want, what=what)


def test_3d_transposed_falls_back_with_reason():
    gm = trace(lambda x, w: F.conv_transpose3d(x, w), torch.randn(1, 2, 3, 3, 3),
               torch.randn(2, 2, 2, 2, 2))
    conv = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert conv and "3-d convolution" in why_unsupported(conv[0])

