"""Scans, products and selections on the device: cumsum, cumprod, prod, argmax/argmin,
max.dim/min.dim, topk and sort against eager through the simulator, fp32 and bf16, over 130 x 513
(rows cross the 128-partition tile edge, rows of 513 cross the 512-column edge and the max8
rounds' multiple of 8) and along leading dims (strided rows).

Every case asserts that every node ran on the device (``lower_and_run``) and that the kernel's
instructions ran (``_ran``). Selections are exact: values and positions must equal eager's
(sorts are compared with ``stable=True``, which ours always is; eager's default sort may order
ties either way, so there the positions are checked to be a permutation that reproduces the
values). ``test_tolerances_can_fail`` feeds each tolerance a known-wrong result.
"""
from __future__ import annotations

import pytest
import torch

from lowering.api import why_unsupported
from lowering_helpers import assert_close, lower_and_run, rand, trace
from runtime_sim import Op

DTYPES = [torch.float32, torch.bfloat16]
R, C = 130, 513


def _ran(low, op: Op) -> int:
    return sum(1 for q in low.compiled.program.streams.values() for ins in q if ins.op is op)


def _exact(a, e, what=""):
    assert a.dtype == e.dtype and a.shape == e.shape, (what, a.dtype, e.dtype, a.shape, e.shape)
    same = (a == e) | (torch.isnan(a) & torch.isnan(e)) if a.is_floating_point() else a == e
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {e.numel()} elements differ"


def _x(dtype=torch.float32, shape=(R, C), seed=1):
    return rand(*shape, dtype=dtype, seed=seed)


# ---- scans -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 0])
def test_cumsum(dtype, dim):
    x = _x(dtype)
    low = lower_and_run(lambda x: torch.cumsum(x, dim), x)
    # the sum of up to 513 terms of |x| <= 2: eager's fp32 order is sequential like ours
    assert_close(low.outputs[0], torch.cumsum(x, dim))
    assert _ran(low, Op.TENSOR_TENSOR_SCAN) >= 1


def test_cumsum_long_rows_carry_across_chunks_and_dtype_arg():
    x = _x(torch.float32, (3, 4500), seed=2)
    low = lower_and_run(lambda x: torch.cumsum(x, -1, dtype=torch.bfloat16), x)
    assert_close(low.outputs[0], torch.cumsum(x, -1, dtype=torch.bfloat16))
    assert _ran(low, Op.TENSOR_TENSOR_SCAN) == 3          # 4500 = 2 chunks of 2048 + a tail


@pytest.mark.parametrize("dtype", DTYPES)
def test_cumprod(dtype):
    x = (1 + 0.05 * _x(torch.float32)).to(dtype)
    low = lower_and_run(lambda x: torch.cumprod(x, 1), x)
    assert_close(low.outputs[0], torch.cumprod(x, 1))
    assert _ran(low, Op.TENSOR_TENSOR_SCAN) >= 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_prod(dtype):
    """Against the fp32-accumulated product rounded once: eager's bf16 prod rounds its partial
    products to bf16 (off by 1.2 on a product of 10 over 513 terms), the device's does not."""
    x = (1 + 0.05 * _x(torch.float32)).to(dtype)
    fn = lambda x: (torch.prod(x, 1), torch.prod(x, 0, keepdim=True), torch.prod(x[:7, :9]))
    low = lower_and_run(fn, x)
    for i, (a, e) in enumerate(zip(low.outputs, fn(x.float()))):
        assert_close(a, e.to(dtype), what=f"output {i}")


# ---- reductions with positions ---------------------------------------------------------------
def _specials(x):
    x = x.clone()
    x[3, 100] = float("nan")          # a NaN wins max/min/argmax/argmin
    x[3, 400] = float("nan")
    x[5, 7] = float("inf")
    x[6, :] = float("-inf")           # all equal: the first position
    x[7, 20] = x[7, 30] = 50.0        # a tied maximum: the first position
    x[8, 11] = x[8, 12] = -50.0
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_argmin_max_min(dtype):
    x = _specials(_x(dtype))
    fn = lambda x: (torch.argmax(x, 1), torch.argmin(x, 1, keepdim=True), *torch.max(x, 1),
                    *torch.min(x, 0, keepdim=True), torch.argmax(x[:20, :30]), torch.argmin(x, 0))
    low = lower_and_run(fn, x)
    for i, (a, e) in enumerate(zip(low.outputs, fn(x))):
        _exact(a, e, f"output {i}")
    assert _ran(low, Op.MAX8) >= 6 and _ran(low, Op.FIND_INDEX8) >= 6
    assert _ran(low, Op.MATCH_REPLACE8) == 0              # k = 1: no round takes values out


def test_argmax_short_rows_and_middle_dim():
    x = _x(torch.float32, (4, 5, 3), seed=3)             # 5 < 8 columns: padded with -inf
    x[1, :, 2] = float("-inf")
    fn = lambda x: (torch.argmax(x, 1), *torch.max(x, 2), torch.argmin(x, -1))
    low = lower_and_run(fn, x)
    for i, (a, e) in enumerate(zip(low.outputs, fn(x))):
        _exact(a, e, f"output {i}")


# ---- topk / sort -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,largest", [(5, True), (20, True), (130, True), (6, False)])
def test_topk(dtype, k, largest):
    x = _x(dtype)
    x[2, 50] = float("nan")
    x[4, 60] = float("-inf")
    low = lower_and_run(lambda x: torch.topk(x, k, 1, largest=largest), x)
    _exact(low.outputs[0], torch.topk(x, k, 1, largest=largest).values, "values")
    # eager's topk orders ties either way (bf16 has many); ours keeps index order, as a stable sort
    ref = torch.sort(x, dim=1, stable=True, descending=largest).indices[:, :k]
    _exact(low.outputs[1], ref, "indices")
    assert (_ran(low, Op.MATCH_REPLACE8) > 0) == (k > 8 or not largest)


def test_topk_leading_dim():
    x = _x(torch.float32, (300, 40), seed=4)
    low = lower_and_run(lambda x: torch.topk(x, 10, 0), x)
    e = torch.topk(x, 10, 0)
    _exact(low.outputs[0], e.values, "values")
    _exact(low.outputs[1], e.indices, "indices")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable(dtype, descending):
    x = _x(dtype)
    x[:, 100:140] = torch.round(x[:, 100:140])          # many ties
    x[9, 3] = x[9, 300] = float("nan")                  # NaN largest: last ascending, first descending
    x[10, 4] = float("-inf")
    x[10, 5] = float("inf")
    fn = lambda x: torch.sort(x, dim=1, stable=True, descending=descending)
    low = lower_and_run(fn, x)
    e = fn(x)
    _exact(low.outputs[0], e.values, "values")
    _exact(low.outputs[1], e.indices, "indices")
    assert _ran(low, Op.MATCH_REPLACE8) == 2 * 65       # 65 rounds of 8 per row tile, 2 tiles


def test_sort_default_is_a_valid_order_and_fp32_neg_inf_restored():
    x = _x(torch.float32, (20, 77), seed=5)
    x[:, :30] = torch.round(x[:, :30])
    x[0, :5] = float("-inf")
    x[1, 9] = torch.finfo(torch.float32).min            # no -inf in that row: kept as is
    low = lower_and_run(lambda x: torch.sort(x, 1, descending=True), x)
    v, i = low.outputs
    _exact(v, torch.sort(x, 1, descending=True).values, "values")
    assert torch.equal(torch.sort(i, 1).values, torch.arange(77).expand(20, 77))
    _exact(x.gather(1, i), v, "x[indices]")


def test_selection_fallbacks_name_the_limit():
    x = torch.randn(2, 16385)
    gm = trace(lambda x: torch.argmax(x, 1), x)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert "16385 elements" in why_unsupported(node) and "16384" in why_unsupported(node)
    gi = trace(lambda x: torch.sort(x, 1), torch.arange(12).reshape(3, 4))
    node = next(n for n in gi.graph.nodes if n.op == "call_function")
    assert "integer" in why_unsupported(node)
    gc = trace(lambda x: torch.cumsum(x, 1), torch.arange(12).reshape(3, 4))
    node = next(n for n in gc.graph.nodes if n.op == "call_function")
    assert "integer scans fall back" in why_unsupported(node)   # a bool mask is counted


def test_tolerances_can_fail():
    """Each comparison above rejects a known-wrong result."""
    x = _x(torch.float32, (4, 40), seed=6)
    e = torch.cumsum(x, 1)
    wrong = e.clone()
    wrong[:, -1] += 0.01 * e.abs().max()                 # the tail of the scan off by 1%
    with pytest.raises(AssertionError):
        assert_close(wrong, e)
    eb = e.to(torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close(eb * 0.5, eb)                        # a halved bf16 scan
    with pytest.raises(AssertionError):                  # a dropped chunk (carry lost)
        assert_close(torch.cat([e[:, :20], e[:, 20:] - e[:, 19:20]], 1).to(torch.bfloat16), eb)
    t = torch.topk(x, 5, 1)
    with pytest.raises(AssertionError):
        _exact(t.indices.flip(1), t.indices)              # right values, wrong order
    with pytest.raises(AssertionError):                  # one round late: the 2nd..6th largest
        _exact(torch.topk(x, 6, 1).values[:, 1:], t.values)
    with pytest.raises(AssertionError):                  # a NaN where eager has a value
        _exact(torch.where(t.values == t.values.max(), float("nan"), t.values), t.values)
