"""A transformers GPT-2 (tiny configuration, random weights) on the ``neuron`` device: every op
of its forward runs on the device in eager mode, and compiled it moves nothing over the host
link."""
import pytest
import torch

import neuron_compiler
from neuron_compiler.device import NeuronTensor

transformers = pytest.importorskip("transformers")


def _models():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                  n_positions=64, bos_token_id=0, eos_token_id=0,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    dev = transformers.GPT2LMHeadModel(cfg).eval()
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to("neuron")


def test_gpt2_forward_on_the_device_eager_and_compiled(fresh_dynamo):
    ref, dev = _models()
    ids = torch.randint(0, 128, (1, 12))
    idsd = ids.to("neuron")
    with torch.no_grad():
        expected = ref(ids).logits
        with neuron_compiler.profile() as prof:
            logits = dev(idsd).logits
        assert isinstance(logits, NeuronTensor)
        torch.testing.assert_close(logits.cpu(), expected, rtol=1e-5, atol=1e-5)
        d = prof.to_dict()
        assert d["fallback_nodes"] == 0 and d["device_nodes"] > 15
        ops = {op for p in d["partitions"] for op in p["ops"]}
        # attention as one fused op, as on the CPU (not the math composition)
        assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops
        assert "aten.bmm.default" not in ops
        assert d["simulated_time_us"] > 0
        compiled = torch.compile(dev, backend="neuron")
        compiled(idsd)
        with neuron_compiler.profile() as prof:
            logits = compiled(idsd).logits
    assert isinstance(logits, NeuronTensor)
    torch.testing.assert_close(logits.cpu(), expected, rtol=1e-5, atol=1e-5)
    d = prof.to_dict()
    assert d["transfer_time_us"] == 0.0
    assert not any(p["name"].startswith("eager_") for p in d["partitions"])
    # the same ATen graph as the model on the host (attention fused)
    ops = {op for p in d["partitions"] for op in p["ops"]}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops


def test_gpt2_compiled_training_step_on_the_device(fresh_dynamo):
    ref, dev = _models()
    ref.train()
    dev.train()
    ids = torch.randint(0, 128, (1, 12))
    expected = ref(ids, labels=ids).loss
    expected.backward()
    compiled = torch.compile(dev, backend="neuron")
    idsd = ids.to("neuron")
    loss = compiled(idsd, labels=idsd).loss
    loss.backward()
    assert isinstance(loss, NeuronTensor)
    torch.testing.assert_close(loss.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    grad = dev.transformer.wte.weight.grad
    assert isinstance(grad, NeuronTensor)
    torch.testing.assert_close(grad.cpu(), ref.transformer.wte.weight.grad, rtol=1e-4,
                               atol=1e-5)
