"""``device_share.by_flops``: the FLOPs of the ATen ops that ran on the device over the model's,
counted with ``torch.utils.flop_counter`` (``neuron_compiler/eval/flops.py``), never clipped.

A float64 matmul falls back (the device has no float64), so two equal matmuls of which one is
float64 put exactly half the model's FLOPs on the host; an all-float32 model puts all of them
on the device, in both sim modes.
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from neuron_compiler.eval.flops import count_host_flops, flop_share
from neuron_compiler.eval.measure import EvalConfig, evaluate
from neuron_compiler.eval.zoo import LoadedModel

N = 64
MM_FLOPS = 2 * N * N * N


class TwoMatmuls(torch.nn.Module):
    def forward(self, a, b, c, d):
        return a @ b, (c @ d) * 2


def _inputs(second_dtype: torch.dtype) -> tuple:
    torch.manual_seed(0)
    return (torch.randn(N, N), torch.randn(N, N), torch.randn(N, N, dtype=second_dtype),
            torch.randn(N, N, dtype=second_dtype))


def _evaluate(second_dtype: torch.dtype, sim_mode: str = "functional") -> dict:
    loaded = LoadedModel("test:two_matmuls", TwoMatmuls(), _inputs(second_dtype))
    return evaluate(loaded, EvalConfig(targets=["trn2"], warmup=1, iters=1, sim_mode=sim_mode))


@pytest.mark.parametrize("sim_mode", ["functional", "timing"])
def test_half_the_flops_fall_back(sim_mode):
    share = _evaluate(torch.float64, sim_mode)["targets"]["trn2"]["device_share"]
    assert share["model_flops"] == 2 * MM_FLOPS
    assert share["host_flops"] == MM_FLOPS
    assert share["host_flops_by_op"] == {"aten.mm.default": MM_FLOPS}
    assert share["by_flops"] == pytest.approx(0.5)
    assert share["device_nodes"] >= 1 and share["fallback_nodes"] >= 1


def test_all_on_device_is_exactly_one_and_program_work_is_separate():
    share = _evaluate(torch.float32)["targets"]["trn2"]["device_share"]
    assert share["host_flops"] == 0 and share["host_flops_by_op"] == {}
    assert share["by_flops"] == 1.0
    assert share["device_flops"] == share["model_flops"] == 2 * MM_FLOPS
    # the simulated programs' own count is reported beside the share, not mixed into it
    assert share["program_flops"] >= share["device_flops"]
    assert share["program_extra_flops"] == share["program_flops"] - share["device_flops"]


def test_share_is_not_clipped():
    """More host FLOPs than the model's (a decomposition that adds work) gives a negative
    device share, shown as it is."""
    class Fake:
        fallback = {"aten.mm.default": 30}
        other_host = 0
        host = 30
    out = flop_share(20, Fake(), 0)   # type: ignore[arg-type]
    assert out["by_flops"] == pytest.approx(-0.5)
    assert flop_share(0, Fake(), 0)["by_flops"] is None   # type: ignore[arg-type]


def test_counter_does_not_recompile_or_change_outputs():
    model = TwoMatmuls()
    args = _inputs(torch.float64)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        first = compiled(*args)
        with neuron_compiler.profile() as prof:
            counter = count_host_flops(lambda: compiled(*args))
            again = compiled(*args)
    assert prof.to_dict()["compiles"] == 0
    for x, y in zip(first, again):
        torch.testing.assert_close(x, y)
    assert dict(counter.fallback) == {"aten.mm.default": MM_FLOPS}
    assert counter.device_eager == 0 and counter.other_host == 0


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_cpu_attention_counts_its_flops():
    """Eager SDPA on the CPU dispatches a kernel torch's registry has no formula for; without
    ``CPU_FORMULAS`` the model would count 0 FLOPs and the share would be undefined."""
    b, h, s, d = 1, 2, 128, 64
    torch.manual_seed(0)
    args = tuple(torch.randn(b, h, s, d) for _ in range(3))
    report = evaluate(LoadedModel("test:sdpa", Attention(), args),
                      EvalConfig(targets=["trn2"], warmup=1, iters=1))
    share = report["targets"]["trn2"]["device_share"]
    assert report["model"]["flops"] == share["model_flops"] == 4 * b * h * s * s * d
    assert share["host_flops"] == 0 and share["by_flops"] == 1.0
