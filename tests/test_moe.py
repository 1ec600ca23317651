"""A top-2 mixture-of-experts layer (router softmax, top-k, capacity dispatch by a running count,
per-expert matmuls, weighted combine) compiled with the neuron backend: forward and backward run
entirely on the device (every ATen compute node, so every matmul FLOP) and match eager.

The dispatch is the static-shape one a Trainium kernel uses (no data-dependent shapes): each
(token, choice) assignment gets a slot inside its expert from a running count of the one-hot
choices (cumsum), is scattered into an [experts x capacity, D] buffer (index_put), the experts
run as one batched matmul pair, and each assignment's row is gathered back (index) and weighted.
Capacity = tokens, so no assignment is dropped (top-2 picks two different experts per token).
"""
from __future__ import annotations

import torch

from neuron_compiler.testing import assert_close, assert_matches_eager, compile_for_neuron, run_on_device
from neuron_compiler.testing import assert_ran_on_device

T, D, H, E = 130, 64, 129, 4      # tokens cross the 128-partition edge, H the 128 one


class Top2MoE(torch.nn.Module):
    def __init__(self, d: int = D, h: int = H, experts: int = E, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.experts = experts
        self.router = torch.nn.Parameter(torch.randn(d, experts, generator=g) / d ** 0.5)
        self.w1 = torch.nn.Parameter(torch.randn(experts, d, h, generator=g) / d ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, h, d, generator=g) / h ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        n = self.experts
        # the router in fp32 (as Mixtral's): bf16 logits tie often, and eager's top-k breaks
        # ties in no documented order (the device keeps index order)
        probs = torch.softmax(x.float() @ self.router.float(), dim=-1)    # [T, E]
        w, idx = torch.topk(probs, 2, dim=-1)                             # [T, 2]
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        e = idx.reshape(-1)                                               # expert per assignment
        onehot = (e[:, None] == torch.arange(n)).to(x.dtype)              # [2T, E]
        slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1).to(torch.int64)  # slot in its expert
        row = e * t + slot                                                # row of [E * T, D]
        tok = torch.arange(t)[:, None].expand(t, 2).reshape(-1)           # token per assignment
        disp = x.new_zeros(n * t, d).index_put((row,), x[tok])
        hid = torch.nn.functional.silu(torch.bmm(disp.view(n, t, d), self.w1))
        y = torch.bmm(hid, self.w2).view(n * t, d)
        return (y[row] * w.reshape(-1, 1)).view(t, 2, d).sum(1)


def _x(dtype=torch.float32, seed=1):
    return torch.randn(T, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_moe_forward_matches_eager_on_the_device():
    model = Top2MoE()
    d = assert_matches_eager(model, _x())
    assert d["fallback_nodes"] == 0
    ops = {op for p in d["partitions"] for op in p["ops"]}
    assert {"aten.topk.default", "aten.bmm.default", "aten.index_put.default",
            "aten.cumsum.default"} <= ops, ops


def test_moe_forward_and_backward_run_on_the_device_and_match():
    model, ref = Top2MoE(), Top2MoE()
    x = _x()
    xr = x.clone().requires_grad_()
    ref(xr).square().sum().backward()
    torch._dynamo.reset()
    compiled = compile_for_neuron(model)
    xd = x.clone().requires_grad_()

    def step():
        compiled(xd).square().sum().backward()

    _, prof = run_on_device(step)
    d = assert_ran_on_device(prof, 1.0)
    assert {g["kind"] for g in d["graphs"]} >= {"forward", "backward"}
    assert d["fallback_nodes"] == 0, d["fallbacks"]
    assert_close(xd.grad, xr.grad, what="x.grad")
    for name, p in model.named_parameters():
        assert_close(p.grad, dict(ref.named_parameters())[name].grad, what=f"{name}.grad")


def test_moe_bf16_forward():
    model = Top2MoE().to(torch.bfloat16)
    d = assert_matches_eager(model, _x(torch.bfloat16, seed=2))
    assert d["fallback_nodes"] == 0
