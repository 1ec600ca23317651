"""``python -m neuron_compiler.demo``: compile a small GPT-style block for trn2 and trn3.

Prints the accuracy against eager PyTorch, the simulated device time per target, and the
fallback table. The block: pre-LayerNorm causal self-attention written with matmul + softmax
(batch 2, seq 64, d_model 128, 4 heads) and a GELU MLP.

Invariants
- The model is seeded: two runs print the same accuracy and simulated times.
- It asserts that the compiled model actually ran (at least one device partition); a demo that
  silently ran eager would be a lie.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from neuron_compiler.profile import profile
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron


class GPTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)); x + mlp(ln2(x)), causal attention."""

    def __init__(self, d_model: int = 128, n_heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h, dh = self.n_heads, c // self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q = q.view(b, t, h, dh).transpose(1, 2)
        k = k.view(b, t, h, dh).transpose(1, 2)
        v = v.view(b, t, h, dh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def run(targets: Sequence[str] = ("trn2", "trn3"), batch: int = 2, seq: int = 64,
        d_model: int = 128, heads: int = 4) -> int:
    torch.manual_seed(0)
    model = GPTBlock(d_model, heads).eval()
    x = torch.randn(batch, seq, d_model)
    with torch.no_grad():
        expected = model(x)
    print(f"GPT-style block: batch {batch}, seq {seq}, d_model {d_model}, {heads} heads, fp32")
    last = None
    for target in targets:
        torch._dynamo.reset()
        compiled = compile_for_neuron(model, options={"target": target})
        t0 = time.perf_counter()
        with torch.no_grad(), profile() as prof:
            out = compiled(x)
        wall = time.perf_counter() - t0
        d = assert_ran_on_device(prof, min_device_fraction=0.0)
        err = (out - expected).abs().max().item()
        print(f"\n[{target}] max abs error vs eager: {err:.3e}   "
              f"simulated device time: {d['simulated_time_us']:.2f} us "
              f"(roofline {d['roofline_time_us']:.2f} us)   transfer: "
              f"{d['transfer_time_us']:.2f} us   nodes on device: {d['device_nodes']}/"
              f"{d['device_nodes'] + d['fallback_nodes']}   (host wall {wall:.1f} s)")
        last = prof
    if last is not None:
        print("\n" + last.summary())
        if not last.to_dict()["fallbacks"]:
            print("\nFallback table: empty (every ATen compute node ran on the device)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neuron_compiler.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="trn2,trn3",
                        help="comma-separated targets (default: trn2,trn3)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args(list(argv) if argv is not None else None)
    return run(tuple(t for t in args.targets.split(",") if t), args.batch, args.seq,
               args.d_model, args.heads)


if __name__ == "__main__":
    sys.exit(main())
