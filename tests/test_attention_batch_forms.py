"""Written-out attention whose operands are re-viewed into another batch form, against eager.

The attention fusion (``lowering/passes/attention.py``) and the copy absorption
(``lowering/passes/fusion.py``) re-view a kernel's batch axes: grouped-query keys and values
(``expand`` + ``reshape`` of the key/value heads) make an [N, Hkv, G] kernel out of [N*H]
products. Any expression that indexes the products' axes (a causal mask built from ``arange``,
a per-head bias built from the head index, an additive mask tensor) must follow the new form, or
be refused. These cases cover the head layouts (MHA, GQA, MQA) x the mask kinds, through
``torch.compile``, asserting that every node ran on the device and comparing every element.
"""
from __future__ import annotations

import math

import pytest
import torch

import neuron_compiler


def _attention(q, k, v, mask, kind: str):
    """``q`` [N, Sq, H, D] and ``k``, ``v`` [N, Sk, Hkv, D] as projections give them; heads
    moved in front as transformers does (``transpose(1, 2)``: strided operands)."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    N, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    G = H // Hkv
    # transformers' repeat_kv: expand a group axis, then merge it into the heads
    k = k[:, :, None].expand(N, Hkv, G, Sk, D).reshape(N, H, Sk, D)
    v = v[:, :, None].expand(N, Hkv, G, Sk, D).reshape(N, H, Sk, D)
    s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D)
    if kind == "causal":                      # a mask from query/key indices
        keep = torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + (Sk - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    elif kind == "causal_min":                # transformers' form: finfo.min, added, expanded
        keep = torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + (Sk - Sq)
        m = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        s = s + m[None, None].expand(N, 1, Sq, Sk)
    elif kind == "additive":                  # a mask tensor read by the score expression
        s = s + mask
    elif kind == "query_rows":                # one value per query row (stride 0 along keys)
        s = s + mask[..., :1]
    elif kind == "head_bias":                 # a bias from the head index (ALiBi-like)
        slopes = 2.0 ** (-(torch.arange(H, dtype=torch.float32) + 1) / H)
        dist = (torch.arange(Sk)[None, :] - torch.arange(Sq)[:, None]).float()
        s = s + slopes[:, None, None] * dist
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


CASES = [(4, 4), (4, 2), (4, 1), (6, 3)]


@pytest.mark.parametrize("kind", ["causal", "causal_min", "additive", "query_rows", "head_bias", "none"])
@pytest.mark.parametrize("heads,kv_heads", CASES)
def test_written_out_attention_matches_eager(heads, kv_heads, kind, fresh_dynamo):
    torch.manual_seed(heads * 10 + kv_heads)
    N, Sq, Sk, D = 2, 19, 19, 16
    q = torch.randn(N, Sq, heads, D)
    k, v = torch.randn(N, Sk, kv_heads, D), torch.randn(N, Sk, kv_heads, D)
    mask = torch.randn(N, 1, Sq, Sk)
    ref = _attention(q, k, v, mask, kind)
    with neuron_compiler.profile() as prof:
        out = torch.compile(_attention, backend="neuron")(q, k, v, mask, kind)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 5, d["fallbacks"]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_a_wrong_group_is_caught(fresh_dynamo):
    """The comparison above can fail: key heads paired with the wrong query group differ by
    far more than the tolerance."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 19, 4, 16), torch.randn(2, 19, 2, 16), torch.randn(2, 19, 2, 16)
    ref = _attention(q, k, v, None, "causal")
    wrong = _attention(q, k.flip(2), v.flip(2), None, "causal")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["additive", "causal_min"])
def test_batch_mask_broadcast_over_heads_is_one_attention_kernel(kind, fresh_dynamo, tmp_path):
    """A mask [N, 1, Sq, Sk] broadcast over the heads of [N*H]-batched products (transformers at
    batch > 1): its stride-0 head axis has no single stride over N*H, so the products and the
    kernel take the [N, H] form; the whole attention is one ATTENTION kernel (GPT-2 small at
    batch 2 ran it as six kernels through HBM)."""
    torch.manual_seed(1)
    N, Sq, Sk, D, H = 2, 19, 19, 16, 4
    q, k, v = torch.randn(N, Sq, H, D), torch.randn(N, Sk, H, D), torch.randn(N, Sk, H, D)
    mask = torch.randn(N, 1, Sq, Sk)
    ref = _attention(q, k, v, mask, kind)
    c = torch.compile(_attention, backend="neuron", options={"dump_dir": str(tmp_path)})
    with neuron_compiler.profile() as prof:
        out = c(q, k, v, mask, kind)
    assert prof.to_dict()["fallback_nodes"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    fused = [p.read_text() for p in tmp_path.rglob("ir_post_fusion.txt")]
    assert sum(t.count("= attention[") for t in fused) == 1, fused


def test_wide_values_stay_separate_kernels_on_the_device(fresh_dynamo, tmp_path):
    """softmax(x @ W1) @ W2 with W2 768 wide has attention's shape, but an ATTENTION kernel's
    output rows take one PSUM bank (512 fp32): the fusion leaves it as products and a softmax,
    all on the device (it used to form the kernel and lose the whole partition to eager)."""
    torch.manual_seed(2)
    x, w1, w2 = torch.randn(3, 200), torch.randn(200, 300), torch.randn(300, 768)

    def f(x, w1, w2):
        return torch.softmax(x @ w1, -1) @ w2
    c = torch.compile(f, backend="neuron", options={"dump_dir": str(tmp_path)})
    with neuron_compiler.profile() as prof:
        out = c(x, w1, w2)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] >= 3, d["fallbacks"]
    torch.testing.assert_close(out, f(x, w1, w2), rtol=1e-4, atol=1e-4)
    fused = "".join(p.read_text() for p in tmp_path.rglob("ir_post_fusion.txt"))
    assert "= attention[" not in fused and "value width 768 is over 512" in fused
