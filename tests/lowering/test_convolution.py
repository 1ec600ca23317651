"""Convolutions on the device: ``aten.convolution`` (1-d and 2-d forward) and
``aten.constant_pad_nd`` against eager through the simulator (functional mode).

Shapes cross the tile edges that matter for the implicit GEMM of ``tiling/conv.py``: channels
1, 3, 127, 128, 129 (the contraction and output-channel chunks of 128, the stacked kernel rows
for few channels), output blocks that cross 128 and 512 pixels (one PSUM bank) and spatial runs
whose first and last blocks touch the padding. Every case runs through ``lowering_helpers.check``,
which fails unless every ATen node is lowered (nothing fell back) and instructions executed.

``test_tolerance_catches_wrong_results`` feeds known-wrong results (halved, one output channel
dropped, one kernel tap dropped) to the same comparison and requires it to fail, in bf16 and
fp32: the tolerances here can fail.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering.api import why_unsupported
from lowering_helpers import assert_close, check, rand, trace
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16)


def _conv_fn(nd: int, bias: bool, **kw):
    f = F.conv2d if nd == 2 else F.conv1d
    if bias:
        return lambda x, w, b: f(x, w, b, **kw)
    return lambda x, w: f(x, w, None, **kw)


def _inputs(xs, ws, dtype, bias=True, seed=0):
    fan = ws[1] * (ws[2] if len(ws) > 2 else 1) * (ws[3] if len(ws) > 3 else 1)
    x = rand(*xs, dtype=dtype, seed=seed)
    w = (rand(*ws, seed=seed + 1) / fan ** 0.5).to(dtype)
    return (x, w, rand(ws[0], dtype=dtype, seed=seed + 2)) if bias else (x, w)


def run_conv(xs, ws, dtype=torch.float32, bias=True, **kw):
    args = _inputs(xs, ws, dtype, bias)
    return check(_conv_fn(len(xs) - 2, bias, **kw), *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("ci,co", [(1, 3), (3, 127), (127, 128), (128, 129), (129, 1)])
def test_conv2d_channels_cross_tile_edges(ci, co, dtype):
    run_conv((1, ci, 7, 6), (co, ci, 3, 3), dtype, padding=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("hw", [(8, 16), (23, 23), (2, 520)], ids=["128px", "529px", "1040px"])
def test_conv2d_pixels_cross_psum_bank(hw, dtype):
    """128, 529 and 1040 output pixels per image: one block, a tail block, column blocks."""
    run_conv((2, 3, *hw), (4, 3, 3, 3), dtype, padding=1)


@pytest.mark.parametrize("kw", [
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(0, 2), dilation=(1, 2)),
    dict(stride=3, padding=2, dilation=2),
    dict(padding=3),                 # blocks made only of padding
    dict(stride=2),                  # no padding: no memset
], ids=["s2p1", "asym", "s3p2d2", "allpad", "s2"])
def test_conv2d_stride_padding_dilation(kw):
    run_conv((2, 5, 11, 13), (6, 5, 3, 3), torch.float32, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("c,groups,co", [(8, 8, 8), (129, 129, 129), (256, 256, 256), (12, 3, 6),
                                         (12, 4, 8), (160, 2, 130)],
                         ids=["dw8", "dw129", "dw256", "g3", "g4", "g2wide"])
def test_conv2d_groups(c, groups, co, dtype):
    """Depthwise and grouped: groups packed block-diagonally (129 = 3 x 43), or one per block."""
    run_conv((1, c, 6, 5), (co, c // groups, 3, 3), dtype, groups=groups, padding=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_conv2d_without_bias_and_1x1(dtype):
    run_conv((2, 129, 5, 7), (130, 129, 1, 1), dtype, bias=False)
    run_conv((1, 3, 9, 9), (5, 3, 7, 7), dtype, bias=False, stride=2, padding=3)   # a stem


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("L,ci,co,kw", [
    (513, 3, 5, dict(padding=2)),
    (1030, 2, 3, dict(stride=2, padding=1)),
    (40, 129, 127, dict(padding=1, dilation=2)),
    (64, 64, 64, dict(groups=64, padding=3)),        # Mamba-style depthwise conv1d (k=4)
], ids=["513", "1030s2", "129ch", "dw"])
def test_conv1d(L, ci, co, kw, dtype):
    k = 4 if kw.get("groups") else 3
    run_conv((2, ci, L), (co, ci // kw.get("groups", 1), k), dtype, **kw)


def test_noncontiguous_input():
    """A permuted (channels-last) input is read through its strides."""
    x, w, b = _inputs((1, 6, 5, 7), (4, 6, 3, 3), torch.float32)
    fn = lambda x, w, b: F.conv2d(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) * 2, w, b,
                                  padding=1)
    check(fn, x, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_tolerance_catches_wrong_results(dtype):
    """The comparison used above rejects a halved result, a dropped output channel and a dropped
    kernel tap (the conv without its last weight column)."""
    xs, ws = (1, 129, 6, 6), (129, 129, 3, 3)
    x, w, b = _inputs(xs, ws, dtype)
    fn = _conv_fn(2, True, padding=1)
    low = check(fn, x, w, b)
    got, want = low.outputs[0], fn(x, w, b)
    dropped = got.clone()
    dropped[:, 128] = 0
    w_tap = w.clone()
    w_tap[..., 2, 2] = 0
    for wrong, what in ((got / 2, "halved"), (dropped, "dropped channel"),
                        (fn(x, w_tap, b), "dropped tap")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, want, what=what)


def test_fallback_reasons():
    """3-d convolutions fall back with the reason; 2-d (and transposed, see
    test_conv_transpose.py) ones are accepted."""
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3)
    gm = trace(lambda x, w: F.conv_transpose2d(x, w), x, w)
    conv = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert conv and why_unsupported(conv[0]) is None
    gm = trace(lambda x, w: F.conv3d(x, w), torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2))
    conv = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert conv and "3-d convolution" in why_unsupported(conv[0])
    gm = trace(lambda x, w: F.conv2d(x, w), x, w)
    conv = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert why_unsupported(conv[0]) is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("pad,value", [((1, 2), 0.0), ((1, 1, 2, 0), -1.5), ((-1, 2, 1, -2), 3.0),
                                       ((0, 0, 0, 0, 1, 1), 0.0)], ids=["w", "hw", "neg", "c"])
def test_constant_pad_nd(pad, value, dtype):
    x = rand(2, 3, 5, 130, dtype=dtype)
    check(lambda x: F.pad(x, pad, value=value) * 1, x)


def test_tiny_cnn_end_to_end():
    """conv -> relu -> conv (depthwise) -> conv under torch.compile: every conv on the device."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(2, 3, 12, 10)
    compiled = compile_for_neuron(model)
    with torch.no_grad():
        out, prof = run_on_device(compiled, x)
        want = model(x)
    d = assert_ran_on_device(prof)
    assert d["fallback_nodes"] == 0 and not d["fallbacks"], d["fallbacks"]
    assert_close(out, want)
