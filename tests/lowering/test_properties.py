"""Property tests (hypothesis): random shapes (tile edges included), dtypes and values.

For every drawn case the graph must lower completely (every ATen node supported, instructions
executed: ``lower_and_run`` asserts both) and match eager PyTorch within the dtype's tolerance.

By default the examples are derandomized (the same every run, so CI is stable);
``LOWERING_PROPERTY_RANDOM=1`` draws fresh random examples, four times as many.
"""
from __future__ import annotations

import math
import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowering_helpers import check, lower_and_run, rand
from neuron_compiler.testing import assert_close


def check_tight(fn, *inputs):
    """Lower and run ``fn``; compare with ``neuron_compiler.testing.assert_close`` (per-dtype
    tolerances that do not grow with the reduction's length, so a halved, zeroed or negated
    sum and a dropped K tile fail: tests/test_testing_helpers.py)."""
    want = fn(*inputs)
    low = lower_and_run(fn, *inputs)
    assert_close(low.outputs[0], want)

RANDOM = os.environ.get("LOWERING_PROPERTY_RANDOM") == "1"


def _examples(n: int):
    return settings(deadline=None, derandomize=not RANDOM, database=None,
                    max_examples=4 * n if RANDOM else n,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
EDGE = [1, 2, 3, 7, 127, 128, 129, 255, 511, 512, 513]
MAX_NUMEL = 1 << 16

dtypes = st.sampled_from([FP32, BF16, FP16])
dim_size = st.one_of(st.sampled_from(EDGE), st.integers(1, 300))


@st.composite
def shapes(draw, min_rank=1, max_rank=3, max_numel=MAX_NUMEL):
    rank = draw(st.integers(min_rank, max_rank))
    dims = []
    for _ in range(rank):
        left = max_numel // max(1, math.prod(dims))
        dims.append(min(draw(dim_size), max(1, left)))
    return tuple(dims)


@st.composite
def broadcast_of(draw, shape):
    """A shape that broadcasts to ``shape``: drop some leading dims, set some dims to 1."""
    drop = draw(st.integers(0, len(shape)))
    tail = shape[drop:]
    return tuple(1 if draw(st.booleans()) else s for s in tail)


# unary/binary steps whose values stay bounded, so chains do not overflow low precision
UNARY_STEPS = {
    "relu": torch.relu, "neg": torch.neg, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "abs": torch.abs,
    "half": lambda x: x * 0.5, "plus1": lambda x: x + 1.0, "sq_tanh": lambda x: torch.tanh(x) ** 2,
    "exp_tanh": lambda x: torch.exp(torch.tanh(x)),
    "round_bf16": lambda x: x.to(torch.bfloat16).to(x.dtype),
}
BINARY_STEPS = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum,
    "min": torch.minimum, "where": lambda x, y: torch.where(x > y, x, y * 0.5),
    "div": lambda x, y: x / (y.abs() + 1.0),
}


@_examples(25)
@given(shape=shapes(), dtype=dtypes, data=st.data(), seed=st.integers(0, 2 ** 16))
def test_elementwise_chain_broadcast(shape, dtype, data, seed):
    yshape = data.draw(broadcast_of(shape), label="yshape")
    steps = data.draw(st.lists(st.one_of(st.sampled_from(sorted(UNARY_STEPS)),
                                         st.sampled_from(sorted(BINARY_STEPS))),
                               min_size=1, max_size=4), label="steps")
    swap = data.draw(st.booleans(), label="y_first")

    def fn(x, y):
        for s in steps:
            if s in UNARY_STEPS:
                x = UNARY_STEPS[s](x)
            else:
                x = BINARY_STEPS[s](y, x) if swap else BINARY_STEPS[s](x, y)
        return x

    x = rand(*shape, dtype=dtype, seed=seed)
    y = rand(*yshape, dtype=dtype, seed=seed + 1)
    # a one-ulp difference in an early step may be amplified by later steps: allow 2 ulps
    check(fn, x, y, scale=2.0, rtol=2 * {FP32: 1e-5, BF16: 1e-2, FP16: 1e-3}[dtype])


@_examples(25)
@given(shape=shapes(max_rank=4), dtype=dtypes, data=st.data(), seed=st.integers(0, 2 ** 16),
       op=st.sampled_from(["sum", "mean", "amax", "amin"]), keepdim=st.booleans())
def test_reduction_random_dims(shape, dtype, data, seed, op, keepdim):
    rank = len(shape)
    dims = data.draw(st.one_of(st.none(), st.lists(st.integers(-rank, rank - 1), min_size=1,
                                                    max_size=rank,
                                                    unique_by=lambda d: d % rank)), label="dims")
    f = getattr(torch, op)
    if dims is None:
        fn = (lambda x: f(x)) if op in ("sum", "mean") else (lambda x: f(x, list(range(rank))))
        n = math.prod(shape)
    else:
        fn = lambda x: f(x, dims, keepdim=keepdim)  # noqa: E731
        n = math.prod(shape[d] for d in dims)
    x = rand(*shape, dtype=dtype, seed=seed)
    check_tight(fn, x)


@_examples(20)
@given(m=dim_size, k=dim_size, n=dim_size, dtype=st.sampled_from([FP32, BF16]),
       layout=st.sampled_from(["nn", "tn", "nt", "bias"]), seed=st.integers(0, 2 ** 16))
def test_matmul_random(m, k, n, dtype, layout, seed):
    a_shape = (k, m) if layout == "tn" else (m, k)
    b_shape = (n, k) if layout == "nt" else (k, n)
    a = rand(*a_shape, dtype=dtype, seed=seed)
    b = rand(*b_shape, dtype=dtype, seed=seed + 1)
    if layout == "tn":
        check_tight(lambda a, b: a.t() @ b, a, b)
    elif layout == "nt":
        check_tight(lambda a, b: a @ b.t(), a, b)
    elif layout == "bias":
        bias = rand(n, dtype=dtype, seed=seed + 2)
        check_tight(lambda a, b, c: torch.addmm(c, a, b), a, b, bias)
    else:
        check_tight(torch.mm, a, b)


@_examples(20)
@given(shape=shapes(max_rank=3), dtype=dtypes, data=st.data(), seed=st.integers(0, 2 ** 16),
       log=st.booleans(), spread=st.sampled_from([1.0, 8.0, 30.0]))
def test_softmax_random_dim(shape, dtype, data, seed, log, spread):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    f = torch.log_softmax if log else torch.softmax
    x = rand(*shape, dtype=dtype, seed=seed, low=-spread, high=spread)
    check(lambda x: f(x, dim), x, scale=2.0)
