"""A tiny transformers Llama (grouped-query attention) generates greedily on the ``neuron``
device in eager mode: every op runs through the lowering or, where the lowering refuses it,
on the CPU with its reason listed; the tokens equal eager's on the CPU."""
import warnings

import pytest
import torch

import neuron_compiler

transformers = pytest.importorskip("transformers")


def test_tiny_llama_generates_on_the_device_with_eager_tokens():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                                   max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    dev = transformers.LlamaForCausalLM(cfg).eval()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("neuron")
    ids = torch.randint(1, 500, (1, 6))
    with torch.no_grad():
        expected = ref.generate(ids, max_new_tokens=6, do_sample=False)
    with warnings.catch_warnings(record=True), torch.no_grad(), neuron_compiler.profile() as prof:
        warnings.simplefilter("always")
        out = dev.generate(ids.to("neuron"), max_new_tokens=6, do_sample=False)
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), expected), (out.cpu(), expected)
    d = prof.to_dict()
    assert d["simulated_time_us"] > 0 and d["device_nodes"] > 0
    for f in d["fallbacks"]:          # every op that ran on the CPU says why
        assert f["reason"] and str(f["op"]) in f["reason"], f
