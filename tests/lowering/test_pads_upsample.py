"""Reflection / replication pads and nearest / bilinear upsampling on the device (forward and
backward) against eager through the simulator (functional mode).

The core-ATen decompositions would split these ops into ``index`` gathers, so the graphs are
traced as written (``undecomposed.lower_raw``: every node must be lowered and instructions must
execute). Shapes cross the tile edges of ``tiling/resample.py``: 134 planes (two partition
tiles), odd sizes, pads on one side only, negative (cropping) replication pads, integer and
fractional scale factors, ``align_corners``. The pad backward ops are also run through
``torch.compile``, which keeps them whole (``lowering.policy.KEEP_WHOLE``).

``test_tolerance_catches_wrong_results`` feeds known-wrong results (a halved result, a border
dropped, a bilinear output shifted by one phase) and requires the comparison to fail.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from lowering_helpers import assert_close, rand
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device
from undecomposed import lower_raw

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16)
ids = lambda d: str(d)[6:]        # noqa: E731


def _check_raw(fn, *args):
    out, _ = lower_raw(fn, *args)
    want = fn(*args)
    assert_close(out[0], want)
    return out[0], want


def _backward_node(fn, x):
    """The ``*_backward`` node autograd records for ``fn`` at ``x``, as a callable of the
    gradient and the input (the pad backward ops read the input's shape)."""
    xr = x.detach().float().clone().requires_grad_()
    y = fn(xr)
    gm = make_fx(lambda x, g: torch.autograd.grad(fn(x), x, g)[0])(xr, torch.ones_like(y))
    node = [n for n in gm.graph.nodes if "backward" in str(n.target)][0]
    return (lambda g, x: node.target(g, *[x if isinstance(a, torch.fx.Node) else a
                                          for a in node.args[1:]])), tuple(y.shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("mode,pad", [("reflect", (1, 2, 3, 0)), ("reflect", (3, 3, 1, 1)),
                                      ("replicate", (0, 0, 2, 2)), ("replicate", (-1, 2, 0, 1))],
                         ids=["refl", "refl_wide", "repl_h", "repl_crop"])
def test_pad2d_forward_and_backward(mode, pad, dtype):
    x = rand(2, 67, 9, 11, dtype=dtype)
    fn = lambda x: F.pad(x, pad, mode=mode)          # noqa: E731
    _check_raw(fn, x)
    bw, shape = _backward_node(fn, x)
    _check_raw(bw, rand(*shape, dtype=dtype, seed=2), x)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad1d_and_3d(mode):
    x = rand(3, 5, 13)
    _check_raw(lambda x: F.pad(x, (4, 2), mode=mode), x)
    fn = lambda x: F.pad(x, (1, 2, 2, 1, 3, 1), mode=mode)   # noqa: E731
    x3 = rand(2, 3, 4, 5, 6)
    _check_raw(fn, x3)
    bw, shape = _backward_node(fn, x3)
    _check_raw(bw, rand(*shape, seed=2), x3)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="nearest"), dict(size=(7, 9), mode="nearest"),
                                dict(scale_factor=(1.5, 0.5), mode="nearest"),
                                dict(scale_factor=2, mode="bilinear"),
                                dict(size=(7, 9), mode="bilinear", align_corners=True),
                                dict(size=(3, 11), mode="bilinear"), dict(scale_factor=1.7, mode="bilinear")],
                         ids=["near2x", "near_size", "near_frac", "bil2x", "bil_ac", "bil_mixed", "bil1.7"])
def test_upsample2d_forward_and_backward(kw, dtype):
    x = rand(2, 67, 5, 7, dtype=dtype)
    fn = lambda x: F.interpolate(x, **kw)            # noqa: E731
    _check_raw(fn, x)
    bw, shape = _backward_node(fn, x)
    _check_raw(lambda g: bw(g, x), rand(*shape, dtype=dtype, seed=3))


def test_upsample_nearest_1d_3d():
    _check_raw(lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), rand(2, 3, 11))
    _check_raw(lambda x: F.interpolate(x, size=(5, 6, 7), mode="nearest"), rand(2, 3, 3, 4, 5))


def test_pads_whole_under_torch_compile():
    """``torch.compile`` keeps reflection/replication pads whole, so forward and backward run
    as RESAMPLE kernels with nothing falling back."""
    torch._dynamo.reset()
    x = rand(2, 3, 6, 7).requires_grad_()
    fn = lambda x: (F.pad(x, (1, 2, 2, 1), mode="reflect") * 2 + F.pad(x, (1, 2, 2, 1), mode="replicate"))  # noqa: E731
    compiled = compile_for_neuron(fn)
    _, prof = run_on_device(lambda x: compiled(x).square().sum().backward(), x)
    d = assert_ran_on_device(prof)
    ops = {op for p in d["partitions"] for op in p["ops"]}
    assert {"aten.reflection_pad2d.default", "aten.reflection_pad2d_backward.default",
            "aten.replication_pad2d.default", "aten.replication_pad2d_backward.default"} <= ops, ops
    xr = x.detach().clone().requires_grad_()
    fn(xr).square().sum().backward()
    assert_close(x.grad, xr.grad)
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsampling_under_torch_compile_runs_on_the_device(mode):
    """Under ``torch.compile`` upsampling arrives decomposed (index gathers by device-computed
    integer positions, bilinear's clamped to the edge): nothing falls back, values match eager
    (a plane count across the 128-partition edge, odd sizes)."""
    torch._dynamo.reset()
    x = rand(2, 67, 9, 13)
    fn = lambda x: F.interpolate(x, scale_factor=2, mode=mode)  # noqa: E731
    out, prof = run_on_device(compile_for_neuron(fn), x)
    assert_ran_on_device(prof)
    assert_close(out, fn(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_tolerance_catches_wrong_results(dtype):
    x = rand(2, 67, 5, 7, dtype=dtype)
    got, want = _check_raw(lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), x)
    border = got.clone()
    border[..., 0] = 0
    for wrong, what in ((got / 2, "halved"), (border, "left border dropped")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, want, what=what)
    fn = lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")   # noqa: E731
    got, want = _check_raw(fn, x)
    with pytest.raises(AssertionError, match="out of tolerance"):     # the other phase's weights
        assert_close(torch.roll(got, 1, dims=-1), want, what="phases shifted")
