"""The ``neuron`` device as torch sees it: moving tensors, factories, printing, views, copies."""
import pytest
import torch

import neuron_compiler
from neuron_compiler.device import NeuronTensor


def test_to_and_back_keeps_values_and_reports_the_device():
    x = torch.randn(5, 7)
    xd = x.to("neuron")
    assert isinstance(xd, NeuronTensor) and xd.device == torch.device("neuron", 0)
    assert xd.is_neuron and str(xd.device) == "neuron:0"
    back = xd.cpu()
    assert type(back) is torch.Tensor and back.device.type == "cpu"
    assert torch.equal(back, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_dtypes_survive_the_round_trip(dtype):
    x = (torch.randn(4, 3) * 10).to(dtype)
    xd = x.to("neuron")
    assert xd.dtype == dtype
    assert torch.equal(xd.cpu(), x)


def test_device_module_and_tensor_methods():
    assert torch.neuron is neuron_compiler.device
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.randn(2).neuron().device.type == "neuron"


def test_factories_build_device_tensors():
    z = torch.zeros(2, 3, device="neuron")
    o = torch.ones(4, device="neuron", dtype=torch.bfloat16)
    f = torch.full((2, 2), 3.5, device="neuron")
    a = torch.arange(1, 9, 2, device="neuron")
    e = torch.empty(3, 4, device="neuron")
    t = torch.tensor([[1.0, 2.0]], device="neuron")
    for d in (z, o, f, a, e, t):
        assert isinstance(d, NeuronTensor) and d.device.type == "neuron"
    assert torch.equal(z.cpu(), torch.zeros(2, 3))
    assert torch.equal(o.cpu(), torch.ones(4, dtype=torch.bfloat16))
    assert torch.equal(f.cpu(), torch.full((2, 2), 3.5))
    assert torch.equal(a.cpu(), torch.tensor([1, 3, 5, 7]))
    assert e.shape == (3, 4)
    assert torch.equal(t.cpu(), torch.tensor([[1.0, 2.0]]))


def test_random_factories_follow_the_cpu_generator():
    torch.manual_seed(7)
    a = torch.randn(6, device="neuron")
    torch.manual_seed(7)
    assert torch.equal(a.cpu(), torch.randn(6))


def test_printing_shows_the_device_and_values():
    text = repr(torch.tensor([1.5, -2.0]).to("neuron"))
    assert text == "tensor([ 1.5000, -2.0000], device='neuron:0')"
    text = repr(torch.ones(2, dtype=torch.bfloat16, device="neuron").requires_grad_())
    assert text == "tensor([1., 1.], device='neuron:0', dtype=torch.bfloat16, requires_grad=True)"


def test_views_alias_their_base():
    base = torch.zeros(4, 6, device="neuron")
    col = base.t()[2]                  # a view of a view
    assert isinstance(col, NeuronTensor) and col.shape == (4,)
    col.fill_(5.0)                     # in place, through the view
    expected = torch.zeros(4, 6)
    expected[:, 2] = 5.0
    assert torch.equal(base.cpu(), expected)


def test_user_copies_are_reported_apart():
    x = torch.randn(64, 32)
    with neuron_compiler.profile() as prof:
        xd = x.to("neuron")
        xd.cpu()
        xd[0, 0].item()
    d = prof.to_dict()
    assert d["user_copies"]["to_device"]["count"] == 1
    assert d["user_copies"]["to_device"]["bytes"] == 64 * 32 * 4
    assert d["user_copies"]["to_device"]["time_us"] > 0
    assert d["user_copies"]["to_host"]["count"] == 2
    assert d["user_copies"]["to_host"]["bytes"] == 64 * 32 * 4 + 4
    assert d["transfer_time_us"] == pytest.approx(
        sum(u["time_us"] for u in d["user_copies"].values()))
    assert d["transfer_time_us"] > 0
    assert "user copies" in prof.summary()


def test_resize_and_set_are_refused_with_the_op_named():
    xd = torch.zeros(3, device="neuron")
    with pytest.raises(RuntimeError, match="resize_.*cannot be resized"):
        xd.resize_(5)
    with pytest.raises(RuntimeError, match="set_.*cannot be re-pointed"):
        xd.set_(torch.zeros(3, device="neuron"))


def test_registering_the_device_keeps_pin_memory_and_data_loaders_working():
    x = torch.randn(4, 2)
    assert torch.equal(x.pin_memory(), x)
    loader = torch.utils.data.DataLoader(list(x), batch_size=2, pin_memory=True)
    assert [tuple(b.shape) for b in loader] == [(2, 2), (2, 2)]


def test_inference_mode_tensors_copy_back_to_the_host():
    x = torch.randn(3, 4)
    with torch.inference_mode():
        y = x.to("neuron") * 2.0
        assert isinstance(y, NeuronTensor) and y.is_inference()
        assert isinstance(y.reshape(4, 3), NeuronTensor)
    back = y.cpu()
    assert type(back) is torch.Tensor and back.device.type == "cpu"
    assert torch.equal(back, x * 2.0)


def test_inference_mode_ops_and_compiled_calls_move_nothing(fresh_dynamo):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    with torch.inference_mode():
        x = torch.randn(8, 16).to("neuron")
        compiled(x)
        (x * 2.0).sum()
        with neuron_compiler.profile() as prof:
            y = compiled(x)
            z = (x * 2.0).sum()
    assert isinstance(y, NeuronTensor) and isinstance(z, NeuronTensor)
    d = prof.to_dict()
    assert d["simulated_time_us"] > 0
    assert d["transfer_time_us"] == 0.0


def test_allocations_like_a_device_tensor_stay_on_the_device_without_fallback():
    import warnings
    xd = torch.ones(2, 3, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = [torch.empty_like(xd), xd.new_empty((4,)), xd.new_empty_strided((2, 2), (1, 2))]
    assert all(isinstance(t, NeuronTensor) for t in made)
    assert [tuple(t.shape) for t in made] == [(2, 3), (4,), (2, 2)]
    assert made[2].stride() == (1, 2)
