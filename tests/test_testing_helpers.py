"""``neuron_compiler.testing``: the public property-testing helpers catch wrong lowerings.

Fault injection: a registry rule or a tiler is replaced by a wrong one (a halved, zeroed or
negated reduction; a matmul that drops its K=513 tail tile) and ``assert_matches_eager`` must
fail, in fp32 and in bf16; with the real lowering the same call passes. Also: a function that
falls back fails the helper; the strategies draw tile-edge shapes and special values; a
hypothesis property test written the way docs/testing.md shows a user.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, TensorRef, const, load
from lowering.registry import REGISTRY
from lowering.tiling import TILERS
from neuron_compiler.runtime import PROGRAM_CACHE
from neuron_compiler.testing import (TILE_EDGES, assert_close, assert_matches_eager,
                                     clone_as_given, default_atol, make_tensor, shapes, tensors)

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


def _rand(*shape, dtype, seed=0):
    return make_tensor(shape, dtype, seed)


def _wrong_rule(monkeypatch, target, how: str):
    """Replace ``target``'s rule by one whose result is then halved / zeroed / negated."""
    rule = REGISTRY[target]
    factor = {"halve": 0.5, "zero": 0.0, "negate": -1.0}[how]

    def lower(ctx, node, *args, **kwargs):
        out = rule.lower(ctx, node, *args, **kwargs)
        bad = ctx.new_tensor(out.shape, out.dtype, hint="bad")
        ctx.emit(KOp(KKind.POINTWISE, (bad,), (out,), PointwiseAttrs(
            Expr(EOp.MUL, (load(0, out.dtype), const(factor)), out.dtype))))
        return bad

    monkeypatch.setitem(REGISTRY, target, dataclasses.replace(rule, lower=lower))
    PROGRAM_CACHE.clear()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", ["halve", "zero", "negate"])
def test_a_wrong_reduction_fails(monkeypatch, dtype, how):
    x = _rand(129, 513, dtype=dtype)
    fn = lambda x: x.sum(1)  # noqa: E731
    PROGRAM_CACHE.clear()
    assert_matches_eager(fn, x)                           # the real lowering passes
    _wrong_rule(monkeypatch, aten.sum.dim_IntList, how)
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_matches_eager(fn, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_matmul_that_drops_its_k_tail_tile_fails(monkeypatch, dtype):
    a, b = _rand(130, 513, dtype=dtype, seed=1), _rand(513, 129, dtype=dtype, seed=2)
    PROGRAM_CACHE.clear()
    assert_matches_eager(torch.mm, a, b)
    real = TILERS[KKind.MATMUL]

    def drop_k_tail(builder, k: KOp):
        A, B = k.ins[:2]
        K = A.shape[-1]
        short = K - (K % 128 or 128)                      # the last K tile (of 1 row for 513)
        A2 = TensorRef(A.buffer, A.dtype, A.shape[:-1] + (short,), A.strides, A.offset)
        B2 = TensorRef(B.buffer, B.dtype, B.shape[:-2] + (short, B.shape[-1]), B.strides, B.offset)
        return real(builder, dataclasses.replace(k, ins=(A2, B2) + k.ins[2:]))

    monkeypatch.setitem(TILERS, KKind.MATMUL, drop_k_tail)
    PROGRAM_CACHE.clear()
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_matches_eager(torch.mm, a, b)


def test_a_fallback_fails_the_helper():
    x = torch.randn(8, 8)
    with pytest.raises(AssertionError, match="ran on the device|no device partition"):
        assert_matches_eager(lambda x: torch.linalg.eigvals(x).real, x)
    d = assert_matches_eager(lambda x: torch.linalg.eigvals(x).real + 1, x, min_device_fraction=0.0)
    assert d["fallback_nodes"] >= 1


def test_in_place_arguments_are_compared():
    def bump(x):
        x.add_(1.0)
        return x.sum()
    assert_matches_eager(bump, torch.randn(129, 7))


def test_assert_close_rules():
    e = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    assert_close(e.clone(), e)
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(torch.tensor([1.0, 0.0, float("inf"), -2.0]), e)
    with pytest.raises(AssertionError, match="infinities"):
        assert_close(torch.tensor([1.0, float("nan"), float("-inf"), -2.0]), e)
    with pytest.raises(AssertionError, match="differ"):
        assert_close(torch.tensor([1, 2]), torch.tensor([1, 3]))
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(e.double(), e)
    big = torch.full((1000,), 100.0)
    assert_close(big + 0.0105, big)                       # rtol of each element's own magnitude
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_close(big + 0.012, big)
    assert_close(big + 0.012, big, atol=0.01)             # an explicit atol is absolute


@pytest.mark.parametrize("dtype, large, floor", [(torch.float32, 1e6, 10.0),
                                                 (torch.bfloat16, 1e3, 10.0)])
def test_a_single_wrong_small_element_among_large_ones_fails(dtype, large, floor):
    """The floor is CANCELLATION x the mean magnitude (fp32 1e-5, bf16 1e-2), not the old
    atol x mean (fp32 1e-4 x 1e6 = 100: a 0.5 returned as 50.5 passed)."""
    e = torch.full((1000,), large, dtype=dtype)
    e[3] = 0.5
    assert default_atol(e) == pytest.approx(floor, rel=0.01)
    a = e.clone()
    a[3] = 50.5
    with pytest.raises(AssertionError, match=r"worst at \[3\]: 50.5 vs eager 0.5"):
        assert_close(a, e)
    a[3] = 0.5 + 0.9 * floor                             # within the floor: passes
    assert_close(a, e)


def test_a_single_wrong_small_element_fails_the_helper():
    """End to end: the compiled function (only) corrupts one small element among 1e6 values."""
    def fn(x):
        y = x * 2.0
        if torch.compiler.is_compiling():                 # traced only by torch.compile
            y = y + (torch.arange(y.shape[0]) == 3).to(y.dtype) * 50.0
        return y
    x = torch.full((256,), 5e5)
    x[3] = 0.25
    with pytest.raises(AssertionError, match=r"1 of 256 elements out of tolerance.*worst at \[3\]"):
        assert_matches_eager(fn, x)
    assert_matches_eager(lambda x: x * 2.0, x)


def test_zero_signs_are_compared_when_asked():
    def fn(x):
        y = x * 0.0                                       # -0.0 where x < 0
        if torch.compiler.is_compiling():
            y = y + 0.0                                   # -0.0 + 0.0 = +0.0: the sign is lost
        return y
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    assert_matches_eager(fn, x)                           # by default zeros compare equal
    with pytest.raises(AssertionError, match="2 of 4 zeros have the other sign; first at \\[0\\]"):
        assert_matches_eager(fn, x, check_zero_sign=True)
    assert_matches_eager(lambda x: x * 0.0, x, check_zero_sign=True)
    with pytest.raises(AssertionError, match="other sign"):
        assert_close(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), check_zero_sign=True)


@pytest.mark.parametrize("view", ["transposed", "sliced"])
def test_strided_arguments_are_passed_as_given(view):
    base = make_tensor((129, 130), torch.float32, 5)
    x = base.t() if view == "transposed" else base[1:, 3::2]
    seen: list[tuple] = []

    def fn(x):
        seen.append((tuple(x.stride()), x.storage_offset()))   # eager, and while Dynamo traces
        return x.exp() * 2.0

    assert_matches_eager(fn, x)
    assert seen and all(s == (x.stride(), x.storage_offset()) for s in seen), (seen, x.stride())
    c = clone_as_given(x)
    assert c.stride() == x.stride() and c.storage_offset() == x.storage_offset()
    assert torch.equal(c, x) and c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_clone_as_given_keeps_expanded_and_empty_tensors():
    for t in (torch.randn(1, 5).expand(4, 5), torch.randn(3, 4)[None].expand(2, 3, 4),
              torch.empty(0, 3), torch.randn(4, 6)[:, 1:4].t()):
        c = clone_as_given(t)
        assert (c.shape, c.stride(), c.storage_offset()) == (t.shape, t.stride(),
                                                              t.storage_offset())
        assert torch.equal(c, t)


def test_strategies_cross_tile_edges_and_draw_special_values():
    seen: set[int] = set()

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(shape=shapes(max_rank=2))
    def collect(shape):
        assert 1 <= len(shape) <= 2 and math.prod(shape) <= 1 << 15
        seen.update(shape)

    collect()
    assert seen & {127, 128, 129, 511, 512, 513} and set(TILE_EDGES) >= {1, 128, 513}
    x = make_tensor((64, 64), torch.float32, 3, "special")
    assert x.isnan().any() and x.isinf().any() and (x == 0).any()
    assert ((x != 0) & (x.abs() < 1e-38)).any()           # denormals
    assert bool((torch.signbit(x) & (x == 0)).any())      # -0.0
    assert make_tensor((5,), torch.int64, 0).dtype is torch.int64
    assert make_tensor((5,), torch.bool, 0).dtype is torch.bool


@settings(max_examples=6, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(x=tensors(shapes=shapes(max_rank=2, max_numel=1 << 13)), alpha=st.floats(-2, 2))
def test_property_test_as_a_user_writes_it(x, alpha):
    assert_matches_eager(lambda x: torch.nn.functional.gelu(x) * alpha + x.mean(), x)
