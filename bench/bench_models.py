"""Whole models, forward + backward, on trn2 and trn3: accuracy, device coverage, simulated time.

    python bench/bench_models.py

For the foundation issue's MLP (Linear(300, 520), GELU, Linear(520, 130), LayerNorm(130),
Softmax(-1) on a [200, 300] input) and a GPT-style block (batch 2, seq 64, d_model 128, 4 heads),
prints per target: max abs error of the output and of every gradient against eager, the share
of ATen compute nodes that ran on the device, simulated device time, roofline time and their
ratio, and the host<->device transfer time. Everything printed is measured in this run
(functional mode: the values come from the simulated programs).
"""
from __future__ import annotations

import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import neuron_compiler  # noqa: E402
from neuron_compiler.demo import GPTBlock  # noqa: E402


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(300, 520), nn.GELU(), nn.Linear(520, 130), nn.LayerNorm(130),
                         nn.Softmax(-1))


def measure(name: str, make, x: torch.Tensor, target: str) -> str:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make()
    ref_model = copy.deepcopy(model)
    cm = torch.compile(model, backend="neuron", options={"target": target})
    xc, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with neuron_compiler.profile() as prof:
        out = cm(xc)
        out.pow(2).sum().backward()
    ref = ref_model(xr)
    ref.pow(2).sum().backward()
    err = (out - ref).abs().max().item()
    gerr = max((a - b).abs().max().item() for a, b in
               zip([xc.grad, *[p.grad for p in model.parameters()]],
                   [xr.grad, *[p.grad for p in ref_model.parameters()]]))
    d = prof.to_dict()
    nodes = d["device_nodes"] + d["fallback_nodes"]
    sim, roof = d["simulated_time_us"], d["roofline_time_us"]
    return (f"{name:10s} {target:5s} {err:10.2e} {gerr:10.2e} {d['device_nodes']:4d}/{nodes:<4d} "
            f"{sim:10.2f} {roof:10.2f} {sim / roof:8.2f} {d['transfer_time_us']:9.2f}")


def main() -> None:
    torch.manual_seed(0)
    x_mlp = torch.randn(200, 300)
    x_gpt = torch.randn(2, 64, 128)
    print(f"{'model':10s} {'target':5s} {'out err':>10s} {'grad err':>10s} {'on device':>9s} "
          f"{'sim us':>10s} {'roof us':>10s} {'sim/roof':>8s} {'xfer us':>9s}")
    for target in ("trn2", "trn3"):
        print(measure("MLP", mlp, x_mlp, target))
    for target in ("trn2", "trn3"):
        print(measure("GPT block", GPTBlock, x_gpt, target))


if __name__ == "__main__":
    main()
