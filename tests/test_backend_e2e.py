"""End to end through the real lowering and simulator: small models, forward and backward."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_entry_points_resolve_without_import():
    try:
        dist = importlib.metadata.distribution("neuron-sim")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the project is not pip-installed; entry points are not visible")
    names = {ep.name: ep.value for ep in dist.entry_points if ep.group == "torch_dynamo_backends"}
    assert names == {"neuron": "neuron_compiler.backend:neuron_backend",
                     "neuron_sim": "neuron_compiler.backend:neuron_sim_backend"}
    # a fresh interpreter that never imports neuron_compiler itself
    code = textwrap.dedent("""
        import sys, torch
        assert "neuron_compiler" not in sys.modules
        f = torch.compile(lambda x: x * 2.0 + 1.0, backend="neuron")
        with torch.no_grad():
            y = f(torch.ones(3))
        assert torch.equal(y, torch.full((3,), 3.0)), y
        assert "neuron_compiler.backend" in sys.modules   # our entry point was loaded
        import neuron_compiler
        print("OK", neuron_compiler.__version__)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_small_mlp_forward_and_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 10))
    ref = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 10))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(6, 24)
    f = compile_for_neuron(model, backend="neuron_sim")
    with neuron_compiler.profile() as prof:
        out = f(x)
        out.sum().backward()
    expected = ref(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.9)
    kinds = {g["kind"] for g in d["graphs"]}
    assert kinds == {"forward", "backward"}


def test_bf16_inputs_round_trip():
    f = compile_for_neuron(lambda a, b: a * b + 1.0)
    a = torch.randn(4, 8, dtype=torch.bfloat16)
    b = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        out, prof = run_on_device(f, a, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, a * b + 1.0, rtol=1e-2, atol=1e-2)
    assert_ran_on_device(prof)


def test_output_aliasing_an_input_and_non_contiguous_output():
    def f(x):
        return x.t(), (x + 1).t()

    cf = compile_for_neuron(f)
    x = torch.randn(4, 6)
    with torch.no_grad():
        (a, b), prof = run_on_device(cf, x)
    ea, eb = f(x)
    torch.testing.assert_close(a, ea)
    torch.testing.assert_close(b, eb)
    assert b.stride() == eb.stride()
    assert_ran_on_device(prof, min_device_fraction=0.0)


def test_non_contiguous_user_inputs():
    f = compile_for_neuron(lambda a, b: torch.relu(a @ b) * 2.0)
    a = torch.randn(12, 8).t()           # [8, 12], strides (1, 8)
    b = torch.randn(12, 5)
    with torch.no_grad():
        out, prof = run_on_device(f, a, b)
    torch.testing.assert_close(out, torch.relu(a @ b) * 2.0, rtol=1e-4, atol=1e-4)
    assert_ran_on_device(prof)


def test_dynamic_graph_compiles_once_per_signature():
    """A second input signature gets its own program; the first stays cached."""
    f = compile_for_neuron(lambda a: (a * 3.0).sum(dim=-1), dynamic=True)
    with torch.no_grad():
        for rows, expect_compiles in ((3, 1), (7, 1), (3, 0)):
            a = torch.randn(rows, 16)
            out, prof = run_on_device(f, a)
            torch.testing.assert_close(out, (a * 3.0).sum(dim=-1), rtol=1e-4, atol=1e-4)
            assert prof.to_dict()["compiles"] == expect_compiles
