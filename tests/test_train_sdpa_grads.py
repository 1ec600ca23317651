"""Training through scaled_dot_product_attention: the gradients match eager's.

torch's own decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` returns the
attention probabilities where the op returns the logsumexp its backward reads, so a training
graph decomposed with it gets silently wrong gradients
(``lowering.policy.flash_attention_for_cpu`` returns the true logsumexp). The loss here also reads the present key/value outputs, whose
tangents reach the backward laid out like the permuted forward outputs (a view the fake
propagation of the backward partition must follow: ``frontend.fake_values``)."""
from __future__ import annotations

import copy

import pytest
import torch

import neuron_compiler

transformers = pytest.importorskip("transformers")


def _loss(model, ids, with_cache: bool):
    out = model(input_ids=ids)
    loss = out.logits.float().pow(2).mean()
    if with_cache:
        for layer in out.past_key_values.layers:
            for t in (layer.keys, layer.values):
                loss = loss + t.float().pow(2).mean()
    return loss


@pytest.mark.parametrize("with_cache", [False, True], ids=["logits", "logits+cache"])
def test_gpt2_gradients_through_sdpa_match_eager(with_cache):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 16))
    _loss(ref, ids, with_cache).backward()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron", options={"sim_mode": "timing"})
    with neuron_compiler.profile() as prof:
        _loss(compiled, ids, with_cache).backward()
    d = prof.to_dict()
    # the attention, forward and backward (through the decompositions above), and every float
    # op ran on the device: what may fall back is integer position ops on the user's token ids
    allowed = {"aten.clamp.default", "aten.ge.Scalar", "aten.lt.Scalar", "aten.ne.Scalar"}
    assert {f["op"] for f in d["fallbacks"]} <= allowed, d["fallbacks"]
    assert d["device_nodes"] > 20 * d["fallback_nodes"], (d["device_nodes"], d["fallback_nodes"])
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-6, msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("mask", ["causal", "bool", "float", "none"])
def test_sdpa_backward_on_the_device(dtype, tol, mask):
    """SDPA's CPU flash backward through its decomposition (``backend``): q/k/v gradients from the
    simulator (functional mode) match eager's, over 130 queries and 140 keys (partial tiles), for
    a causal, a boolean and an additive mask and a scale; nothing falls back; a halved gradient
    fails the comparison. With dropout the op is not decomposed."""
    import torch.nn.functional as F
    from lowering.policy import flash_attention_for_cpu_backward
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 40, dtype=dtype) for n in (130, 140, 140))
    g = torch.randn(2, 3, 130, 40, dtype=dtype)
    kw = {"scale": 0.3}
    if mask == "causal":
        kw["is_causal"] = True
    elif mask == "bool":
        kw["attn_mask"] = torch.rand(130, 140) > 0.2
    elif mask == "float":
        kw["attn_mask"] = (torch.randn(130, 140) * 0.5).to(dtype)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    grads = []
    for fn in (torch.compile(f, backend="neuron"), f):
        torch._dynamo.reset()
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        with neuron_compiler.profile() as prof:
            (fn(qs, ks, vs) * g).sum().backward()
        grads.append((qs.grad, ks.grad, vs.grad, prof.to_dict()))
    d = grads[0][3]
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 0, d["fallbacks"]
    for name, a, b in zip(("dq", "dk", "dv"), grads[0][:3], grads[1][:3]):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * scale, msg=name)
    with pytest.raises(AssertionError):
        b = grads[1][0]
        torch.testing.assert_close((grads[0][0] * 0.5).float(), b.float(), rtol=tol,
                                   atol=tol * max(1.0, float(b.abs().max())))
    z = torch.zeros(1, 1, 4, 8)
    assert flash_attention_for_cpu_backward(z, z, z, z, z, z[..., 0], 0.1, False) is NotImplemented
