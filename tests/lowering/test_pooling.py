"""Pools on the device against eager through the simulator (functional mode): max / avg /
adaptive-avg pooling, 2-d (forward and backward) and 3-d (forward).

Shapes cross the tile edges of ``tiling/resample.py`` and ``tiling/pool.py``: 134 planes (two
partition tiles: 128 + 6), odd spatial sizes, windows that touch the padding on one side only
(ceil_mode), dilation, overlapping and disjoint windows, and planes split into row blocks (the
SBUF share is shrunk with ``monkeypatch`` so that small planes need several blocks, looped).
Every case runs through ``lowering_helpers.check``: it fails unless every ATen node is lowered
(nothing fell back) and instructions executed.

``test_tolerance_catches_wrong_results`` feeds known-wrong results (halved, one plane dropped,
a window tap dropped) to the same comparison and requires it to fail, in fp32 and bf16.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering.api import why_unsupported
from lowering.tiling import pool, resample
from lowering.errors import Unsupported
from lowering_helpers import assert_close, check, compile_fn, rand, trace

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16)
ids = lambda d: str(d)[6:]        # noqa: E731

# (kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 2, True), ((2, 3), (1, 2), (1, 1), 1, True)]
MAX_IDS = ["resnet3s2p1", "2x2s2", "dil2ceil", "asym"]


def _x(dtype, shape=(2, 67, 9, 11), seed=0):
    return rand(*shape, dtype=dtype, seed=seed)


def _pair(v):
    return list(v) if isinstance(v, tuple) else [v, v]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("case", MAX_CASES, ids=MAX_IDS)
def test_max_pool2d_with_indices(case, dtype):
    k, s, p, d, c = case
    low = check(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c, return_indices=True), _x(dtype))
    assert "indices" in low.dumps["tir.txt"]


def test_max_pool2d_values_only_skips_indices():
    """Inference reads only the values: no index work (no iota, no select) is emitted."""
    low = check(lambda x: F.max_pool2d(x, 3, 2, 1), _x(torch.float32))
    assert "iota(" not in low.dumps["tir.txt"] and "select(" not in low.dumps["tir.txt"]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("case", MAX_CASES, ids=MAX_IDS)
def test_max_pool2d_backward(case, dtype):
    k, s, p, d, c = case
    x = _x(dtype)
    y, idx = F.max_pool2d(x.float(), k, s, p, d, ceil_mode=c, return_indices=True)
    g = rand(*y.shape, dtype=dtype, seed=3)
    check(lambda g, x, i: aten.max_pool2d_with_indices_backward(
        g, x, _pair(k), _pair(s), _pair(p), _pair(d), c, i), g, x, idx)


def test_max_pool2d_ties_and_infinities():
    """Equal maxima keep the first (row-major) index; a window of -inf keeps its first real
    position; the backward routes each gradient through those indices."""
    x = torch.zeros(1, 3, 6, 7)
    x[0, 1] = float("-inf")
    x[0, 2, ::2] = 1.0
    fn = lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)   # noqa: E731
    check(fn, x)
    y, idx = fn(x)
    g = rand(*y.shape, seed=5)
    check(lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                                False, i), g, x, idx)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("k,s,p,c,cip,div", [(3, 2, 1, False, True, None), (3, 2, 1, True, False, None),
                                             (2, 2, 0, False, True, None), (3, 3, 1, True, True, 5)],
                         ids=["3s2p1", "ceil_nopad", "2x2", "divisor"])
def test_avg_pool2d_forward_and_backward(k, s, p, c, cip, div, dtype):
    x = _x(dtype)
    check(lambda x: F.avg_pool2d(x, k, s, p, c, cip, div), x)
    y = F.avg_pool2d(x.float(), k, s, p, c, cip, div)
    g = rand(*y.shape, dtype=dtype, seed=4)
    check(lambda g, x: aten.avg_pool2d_backward(g, x, [k, k], [s, s], [p, p], c, cip, div), g, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("osz", [(3, 4), (9, 11), (4, 7)], ids=["down", "same", "overlap"])
def test_adaptive_avg_pool2d_forward_and_backward(osz, dtype):
    x = _x(dtype)
    check(lambda x: F.adaptive_avg_pool2d(x, osz), x)
    g = rand(2, 67, *osz, dtype=dtype, seed=5)
    check(lambda g, x: aten._adaptive_avg_pool2d_backward(g, x), g, x)


def test_pools_3d():
    x = rand(2, 3, 5, 6, 7)
    check(lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: F.avg_pool3d(x, (2, 3, 3), (1, 2, 2), (1, 1, 0), ceil_mode=True,
                                 count_include_pad=False), x)
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), x)


def test_pools_1d_and_unbatched():
    """1-d pools reach the graph as 2-d pools of an unsqueezed axis; 3-d inputs are unbatched."""
    x = rand(3, 5, 41)
    check(lambda x: F.max_pool1d(x, 4, 3, 2, return_indices=True), x)
    check(lambda x: F.avg_pool1d(x, 3, 2, 1), x)
    check(lambda x: F.max_pool2d(x, 3, 2, return_indices=True), rand(5, 9, 8))


def test_noncontiguous_input():
    """A channels-last input: its planes are not one strided axis, so it is copied first."""
    x = rand(2, 7, 6, 5).permute(0, 3, 1, 2)        # [2, 5, 7, 6] with channel stride 1
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), x)


def test_row_blocks(monkeypatch):
    """Planes split into row blocks (looped when they share one structure)."""
    monkeypatch.setattr(resample, "BUDGET", 0.02)
    monkeypatch.setattr(pool, "BUDGET", 0.025)
    x = rand(2, 3, 40, 37)
    low = check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    note = [n for n in low.dumps["tir.txt"].splitlines() if "resample" in n and "block(s)" in n][0]
    assert "1 block(s)" not in note and "loop(s)" in note, note
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), x)
    y, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    g = rand(*y.shape, seed=6)
    low = check(lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1],
                                                                      [1, 1], False, i), g, x, idx)
    assert "1 row block(s)" not in low.dumps["tir.txt"]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_tolerance_catches_wrong_results(dtype):
    """The comparison used above rejects a halved result, a dropped plane (the second partition
    tile) and a window with a tap dropped."""
    x = _x(dtype, (2, 67, 9, 11))
    fn = lambda x: F.avg_pool2d(x, 3, 2, 1)       # noqa: E731
    got, want = check(fn, x).outputs[0], fn(x)
    dropped = got.clone()
    dropped[1, 66] = 0
    tap = x.clone()
    tap[..., ::2, ::2] = 0                                # every window loses its corner taps
    for wrong, what in ((got / 2, "halved"), (dropped, "dropped plane"), (fn(tap), "dropped tap")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, want, what=what)
    y, idx = F.max_pool2d(x.float(), 3, 2, 1, return_indices=True)
    g = rand(*y.shape, dtype=dtype, seed=3)
    bw = lambda g, x, i: aten.max_pool2d_with_indices_backward(   # noqa: E731
        g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i)
    got, want = check(bw, g, x, idx).outputs[0], bw(g, x, idx)
    for wrong, what in ((got / 2, "halved"), (torch.zeros_like(got), "zeroed")):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(wrong, want, what=what)


def test_fallback_reasons(monkeypatch):
    """What does not run on the device says why, naming the op, the constraint and the value."""
    gm = trace(lambda x: F.avg_pool2d(x, 2), torch.randn(1, 2, 4, 4, dtype=torch.float64))
    node = [n for n in gm.graph.nodes if n.target is aten.avg_pool2d.default][0]
    assert "dtype float64" in why_unsupported(node)
    monkeypatch.setattr(resample, "BUDGET", 1e-4)
    with pytest.raises(Unsupported, match=r"max_pool2d_with_indices.*needs \d+ B per SBUF partition"):
        compile_fn(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), rand(1, 2, 9, 300))
