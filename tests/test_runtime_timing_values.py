"""Timing mode computes the values it returns in fp32 where the CPU has no native kernels for a
low-precision type (``neuron_compiler.upcast``): outputs keep their dtypes, match eager up to
rounding, no low-precision matmul runs on the CPU, and the call is faster than eager's."""
from __future__ import annotations

import time

import pytest
import torch

import neuron_compiler
import neuron_compiler.upcast as upcast
from neuron_compiler.upcast import LOW_PRECISION, run_upcast, upcast_graph

MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"}


def low_precision_matmuls(fn, *args) -> int:
    """How many matmuls ``fn(*args)`` runs on the CPU with a bf16/fp16 operand (from the
    profiler's recorded input types; a dispatch mode would make Dynamo run eagerly)."""
    with torch.profiler.profile(record_shapes=True) as prof:
        fn(*args)
    return sum(1 for e in prof.events() if e.name.removeprefix("aten::") in MATMULS
               and any(t in ("c10::BFloat16", "c10::Half") for t in e.input_dtypes if t))


def _mlp(d: int = 512, h: int = 1024) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d),
                               torch.nn.LayerNorm(d)).to(torch.bfloat16).eval()


@pytest.fixture
def every_low_type_slow(monkeypatch):
    """As on a CPU without native bf16/fp16 kernels: every low-precision type is upcast."""
    monkeypatch.setattr(upcast, "slow_dtypes", lambda: LOW_PRECISION)


def test_bf16_model_values_close_to_eager_in_its_dtype_without_bf16_matmuls(
        fresh_dynamo, every_low_type_slow):
    model = _mlp()
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    f = torch.compile(model, backend="neuron", options={"sim_mode": "timing"})
    with torch.no_grad(), neuron_compiler.profile() as prof:
        y = f(x)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 0 and d["simulated_time_us"] > 0
    with torch.no_grad():
        ref = model(x)                                    # eager bf16
        exact = model.float()(x.float())                  # the fp32 computation
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    # every tensor between ops rounded as eager rounds it: eager bf16's values within a few
    # bf16 ulps (a matmul accumulated in fp32 and rounded once), as close to fp32 as eager is
    err_eager = (y.float() - ref.float()).abs().max().item()
    err_exact = (y.float() - exact).abs().max().item()
    err_ref = (ref.float() - exact).abs().max().item()
    assert err_eager <= 4 * 2 ** -8 * ref.float().abs().max().item(), err_eager
    assert err_exact <= 1.5 * err_ref, (err_exact, err_ref)
    torch.testing.assert_close(y, ref, rtol=2 ** -6, atol=2 ** -6)

    model = _mlp()                                        # bf16 again (.float() above)
    f = torch.compile(model, backend="neuron", options={"sim_mode": "timing"})
    with torch.no_grad():
        f(x)
        assert low_precision_matmuls(model, x) >= 2          # eager bf16: the counter sees them
        assert low_precision_matmuls(f, x) == 0


@pytest.mark.slow
def test_timing_mode_call_is_faster_than_eager_in_a_slow_type(fresh_dynamo):
    """A steady-state timing-mode call of matmuls in a type this CPU has no fast kernels for
    costs fp32 arithmetic, not eager's (fp16 mm here: 4.7 s against 0.06 s in fp32 at 1024^3;
    the bound leaves a wide margin)."""
    slow = sorted(upcast.slow_dtypes() & {torch.float16, torch.bfloat16}, key=str)
    if not slow:
        pytest.skip("this CPU has native bf16 and fp16 kernels: nothing is upcast")

    def fn(a, b, c):
        return torch.relu(a @ b) @ c

    args = [torch.randn(512, 512, dtype=slow[0]) / 16 for _ in range(3)]
    f = torch.compile(fn, backend="neuron", options={"sim_mode": "timing"})

    def best(g) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            g(*args)
            times.append(time.perf_counter() - t0)
        return min(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)         # two shared cores: OpenMP waits would dominate the times
    try:
        f(*args)
        compiled, eager = best(f), best(fn)
    finally:
        torch.set_num_threads(threads)
    assert compiled < eager / 3, (compiled, eager)
    torch.testing.assert_close(f(*args), fn(*args), rtol=2 ** -8, atol=2 ** -8)


def test_dtype_arguments_inside_the_graph_are_upcast(fresh_dynamo, every_low_type_slow):
    """An fp32 input cast to bf16 inside the graph: the matmul runs in fp32, the output keeps
    bf16, and the value is the fp32 product rounded once."""
    def fn(a, b):
        return a.to(torch.bfloat16) @ b.to(torch.bfloat16)

    a, b = torch.randn(64, 96), torch.randn(96, 48)
    f = torch.compile(fn, backend="neuron", options={"sim_mode": "timing"})
    f(a, b)
    assert low_precision_matmuls(fn, a, b) >= 1 and low_precision_matmuls(f, a, b) == 0
    y = f(a, b)
    assert y.dtype == torch.bfloat16
    want = (a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()).to(torch.bfloat16)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_bit_views_are_not_upcast():
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.view.dtype(x, torch.int16))
    assert upcast_graph(gm) is None
    gm = torch.fx.symbolic_trace(lambda x: x * 3)
    out = run_upcast(upcast_graph(gm), (torch.ones(2, dtype=torch.float16),), [torch.float16],
                     False)
    assert out.dtype == torch.float16 and out.tolist() == [3.0, 3.0]


def test_native_low_precision_is_not_upcast(fresh_dynamo, monkeypatch):
    """Where the CPU runs bf16 natively (oneDNN says so), timing mode runs the graph as written:
    its eager bf16 is at least as fast as an fp32 copy (avx512_bf16 here)."""
    monkeypatch.setattr(upcast, "slow_dtypes", lambda: LOW_PRECISION - {torch.bfloat16})
    model = _mlp(128, 256)
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    f = torch.compile(model, backend="neuron", options={"sim_mode": "timing"})
    with torch.no_grad():
        f(x)
        assert low_precision_matmuls(f, x) >= 2
        torch.testing.assert_close(f(x), model(x), rtol=0, atol=0)


def test_parameter_copies_are_kept_until_the_parameter_changes(every_low_type_slow):
    w = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.bfloat16))
    gm = upcast_graph(torch.fx.symbolic_trace(lambda a, b: a @ b))
    seen = []
    gm.register_forward_pre_hook(lambda mod, args: seen.append(args[1]))
    x = torch.randn(4, 4, dtype=torch.bfloat16)
    run_upcast(gm, (x, w), [torch.bfloat16], False)
    run_upcast(gm, (x, w), [torch.bfloat16], False)
    assert seen[0] is seen[1] and seen[0].dtype == torch.float32
    with torch.no_grad():
        w.mul_(2)                                    # an optimizer step: a new copy
    y = run_upcast(gm, (x, w), [torch.bfloat16], False)
    assert seen[2] is not seen[1]
    torch.testing.assert_close(y, (x.float() @ w.float()).to(torch.bfloat16), rtol=0, atol=0)
