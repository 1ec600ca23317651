"""``nki_op``: NKI kernels as torch custom ops, in eager mode and inside compiled graphs (run on
the simulator as device operations, never as fallbacks), with registered autograd."""
import json

import numpy as np
import pytest
import torch

import neuron_compiler
import neuron_compiler.nki.language as nl
from neuron_compiler import nki
from neuron_compiler.nki import nki_op

STRICT = {"fallback": "error"}


@nki.jit
def exp2_kernel(x, out):
    """out = 2 * exp(x), rows tiled by 128 (masked at the edge)."""
    rows, cols = x.shape
    for i in nl.affine_range((rows + 127) // 128):
        ip = i * 128 + nl.arange(128)[:, None]
        jf = nl.arange(cols)[None, :]
        t = nl.load(x[ip, jf], mask=ip < rows)
        nl.store(out[ip, jf], value=nl.multiply(nl.exp(t), 2.0), mask=ip < rows)


@nki.jit
def mul_kernel(a, b):
    """a * b (returns a new HBM tensor), rows tiled by 128."""
    rows, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + 127) // 128):
        ip = i * 128 + nl.arange(128)[:, None]
        jf = nl.arange(cols)[None, :]
        t = nl.multiply(nl.load(a[ip, jf], mask=ip < rows), nl.load(b[ip, jf], mask=ip < rows))
        nl.store(out[ip, jf], value=t, mask=ip < rows)
    return out


@nki.jit
def exp_kernel_wrong(x, out):
    """Forgets the factor 2 (a wrong kernel)."""
    t = nl.load(x)
    nl.store(out, value=nl.exp(t))


@nki_op("nki_test::exp2", mutates_args={})
def exp2(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    exp2_kernel(x, out)
    return out


@nki_op("nki_test::mul", mutates_args=())
def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return mul_kernel(a, b)


def _exp2_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _exp2_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return mul(grad.contiguous(), y)          # d(2 e^x)/dx = 2 e^x: the backward is an nki_op too


exp2.register_autograd(_exp2_backward, setup_context=_exp2_setup)


@nki_op("nki_test::exp2_wrong", mutates_args={})
def exp2_wrong(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    exp_kernel_wrong(x, out)
    return out


def _nki_parts(d: dict) -> list[dict]:
    return [p for p in d["partitions"] if p["partition"].startswith("nki ")]


def test_eager_call_runs_the_simulator_and_is_profiled():
    x = torch.randn(200, 48)
    with neuron_compiler.profile() as prof:
        y = exp2(x)
    np.testing.assert_allclose(y.numpy(), 2 * np.exp(x.numpy()), rtol=1e-5, atol=1e-6)
    d = prof.to_dict()
    assert [p["graph"] for p in d["partitions"]] == ["nki_exp2_kernel"]
    assert d["simulated_time_us"] > 0


def test_fake_implementation_comes_from_the_kernel_declaration():
    torch.library.opcheck(mul, (torch.randn(130, 20), torch.randn(130, 20)),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        y = mul(torch.empty(300, 40, dtype=torch.bfloat16), torch.empty(300, 40, dtype=torch.bfloat16))
    assert y.shape == (300, 40) and y.dtype == torch.bfloat16


def test_compiled_graph_runs_the_op_on_the_device(fresh_dynamo, tmp_path):
    def f(x, w):
        return exp2(x * 0.5) * w + 1.0

    x, w = torch.randn(200, 64), torch.randn(200, 64)
    cf = torch.compile(f, backend="neuron", options=STRICT)
    with neuron_compiler.profile() as prof:
        y = cf(x, w)
    ref = 2 * np.exp(x.numpy() * 0.5) * w.numpy() + 1.0
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["fallbacks"] == []
    assert d["device_nodes"] >= 3
    (part,) = _nki_parts(d)
    assert part["partition"] == "nki nki_test.exp2.default/exp2_kernel"
    assert part["graph"].startswith("inference_") and part["calls"] == 1
    assert part["simulated_time_us"] > 0 and part["engine_busy"]["act"] > 0   # exp on ScalarE
    assert d["simulated_time_us"] > part["simulated_time_us"]      # the mul/add partitions too
    assert "nki nki_test.exp2.default/exp2_kernel" in prof.summary()
    trace = tmp_path / "t.json"
    prof.export_chrome_trace(str(trace))
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("name") == "process_name"}
    assert any("exp2_kernel" in n for n in names)


def test_compiled_op_values_come_from_the_simulator(fresh_dynamo):
    """A wrong kernel gives wrong values in the compiled graph too (not eager torch's)."""
    cf = torch.compile(lambda x: exp2_wrong(x) + 0.0, backend="neuron", options=STRICT)
    x = torch.randn(128, 32)
    y = cf(x)
    np.testing.assert_allclose(y.numpy(), np.exp(x.numpy()), rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(y.numpy(), 2 * np.exp(x.numpy()), rtol=1e-3)


@pytest.mark.parametrize("dtype,sim_mode", [(torch.float32, "timing"), (torch.bfloat16, "functional")])
def test_compiled_op_values_in_both_modes_and_bf16(fresh_dynamo, dtype, sim_mode):
    a, b = torch.randn(130, 40).to(dtype), torch.randn(130, 40).to(dtype)
    cf = torch.compile(lambda a, b: mul(a, b) - 1, backend="neuron",
                       options={**STRICT, "sim_mode": sim_mode})
    with neuron_compiler.profile() as prof:
        y = cf(a, b)
    assert y.dtype == dtype
    torch.testing.assert_close(y, (a * b) - 1)
    assert [p["partition"] for p in _nki_parts(prof.to_dict())] == ["nki nki_test.mul.default/mul_kernel"]


def test_registered_autograd_trains(fresh_dynamo):
    w0 = torch.randn(160, 32) * 0.3
    target = torch.randn(160, 32)

    def loss_fn(w):
        return ((exp2(w) - target) ** 2).mean()

    w = w0.clone().requires_grad_()
    cl = torch.compile(loss_fn, backend="neuron", options=STRICT)
    with neuron_compiler.profile() as prof:
        loss = cl(w)
        loss.backward()
    wr = w0.clone().requires_grad_()
    ref = ((2 * torch.exp(wr) - target) ** 2).mean()
    ref.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-4, atol=1e-6)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0
    graphs = {p["graph"].split("_")[0] for p in _nki_parts(d)}
    assert graphs == {"forward", "backward"}       # exp2 forward, mul in the backward
    # a few steps of SGD through the compiled op reduce the loss
    losses = []
    for _ in range(4):
        w.grad = None
        loss = cl(w)
        loss.backward()
        with torch.no_grad():
            w -= 0.05 * w.grad
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_mutating_op_in_a_compiled_graph(fresh_dynamo):
    @nki.jit
    def double_into(a, out):
        nl.store(out, value=nl.multiply(nl.load(a), 2.0))

    @nki_op("nki_test::double_into", mutates_args={"out"})
    def double(a: torch.Tensor, out: torch.Tensor) -> None:
        double_into(a, out)

    def f(a, b):
        o = torch.zeros_like(a)
        double(mul(a, b), o)
        return o + 1

    a, b = torch.randn(64, 32), torch.randn(64, 32)
    with neuron_compiler.profile() as prof:
        y = torch.compile(f, backend="neuron", options=STRICT)(a, b)
    np.testing.assert_allclose(y.numpy(), 2 * a.numpy() * b.numpy() + 1, rtol=1e-6, atol=1e-6)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0
    assert {p["partition"] for p in _nki_parts(d)} == {
        "nki nki_test.mul.default/mul_kernel", "nki nki_test.double_into.default/double_into"}


def test_kernel_breaking_a_machine_rule_fails_at_compile(fresh_dynamo):
    @nki.jit
    def too_tall(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))     # 256 partitions in one tile
        return out

    @nki_op("nki_test::too_tall", mutates_args=())
    def tall(x: torch.Tensor) -> torch.Tensor:
        return too_tall(x)

    cf = torch.compile(lambda x: tall(x) + 1, backend="neuron", options=STRICT)
    with pytest.raises(Exception, match="partition") as info:
        cf(torch.randn(256, 8))
    assert "256" in str(info.value)


def test_op_body_without_a_kernel_is_refused(fresh_dynamo):
    @nki_op("nki_test::no_kernel", mutates_args=())
    def no_kernel(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    cf = torch.compile(lambda x: no_kernel(x) + 1, backend="neuron", options=STRICT)
    with pytest.raises(RuntimeError, match="nki_test.no_kernel.*no @nki.jit kernel"):
        cf(torch.randn(8, 8))
