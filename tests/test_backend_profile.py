"""neuron_compiler.profile(): keys and types, nesting, late opening, targets, Chrome trace."""
from __future__ import annotations

import json

import pytest
import torch

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1) @ w2


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(16, 32, generator=g), torch.randn(32, 64, generator=g),
            torch.randn(64, 8, generator=g))


PARTITION_KEYS = {
    "name": str, "ops": list, "simulated_time_us": float, "roofline_time_us": float,
    "instructions": int, "flops": int, "hbm_bytes": int, "sbuf_peak_bytes": int,
    "psum_peak_bytes": int, "engine_busy": dict, "calls": int, "transfer_time_us": float,
}


def test_profile_keys_and_types():
    f = compile_for_neuron(mlp)
    with torch.no_grad():
        out, prof = run_on_device(f, *_inputs())
    torch.testing.assert_close(out, mlp(*_inputs()), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof)
    json.dumps(d)  # JSON-ready
    assert d["target"] == "trn2"
    for key in ("simulated_time_us", "fallback_time_us", "transfer_time_us"):
        assert isinstance(d[key], float) and d[key] >= 0.0, key
    assert d["simulated_time_us"] > 0.0 and d["transfer_time_us"] > 0.0
    assert isinstance(d["device_nodes"], int) and isinstance(d["fallback_nodes"], int)
    assert d["device_nodes"] == 3 and d["fallback_nodes"] == 0     # mm, relu, mm
    assert d["fallbacks"] == []
    assert len(d["partitions"]) == 1
    part = d["partitions"][0]
    for key, typ in PARTITION_KEYS.items():
        assert isinstance(part[key], typ), (key, part[key])
    assert part["instructions"] > 0 and part["flops"] >= 2 * 16 * 32 * 64
    assert part["engine_busy"] and all(0.0 <= v <= 1.0 for v in part["engine_busy"].values())
    assert part["simulated_time_us"] == pytest.approx(d["simulated_time_us"])
    text = prof.summary()
    assert "trn2" in text and "simulated device time" in text and part["name"] in text


def test_profile_opened_after_compilation_sees_compile_time_facts():
    f = compile_for_neuron(mlp)
    with torch.no_grad():
        f(*_inputs())                       # compiled outside any profile
        with neuron_compiler.profile() as prof:
            f(*_inputs())
            f(*_inputs())
    d = prof.to_dict()
    assert d["compiles"] == 0
    assert d["device_nodes"] == 3            # counted once per graph, not per call
    assert d["partitions"][0]["calls"] == 2
    assert d["graphs"][0]["calls"] == 2


def test_nested_profiles_both_record():
    f = compile_for_neuron(mlp)
    with torch.no_grad(), neuron_compiler.profile() as outer:
        f(*_inputs())
        with neuron_compiler.profile() as inner:
            f(*_inputs())
    assert outer.to_dict()["partitions"][0]["calls"] == 2
    assert inner.to_dict()["partitions"][0]["calls"] == 1
    assert outer.to_dict()["compiles"] >= 1 and inner.to_dict()["compiles"] == 0


def test_empty_profile():
    with neuron_compiler.profile() as prof:
        pass
    d = prof.to_dict()
    assert d["target"] is None and d["partitions"] == [] and d["simulated_time_us"] == 0.0
    assert "neuron profile" in prof.summary()


def test_targets_give_different_simulated_times():
    times = {}
    for target in ("trn2", "trn3"):
        torch._dynamo.reset()
        f = compile_for_neuron(mlp, options={"target": target})
        with torch.no_grad():
            _, prof = run_on_device(f, *_inputs())
        d = assert_ran_on_device(prof)
        assert d["target"] == target
        times[target] = d["simulated_time_us"]
    assert times["trn2"] != times["trn3"]


def test_timing_mode_values_from_eager_and_same_timing():
    results = {}
    for mode in ("functional", "timing"):
        torch._dynamo.reset()
        f = compile_for_neuron(mlp, options={"sim_mode": mode})
        with torch.no_grad():
            out, prof = run_on_device(f, *_inputs())
        torch.testing.assert_close(out, mlp(*_inputs()), rtol=1e-4, atol=1e-4)
        results[mode] = assert_ran_on_device(prof)["simulated_time_us"]
    assert results["timing"] == pytest.approx(results["functional"])


def test_chrome_trace(tmp_path):
    f = compile_for_neuron(mlp)
    with torch.no_grad():
        _, prof = run_on_device(f, *_inputs())
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete, "no instruction events"
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(threads) >= 2          # at least one engine and one DMA queue
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
