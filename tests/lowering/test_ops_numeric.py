"""Every lowering against eager PyTorch through the simulator.

Shapes cross the tile edges of the machine: 128 partitions (rows/M/K: 1, 127, 128, 129, 513),
the 512-wide matmul moving tile (N: 511, 512, 513) and the 2048-element elementwise free chunk
(2049), for fp32 and bf16 (fp16 where it is cheap). Elementwise cases mostly use [129, 65]
(crossing the partition edge) to keep the simulator time low. Each case is traced with ``make_fx`` + core-ATen decompositions, must lower
completely (``lower_and_run`` asserts every node is supported and instructions executed) and must
match eager within the dtype's tolerance (NaN/inf positions must coincide).

Known lowering bugs are ``xfail(strict=True)`` with a reproduction in the reason.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lowering.errors import LoweringError, Unsupported
from lowering_helpers import assert_close, check, compile_fn, lower_and_run, rand, to_numpy

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [FP32, BF16]
DTYPES3 = [FP32, BF16, FP16]


def _ids(v):
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple):
        return "x".join(str(s) for s in v)
    return None


# ---- matrix products ------------------------------------------------------------------------
MM_SHAPES = [(1, 1, 1), (127, 128, 129), (128, 512, 128), (129, 513, 511), (513, 129, 65)]


@pytest.mark.parametrize("mkn,dtype", [(s, d) for s in MM_SHAPES for d in DTYPES3
                                        if d is not FP16 or math.prod(s) <= 2 ** 22], ids=_ids)
def test_mm(mkn, dtype):
    m, k, n = mkn
    check(torch.mm, rand(m, k, dtype=dtype, seed=1), rand(k, n, dtype=dtype, seed=2),
          scale=math.sqrt(k))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("alpha,beta", [(1, 1), (2.0, 0.5), (-1.5, 0.0)])
@pytest.mark.parametrize("bias_2d", [False, True], ids=["bias1d", "bias2d"])
def test_addmm(alpha, beta, bias_2d, dtype):
    m, k, n = 129, 130, 513
    bias = rand(m, n, dtype=dtype, seed=3) if bias_2d else rand(n, dtype=dtype, seed=3)
    check(lambda b, x, w: torch.addmm(b, x, w, beta=beta, alpha=alpha),
          bias, rand(m, k, dtype=dtype, seed=4), rand(k, n, dtype=dtype, seed=5), scale=math.sqrt(k))


def test_addmm_beta0_ignores_nan_bias():
    check(lambda b, x, w: torch.addmm(b, x, w, beta=0), torch.full((140,), float("nan")),
          rand(129, 130, seed=120), rand(130, 140, seed=121), scale=12.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("bmkn", [(1, 1, 1, 1), (3, 129, 65, 127), (2, 128, 257, 513)], ids=_ids)
def test_bmm(bmkn, dtype):
    b, m, k, n = bmkn
    check(torch.bmm, rand(b, m, k, dtype=dtype, seed=6), rand(b, k, n, dtype=dtype, seed=7),
          scale=math.sqrt(k))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("xshape", [(129, 96), (2, 65, 96)], ids=_ids)
def test_linear(xshape, bias, dtype):
    w = rand(130, 96, dtype=dtype, seed=8)
    args = [rand(*xshape, dtype=dtype, seed=9), w] + ([rand(130, dtype=dtype, seed=10)] if bias else [])
    check(lambda *a: F.linear(*a), *args, scale=math.sqrt(96))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("case", ["xT_g", "g_wT", "aT_bT", "batched_T", "3d_at_2d"])
def test_matmul_transposed_views(case, dtype):
    """Backward-graph shapes: grad_w = x.t() @ g, grad_x = g @ w; transposed batched operands."""
    if case == "xT_g":
        fn, a, b = (lambda x, g: x.t() @ g), rand(129, 65, dtype=dtype, seed=11), rand(129, 513, dtype=dtype, seed=12)
    elif case == "g_wT":
        fn, a, b = (lambda g, w: g @ w.t()), rand(129, 130, dtype=dtype, seed=13), rand(257, 130, dtype=dtype, seed=14)
    elif case == "aT_bT":
        fn, a, b = (lambda x, y: x.t() @ y.t()), rand(130, 129, dtype=dtype, seed=15), rand(65, 130, dtype=dtype, seed=16)
    elif case == "batched_T":
        fn, a, b = (lambda x, y: x @ y.transpose(1, 2)), rand(2, 129, 64, dtype=dtype, seed=17), rand(2, 130, 64, dtype=dtype, seed=18)
    else:
        fn, a, b = (lambda x, w: torch.matmul(x, w)), rand(2, 129, 64, dtype=dtype, seed=19), rand(64, 130, dtype=dtype, seed=20)
    check(fn, a, b, scale=math.sqrt(a.shape[-1] if case != "xT_g" else 129))


# ---- elementwise: binary --------------------------------------------------------------------
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
# elementwise tiles: rows on 128 partitions, free chunks of up to 2048 elements; 1-D tensors of
# >= 256 elements become [128, n // 128] plus a tail row
EW_SHAPES = [(1,), (127,), (257,), (128, 512), (129, 65), (3, 2049), (3, 129, 65)]


@pytest.mark.parametrize("shape,dtype", [(s, d) for s in EW_SHAPES for d in DTYPES
                                          if d is FP32 or len(s) > 1], ids=_ids)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_tensor(op, shape, dtype):
    x = rand(*shape, dtype=dtype, seed=21)
    y = rand(*shape, dtype=dtype, seed=22, low=0.5, high=2.0)  # keep div away from 0
    check(BINARY[op], x, y)


@pytest.mark.parametrize("bcast,dtype", [(b, d) for b in ["row", "col", "scalar0d", "outer", "middle"]
                                          for d in DTYPES3 if d is not FP16 or b in ("row", "col")],
                         ids=_ids)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_broadcast(op, bcast, dtype):
    x = rand(129, 65, dtype=dtype, seed=23)
    if bcast == "row":
        y = rand(65, dtype=dtype, seed=24, low=0.5)
    elif bcast == "col":
        y = rand(129, 1, dtype=dtype, seed=24, low=0.5)
    elif bcast == "scalar0d":
        y = torch.tensor(1.75, dtype=dtype)
    elif bcast == "outer":
        x, y = rand(129, 1, dtype=dtype, seed=23), rand(1, 2049, dtype=dtype, seed=24, low=0.5)
    else:
        x, y = rand(3, 129, 65, dtype=dtype, seed=23), rand(3, 1, 65, dtype=dtype, seed=24, low=0.5)
    check(BINARY[op], x, y)


@pytest.mark.parametrize("dtype", DTYPES3, ids=_ids)
@pytest.mark.parametrize("expr", ["x+2.5", "x-0.75", "3-x", "x*-1.5", "x/3", "2/x", "x+2y",
                                  "add_alpha", "sub_alpha", "max", "min", "clamp"])
def test_binary_scalar_and_alpha(expr, dtype):
    x = rand(129, 65, dtype=dtype, seed=25, low=0.25, high=3.0)
    y = rand(129, 65, dtype=dtype, seed=26)
    fns = {
        "x+2.5": lambda x, y: x + 2.5, "x-0.75": lambda x, y: x - 0.75, "3-x": lambda x, y: 3 - x,
        "x*-1.5": lambda x, y: x * -1.5, "x/3": lambda x, y: x / 3, "2/x": lambda x, y: 2 / x,
        "x+2y": lambda x, y: x + y * 2,
        "add_alpha": lambda x, y: torch.add(x, y, alpha=2.5),
        "sub_alpha": lambda x, y: torch.sub(x, y, alpha=0.5),
        "max": torch.maximum, "min": torch.minimum,
        "clamp": lambda x, y: torch.clamp(y, -0.5, 0.75),
    }
    check(fns[expr], x, y)


# ---- elementwise: unary ---------------------------------------------------------------------
def _pos(fn):
    return fn, (0.05, 4.0)


UNARY = {
    "neg": (torch.neg, (-3, 3)),
    "abs": (torch.abs, (-3, 3)),
    "relu": (torch.relu, (-3, 3)),
    "gelu": (lambda x: F.gelu(x), (-4, 4)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (-4, 4)),
    "silu": (lambda x: F.silu(x), (-6, 6)),
    "sigmoid": (torch.sigmoid, (-8, 8)),
    "tanh": (torch.tanh, (-4, 4)),
    "exp": (torch.exp, (-5, 5)),
    "log": _pos(torch.log),
    "sqrt": _pos(torch.sqrt),
    "rsqrt": _pos(torch.rsqrt),
    "reciprocal": _pos(torch.reciprocal),
    "erf": (torch.erf, (-3, 3)),
    "sin": (torch.sin, (-3, 3)),
    "cos": (torch.cos, (-3, 3)),
    "sign": (torch.sign, (-3, 3)),
    "pow2": (lambda x: x ** 2, (-3, 3)),
    "pow3": (lambda x: torch.pow(x, 3), (-3, 3)),
    "pow0.5": _pos(lambda x: x ** 0.5),
    "pow-1": _pos(lambda x: x ** -1),
    "pow2.5": _pos(lambda x: x ** 2.5),
    "scalar_pow": (lambda x: torch.pow(2.0, x), (-3, 3)),
}


@pytest.mark.parametrize("shape,dtype", [((1,), FP32), ((257,), FP32), ((129, 65), FP32),
                                         ((3, 2049), FP32), ((129, 65), BF16)], ids=_ids)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, shape, dtype):
    fn, (lo, hi) = UNARY[op]
    check(fn, rand(*shape, dtype=dtype, low=lo, high=hi, seed=27))


@pytest.mark.parametrize("op", ["gelu", "silu", "exp", "tanh", "rsqrt"])
def test_unary_fp16(op):
    fn, (lo, hi) = UNARY[op]
    check(fn, rand(129, 65, dtype=FP16, low=lo, high=hi, seed=28))


# ---- comparisons, where, masked_fill --------------------------------------------------------
CMPS = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("rhs,dtype", [("tensor", FP32), ("tensor", BF16), ("scalar", FP32),
                                        ("bcast", FP32)], ids=_ids)
@pytest.mark.parametrize("op", CMPS)
def test_compare(op, rhs, dtype):
    # rounded values make ties common, so eq/ne/le/ge are exercised on equal elements
    x = (rand(129, 65, dtype=FP32, seed=29) * 2).round().to(dtype)
    y = {"tensor": (rand(129, 65, dtype=FP32, seed=30) * 2).round().to(dtype),
         "scalar": 1.0,
         "bcast": (rand(65, dtype=FP32, seed=31) * 2).round().to(dtype)}[rhs]
    f = getattr(torch, op)
    if rhs == "scalar":
        check(lambda x: f(x, 1.0), x)
    else:
        check(f, x, y)


@pytest.mark.parametrize("dtype", DTYPES3, ids=_ids)
def test_compare_to_float_mask(dtype):
    check(lambda x, y: (x > y).to(dtype) * x, rand(129, 65, dtype=dtype, seed=32),
          rand(129, 65, dtype=dtype, seed=33))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("case", ["tensors", "scalar_other", "bcast_cond", "logical"])
def test_where(case, dtype):
    x = rand(129, 65, dtype=dtype, seed=34)
    y = rand(129, 65, dtype=dtype, seed=35)
    fns = {
        "tensors": lambda x, y: torch.where(x > y, x, y),
        "scalar_other": lambda x, y: torch.where(x > 0, x, 0.0),
        "bcast_cond": lambda x, y: torch.where(y[0] > 0, x, y),
        "logical": lambda x, y: torch.where(
            torch.logical_or(torch.logical_and(x > 0, y < 0), x < -1.5), x * 2, y),
    }
    check(fns[case], x, y)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("value", [0.0, -1e4, float("-inf")], ids=["0", "-1e4", "-inf"])
def test_masked_fill(value, dtype):
    check(lambda x, y: x.masked_fill(y < 0, value), rand(129, 65, dtype=dtype, seed=36),
          rand(129, 65, dtype=dtype, seed=37))


@pytest.mark.parametrize("op", ["and", "or", "not"])
def test_bool_bitwise_ops(op):
    fns = {"and": lambda x, y: torch.where((x > 0) & (y < 0), x, y),
           "or": lambda x, y: torch.where((x > 0) | (y < 0), x, y),
           "not": lambda x, y: torch.where(~(x > 0), x, y)}
    check(fns[op], rand(129, 130, seed=70), rand(129, 130, seed=71))


def test_logical_not():
    check(lambda x: torch.logical_not(x > 0).float() + x, rand(129, 130, seed=38))


# ---- dtype casts ----------------------------------------------------------------------------
CASTS = [(FP32, BF16), (BF16, FP32), (FP32, FP16), (FP16, FP32), (BF16, FP16), (FP16, BF16)]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda d: _ids(d))
def test_cast_float(src, dst):
    check(lambda x: x.to(dst), rand(129, 65, dtype=src, low=-300, high=300, seed=39))


@pytest.mark.parametrize("dst", [torch.bool, FP32, BF16], ids=_ids)
def test_cast_from_bool(dst):
    check(lambda x: (x > 0).to(dst), rand(129, 65, seed=40))


def test_cast_to_bool():
    x = rand(129, 65, seed=41).round()  # many exact zeros
    check(lambda x: x.bool(), x)


def test_cast_rounding_bf16_fp32_chain():
    """Each op rounds to its own dtype like eager: (x.bf16() * 3).float() + x."""
    check(lambda x: (x.to(BF16) * 3).float() + x, rand(129, 65, seed=42), rtol=1e-5)


@pytest.mark.parametrize("dst", [torch.int32, torch.int64], ids=_ids)
def test_cast_float_to_int(dst):
    check(lambda x: x.to(dst), rand(129, 130, low=-50, high=50, seed=43))


# ---- reductions -----------------------------------------------------------------------------
RED_CASES = [
    ((513, 129), 0), ((513, 129), 1), ((513, 129), -1), ((513, 129), (0, 1)),
    ((3, 129, 130), 0), ((3, 129, 130), 1), ((3, 129, 130), 2), ((3, 129, 130), (0, 2)),
    ((3, 129, 130), (1, 2)), ((1,), 0), ((128, 512), 1), ((2, 3, 4, 65), (1, 3)),
]


# every (op, case) once; keepdim both ways on alternating cases
@pytest.mark.parametrize("shape,dim,keepdim", [(s, d, bool(i % 2)) for i, (s, d) in enumerate(RED_CASES)],
                         ids=lambda v: _ids(v) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_reduce_fp32(op, shape, dim, keepdim):
    f = getattr(torch, op)
    n = 1
    for d in (dim if isinstance(dim, tuple) else (dim,)):
        n *= shape[d]
    check(lambda x: f(x, dim, keepdim=keepdim), rand(*shape, seed=44), scale=math.sqrt(n))


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=_ids)
@pytest.mark.parametrize("shape,dim", [((513, 129), 0), ((3, 129, 130), 2), ((3, 129, 130), (0, 1))],
                         ids=lambda v: _ids(v) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_reduce_low_precision(op, shape, dim, dtype):
    f = getattr(torch, op)
    check(lambda x: f(x, dim), rand(*shape, dtype=dtype, seed=45), scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_reduce_full(op, dtype):
    f = getattr(torch, op)
    check(lambda x: f(x), rand(129, 513, dtype=dtype, seed=46), scale=64.0)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=_ids)
@pytest.mark.parametrize("shape", [(129, 513), (3, 129, 130)], ids=_ids)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_every_element_are_exact(op, shape, dtype):
    """``torch.max(x)`` / ``torch.min(x)`` (aten.max/min.default): a selection, so exactly
    eager's value (and a halved result would not pass)."""
    x = rand(*shape, dtype=dtype, seed=47)
    fn = getattr(torch, op)
    low = lower_and_run(fn, x)
    got, want = low.outputs[0], fn(x)
    assert got.shape == want.shape and torch.equal(got, want), (got, want)
    assert not torch.equal(got / 2, want)      # the comparison can fail


# ---- softmax / log_softmax / layer norm -----------------------------------------------------
SOFTMAX_CASES = [((129, 513), -1), ((129, 513), 0), ((1, 1), -1), ((3, 129, 130), 1),
                 ((2, 4, 65, 65), -1)]


@pytest.mark.parametrize("shape,dim,dtype", [(s, d, dt) for s, d in SOFTMAX_CASES for dt in DTYPES3
                                             if dt is not FP16 or len(s) <= 2],
                         ids=lambda v: _ids(v) if isinstance(v, (tuple, torch.dtype)) else str(v))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax(log, shape, dim, dtype):
    f = torch.log_softmax if log else torch.softmax
    check(lambda x: f(x, dim), rand(*shape, dtype=dtype, low=-6, high=6, seed=47))


def test_softmax_half_to_float():
    check(lambda x: torch.softmax(x, -1, dtype=FP32), rand(129, 130, dtype=BF16, seed=48))


@pytest.mark.parametrize("affine,dtype", [(a, d) for a in ["wb", "w", "none"] for d in DTYPES3
                                          if d is not FP16 or a == "wb"], ids=_ids)
@pytest.mark.parametrize("shape,nshape", [((129, 513), (513,)), ((2, 65, 96), (96,)),
                                          ((3, 8, 65), (8, 65)), ((1, 1), (1,))],
                         ids=lambda v: _ids(v))
def test_layer_norm(shape, nshape, affine, dtype):
    x = rand(*shape, dtype=dtype, low=-3, high=5, seed=49)
    w = rand(*nshape, dtype=dtype, seed=50)
    b = rand(*nshape, dtype=dtype, seed=51)
    if affine == "wb":
        check(lambda x, w, b: F.layer_norm(x, nshape, w, b), x, w, b)
    elif affine == "w":
        check(lambda x, w: F.layer_norm(x, nshape, w), x, w)
    else:
        check(lambda x: F.layer_norm(x, nshape), x)


def test_native_layer_norm_mean_rstd():
    """All three outputs of native_layer_norm (mean and rstd are what backward graphs use)."""
    x, w, b = rand(129, 513, seed=52), rand(513, seed=53), rand(513, seed=54)
    check(lambda x, w, b: torch.ops.aten.native_layer_norm(x, [513], w, b, 1e-5), x, w, b)


# ---- views and shape ops --------------------------------------------------------------------
VIEW_FNS = {
    "view": (lambda x: x.view(129, 3, 130) * 2, (387, 130)),
    "reshape_noncontig": (lambda x: x.t().reshape(-1) + 1, (129, 130)),
    "permute": (lambda x: x.permute(2, 0, 1) * 2, (3, 129, 65)),
    "permute_contiguous": (lambda x: x.permute(1, 2, 0).contiguous(), (3, 129, 65)),  # copy

    "transpose": (lambda x: x.transpose(0, 1) + 1, (129, 130)),
    "transpose_clone": (lambda x: x.transpose(-1, -2).clone(), (2, 129, 130)),
    "expand": (lambda x: x.expand(129, 130) * 1.5, (1, 130)),
    "expand_col": (lambda x: x.unsqueeze(-1).expand(129, 130, 3) + 0, (129, 130)),
    "unsqueeze": (lambda x: x.unsqueeze(1) - 1, (129, 130)),
    "squeeze": (lambda x: x.squeeze(1) * 3, (129, 1, 65)),
    "squeeze_all": (lambda x: x.squeeze() * 3, (1, 129, 1)),
    "slice": (lambda x: x[1:128, 2:130] * 2, (129, 130)),
    "slice_step": (lambda x: x[::2, 3::5] + 1, (129, 130)),
    "select": (lambda x: x[:, 5] + x[3], (129, 129)),
    "narrow_cat": (lambda x: torch.cat([x[:, 64:], x[:, :64]], dim=1), (129, 130)),
    "clone": (lambda x: x.clone(), (129, 130)),
    "split": (lambda x: [t * (i + 1) for i, t in enumerate(x.split(50, dim=1))], (129, 130)),
    "split_rows": (lambda x: [t + 1 for t in x.split(64, dim=0)], (129, 65)),
    "chunk_sum": (lambda x: sum(x.chunk(2, dim=-1)), (129, 130)),
    "unbind": (lambda x: x.unbind(0)[1] * 2, (3, 129, 65)),
    "flatten_mm": (lambda x: x.flatten(0, 1) @ x[0].t(), (2, 65, 96)),
}


# clone/contiguous are lowered as views (no data moves on the device: the output is read back
# through its strides), so these graphs may execute no instruction
NO_INSTR = {"permute_contiguous", "transpose_clone", "clone"}


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("name", list(VIEW_FNS))
def test_views(name, dtype):
    fn, shape = VIEW_FNS[name]
    check(fn, rand(*shape, dtype=dtype, seed=55), scale=10.0,
          expect_instructions=name not in NO_INSTR)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim, dtype):
    a = rand(129, 65, dtype=dtype, seed=56)
    b = rand(129, 65, dtype=dtype, seed=57)
    c = rand(129, 65, dtype=dtype, seed=58)
    check(lambda a, b, c: torch.cat([a, b * 2, c], dim=dim), a, b, c)


def test_cat_uneven():
    check(lambda a, b: torch.cat([a, b], dim=0), rand(1, 130, seed=59), rand(128, 130, seed=60))


def test_pure_view_output():
    """A graph whose only output is a view of its input: the output aliases the input buffer."""
    x = rand(129, 130, seed=61)
    low = lower_and_run(lambda x: x.view(130, 129), x, expect_instructions=False)
    assert_close(low.outputs[0], x.view(130, 129))


# ---- tensors made on the device -------------------------------------------------------------
FACTORY = {
    "full": lambda x: x + torch.full((130,), 2.5, dtype=x.dtype),
    "zeros": lambda x: torch.zeros(129, 130, dtype=x.dtype) + x,
    "ones": lambda x: x * torch.ones(129, 1, dtype=x.dtype),
    "arange": lambda x: x + torch.arange(130, dtype=x.dtype),
    "arange_step": lambda x: x * torch.arange(1, 131 * 2 - 1, 2).to(x.dtype),
    "arange_float": lambda x: x + torch.arange(0.0, 13.0, 0.1, dtype=FP32)[:130].to(x.dtype),
    "arange_1d": lambda x: x.reshape(-1)[:513] + torch.arange(513).to(x.dtype),
    "tril_mul": lambda x: x[:, :129] * torch.ones(129, 129, dtype=x.dtype).tril(),
    "causal_mask_eq0": lambda x: x[:, :129].masked_fill(torch.tril(torch.ones(129, 129)) == 0,
                                                       float("-inf")),
    "causal_arange": lambda x: x[:, :129].masked_fill(
        torch.arange(129)[:, None] < torch.arange(129)[None, :], float("-inf")),
    "triu_diag": lambda x: x[:, :129] * torch.ones(129, 129, dtype=x.dtype).triu(1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("name", list(FACTORY))
def test_factories(name, dtype):
    check(FACTORY[name], rand(129, 130, dtype=dtype, seed=62))


@pytest.mark.parametrize("case", ["arange", "tril", "causal_bmm"])
def test_matmul_epilogue_with_iota(case):
    """An elementwise consumer of mm/bmm that reads an on-device iota (arange, tril, causal
    mask) is fused into the matmul epilogue (regression: this used to raise KeyError in
    tiling/matmul/kernel.py)."""
    fns = {
        "arange": (lambda a, b: (a @ b) + torch.arange(8, dtype=FP32), (4, 8), (8, 8)),
        "tril": (lambda a, b: (a @ b) * torch.ones(8, 8).tril(), (8, 8), (8, 8)),
        "causal_bmm": (lambda a, b: (a @ b).masked_fill(
            torch.arange(8)[:, None] < torch.arange(8)[None, :], float("-inf")), (2, 8, 8), (2, 8, 8)),
    }
    fn, sa, sb = fns[case]
    check(fn, rand(*sa, seed=72), rand(*sb, seed=73), scale=3.0)


def test_causal_softmax():
    """The attention pattern: scores masked by a causal mask, then softmax."""
    def fn(q, k):
        s = (q @ k.transpose(-1, -2)) * 0.125
        mask = torch.tril(torch.ones(129, 129))
        return torch.softmax(s.masked_fill(mask == 0, float("-inf")), dim=-1)
    check(fn, rand(2, 129, 64, seed=63), rand(2, 129, 64, seed=64), scale=8.0)


def test_zeros_like_full_like():
    check(lambda x: torch.maximum(x, torch.zeros_like(x)), rand(129, 130, seed=74))


def test_causal_mask_bitwise_not():
    check(lambda x: x.masked_fill(~torch.tril(torch.ones(129, 129, dtype=torch.bool)),
                                  float("-inf")), rand(129, 129, seed=65))


# ---- empty tensors, NaN and Inf -------------------------------------------------------------
@pytest.mark.parametrize("case", ["ew", "sum_empty_dim", "sum_keep_rows", "mm_k0", "cat_empty"])
def test_empty(case):
    """Empty tensors either compute like eager or raise ``Unsupported`` with a reason naming the
    op (the backend then falls back): never a crash, never a wrong value."""
    fns = {
        "ew": (lambda x: x * 2 + 1, (0, 65)),
        "sum_empty_dim": (lambda x: x.sum(0), (0, 65)),
        "sum_keep_rows": (lambda x: x.sum(1), (0, 65)),
        "mm_k0": (lambda x: x.t() @ x, (0, 65)),
        "cat_empty": (lambda x: torch.cat([x, x * 2], dim=0), (0, 65)),
    }
    fn, shape = fns[case]
    try:
        check(fn, rand(*shape, seed=66), expect_instructions=False)
    except Unsupported as e:
        assert e.reason and e.op, str(e)


def _specials(*shape, dtype=FP32):
    x = rand(*shape, dtype=FP32, seed=67)
    flat = x.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = float("inf")
    flat[5::13] = float("-inf")
    return x.to(dtype)


SPECIAL_FNS = {
    "add": lambda x: x + 1,
    "mul_neg": lambda x: x * -2,
    "relu": torch.relu,
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "where_gt": lambda x: torch.where(x > 0, x, 0.5),
    "maximum": lambda x: torch.maximum(x, torch.zeros(129, 130)),
    "minimum": lambda x: torch.minimum(x, torch.zeros(129, 130)),
    "clamp": lambda x: torch.clamp(x, -1.0, 1.0),
    "cast_bf16": lambda x: x.to(BF16),
    "sum_rows": lambda x: x.sum(-1),
    "amax_rows": lambda x: x.amax(-1),
    "amax_cols": lambda x: x.amax(0),
    "amin_rows": lambda x: x.amin(-1),
    "softmax": lambda x: torch.softmax(x, -1),
    "mm": lambda x: x @ torch.ones(130, 65),
}


@pytest.mark.parametrize("name", list(SPECIAL_FNS))
def test_nan_inf_propagate(name):
    check(SPECIAL_FNS[name], _specials(129, 130))


def test_softmax_all_masked_row_is_nan():
    """A row that is entirely -inf gives NaN in eager softmax (0/0)."""
    x = rand(129, 130, seed=68)
    x[5] = float("-inf")
    check(lambda x: torch.softmax(x, -1), x)


def test_full_reduction_run_shape():
    """``CompiledGraph.run`` returns outputs with the shape of the graph output."""
    x = rand(129, 130, seed=69)
    _, cg = compile_fn(lambda x: x.sum(), x)
    outs, _ = cg.run([to_numpy(x)])
    assert outs[0].shape == ()


# ---- signed zeros and NaN edge cases (eager semantics) --------------------------------------
@pytest.mark.parametrize("op", ["reciprocal", "rsqrt", "one_over"])
def test_negative_zero_reciprocal(op):
    fn = {"reciprocal": torch.reciprocal, "rsqrt": torch.rsqrt, "one_over": lambda x: 1.0 / x}[op]
    check(fn, torch.tensor([[-0.0, 0.0, 1.0, -2.0]]))


def test_sign_nan():
    check(torch.sign, torch.tensor([[float("nan"), -1.0, 0.0, 2.0]]))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("case", ["div_by_zero", "log_neg", "sqrt_neg", "exp_overflow",
                                  "sigmoid_sat", "eq_nan", "ne_nan", "max_nan", "relu_nan",
                                  "clamp_nan", "fp16_overflow", "float_to_int_trunc"])
def test_special_values(case):
    x = rand(129, 130, seed=75)
    y = rand(129, 130, seed=76)
    xn = torch.where(x > 1.5, float("nan"), x)
    fns = {
        "div_by_zero": (lambda x, y: x / (y * 0), (x, y)),
        "log_neg": (torch.log, (x,)),
        "sqrt_neg": (torch.sqrt, (x,)),
        "exp_overflow": (lambda x: torch.exp(x * 100), (x,)),
        "sigmoid_sat": (lambda x: torch.sigmoid(x * 100), (x,)),
        "eq_nan": (lambda x: x == x, (xn,)),
        "ne_nan": (lambda x: x != x, (xn,)),
        "max_nan": (torch.maximum, (xn, y)),
        "relu_nan": (torch.relu, (xn,)),
        "clamp_nan": (lambda x: torch.clamp(x, -1, 1), (xn,)),
        "fp16_overflow": (lambda x: x.to(FP16), (x * 1e5,)),
        "float_to_int_trunc": (lambda x: (x * 3.7).to(torch.int32), (x,)),
    }
    fn, args = fns[case]
    check(fn, *args)


# ---- outputs that are views, several outputs, inputs as outputs ----------------------------
OUTPUT_FNS = {
    "transposed_temp": lambda x: (x * 2).t(),
    "sliced_temp": lambda x: (x * 2)[:, 1:],
    "two_views_of_one": lambda x: ((x * 2), (x * 2)[3]),
    "input_and_result": lambda x: (x, x * 2),
    "expand_of_input": lambda x: (x.expand(2, 129, 130), x + 1),
}


@pytest.mark.parametrize("name", list(OUTPUT_FNS))
def test_outputs(name):
    check(OUTPUT_FNS[name], rand(129, 130, seed=77))


# ---- composite patterns seen in models ------------------------------------------------------
COMPOSITE = {
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                 lambda: (rand(129, 130, seed=78), rand(130, seed=79)), 1.0),
    "mse": (lambda x, y: ((x - y) ** 2).mean(), lambda: (rand(129, 130, seed=80), rand(129, 130, seed=81)), 10.0),
    "baddbmm": (lambda b, x, w: torch.baddbmm(b, x, w, alpha=0.5, beta=2),
                lambda: (rand(2, 129, 130, seed=82), rand(2, 129, 64, seed=83), rand(2, 64, 130, seed=84)), 8.0),
    "attention_4d": (lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.18, -1) @ v,
                     lambda: (rand(2, 3, 65, 32, seed=85), rand(2, 3, 65, 32, seed=86), rand(2, 3, 65, 32, seed=87)), 8.0),
    "softmax_4d_dim1": (lambda x: torch.softmax(x, 1), lambda: (rand(2, 3, 65, 32, seed=88),), 1.0),
    "pow_tensor": (lambda x, y: x.abs() ** y, lambda: (rand(129, 130, seed=89), rand(129, 130, seed=90)), 1.0),
    "clamp_min_only": (lambda x: torch.clamp(x, min=0.5), lambda: (rand(129, 130, seed=91),), 1.0),
    "sum_dtype_f32": (lambda x: x.sum(-1, dtype=FP32), lambda: (rand(129, 130, dtype=BF16, seed=92),), 4.0),
    "mm_bf16_to_f32": (lambda a, b: (a @ b).float(), lambda: (rand(129, 64, dtype=BF16, seed=93),
                                                            rand(64, 130, dtype=BF16, seed=94)), 8.0),
    "matmul_output_also_consumed": (lambda x, w: (x @ w, F.gelu(x @ w)),
                                    lambda: (rand(129, 130, seed=122), rand(130, 140, seed=123)), 12.0),
    "temp_two_consumers": (lambda x: torch.exp(x * 2) + (x * 2).amax(-1, keepdim=True),
                           lambda: (rand(129, 130, seed=124),), 1.0),
    "mixed_dtype_chain": (lambda x: torch.tanh(x.to(BF16)).float() * x, lambda: (rand(129, 130, seed=125),), 1.0),
    "softmax_then_mm": (lambda x, v: torch.softmax(x, -1) @ v,
                        lambda: (rand(129, 130, seed=126), rand(130, 64, seed=127)), 5.0),
    "layer_norm_linear_gelu": (lambda x, w: F.gelu(F.linear(F.layer_norm(x, (130,)), w)),
                               lambda: (rand(129, 130, seed=128), rand(64, 130, seed=129)), 12.0),
    "expand_then_sum": (lambda x: x.expand(4, 129, 130).sum(0), lambda: (rand(129, 130, seed=130),), 2.0),
    "mlp_block": (lambda x, w1, b1, w2: F.linear(F.silu(F.linear(x, w1, b1)), w2) + x,
                  lambda: (rand(129, 96, seed=95), rand(200, 96, seed=96) * 0.1, rand(200, seed=97),
                           rand(96, 200, seed=98) * 0.1), 8.0),
}


@pytest.mark.parametrize("name", list(COMPOSITE))
def test_composite(name):
    fn, make, scale = COMPOSITE[name]
    check(fn, *make(), scale=scale)


# ---- rows longer than one SBUF tile stream in column chunks (rowwise_chunked.py) -------------
CHUNKED_FNS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "layer_norm_affine": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
}


@pytest.mark.parametrize("op", list(CHUNKED_FNS))
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_long_rows_stream_in_chunks(op, dtype):
    """Rows of 65537 elements do not fit one SBUF partition's tiles: the kernel streams them in
    chunks (several passes over HBM) and still matches eager; and it costs more HBM traffic than
    the x/y bytes alone (the extra passes are visible in the stats)."""
    C = 65537
    args = [rand(3, C, dtype=dtype, seed=100) * 3]
    if op == "layer_norm_affine":
        args += [rand(C, dtype=dtype, seed=101), rand(C, dtype=dtype, seed=102)]
    low = check(CHUNKED_FNS[op], *args)
    s = low.result.stats
    assert s.hbm_bytes > 2 * 3 * C * args[0].element_size()


# ---- other targets --------------------------------------------------------------------------
TARGET_FNS = {
    "mm": (torch.mm, lambda: (rand(129, 130, seed=101), rand(130, 513, seed=102)), 12.0),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (rand(129, 130, seed=103),), 1.0),
    "layer_norm": (lambda x: F.layer_norm(x, (130,)), lambda: (rand(129, 130, seed=104),), 1.0),
    "ew_bf16": (lambda x, y: F.gelu(x * y), lambda: (rand(129, 130, dtype=BF16, seed=105),
                                                     rand(130, dtype=BF16, seed=106)), 1.0),
    "sum": (lambda x: x.sum(0), lambda: (rand(129, 130, seed=107),), 12.0),
}


@pytest.mark.parametrize("target", ["trn1", "trn3"])
@pytest.mark.parametrize("name", list(TARGET_FNS))
def test_other_targets(name, target):
    fn, make, scale = TARGET_FNS[name]
    low = check(fn, *make(), target=target, scale=scale)
    assert low.compiled.program.target == target


# ---- big shapes (not in the default run) ----------------------------------------------------
BIG = {
    "mm_1024x2048x1024": (torch.mm, lambda: (rand(1024, 2048, seed=108), rand(2048, 1024, seed=109)), 45.0),
    "mm_bf16_1024": (torch.mm, lambda: (rand(1024, 1024, dtype=BF16, seed=110),
                                         rand(1024, 1024, dtype=BF16, seed=111)), 32.0),
    "bmm_8x512x512x512": (torch.bmm, lambda: (rand(8, 512, 512, seed=112), rand(8, 512, 512, seed=113)), 23.0),
    "softmax_1024x4096": (lambda x: torch.softmax(x, -1), lambda: (rand(1024, 4096, seed=114),), 1.0),
    "softmax_4096_dim0": (lambda x: torch.softmax(x, 0), lambda: (rand(4096, 513, seed=115),), 1.0),
    "layer_norm_1024x4096": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                             lambda: (rand(1024, 4096, seed=116), rand(4096, seed=117), rand(4096, seed=118)), 1.0),
    "ew_1024x8192": (lambda x, y: F.gelu(x * y + 1), lambda: (rand(1024, 8192, seed=119), rand(8192, seed=120)), 1.0),
    "sum_rows_4096x4096": (lambda x: x.sum(0), lambda: (rand(4096, 4096, seed=121),), 64.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BIG))
def test_big_shapes(name):
    fn, make, scale = BIG[name]
    check(fn, *make(), scale=scale)
