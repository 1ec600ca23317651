"""Convolutions whose weights or input tiles exceed their SBUF share run on the device, split
by ``lowering/tiling/conv_plan.py`` (output-channel weight passes, weight rows per kernel-row
group, input tiles per 128-channel chunk), against eager through the simulator (fp32, bf16).

Each case asserts, from the tiler's note in the dump, that the split it is meant to exercise
was taken (so a change of budgets cannot silently turn the test into a plain one), and every
case goes through ``lowering_helpers.check``: all nodes lowered, instructions executed.
``test_tolerance_catches_a_lost_pass`` feeds known-wrong results to the same comparison.
Through ``torch.compile``: ``tests/test_cnn_models.py`` (ViT-B/16 patch embedding, DeepLabV3's
atrous head on 960 channels).
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from lowering.api import why_unsupported
from lowering.errors import Unsupported
from lowering.tiling.conv_plan import plan_conv
from lowering_helpers import assert_close, check, rand, trace
from runtime_sim.targets import TARGETS

DTYPES = (torch.float32, torch.bfloat16)

# name: (input shape, weight shape, conv kwargs, {dtype: what the note must say})
CASES = {
    # ViT-B/16 patch embedding on a 64 px image: 64 stacked units x 768 outputs do not fit
    "patch16": ((1, 3, 64, 64), (768, 3, 16, 16), dict(stride=16),
                {torch.float32: "6 weight passes of 128", torch.bfloat16: "3 weight passes of 256"}),
    # ResNet stem on 64 px (fits in one pass: the plan must not split it)
    "stem7x7": ((2, 3, 64, 64), (64, 3, 7, 7), dict(stride=2, padding=3),
                {torch.float32: "1 weight passes of 64", torch.bfloat16: "1 weight passes of 64"}),
    # DeepLabV3 ASPP: 960 channels, dilation 12 on a 25x25 map: the halo makes one tile of
    # every chunk too big; 130 outputs cross the 128-channel edge
    "atrous960": ((1, 960, 25, 25), (130, 960, 3, 3), dict(padding=12, dilation=12),
                  {torch.float32: "per 128-channel chunk", torch.bfloat16: "per 128-channel chunk"}),
    # large-kernel depthwise on a large map (ConvNeXt-like 13x13): block-diagonal stationaries
    # split into passes narrower than 128 (fp32: 3 of 43, the group mask offset per pass)
    "dw13": ((1, 256, 24, 24), (256, 1, 13, 13), dict(padding=6, groups=256),
             {torch.float32: "3 weight passes of 43", torch.bfloat16: "2 weight passes of 64"}),
    # depthwise 3x3 over a 96x96 map: 18 output blocks of 512 pixels, border runs
    "dw_map": ((1, 128, 96, 96), (128, 1, 3, 3), dict(padding=1, groups=128),
               {torch.float32: "1 weight passes of 128", torch.bfloat16: "1 weight passes of 128"}),
    # 129 input channels x 7x7 taps: passes of fewer than 128 channels over 300 outputs
    "ci129k7": ((1, 129, 9, 9), (300, 129, 7, 7), dict(padding=3),
                {torch.float32: "4 weight passes of 75", torch.bfloat16: "1 weight passes of 300"}),
    # 520 outputs in passes of 128 (a tail pass of 8), two images
    "co520": ((2, 129, 9, 9), (520, 129, 5, 5), dict(padding=2, stride=(1, 2)),
              {torch.float32: "5 weight passes of 128", torch.bfloat16: "1 weight passes of 520"}),
}


def _args(xs, ws, dtype, seed=0):
    fan = ws[1] * ws[2] * ws[3]
    return (rand(*xs, dtype=dtype, seed=seed), (rand(*ws, seed=seed + 1) / fan ** 0.5).to(dtype),
            rand(ws[0], dtype=dtype, seed=seed + 2))


def _note(low) -> str:
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("#") and "conv [" in ln]
    assert len(notes) == 1, notes
    return notes[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", list(CASES))
def test_conv_split_to_fit_matches_eager(name, dtype):
    xs, ws, kw, want = CASES[name]
    low = check(lambda x, w, b: F.conv2d(x, w, b, **kw), *_args(xs, ws, dtype))
    assert want[dtype] in _note(low), _note(low)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_conv1d_long_kernel_passes(dtype):
    """A 1-d conv whose 255-tap kernel over 130 channels needs weight passes and row groups."""
    x, w, b = _args((1, 130, 300, 1), (140, 130, 255, 1), dtype)
    fn = lambda x, w, b: F.conv1d(x, w, b, padding=127)
    low = check(fn, x[..., 0], w[..., 0], b)
    assert re.search(r"\d+ weight passes", _note(low))
    assert not _note(low).count("1 weight passes of")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_tolerance_catches_a_lost_pass(dtype):
    """The comparison rejects the patch embedding with one weight pass's channels zeroed, or one
    input chunk's contribution missing from the atrous conv."""
    xs, ws, kw, _ = CASES["patch16"]
    x, w, b = _args(xs, ws, dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, **kw)
    got = check(fn, x, w, b).outputs[0]
    lost = got.clone()
    lost[:, 128:256] = 0
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_close(lost, fn(x, w, b), what="lost pass")
    xs, ws, kw, _ = CASES["atrous960"]
    x, w, b = _args(xs, ws, dtype)
    fn = lambda x, w, b: F.conv2d(x, w, b, **kw)
    w_chunk = w.clone()
    w_chunk[:, 128:256] = 0
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_close(fn(x, w_chunk, b), fn(x, w, b), what="lost chunk")


def test_plan_fits_every_target():
    """For every target, the chosen plan's weight and input tiles stay within their shares, and
    what cannot fit at all is Unsupported naming the op, the bytes and the limit."""
    for t in TARGETS.values():
        part = t.sbuf_bytes_per_partition
        for xs, ws, kw, _ in CASES.values():
            st = kw.get("stride", 1)
            st = (st, st) if isinstance(st, int) else st
            d = kw.get("dilation", 1)
            for isz in (2, 4):
                g = plan_conv("c", part, isz, Co=ws[0], Cig=ws[1], Kh=ws[2], Kw=ws[3], Ho=8,
                              Wo=8, W=xs[3], stride=st, dilation=(d, d), groups=kw.get("groups", 1))
                assert g.nci * len(g.units) * g.cob * isz * (2 if g.passes > 1 else 1) <= part / 3
    with pytest.raises(Unsupported, match=r"conv: weights of 128 input channels x 100000 taps need "
                                          r"800000 B per SBUF partition for one output channel "
                                          r"\(limit \d+\)"):
        plan_conv("conv", 192 * 1024, 4, Co=8, Cig=128, Kh=1, Kw=100000, Ho=1, Wo=8, W=8,
                  stride=(1, 1), dilation=(1, 1), groups=1)


def test_registry_refuses_what_cannot_fit():
    """The registry's check asks the same plan (for the smallest target), so a convolution that
    cannot fit falls back with the reason before its partition is tiled; one that fits by
    splitting is accepted."""
    def node(xs, ws, **kw):
        gm = trace(lambda x, w: F.conv2d(x, w, **kw), torch.empty(*xs), torch.empty(*ws))
        return next(n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default)
    assert why_unsupported(node((1, 3, 64, 64), (768, 3, 16, 16), stride=16)) is None
    assert why_unsupported(node((1, 960, 25, 25), (256, 960, 3, 3), padding=12, dilation=12)) is None
    reason = why_unsupported(node((1, 4, 8, 8), (8, 4, 1, 100000), padding=(0, 50000)))
    assert reason and "100000 taps need 800000 B per SBUF partition" in reason, reason

