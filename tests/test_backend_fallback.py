"""Eager fallback: unsupported ops run in PyTorch with the reason recorded, or raise on demand."""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from neuron_compiler import NeuronFallbackError
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device

FFT = "aten._fft_r2c.default"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def fft_model(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.relu(x @ w + 1.0)
    spec = torch.fft.rfft(h, dim=-1)
    return spec, h * 2.0


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randn(16, 32, generator=g)


def test_rfft_falls_back_with_reason_and_the_rest_runs_on_the_device():
    x, w = _inputs()
    f = compile_for_neuron(fft_model)
    with torch.no_grad():
        (spec, h2), prof = run_on_device(f, x, w)
        spec_ref, h2_ref = fft_model(x, w)
    torch.testing.assert_close(spec, spec_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h2, h2_ref, rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.5)
    ops = {f["op"]: f for f in d["fallbacks"]}
    assert FFT in ops, d["fallbacks"]
    assert ops[FFT]["count"] == 1
    assert isinstance(ops[FFT]["reason"], str) and ops[FFT]["reason"]
    # the matmul, add, relu and mul ran on the device
    device_ops = {op for p in d["partitions"] for op in p["ops"]}
    assert d["device_nodes"] >= 4 and d["fallback_nodes"] >= 1
    assert device_ops, d["partitions"]
    assert d["fallback_time_us"] > 0.0


def test_fallback_error_names_the_op_and_its_reason():
    x, w = _inputs()
    f = compile_for_neuron(fft_model, options={"fallback": "error"})
    with pytest.raises(Exception) as info, torch.no_grad():
        f(x, w)
    msg = str(info.value)
    assert "fallback='error'" in msg and FFT in msg


def test_fallback_error_names_every_unsupported_op():
    def two_bad(x):
        spec = torch.fft.rfft(x)                # _fft_r2c
        return torch.fft.fft(spec).abs().sum()  # _fft_c2c

    with pytest.raises(NeuronFallbackError) as info:
        from neuron_compiler.backend import compile_aten_graph
        from neuron_compiler.options import NeuronOptions
        gm = torch.fx.experimental.proxy_tensor.make_fx(two_bad)(torch.randn(4, 8))
        compile_aten_graph(gm, "inference", NeuronOptions(fallback="error"))
    ops = {op for op, _, _ in info.value.entries}
    assert "aten._fft_r2c.default" in ops and "aten._fft_c2c.default" in ops
    for op in ops:
        assert op in str(info.value)


def _reject_relu(monkeypatch):
    """Make the lowering reject (at compile time) any partition containing relu."""
    api = pytest.importorskip("lowering.api")
    real = api.compile_graph

    def compile_graph(gm, specs, target, dump=None, name=None):
        for n in gm.graph.nodes:
            if n.op == "call_function" and "relu" in str(n.target):
                raise api.Unsupported(str(n.target), "rejected by the test at compile time")
        return real(gm, specs, target, dump=dump, name=name)

    monkeypatch.setattr(api, "compile_graph", compile_graph)


def test_unsupported_at_compile_time_runs_the_partition_eagerly(monkeypatch):
    _reject_relu(monkeypatch)
    f = compile_for_neuron(lambda x: torch.relu(x * 2.0) + 1.0)
    x = torch.randn(4, 8)
    with torch.no_grad():
        out, prof = run_on_device(f, x)
    torch.testing.assert_close(out, torch.relu(x * 2.0) + 1.0)
    d = prof.to_dict()
    assert d["device_nodes"] == 0 and d["fallback_nodes"] == 3
    reasons = {f["op"]: f["reason"] for f in d["fallbacks"]}
    assert "rejected by the test" in reasons["aten.relu.default"]
    assert "fused_0" in reasons["aten.mul.Tensor"]      # fell back with its partition
    assert d["partitions"] == []
    # the second call reuses the decision (no new compile) and still reports the fallback
    with torch.no_grad(), neuron_compiler.profile() as prof2:
        f(x)
    assert prof2.to_dict()["compiles"] == 0
    assert prof2.to_dict()["fallback_nodes"] == 3


def test_unsupported_at_compile_time_with_fallback_error_raises(monkeypatch):
    _reject_relu(monkeypatch)
    f = compile_for_neuron(lambda x: torch.relu(x * 2.0), options={"fallback": "error"})
    with pytest.raises(NeuronFallbackError, match="aten.relu.default.*rejected by the test"):
        with torch.no_grad():
            f(torch.randn(4, 8))
