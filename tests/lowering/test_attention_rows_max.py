"""The row maxes of the two-phase attention path (tiling/attention/rows.py) with scores in PSUM:
VectorE takes the elementwise max of each score bank's two halves into SBUF, GpSimdE (which
cannot read PSUM) the row max of that (``attention.steps._half_max``). A max that missed either
half would let an exp overflow: each row's largest score (about 128 after the scale) sits in
the first half of one key block or in the second half of another, depending on the row.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run


def _hot(sign: float):
    """q [1, 2, 256, 64], k, v [1, 2, 1024, 64] (two key blocks of 512): even rows score high
    (16 * 64) on key 100 (the first half of block 0), odd rows on key 900 (the second half of
    block 1); every other score is small."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (0.1 * torch.randn(1, 2, n, 64, generator=g) for n in (256, 1024, 1024))
    q[..., 0::2, 0] = 16.0 * sign
    q[..., 1::2, 1] = 16.0 * sign
    k[..., 100, 0] = 64.0
    k[..., 900, 1] = 64.0
    return tuple(x.to(torch.bfloat16) for x in (q, k, v))


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["scale", "negative-scale"])
def test_row_max_of_scores_in_psum_sees_both_halves_of_every_bank(sign, target):
    """With a negative scale the largest scaled score is the smallest product (a row min); on
    trn3 K^T carries the scale (VectorE's exps)."""
    q, k, v = _hot(sign)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=sign / 8)  # noqa: E731
    low = lower_and_run(fn, q, k, v, target=target)
    tir = low.dumps["tir.txt"]
    assert any("two-phase softmax" in ln for ln in tir.splitlines() if ln.startswith("# "))
    ref = fn(q, k, v)
    assert torch.isfinite(ref).all()
    assert_close(low.outputs[0], ref)
