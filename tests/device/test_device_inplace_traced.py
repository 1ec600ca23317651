"""In-place updates inside compiled code over device tensors reach the traced graph: a tensor
that a factory creates inside the compiled function (``device=x.device``) and an op then updates
in place (transformers' lazily created static KV cache) holds the update, in the output and in
the Python state, as on the CPU; and a GPT-2 on the device with its forward compiled generates
eager's tokens with a static cache."""
import warnings

import pytest
import torch

import neuron_compiler  # noqa: F401  (registers the device)

transformers = pytest.importorskip("transformers")


class _State:
    def __init__(self):
        self.k = None


def _step(state, x, pos):
    if state.k is None:
        state.k = torch.zeros(6, 4, device=x.device, dtype=x.dtype)
    state.k.index_copy_(0, pos, x)
    return state.k * 2.0


def test_a_factory_tensor_updated_in_place_inside_compiled_code(fresh_dynamo):
    results = {}
    for dev in ("cpu", "neuron"):
        torch._dynamo.reset()
        state = _State()
        f = torch.compile(_step, backend="neuron")
        outs = [f(state, torch.full((2, 4), 3.0).to(dev), torch.tensor([0, 1]).to(dev)).cpu(),
                f(state, torch.full((1, 4), 5.0).to(dev), torch.tensor([2]).to(dev)).cpu()]
        results[dev] = (outs, state.k.cpu())
    assert results["neuron"][1].device.type == "cpu"
    for a, b in zip(results["neuron"][0], results["cpu"][0]):
        assert torch.equal(a, b), (a, b)
    assert torch.equal(results["neuron"][1], results["cpu"][1])
    assert results["cpu"][1][:3, 0].tolist() == [3.0, 3.0, 5.0]      # the update is there


def test_gpt2_on_the_device_compiled_generates_eager_tokens_with_a_static_cache(fresh_dynamo):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    dev = transformers.GPT2LMHeadModel(cfg).eval()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("neuron")
    dev.forward = torch.compile(dev.forward, backend="neuron")
    ids = torch.randint(1, 1000, (1, 8))
    kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static",
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want = ref.generate(ids, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = dev.generate(ids.to("neuron"), **kw)
    assert out.sequences.device.type == "neuron"
    assert torch.equal(out.sequences.cpu(), want.sequences), (out.sequences.cpu(), want.sequences)
    for step, (got, exp) in enumerate(zip(out.logits, want.logits)):   # every step's logits
        torch.testing.assert_close(got.cpu(), exp, atol=1e-4, rtol=1e-4, msg=f"step {step}")
