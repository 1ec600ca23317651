"""``div(a, b, rounding_mode='trunc' | 'floor')`` against eager, bit for bit.

Floats: torch's fmod-based floor division and ``trunc(a / b)`` (``mathfns.div_floor`` /
``div_trunc``) over signed zeros, infinities, NaN, huge and tiny values; bf16 with a tensor
divisor rounds every step to bf16 as eager does, with a one-element divisor it computes in
fp32 once (both checked, and the test shows the two differ). int32: exact on the integer ALU
(values over the whole range). int64: by constants below 2**27 exact (tests/lowering/
test_int_exact.py), by a tensor only on device-generated integers; a graph input divided by a
tensor is refused with the reason. Shapes cross the tile edges; every case runs on the device.
"""
from __future__ import annotations

import math

import pytest
import torch

from lowering_helpers import lower_and_run, trace, unsupported_nodes

MODES = ("floor", "trunc")


def vals(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 10
    x.view(-1)[:14] = torch.tensor([0., -0., math.inf, -math.inf, math.nan, 1e38, -1e38, 3., -3.,
                                    7.5, -7.5, 1e-30, 255.7, -0.5])
    return x.to(dtype)


def bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if not want.dtype.is_floating_point:
        bad = got != want
        assert not bool(bad.any()), (f"{int(bad.sum())} of {want.numel()} differ: "
                                     f"{got[bad][:5].tolist()} vs {want[bad][:5].tolist()}")
        return
    g, w = got.float(), want.float()
    nan = g.isnan() & w.isnan()
    bad = ~nan & ((g != w) | (torch.signbit(g) != torch.signbit(w)))
    assert not bool(bad.any()), (f"{int(bad.sum())} of {w.numel()} differ: {g[bad][:5].tolist()} vs "
                                 f"{w[bad][:5].tolist()}")


def run(fn, *inputs):
    low = lower_and_run(fn, *inputs)
    bits_equal(low.outputs[0], fn(*inputs))
    return low


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("divisor", ["tensor", "scalar", "one_element"])
def test_float_div_modes_bit_exact(mode, dtype, divisor):
    shape = (129, 513) if divisor == "tensor" else (2, 128, 129)
    a, b = vals(shape, dtype, 1), vals(shape, dtype, 2).flip(0)
    b.view(-1)[20:30] = torch.tensor([0., -0., 3., -3., 0.5, -0.5, 1e-38, 2., -2., 7.]).to(dtype)
    fn = {"tensor": lambda x, y: torch.div(x, y, rounding_mode=mode),
          "scalar": lambda x, y: torch.div(x, -3.7, rounding_mode=mode),
          "one_element": lambda x, y: torch.div(x, y[:1, :1], rounding_mode=mode)}[divisor]
    run(fn, a, b)


def test_bf16_rounding_points_matter():
    """A tensor divisor rounds the bf16 quotient before truncating, a one-element divisor does
    not: 254 / (1 - 2**-8) = 254.996 truncates to 255 in the first case (bf16(254.996) = 255),
    254 in the second."""
    a = torch.full((4, 130), 254.0, dtype=torch.bfloat16)
    b = torch.full((4, 130), 1 - 2 ** -8, dtype=torch.bfloat16)
    t = run(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b).outputs[0]
    s = run(lambda x, y: torch.div(x, y[:1, :1], rounding_mode="trunc"), a, b).outputs[0]
    assert float(t[0, 0]) == 255.0 and float(s[0, 0]) == 254.0


def test_a_float_result_one_ulp_off_fails():
    a, b = vals((129, 513), torch.float32, 4), vals((129, 513), torch.float32, 5)
    low = run(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
    want = torch.div(a, b, rounding_mode="floor")
    k = int(torch.nonzero(torch.isfinite(want.view(-1)) & (want.view(-1) != 0))[0])
    bad = low.outputs[0].clone()
    bad.view(-1)[k] = torch.nextafter(bad.view(-1)[k], torch.tensor(float("inf")))
    with pytest.raises(AssertionError, match="1 of 66177 differ"):
        bits_equal(bad, want)
    neg0 = want.clone()
    neg0[neg0 == 0] = 0.0                       # -0.0 where +0.0 is due (or back) must fail too
    if bool((torch.signbit(want) & (want == 0)).any()):
        with pytest.raises(AssertionError):
            bits_equal(neg0, want)


@pytest.mark.parametrize("mode", MODES)
def test_int32_div_modes_exact_over_the_range(mode):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-2 ** 31, 2 ** 31 - 1, (129, 513), generator=g, dtype=torch.int32)
    b = torch.randint(-2 ** 31, 2 ** 31 - 1, (129, 513), generator=g, dtype=torch.int32)
    b[b == 0] = 3
    b.view(-1)[:10] = torch.tensor([1, -1, 2, -2, 3, -3, 7, -7, 2 ** 30, -2 ** 31])
    a.view(-1)[:3] = torch.tensor([-2 ** 31, 2 ** 31 - 1, -7])
    low = run(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
    assert low.result.stats.engine_busy_ns.get("pool", 0) > 0
    run(lambda x: torch.div(x, -7, rounding_mode=mode), a)
    wrong = low.outputs[0].clone()
    wrong.view(-1)[5] += 1
    with pytest.raises(AssertionError, match="1 of 66177 differ"):
        bits_equal(wrong, torch.div(a, b, rounding_mode=mode))


def test_int64_division_of_device_integers_and_the_graph_input_refusals():
    x = torch.randn(3, 515)
    fn = lambda x: x * torch.div(torch.arange(515) - 300, 7, rounding_mode="floor")  # noqa: E731
    low = lower_and_run(fn, x)
    bits_equal(low.outputs[0], fn(x))
    bad = unsupported_nodes(trace(lambda i: torch.div(i, i.flip(0), rounding_mode="floor"),
                                  torch.arange(1, 10)))
    assert len(bad) == 1 and "int64 division of" in bad[0] and "by a tensor" in bad[0], bad
    bad = unsupported_nodes(trace(lambda i: torch.div(i, 2 ** 40, rounding_mode="trunc"),
                                  torch.arange(1, 10)))
    assert len(bad) == 1 and "constant 1099511627776" in bad[0] and "2**27" in bad[0], bad
