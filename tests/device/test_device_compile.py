"""``torch.compile`` over ``neuron`` tensors: inputs, outputs, parameters and buffers stay on
the device; the steady state moves nothing over the host link."""
import torch

import neuron_compiler
from neuron_compiler.device import NeuronTensor


def _sequential():
    torch.manual_seed(4)
    return torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.GELU(),
                               torch.nn.Linear(160, 48))


def _steady(compiled, x):
    with torch.no_grad():
        compiled(x)                                    # warm-up: compile, parameters sent
        with neuron_compiler.profile() as prof:
            y = compiled(x)
    return y, prof.to_dict()


def test_done_when_compiled_sequential_on_the_device_moves_nothing(fresh_dynamo):
    x = torch.randn(20, 64)
    host_model = _sequential()
    with torch.no_grad():
        expected = host_model(x)
    on_host = _steady(torch.compile(host_model, backend="neuron"), x)[1]
    assert on_host["transfer_time_us"] > 0             # the host path pays: input in, output out
    model = _sequential().to("neuron")
    y, d = _steady(torch.compile(model, backend="neuron"), x.to("neuron"))
    assert isinstance(y, NeuronTensor) and y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert d["transfer_time_us"] == 0.0
    assert d["steady_state"]["transfer_time_us"] == 0.0
    assert d["steady_state"]["graph_calls"] == 1
    assert d["simulated_time_us"] > 0 and d["fallback_nodes"] == 0
    assert d["user_copies"]["to_host"]["count"] == 0
    assert not any(p["name"].startswith("eager_") for p in d["partitions"])
    # the same program as on the host: device parameters may take the program's own layouts
    assert d["simulated_time_us"] == on_host["simulated_time_us"]


def test_a_copy_back_is_the_users_and_is_reported(fresh_dynamo):
    model = _sequential().to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(20, 64).to("neuron")
    _steady(compiled, x)
    with torch.no_grad(), neuron_compiler.profile() as prof:
        compiled(x).cpu()
    d = prof.to_dict()
    assert d["user_copies"]["to_host"] == {"count": 1, "bytes": 20 * 48 * 4,
                                           "time_us": d["transfer_time_us"]}
    assert d["transfer_time_us"] > 0


class _StaticCache(torch.nn.Module):
    """A projection written into a static cache buffer in place (as a KV cache is)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.register_buffer("cache", torch.zeros(1, 12, 32))

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, self.proj(x))
        return (self.cache * 2.0).sum(-1)


def test_buffer_updated_in_place_stays_on_the_device(fresh_dynamo):
    torch.manual_seed(5)
    ref = _StaticCache()
    dev = _StaticCache()
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    compiled = torch.compile(dev, backend="neuron")
    with torch.no_grad():
        for step in range(3):
            x, pos = torch.randn(1, 1, 32), torch.tensor([step])
            expected = ref(x, pos)
            xd, posd = x.to("neuron"), pos.to("neuron")
            with neuron_compiler.profile() as prof:
                y = compiled(xd, posd)
            d = prof.to_dict()
            assert isinstance(y, NeuronTensor)
            torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-5)
            assert d["transfer_time_us"] == 0.0, d
            assert d["fallbacks"] == []
    assert isinstance(dev.cache, NeuronTensor)
    torch.testing.assert_close(dev.cache.cpu(), ref.cache, rtol=1e-5, atol=1e-6)


def test_compiled_training_step_keeps_gradients_on_the_device(fresh_dynamo):
    model = _sequential()
    ref = _sequential()
    x = torch.randn(20, 64)
    ref(x).square().mean().backward()
    model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    xd = x.to("neuron")
    compiled(xd).square().mean().backward()          # warm-up
    model.zero_grad()
    with neuron_compiler.profile() as prof:
        compiled(xd).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert isinstance(p.grad, NeuronTensor)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)
    d = prof.to_dict()
    assert d["transfer_time_us"] == 0.0
    kinds = {g["name"].split("_")[0] for g in d["graphs"]}
    assert {"forward", "backward"} <= kinds


def test_factories_on_the_inputs_device_inside_compiled_code(fresh_dynamo):
    def f(x):
        pos = torch.arange(x.shape[0], device=x.device, dtype=x.dtype)
        return x * 2 + pos[:, None], torch.ones(3, device=x.device)

    x = torch.randn(5, 4)
    y, ones = torch.compile(f, backend="neuron")(x.to("neuron"))
    assert isinstance(y, NeuronTensor) and isinstance(ones, NeuronTensor)
    torch.testing.assert_close(y.cpu(), f(x)[0])
    assert torch.equal(ones.cpu(), torch.ones(3))
