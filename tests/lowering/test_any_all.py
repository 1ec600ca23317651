"""``aten.any`` / ``aten.all`` (``.default``, ``.dim``, ``.dims``) against eager, through the
simulator in functional mode.

Under the core-ATen decompositions ``all`` becomes ``logical_not(any(logical_not(x)))``, so the
numeric cases below exercise ``any.*`` for both ops; ``test_overloads_without_decomposition``
lowers the ``all.*`` rules themselves. Every case must lower completely and execute instructions
(``lower_and_run``), its graph must contain the overload under test, and the result must equal
eager exactly (bool/uint8 outputs: ``assert_close`` compares them element by element).

Inputs are built so the answer is not constant: each reduced slice is all-zero (all-nonzero for
``all``) with probability about 1/2, and the edge cases put the single deciding element last, past
the 128-partition and 2048-element free-chunk edges, where a dropped tile would change the answer.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import TensorSpec, compile_graph, why_unsupported
from lowering_helpers import assert_close, check, from_numpy, to_numpy, unsupported_nodes

aten = torch.ops.aten
BOOL, FP32, BF16, FP16 = torch.bool, torch.float32, torch.bfloat16, torch.float16
INT64, INT32, UINT8, INT8 = torch.int64, torch.int32, torch.uint8, torch.int8
OPS = ["any", "all"]


def _ids(v):
    if isinstance(v, bool):
        return "keep" if v else "nokeep"
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple):
        return "x".join(str(s) for s in v) or "none"
    return None


def _nonzero(shape, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Non-zero values of ``dtype`` (both signs; integers up to the dtype's range)."""
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1, 1)
    if dtype.is_floating_point:
        return (sign * (0.25 + 1.75 * torch.rand(shape, generator=g))).to(dtype)
    if dtype == BOOL:
        return torch.ones(shape, dtype=BOOL)
    hi = {INT64: 2 ** 62, INT32: 2 ** 31 - 1, UINT8: 256, INT8: 128}[dtype]
    mag = torch.randint(1, hi, shape, generator=g, dtype=torch.int64)
    return (mag if dtype == UINT8 else sign * mag).to(dtype)


def _mixed(shape, red, op: str, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Zeros with the probability that makes each reduced slice decide either way about 1/2."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape[d] for d in red)
    p_zero = 0.5 ** (1.0 / n) if op == "any" else 1.0 - 0.5 ** (1.0 / n)
    zero = torch.rand(shape, generator=g) < p_zero
    return torch.where(zero, torch.zeros((), dtype=dtype), _nonzero(shape, dtype, g))


def _reduce(op: str, dims, keepdim: bool = False):
    """``x.any(d, keepdim)`` for one dim (-> ``.dim``), a dims tuple (-> ``.dims``), or every
    dim when ``dims`` is None (-> ``.default`` for any, ``.dims`` for the decomposed all)."""
    def fn(x):
        f = getattr(torch, op)
        if dims is None:
            return f(x)
        if len(dims) == 1:
            return f(x, dims[0], keepdim=keepdim)
        return f(x, dim=dims, keepdim=keepdim)
    return fn


def _trues(t: torch.Tensor) -> int:
    return int((t != 0).sum())


def _targets(gm) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def _kernels(low, kind: str) -> int:
    return sum(f"= {kind}[" in line for line in low.dumps["ir_pre_fusion.txt"].splitlines())


def _run(fn, x: torch.Tensor, overload, **kw):
    """``check`` (lowered completely, instructions executed, equal to eager) and the traced graph
    holds ``overload`` (so a change in the decompositions cannot leave the rule untested)."""
    low = check(fn, x, **kw)
    assert overload in _targets(low.gm), f"{overload} not in the traced graph {_targets(low.gm)}"
    return low


# ---- reductions over some dims, keepdim both ways -------------------------------------------
SHAPES_DIMS = [((129, 513), (1,)), ((129, 513), (0,)), ((513, 3), (0,)), ((127, 128), (-1,)),
               ((1, 129), (0,)), ((3, 129, 65), (1,)), ((3, 129, 65), (0, 2)),
               ((2, 130, 2049), (-1,))]
# keepdim only changes the output view: both ways for bool/fp32, once for the other dtypes
CASES = ([(k, s, d, dt) for s, d in SHAPES_DIMS for dt in (BOOL, FP32) for k in (False, True)]
         + [(k, s, d, BF16) for k, (s, d) in zip((False, True) * 4, SHAPES_DIMS)]
         + [(False, (129, 513), (1,), dt) for dt in (FP16, INT64, INT32, UINT8, INT8)]
         + [(True, (3, 129, 65), (0, 2), dt) for dt in (INT64, UINT8)])


INT_ALL_XFAIL = pytest.mark.xfail(strict=True, reason=(
    "core ATen decomposes all(x) into logical_not(any(logical_not(x))); the elementwise "
    "logical_not refuses uint8/int8 (not in EW_DTYPES), although x == 0 is exact through fp32 "
    "(int32/int64 run on the integer ALU). Repro: "
    "check(lambda x: x.all(1), torch.ones(4, 5, dtype=torch.uint8))"))


def _with_ops(rows: list[tuple]) -> list:
    """(op, *row) for both ops; ``all`` over an integer dtype (``row[-1]``) is the known xfail."""
    out = []
    for row in rows:
        for op in OPS:
            integer = row[-1] in (torch.uint8, torch.int8)
            marks = [INT_ALL_XFAIL] if op == "all" and integer else []
            out.append(pytest.param(op, *row, marks=marks))
    return out


@pytest.mark.parametrize("op,keepdim,shape,dims,dtype", _with_ops(CASES), ids=_ids)
def test_reduce_dims(op, keepdim, shape, dims, dtype):
    x = _mixed(shape, [d % len(shape) for d in dims], op, dtype, seed=len(shape) + sum(shape))
    expected = _reduce(op, dims, keepdim)(x)
    assert expected.dtype == (UINT8 if dtype == UINT8 else BOOL)
    assert 0 < _trues(expected) < expected.numel(), "degenerate input: the answer is constant"
    low = _run(_reduce(op, dims, keepdim), x, aten.any.dim if len(dims) == 1 else aten.any.dims)
    assert _kernels(low, "reduce") == 1
    # any: a bool input is reduced as it is, others go through one ``x != 0`` kernel first;
    # all: the decomposition's logical_not already made the input of any.* bool
    assert _kernels(low, "pointwise") == (2 if op == "all" else 0 if dtype == BOOL else 1)


# ---- full reductions: the deciding element is the last one --------------------------------
FULL_SHAPES = [(1,), (127,), (128,), (129,), (513,), (2049,), (129, 513), (3, 129, 65)]


FULL_CASES = [(s, dt) for s in FULL_SHAPES for dt in (BOOL, FP32, BF16)] + [
    ((129,), INT64), ((3, 129, 65), INT64)]


@pytest.mark.parametrize("op,shape,dtype", _with_ops(FULL_CASES), ids=_ids)
@pytest.mark.parametrize("case", ["uniform", "last_differs"])
def test_full_reduction(op, case, shape, dtype):
    """any: all zeros, or zeros but the last element; all: all non-zero, or the last zero."""
    g = torch.Generator().manual_seed(len(shape))
    x = _nonzero(shape, dtype, g) if op == "all" else torch.zeros(shape, dtype=dtype)
    if case == "last_differs":
        x.view(-1)[-1] = 0 if op == "all" else _nonzero((), dtype, g)
    expected = _reduce(op, None)(x)
    assert bool(expected) == ((op == "all") == (case == "uniform"))
    _run(_reduce(op, None), x, aten.any.default if op == "any" else aten.any.dims)


@pytest.mark.parametrize("op", OPS)
def test_every_dim_listed(op):
    x = torch.zeros(129, 65) if op == "any" else torch.ones(129, 65)
    x[128, 64] = 1 if op == "any" else 0
    assert bool(_reduce(op, (0, 1))(x)) == (op == "any")
    _run(_reduce(op, (0, 1), keepdim=True), x, aten.any.dims)
    _run(_reduce(op, (1, 0)), x, aten.any.dims)


@pytest.mark.parametrize("dtype", [BOOL, FP32], ids=_ids)
@pytest.mark.parametrize("op", OPS)
def test_single_deciding_element_past_tile_edges(op, dtype):
    """Each row of [130, 2049] is uniform except one element; rows 127..129 put it in the second
    free chunk (column 2048) and the second partition tile (rows 128, 129)."""
    x = torch.zeros(130, 2049, dtype=dtype) if op == "any" else torch.ones(130, 2049, dtype=dtype)
    hit = 1 if op == "any" else 0
    for r, c in [(0, 0), (1, 2047), (127, 2048), (128, 2048), (129, 1000)]:
        x[r, c] = hit
    expected = _reduce(op, (1,))(x)
    assert _trues(expected) == (5 if op == "any" else 125)
    _run(_reduce(op, (1,)), x, aten.any.dim)
    expected0 = _reduce(op, (0,))(x)
    assert int((expected0 == (op == "any")).sum()) == 4
    _run(_reduce(op, (0,)), x, aten.any.dim)


# ---- NaN, inf, -0.0 -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [FP32, BF16, FP16], ids=_ids)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("op", OPS)
def test_nan_inf_negative_zero(op, dim, dtype):
    """NaN and +-inf are true and -0.0 is false, in torch and on the device."""
    nan, inf = float("nan"), float("inf")
    rows = [[nan, 0.0, 0.0], [0.0, -0.0, 0.0], [-0.0, -0.0, inf], [-inf, 0.0, -0.0],
            [nan, nan, nan], [nan, 1.0, -inf], [-0.0, -0.0, -0.0], [2.0, -0.0, nan]]
    x = torch.tensor(rows, dtype=dtype)
    x = torch.cat([x, torch.zeros(121, 3, dtype=dtype), x], 0)   # [137, 3]: two partition tiles
    if dim == 0:
        x = x.t().contiguous()
    expected = _reduce(op, (dim,))(x)
    assert 0 < _trues(expected) < expected.numel()
    _run(_reduce(op, (dim,)), x, aten.any.dim)


# ---- empty reductions, no reduction, 0-d ----------------------------------------------------
EMPTY = [((0,), None, False), ((0,), (0,), False), ((0,), (0,), True), ((0, 5), (0,), False),
         ((0, 5), (0,), True), ((5, 0), (1,), False), ((5, 0), (1,), True), ((0, 5), (1,), False),
         ((2, 0, 3), (1,), True), ((2, 0, 3), (0, 2), False), ((129, 0), None, False)]


@pytest.mark.parametrize("shape,dims,keepdim", EMPTY, ids=_ids)
@pytest.mark.parametrize("dtype", [BOOL, FP32], ids=_ids)
@pytest.mark.parametrize("op", OPS)
def test_empty(op, dtype, shape, dims, keepdim):
    """torch defines an empty reduction as the identity (any: False, all: True); an empty output
    is empty. The device writes the identity without reading the input."""
    x = torch.zeros(shape, dtype=dtype)
    expected = _reduce(op, dims, keepdim)(x)
    if expected.numel():
        assert bool(expected.all()) == (op == "all")
    check(_reduce(op, dims, keepdim), x, expect_instructions=expected.numel() > 0)


@pytest.mark.parametrize("op,dtype", _with_ops([(BOOL,), (FP32,), (INT64,)]), ids=_ids)
def test_empty_dim_list_reduces_nothing(op, dtype):
    """``any.dims(x, [])`` reduces no dim (unlike ``amax(x, dim=[])``): the truth values."""
    x = _mixed((129, 65), (1,), "any", dtype, seed=9)
    f = (lambda x: aten.any.dims(x, [])) if op == "any" else (lambda x: torch.all(x, dim=()))
    expected = f(x)
    assert expected.shape == x.shape and 0 < _trues(expected) < expected.numel()
    _run(f, x, aten.any.dims)


@pytest.mark.parametrize("value", [0.0, -0.0, 3.0, float("nan")])
@pytest.mark.parametrize("call", ["default", "dim", "dim_keep"])
@pytest.mark.parametrize("op", OPS)
def test_zero_dim_input(op, call, value):
    x = torch.tensor(value)
    fns = {"default": lambda x: getattr(torch, op)(x),
           "dim": lambda x: getattr(torch, op)(x, 0),
           "dim_keep": lambda x: getattr(torch, op)(x, -1, keepdim=True)}
    check(fns[call], x)


# ---- the all.* rules themselves (core ATen decomposes all into any) -------------------------
DIRECT = {
    "any.default": (lambda x: aten.any.default(x), aten.any.default),
    "any.dim": (lambda x: aten.any.dim(x, 1, True), aten.any.dim),
    "any.dims": (lambda x: aten.any.dims(x, [0, 2]), aten.any.dims),
    "all.default": (lambda x: aten.all.default(x), aten.all.default),
    "all.dim": (lambda x: aten.all.dim(x, 1), aten.all.dim),
    "all.dim_keep": (lambda x: aten.all.dim(x, -1, True), aten.all.dim),
    "all.dims": (lambda x: aten.all.dims(x, [0, 2], True), aten.all.dims),
    "all.dims_none": (lambda x: aten.all.dims(x), aten.all.dims),
    "all.dims_empty": (lambda x: aten.all.dims(x, []), aten.all.dims),
}


@pytest.mark.parametrize("dtype", [BOOL, FP32, BF16, INT64, UINT8], ids=_ids)
@pytest.mark.parametrize("name", list(DIRECT))
def test_overloads_without_decomposition(name, dtype):
    fn, overload = DIRECT[name]
    op = name.split(".")[0]
    x = _mixed((3, 129, 65), (1,), op, dtype, seed=11)
    if name.endswith("default") or name.endswith("none"):
        x.view(-1)[:] = 0 if op == "any" else 1
        x.view(-1)[-1] = 1 if op == "any" else 0
    gm = make_fx(fn)(x)                        # no decomposition table: the overload stays
    assert overload in _targets(gm), _targets(gm)
    assert not unsupported_nodes(gm), unsupported_nodes(gm)
    cg = compile_graph(gm, [TensorSpec(tuple(x.shape), x.dtype)], target="trn2")
    outs, res = cg.run([to_numpy(x)], mode="functional")
    assert res.stats.instructions > 0
    v = cg.outputs[0]
    assert_close(from_numpy(outs[0], v.dtype).reshape(v.shape), fn(x), what=name)


# ---- what the models need: scaled_dot_product_attention with a mask -------------------------
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=_ids)
def test_sdpa_with_mask_runs_entirely_on_device(dtype):
    """The SDPA decomposition zeroes fully masked rows with ``all(score == -inf)`` (via any.dim):
    rows 5 and 128 of the mask are all False, so the result depends on the any/all lowering."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 130, 64, generator=g).to(dtype) for _ in range(3))
    mask = torch.rand(1, 1, 130, 130, generator=g) > 0.3
    mask[..., 5, :] = False
    mask[..., 128, :] = False
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    expected = fn(q, k, v, mask)
    assert bool((expected[0, :, 5] == 0).all()) and bool((expected[0, :, 128] == 0).all())
    low = check(fn, q, k, v, mask)
    assert aten.any.dim in _targets(low.gm)


# ---- fallback with a reason -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.int16], ids=_ids)
def test_unsupported_dtype_falls_back_with_reason(dtype):
    gm = make_fx(lambda x: x.any(1))(torch.zeros(4, 5, dtype=dtype))
    node = next(n for n in gm.graph.nodes if n.target == aten.any.dim)
    reason = why_unsupported(node)
    assert reason is not None and "aten.any.dim" in reason and _ids(dtype) in reason, reason
