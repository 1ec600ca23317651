"""A mask shared by every head (GPT-2's ``where(mask[1, 1, S, S], 0, -inf)`` added to the
scaled scores, ``tiling/attention/bias.py``): evaluated once per query block before the head
loop and added to each head's product in one instruction, against eager through the simulator.

Shapes cross the tile edges: 130 queries and keys (a full query block and a partial one; one
key block), heads of 64 (paired) and 32; a fully masked row under SDPA's safe softmax (0) and
under a plain softmax (NaN); a power-of-two scale prescaled into Q (resident projection rows) and
divided out of the bias (DMA-transposed Q/K); a bf16 bias added on TensorE, an fp32 one by
VectorE; a per-head mask keeps the general path.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run

NOTE = "bias is the same for every head"


def _notes(low) -> list[str]:
    return [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]


def _fails_when_a_head_is_dropped(out, ref, h: int) -> None:
    bad = out.clone()
    bad[:, h] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("S", [128, 130])
def test_shared_mask_of_resident_heads_is_evaluated_once(target, S):
    """The GPT-2 shape of it: a fused QKV projection (rows resident in SBUF, Q prescaled), a
    boolean causal-and-padding mask [1, 1, S, S] made at run time, SDPA's where(mask, 0, -inf)."""
    g = torch.Generator().manual_seed(S)
    H, D, E = 4, 64, 96
    x = torch.randn(1, S, E, generator=g).to(torch.bfloat16)
    w = (torch.randn(E, 3 * H * D, generator=g) * E ** -0.5).to(torch.bfloat16)
    keep = torch.ones(S, S, dtype=torch.bool).tril()
    keep[:, S - 3:] = False                      # padded keys
    keep[5, :] = False                           # a row that sees no key: 0 in safe softmax
    keep = keep.view(1, 1, S, S)

    def fn(x, w, keep):
        q, k, v = (t.view(1, S, H, D).transpose(1, 2) for t in (x @ w).split(H * D, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    low = lower_and_run(fn, x, w, keep, target=target)
    assert any(NOTE in n and "added on TensorE" in n for n in _notes(low)), _notes(low)
    assert ".pbias0[" in low.dumps["program.txt"]
    ref = fn(x, w, keep)
    assert (ref[0, :, 5] == 0).all()
    assert_close(low.outputs[0], ref)
    _fails_when_a_head_is_dropped(low.outputs[0], ref, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_shared_additive_mask_is_divided_by_the_scale(dtype):
    """Q and K from HBM (no prescale): the bias tile holds bias / scale, the softmax applies
    the scale; a float mask with -inf entries (a row of -inf: 0 in SDPA's safe softmax)."""
    g = torch.Generator().manual_seed(21)
    H, S, D = 3, 129, 32
    q, k, v = (torch.randn(1, H, S, D, generator=g).to(dtype) for _ in range(3))
    m = torch.randn(1, 1, S, S, generator=g).to(dtype)
    m[0, 0, :, 100:] = float("-inf")
    m[0, 0, 7, :] = float("-inf")

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.25)

    low = lower_and_run(fn, q, k, v, m, target="trn3")
    pe = "added on TensorE" if dtype == torch.bfloat16 else "one add"   # bf16 values only
    assert any(NOTE in n and pe in n for n in _notes(low)), _notes(low)
    ref = fn(q, k, v, m)
    assert (ref[0, :, 7] == 0).all()
    assert_close(low.outputs[0], ref)
    _fails_when_a_head_is_dropped(low.outputs[0], ref, 1)


def test_per_head_mask_keeps_the_per_head_score():
    """A mask that differs per head is not hoisted, and still matches eager."""
    g = torch.Generator().manual_seed(22)
    H, S, D = 3, 100, 32
    q, k, v = (torch.randn(1, H, S, D, generator=g) for _ in range(3))
    m = torch.randn(1, H, S, S, generator=g)

    def fn(q, k, v, m):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + m, dim=-1) @ v

    low = lower_and_run(fn, q, k, v, m, target="trn3")
    assert not any(NOTE in n for n in _notes(low))
    assert_close(low.outputs[0], fn(q, k, v, m))
