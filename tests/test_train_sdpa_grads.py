"""Training through scaled_dot_product_attention: the gradients match eager's.

torch's own decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` returns the
attention probabilities where the op returns the logsumexp its backward reads, so a training
graph decomposed with it gets silently wrong gradients (``backend._flash_attention_for_cpu``
returns the true logsumexp). The loss here also reads the present key/value outputs, whose
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
    # the forward attention (through the decomposition above) and every float op ran on the
    # device: what falls back is the flash backward op (no lowering) and the integer position
    # ops on the user's token ids
    allowed = {"aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
               "aten.clamp.default", "aten.ge.Scalar", "aten.lt.Scalar", "aten.ne.Scalar"}
    assert {f["op"] for f in d["fallbacks"]} <= allowed, d["fallbacks"]
    assert d["device_nodes"] > 20 * d["fallback_nodes"], (d["device_nodes"], d["fallback_nodes"])
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-6, msg=name)
