"""Eager ops on ``neuron`` tensors: lowered per op signature, run on the simulator, profiled."""
import warnings

import pytest
import torch

import neuron_compiler
from neuron_compiler.device import NeuronDeviceFallbackError, NeuronTensor, eager
from neuron_compiler.device.config import NeuronDeviceFallbackWarning


@pytest.fixture
def device_policy():
    """Target and fallback policy restored after the test."""
    target, fallback = neuron_compiler.device.get_target(), neuron_compiler.device.get_fallback()
    yield neuron_compiler.device
    neuron_compiler.device.set_target(target)
    neuron_compiler.device.set_fallback(fallback)


def test_done_when_relu_matmul_plus_one_runs_on_the_device():
    torch.manual_seed(0)
    x, w = torch.randn(130, 96), torch.randn(96, 72)
    xd, wd = x.to("neuron"), w.to("neuron")
    with neuron_compiler.profile() as prof:
        y = torch.relu(xd @ wd) + 1
    assert isinstance(y, NeuronTensor) and y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), torch.relu(x @ w) + 1, rtol=1e-5, atol=1e-4)
    d = prof.to_dict()
    assert d["simulated_time_us"] > 0
    assert d["fallback_nodes"] == 0 and d["device_nodes"] == 3
    ops = sorted(op for p in d["partitions"] for op in p["ops"])
    assert ops == ["aten.add.Tensor", "aten.mm.default", "aten.relu.default"]
    assert all(p["name"].startswith("eager_") for p in d["partitions"])
    assert d["transfer_time_us"] == 0.0          # everything was already on the device


def test_one_program_per_signature():
    xd = torch.randn(33, 17).to("neuron")
    (xd * 3.0).sum()                                # the signatures are compiled
    before = eager.program_count()
    with neuron_compiler.profile() as prof:
        for _ in range(3):
            (xd * 3.0).sum()
    assert eager.program_count() == before
    d = prof.to_dict()
    assert d["compiles"] == 0
    assert d["steady_state"]["graph_calls"] == 6
    (xd * 4.0).sum()                                # another scalar: another program
    assert eager.program_count() == before + 1
    torch.randn(34, 17).to("neuron") * 3.0          # another shape: another program
    assert eager.program_count() == before + 2


def test_values_come_from_the_simulator_for_bf16():
    torch.manual_seed(1)
    a, b = torch.randn(64, 256, dtype=torch.bfloat16), torch.randn(256, 48, dtype=torch.bfloat16)
    out = (a.to("neuron") @ b.to("neuron")).cpu()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)


def test_in_place_ops_write_their_self():
    x = torch.randn(8, 8)
    xd = x.to("neuron")
    alias = xd
    out = xd.add_(2.0).mul_(torch.full((8, 8), 0.5, device="neuron"))
    assert out is alias
    torch.testing.assert_close(xd.cpu(), (x + 2.0) * 0.5)


def test_a_cpu_scalar_tensor_mixes_but_a_cpu_matrix_does_not():
    xd = torch.ones(4, device="neuron")
    assert torch.equal((xd * torch.tensor(3.0)).cpu(), torch.full((4,), 3.0))
    with pytest.raises(RuntimeError, match=r"aten.add.Tensor: expected all tensors on the neuron "
                                           r"device, but argument 1 is a cpu tensor"):
        xd + torch.ones(4)


def test_unsupported_op_warns_once_runs_on_the_cpu_and_is_profiled(device_policy):
    x = torch.randn(6, 5)
    xd = x.to("neuron")
    eager._WARNED.discard("aten.nonzero.default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with neuron_compiler.profile() as prof:
            first = torch.nonzero(xd > 0)
            torch.nonzero(xd < 0)
    ours = [w for w in caught if issubclass(w.category, NeuronDeviceFallbackWarning)]
    assert len(ours) == 1
    assert "aten.nonzero.default" in str(ours[0].message)
    assert "data-dependent" in str(ours[0].message)
    assert isinstance(first, NeuronTensor)
    assert torch.equal(first.cpu(), torch.nonzero(x > 0))
    d = prof.to_dict()
    assert [f["op"] for f in d["fallbacks"]] == ["aten.nonzero.default"]
    assert d["transfer_time_us"] > 0                # in and out over the host link
    assert d["simulated_time_us"] > 0               # the comparisons ran on the device


def test_fallback_error_policy_names_the_op(device_policy):
    xd = torch.randn(6, 5).to("neuron")
    device_policy.set_fallback("error")
    with pytest.raises(NeuronDeviceFallbackError, match=r"aten.nonzero.default.*data-dependent"):
        torch.nonzero(xd)
    with pytest.raises(neuron_compiler.NeuronOptionError, match="'allow', 'error'"):
        device_policy.set_fallback("sometimes")


def test_target_selects_the_simulated_generation(device_policy):
    xd, wd = torch.randn(256, 512).to("neuron"), torch.randn(512, 512).to("neuron")
    times = {}
    for target in ("trn2", "trn3"):
        device_policy.set_target(target)
        xd @ wd
        with neuron_compiler.profile() as prof:
            y = xd @ wd
        times[target] = prof.to_dict()
        assert y.device.type == "neuron"
    assert times["trn2"]["target"] == "trn2" and times["trn3"]["target"] == "trn3"
    assert times["trn3"]["simulated_time_us"] < times["trn2"]["simulated_time_us"]


def test_environment_sets_the_default_target_and_policy():
    import os
    import subprocess
    import sys
    env = {**os.environ, "NEURON_DEVICE_FALLBACK": "error", "NEURON_DEVICE_TARGET": "trn3"}
    code = ("import neuron_compiler as n; "
            "print(n.device.get_target(), n.device.get_fallback())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["trn3", "error"]
