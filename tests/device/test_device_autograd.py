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


def test_backward_runs_on_the_calling_thread_in_every_thread_that_uses_the_device():
    """A backward on the device's autograd worker thread can abort the interpreter at exit;
    each thread that runs a device op takes single-threaded backward instead."""
    import threading
    seen = {}

    def work():
        w = torch.randn(3).to("neuron").requires_grad_()
        (w * 2.0).sum().backward()
        seen["multithreading"] = torch.autograd.is_multithreading_enabled()
        seen["grad"] = w.grad.cpu()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["multithreading"] is False
    assert torch.equal(seen["grad"], torch.full((3,), 2.0))
    assert torch.autograd.is_multithreading_enabled() is False     # the importing thread


def test_attention_takes_the_fused_op_and_its_gradients_match():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    keep = torch.rand(16, 16) > 0.3
    keep[:, 0] = True
    for kwargs in ({"is_causal": True}, {"attn_mask": keep}):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        grads = torch.autograd.grad(ref.sum(), (q, k, v))
        dev = [t.detach().to("neuron").requires_grad_() for t in (q, k, v)]
        dkw = {n: a.to("neuron") if isinstance(a, torch.Tensor) else a for n, a in kwargs.items()}
        with neuron_compiler.profile() as prof:
            out = torch.nn.functional.scaled_dot_product_attention(*dev, **dkw)
            out.sum().backward()
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
        for t, g in zip(dev, grads):
            torch.testing.assert_close(t.grad.cpu(), g, rtol=1e-4, atol=1e-5)
        assert prof.to_dict()["fallback_nodes"] == 0
