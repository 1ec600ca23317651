"""The rest of the pointwise set against eager through the simulator, over a [130, 513] tensor
(crosses the 128-partition and 512-column tile edges), fp32 and bf16.

- Exact ops (rounding, fmod/remainder, classification, copies) must equal eager bit for bit,
  NaN, infinities and signed zeros included (``_bits``), over values that include the rounding
  ties, 2**22/2**23 boundaries, denormals and specials.
- Transcendental compositions (``lowering/ops/mathfns.py``) use the per-dtype tolerances of
  ``lowering_helpers.assert_close``; ``test_tolerances_can_fail`` feeds each comparison a
  known-wrong result.
- Every case goes through ``lower_and_run``: every ATen node of the graph must be supported and
  the program must execute instructions (ran on the device, not a fallback).
- Rules that the core decompositions never leave in a graph (``nan_to_num``) are traced
  without decompositions (``undecomposed.lower_raw``).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import why_unsupported
from lowering_helpers import assert_close, lower_and_run, rand, trace
from undecomposed import lower_raw

aten = torch.ops.aten
SHAPE = (130, 513)
SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1e-40, -1e-40, 8388607.5, 8388608.0,
           -8388609.0, 4194304.5, -4194304.5, math.inf, -math.inf, math.nan, 1.0, -1.0,
           0.99999994, -0.99999994, 1e-8, -1e-8, 3e38, -3e38, 100.0, -100.0, 20.5, -20.5, 88.5,
           -88.5, 0.49999997, -0.49999997, 3.0, -3.0]


def values(scale: float = 3.0, seed: int = 0, dtype=torch.float32, special=True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=g) * scale
    if special:
        x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
        x.view(-1)[-len(SPECIAL):] = torch.tensor(SPECIAL[::-1])   # the last row tile too
    return x.to(dtype)


def _bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if expected.dtype == torch.bool:
        bad = actual != expected
    else:
        it = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[expected.dtype]
        bad = (actual.view(it) != expected.view(it)) & ~(torch.isnan(actual) & torch.isnan(expected))
    if bool(bad.any()):
        i = bad.flatten().nonzero()[0, 0]
        raise AssertionError(f"{what}: {int(bad.sum())} of {expected.numel()} elements differ; first "
                             f"{float(actual.flatten()[i])!r} vs {float(expected.flatten()[i])!r}")


# ---- exact unary ------------------------------------------------------------------------------
EXACT_UNARY = {"floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
               "round2": lambda x: torch.round(x, decimals=2),
               "round-1": lambda x: torch.round(x, decimals=-1),
               "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
               "exp2": torch.exp2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(EXACT_UNARY))
def test_exact_unary(name, dtype):
    fn = EXACT_UNARY[name]
    x = values(dtype=dtype)
    if name == "exp2":                 # exact for integer exponents; fractions are transcendental
        x = torch.round(x).clamp(-140, 127)
    low = lower_and_run(fn, x)
    _bits(low.outputs[0], fn(x), name)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=40))
def test_rounding_property(vals):
    x = torch.tensor(vals, dtype=torch.float32)
    x = x.repeat(-(-SHAPE[1] // x.numel()))[: SHAPE[1]].repeat(3, 1)    # [3, 513]
    fn = lambda t: torch.stack([torch.floor(t), torch.ceil(t), torch.round(t), torch.trunc(t)])
    low = lower_and_run(fn, x)
    _bits(low.outputs[0], fn(x), "floor/ceil/round/trunc")


# ---- exact binary -----------------------------------------------------------------------------
def _pair(dtype=torch.float32):
    a, b = values(4.0, 1), values(2.0, 2, special=False)
    sp = [0.0, -0.0, math.inf, -math.inf, math.nan, 3.0, -3.0, 1e-10, -1e-10, 4.0, -4.0, 1.5]
    k = 0
    for u in sp:
        for v in sp:
            a.view(-1)[k], b.view(-1)[k] = u, v
            k += 1
    return a.to(dtype), b.to(dtype)


EXACT_BINARY = {"fmod": torch.fmod, "remainder": torch.remainder,
                "fmod_scalar": lambda a, b: torch.fmod(a, -1.5) + 0 * b,
                "remainder_scalar": lambda a, b: torch.remainder(a, 1.5) + 0 * b,
                "clamp_tensor": lambda a, b: torch.clamp(a, b, b + 1),
                "clamp_min_tensor": lambda a, b: torch.clamp(a, min=b),
                "copy": lambda a, b: aten.copy.default(a, b[0]),
                "fill_tensor": lambda a, b: aten.fill.Tensor(a, b[3, 7])}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(EXACT_BINARY))
def test_exact_binary(name, dtype):
    fn = EXACT_BINARY[name]
    a, b = _pair(dtype)
    if name.startswith("clamp"):       # a NaN bound: torch and the ALU agree only on NaN x
        b = torch.nan_to_num(b)
    low = lower_and_run(fn, a, b)
    _bits(low.outputs[0], fn(a, b), name)


def test_xor_of_masks():
    a, b = _pair()
    fn = lambda a, b: torch.stack([(a > 0) ^ (b > 0), torch.logical_xor(a > 1, b < 0)])
    low = lower_and_run(fn, a, b)
    _bits(low.outputs[0], fn(a, b), "xor")


def test_nan_to_num_rule():
    x = values()
    fns = [lambda t: torch.nan_to_num(t), lambda t: torch.nan_to_num(t, nan=1.5, posinf=7.0, neginf=-9.0)]
    for fn in fns:
        _bits(lower_raw(fn, x)[0][0], fn(x), "nan_to_num")


# ---- transcendental compositions --------------------------------------------------------------
def _domain(name: str, x: torch.Tensor) -> torch.Tensor:
    if name in ("asin", "acos", "atanh"):
        return torch.tanh(x)                          # mostly inside [-1, 1]
    if name == "acosh":
        return x.abs() + 1
    if name in ("sinh", "cosh"):
        # crosses the |x| > 20 and > 88 branches; stops short of exp's overflow (88.72), where
        # torch's vectorised sinh/cosh already give inf while its scalar path (and this
        # lowering) stay finite up to 89.41
        return (x * 8).clamp(-88.5, 88.5)
    if name == "tan":
        return x.clamp(-3, 3)
    return x


TRANSCENDENTAL = {n: getattr(torch, n) for n in
                  ("log1p", "expm1", "log2", "log10", "exp2", "atan", "tan", "asin", "acos",
                   "sinh", "cosh", "asinh", "acosh", "atanh")}
TRANSCENDENTAL["elu"] = lambda x: F.elu(x, alpha=0.7)
TRANSCENDENTAL["atan2"] = lambda x: torch.atan2(x, torch.roll(x, 1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(TRANSCENDENTAL))
def test_transcendental(name, dtype):
    fn = TRANSCENDENTAL[name]
    x = _domain(name, values(special=False)).to(dtype)
    if name == "atan2":
        y = torch.roll(x, 1, 1)
        low = lower_and_run(torch.atan2, x, y)
        want = torch.atan2(x, y)
    else:
        low = lower_and_run(fn, x)
        want = fn(x)
    assert_close(low.outputs[0], want, what=name)


@pytest.mark.parametrize("name", ["log1p", "expm1", "atan", "asin", "acos", "sinh", "cosh",
                                  "asinh", "acosh", "atanh"])
def test_transcendental_specials(name):
    """NaN/inf/signed-zero positions and the values near 0 and near the branch points."""
    fn = TRANSCENDENTAL[name]
    x = values()
    low = lower_and_run(fn, x)
    want = fn(x)
    got = low.outputs[0]
    assert_close(got, want, what=name)
    zeros = want == 0
    assert torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros])), f"{name}: zero signs"
    small = (x.abs() < 1e-6) & (x != 0) & torch.isfinite(want) & (want != 0)
    if not bool(small.any()):
        return
    rel = ((got[small] - want[small]).abs() / want[small].abs()).max()
    assert rel < 1e-6, f"{name}: relative error {float(rel):g} near 0 (cancellation)"


# ---- copies -----------------------------------------------------------------------------------
COPIES = {"repeat": lambda x: x.repeat(2, 3), "repeat_new_axis": lambda x: x.repeat(2, 1, 3),
          "flip": lambda x: x.flip(0, 1), "flip_inner": lambda x: x.flip(-1),
          "flip_transposed": lambda x: x.t().flip(0),
          "fill": lambda x: aten.fill.Scalar(x, 2.5),
          "empty": lambda x: aten.empty.memory_format([130, 513], dtype=x.dtype) * 0 + x}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("name", list(COPIES))
def test_copies(name, dtype):
    fn = COPIES[name]
    x = values(special=False, dtype=torch.float32)
    x = (x * 100).to(dtype) if dtype == torch.int64 else x.to(dtype)
    if name.startswith("repeat"):
        x = x[:65, :171]
    low = lower_and_run(fn, x)
    want = x if name == "empty" else fn(x)      # eager's empty holds garbage (maybe NaN)
    assert torch.equal(low.outputs[0], want), name


# ---- fallbacks with reasons, and tolerances that can fail -------------------------------------
def _node(fn, *inputs, target):
    gm = trace(fn, *inputs)
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def test_unsupported_variants_fall_back_with_a_reason():
    i = torch.arange(10).reshape(2, 5)
    r = why_unsupported(_node(lambda t: torch.fmod(t, t.flip(0) + 1), i, target=aten.fmod.Tensor))
    assert r and "int64 division of" in r and "by a tensor" in r, r
    r = why_unsupported(_node(lambda t: t + 2 ** 60, i, target=aten.add.Tensor))
    assert r and "integer constant 1152921504606846976 is beyond 2**53" in r, r
    gm = make_fx(lambda t: torch.empty_strided((4, 5), (1, 4)) + t)(torch.ones(4, 5))
    n = next(n for n in gm.graph.nodes if n.target is aten.empty_strided.default)
    assert "is not the contiguous stride" in why_unsupported(n)


def test_tolerances_can_fail():
    x = values(special=False)
    low = lower_and_run(torch.log1p, x.abs())
    want = torch.log1p(x.abs())
    assert_close(low.outputs[0], want)
    with pytest.raises(AssertionError):
        assert_close(low.outputs[0] * (1 + 5e-5), want)
    xb = x.abs().to(torch.bfloat16)
    lowb = lower_and_run(torch.log1p, xb)
    assert_close(lowb.outputs[0], torch.log1p(xb))
    with pytest.raises(AssertionError):
        assert_close((lowb.outputs[0].float() * 1.03).to(torch.bfloat16), torch.log1p(xb))
    lowr = lower_and_run(torch.round, x)
    bad = lowr.outputs[0].clone()
    bad.view(-1)[1000] = torch.nextafter(bad.view(-1)[1000], torch.tensor(math.inf))
    with pytest.raises(AssertionError):
        _bits(bad, torch.round(x), "round")
    neg0 = torch.round(x).clone()
    neg0[neg0 == 0] = 0.0                        # -0.0 replaced by +0.0 must fail too
    with pytest.raises(AssertionError):
        _bits(neg0, torch.round(x), "round")


def test_clamp_of_device_and_graph_input_integers_is_exact():
    """clamp on int64 positions computed on the device (as bilinear upsampling's) runs through
    fp32 exactly; on an int64 graph input it runs on the integer ALU, exact beyond 2**24."""
    x = rand(3, 129)
    fn = lambda x: x * (torch.arange(129) * 3 - 50).clamp(0, 300)  # noqa: E731
    low = lower_and_run(fn, x)
    assert_close(low.outputs[0], fn(x))
    ids = torch.arange(129 * 513).reshape(129, 513) * 4099 - 2 ** 25 - 1
    clamp = lambda i: i.clamp(-2 ** 25 + 1, 2 ** 27 + 3)  # noqa: E731
    low = lower_and_run(clamp, ids)
    assert torch.equal(low.outputs[0], clamp(ids))
    assert not torch.equal(low.outputs[0] + 1, clamp(ids))
