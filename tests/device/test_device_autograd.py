"""Autograd on ``neuron`` tensors: the backward's ATen ops run on the device too."""
import torch

import neuron_compiler
from neuron_compiler.device import NeuronTensor


def test_gradients_of_a_matmul_chain_match_eager():
    torch.manual_seed(2)
    x, w = torch.randn(24, 40), torch.randn(40, 16, requires_grad=True)
    wd = w.detach().to("neuron").requires_grad_()
    with neuron_compiler.profile() as prof:
        loss = (torch.tanh(x.to("neuron") @ wd) * 2.0).sum()
        loss.backward()
    (torch.tanh(x @ w) * 2.0).sum().backward()
    assert isinstance(wd.grad, NeuronTensor) and wd.grad.device.type == "neuron"
    torch.testing.assert_close(wd.grad.cpu(), w.grad, rtol=1e-5, atol=1e-4)
    d = prof.to_dict()
    ops = {op for p in d["partitions"] for op in p["ops"]}
    assert "aten.mm.default" in ops and len(d["partitions"]) >= 5   # forward and backward
    assert d["fallback_nodes"] == 0


def test_module_on_the_device_trains_one_step():
    torch.manual_seed(3)
    ref = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 3))
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    assert all(isinstance(p, NeuronTensor) and isinstance(p, torch.nn.Parameter)
               for p in dev.parameters())
    x = torch.randn(9, 12)
    for model, inp in ((ref, x), (dev, x.to("neuron"))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(inp).pow(2).mean().backward()
        opt.step()
    for (name, p), q in zip(dev.named_parameters(), ref.parameters()):
        assert p.device.type == "neuron", name
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5)
