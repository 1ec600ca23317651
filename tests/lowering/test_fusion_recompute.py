"""Fusion rule 1's bound on recomputation (``passes/fusion.py``): a pointwise producer built
from loaded tensors, with several operations, whose readers together compute many times more
elements than it writes (a packed-sequence attention mask built once and broadcast over every
head of every layer, as transformers builds GPT-2's with ``use_cache=False``) stays one kernel,
and the attention kernels load it; a mask of indices only (causal) is still inlined, so the
attention tiler keeps recognising it. Checked against eager, with the device doing all of it."""
from __future__ import annotations

import torch

from lowering_helpers import assert_close, lower_and_run


def _kernels(low) -> list[str]:
    return [ln.split("= ", 1)[1].split("[", 1)[0] for ln in low.dumps["ir_post_fusion.txt"].splitlines()
            if " = " in ln]


def _two_layers(q, k, v, pos):
    """Two attention layers sharing one mask: causal and same packed sequence (position ids
    restart at 0 where a new sequence starts)."""
    n = pos.shape[-1]
    seq = torch.cumsum(torch.diff(pos, prepend=pos[:1] + 1) != 1, 0)
    i = torch.arange(n)
    keep = (i[None, :] <= i[:, None]) & (seq[:, None] == seq[None, :])
    mask = torch.where(keep, 0.0, float("-inf"))
    h = torch.softmax(q @ k.transpose(-1, -2) * 0.125 + mask, dim=-1) @ v
    return torch.softmax(h @ k.transpose(-1, -2) * 0.125 + mask, dim=-1) @ v


def test_a_loaded_mask_shared_by_every_head_and_layer_is_computed_once():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 8, 128, 64, generator=g) for _ in range(3))
    pos = torch.cat([torch.arange(50), torch.arange(78)])
    low = lower_and_run(_two_layers, q, k, v, pos)
    kinds = _kernels(low)
    assert kinds.count("attention") == 2, kinds
    ref = _two_layers(q, k, v, pos)
    assert_close(low.outputs[0], ref)
    # the mask is written once by its own kernel, then read by both attention kernels
    lines = [ln for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]
    mask = [ln.split("[", 1)[0] for ln in lines if "[128, 128]" in ln.split(" = ")[0] and "= pointwise" in ln]
    assert len(mask) == 1, lines
    att = [ln for ln in lines if "= attention" in ln]
    assert all(mask[0] + "[" in ln.split("](", 1)[1] for ln in att), att
    # the tolerance sees a wrong mask: the second sequence's first row allowed to see the first
    wrong = _two_layers(q, k, v, torch.arange(128))
    try:
        assert_close(low.outputs[0], wrong)
    except AssertionError:
        pass
    else:
        raise AssertionError("a program with the packed-sequence mask dropped would pass")


def test_an_index_only_mask_is_still_inlined_into_the_attention():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 12, 128, 64, generator=g) for _ in range(3))
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    low = lower_and_run(fn, q, k, v)
    assert _kernels(low) == ["attention"]
    assert_close(low.outputs[0], fn(q, k, v))
