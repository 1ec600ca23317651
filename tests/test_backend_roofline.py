"""The profile's roofline is the physical floor of each program (compulsory bytes, FLOPs,
transcendentals), with the program's actual HBM traffic beside it as traffic / compulsory."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device
from runtime_sim.targets import get_target


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _hbm_share(target: str) -> float:
    t = get_target(target)
    return t.hbm_bytes_per_ns / t.cores_per_chip          # bytes per ns of one core


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_layer_norm_floor_is_its_compulsory_bytes(target):
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    w, b = torch.randn(512, dtype=torch.bfloat16), torch.randn(512, dtype=torch.bfloat16)
    fn = lambda x, w, b: F.layer_norm(x, (512,), w, b)   # noqa: E731
    f = compile_for_neuron(fn, options={"target": target, "sim_mode": "timing"})
    with torch.no_grad():
        out, prof = run_on_device(f, x, w, b)
    d = assert_ran_on_device(prof)
    (p,) = d["partitions"]
    compulsory = nbytes(x, w, b, out)                     # each input read once, output written once
    assert p["compulsory_hbm_bytes"] == compulsory
    assert p["roofline_bound"] == "hbm"
    assert p["roofline_time_per_call_us"] == pytest.approx(compulsory / _hbm_share(target) / 1e3)
    assert p["traffic_ratio"] == pytest.approx(p["hbm_bytes"] / compulsory)
    assert p["traffic_ratio"] >= 1.0
    assert p["roofline_time_per_call_us"] <= p["simulated_time_per_call_us"]
    assert d["roofline_time_us"] == pytest.approx(p["roofline_time_us"])
    text = prof.summary()
    assert "traffic/comp" in text and f"{p['traffic_ratio']:.2f}x" in text


def test_matmul_floor_is_its_flops():
    a, b = torch.randn(256, 512), torch.randn(512, 512)
    f = compile_for_neuron(torch.mm, options={"sim_mode": "timing"})
    with torch.no_grad():
        _, prof = run_on_device(f, a, b)
    (p,) = assert_ran_on_device(prof)["partitions"]
    t = get_target("trn2")
    fp32_peak = 128 * 128 * 2 * t.tensor_clock_ghz / 4       # FLOP/ns, fp32 at a quarter rate
    flops = 2 * 256 * 512 * 512
    assert p["flops"] == flops and p["roofline_bound"] == "tensor"
    assert p["roofline_time_per_call_us"] == pytest.approx(flops / fp32_peak / 1e3)


def test_transcendental_chain_floor_is_scalare_bound():
    """gelu -> tanh -> exp: three ScalarE functions per element outweigh the 4 bytes per element
    of HBM traffic, so the floor is ScalarE's, not HBM's."""
    x = torch.randn(128, 2048, dtype=torch.bfloat16)
    fn = lambda x: torch.exp(torch.tanh(F.gelu(x)))        # noqa: E731
    f = compile_for_neuron(fn, options={"sim_mode": "timing"})
    with torch.no_grad():
        out, prof = run_on_device(f, x)
    (p,) = assert_ran_on_device(prof)["partitions"]
    t = get_target("trn2")
    scalar_floor_us = 3 * x.numel() / (128 * t.scalar_clock_ghz) / 1e3   # one element per lane-cycle
    hbm_floor_us = nbytes(x, out) / _hbm_share("trn2") / 1e3
    assert scalar_floor_us > hbm_floor_us
    assert p["roofline_bound"] == "scalar"
    assert p["roofline_time_per_call_us"] >= scalar_floor_us * (1 - 1e-9)
    assert p["roofline_time_per_call_us"] <= p["simulated_time_per_call_us"]
