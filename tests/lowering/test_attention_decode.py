"""Decode attention (one query per head over a KV cache): every head of a batch item at once,
heads on partitions (tiling/attention/decode.py). Shapes cross the tile edges: keys 130 / 700 /
1024 / 2048 (128-key chunks and 512-key banks, partial ones), head widths 32-128, heads 2-16;
masks as loads broadcast over heads or per head; matches eager, and a wrong result fails."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run

CASES = [(1, 12, 1024, 64, torch.bfloat16, "trn2"), (2, 4, 700, 32, torch.float32, "trn2"),
         (1, 3, 130, 128, torch.bfloat16, "trn3"), (1, 16, 2048, 64, torch.bfloat16, "trn3"),
         (1, 2, 513, 128, torch.float32, "trn3")]


def _notes(low) -> list[str]:
    return [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]


def _check(fn, args, ref):
    *_, target = args
    low = lower_and_run(fn, *args[:-1], target=target)
    assert any("heads of one query each" in n for n in _notes(low)), _notes(low)
    assert_close(low.outputs[0], ref)
    bad = low.outputs[0].clone()         # the tolerance can fail: one head's output dropped
    bad[..., 1, :, :] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"-{c[4]}-{c[5]}".replace("torch.", ""))
def test_one_query_per_head_takes_the_decode_path_and_matches_eager(case):
    B, H, Sk, D, dtype, target = case
    g = torch.Generator().manual_seed(Sk + H)
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H, Sk, D, generator=g).to(dtype) for _ in range(2))
    fn = F.scaled_dot_product_attention
    _check(fn, (q, k, v, target), fn(q, k, v))


@pytest.mark.parametrize("per_head", [False, True], ids=["mask-shared", "mask-per-head"])
def test_decode_with_a_mask_over_the_cache(per_head):
    """A bool mask of the keys written so far (shared by the heads, or one per head): the
    score expression loads it for every head."""
    g = torch.Generator().manual_seed(5)
    H, Sk, D = 6, 900, 64
    q = torch.randn(1, H, 1, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, H, Sk, D, generator=g).to(torch.bfloat16) for _ in range(2))
    mask = torch.arange(Sk).view(1, 1, 1, Sk) <= 611
    if per_head:
        mask = (torch.rand(1, H, 1, Sk, generator=g) > 0.4) & mask
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    _check(fn, (q, k, v, mask, "trn2"), fn(q, k, v, mask))
