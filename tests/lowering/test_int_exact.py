"""Exact integer arithmetic on integer graph inputs (``lowering/tiling/intgen.py``): int32 on
GpSimdE's 32-bit integer ALU, int64 as two 32-bit words, wraparound as torch's.

Every case lowers directly (every node must be supported), runs on the simulator in functional
mode, checks that the integer work ran on GpSimdE (``pool``), and compares exactly with eager,
on shapes that cross the tile edges (128 partitions, 512 free elements) and with values beyond
2**24 (where an fp32 path rounds), beyond 2**32 for int64 (where one 32-bit word is not enough)
and at the wraparound extremes; int64 division and modulo by constants below 2**27 (long
division on the int32 ALU). ``test_a_wrong_result_fails`` feeds a result one off.
"""
from __future__ import annotations

import pytest
import torch

from lowering_helpers import assert_close, lower_and_run

SHAPES = [(1,), (127, 3), (128, 512), (129, 513), (2, 131, 511)]
I32_MAX, I32_MIN = 2 ** 31 - 1, -2 ** 31
I64_MAX, I64_MIN = 2 ** 63 - 1, -2 ** 63


def ints(shape, dtype, seed=0, lim=None) -> torch.Tensor:
    """Random values over (most of) the dtype's range with the extremes, -1, 0 and
    2**24 + 1 (odd beyond fp32's exact range) in the first elements."""
    g = torch.Generator().manual_seed(seed)
    hi = lim if lim is not None else (2 ** 62 if dtype == torch.int64 else 2 ** 31 - 1)
    x = torch.randint(-hi, hi, shape, generator=g, dtype=torch.int64)
    edge = [I64_MAX, I64_MIN, 2 ** 32 - 1, 2 ** 32] if dtype == torch.int64 else [I32_MAX, I32_MIN]
    edge += [-1, 0, 2 ** 24 + 1, 3]
    if lim is None:
        x.view(-1)[:min(x.numel(), len(edge))] = torch.tensor(edge[:x.numel()])
    return x.to(dtype)


def check(fn, *inputs) -> None:
    low = lower_and_run(fn, *inputs)
    busy = low.result.stats.engine_busy_ns
    assert busy.get("pool", 0) > 0, f"no GpSimdE instruction ran: {busy}"
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for got, w in zip(low.outputs, want):
        assert_close(got, w)


UNARY = {
    "add_1": lambda x: x + 1,                       # batch norm's num_batches_tracked += 1
    "sub_const": lambda x: x - 123456789,
    "rsub_alpha": lambda x: torch.sub(7, x, alpha=3),
    "add_alpha": lambda x: torch.add(x, x, alpha=5),
    "mul_const": lambda x: x * 3,
    "mul_big_const": lambda x: x * -70001,
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "compare": lambda x: (x > 2 ** 24) | (x == -1),
    "where_const": lambda x: torch.where(x < 0, x, 5),
    "clamp": lambda x: x.clamp(-2 ** 25 + 1, 2 ** 30 + 7),
    "to_int32": lambda x: (x * 5).to(torch.int32),
    "to_int64_plus": lambda x: x.to(torch.int64) + 2 ** 33,
    "to_bool": lambda x: x.bool(),
    "logical_not": lambda x: torch.logical_not(x),
    "index_math": lambda x: torch.where(x < 0, x + 1000, x) * 8 + 3,
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_int(name, dtype):
    shape = SHAPES[(list(UNARY).index(name) + (dtype == torch.int64)) % len(SHAPES)]
    check(UNARY[name], ints(shape, dtype))


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "minimum": torch.minimum, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "eq": torch.eq, "ne": torch.ne, "logical_xor": torch.logical_xor,
    "logical_and": torch.logical_and,
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_int(name, dtype):
    shape = (129, 513) if name in ("add", "mul", "lt") else SHAPES[list(BINARY).index(name) % len(SHAPES)]
    a, b = ints(shape, dtype, 1), ints(shape, dtype, 2)
    b.view(-1)[4:12] = a.view(-1)[4:12]                     # some equal pairs
    if dtype == torch.int64:                                  # equal high words, low words differ
        b.view(-1)[12:20] = a.view(-1)[12:20] ^ 0x7FFFFFFF
    check(BINARY[name], a, b)


def test_mixed_widths_and_broadcast():
    a = ints((129, 513), torch.int64, 3)
    b = ints((513,), torch.int32, 4)
    check(lambda x, y: x * y - y, a, b)
    check(lambda x, y: x < y, a[:, :1], b)


def test_int64_carries_across_the_word():
    """Low words at 2**32 - 1 and 0: an add carries into, a sub borrows from, the high word."""
    x = torch.tensor([2 ** 32 - 1, 2 ** 33 - 1, -1, 0, -(2 ** 32), I64_MAX, I64_MIN] * 20)
    check(lambda x: x + 1, x)
    check(lambda x: x - 1, x)
    check(lambda x, y: x + y, x, x.flip(0))
    check(lambda x: x * 65537, x)


DIVISORS = [1, 2, 3, -3, 7, 1000, -50257, 2 ** 26 + 5, -(2 ** 26 + 5)]


@pytest.mark.parametrize("c", DIVISORS)
def test_int64_division_and_modulo_by_constants(c):
    """Long division in chunks on the int32 ALU: floor, trunc and remainder by constants of
    every sign and size up to 2**27, the int64 extremes included."""
    x = ints((129, 513) if abs(c) in (3, 1000) else (2, 131, 17), torch.int64, 7)
    check(lambda x: torch.div(x, c, rounding_mode="floor"), x)
    check(lambda x: torch.div(x, c, rounding_mode="trunc"), x)
    check(lambda x: x % c, x)
    check(lambda x: torch.fmod(x, c), x)


def test_index_unflatten_shares_one_long_division():
    """(i // n, i % n) of a flat index: one long division serves both."""
    i = ints((129, 513), torch.int64, 8, lim=2 ** 45)
    fn = lambda i: (i // 4099, i % 4099)  # noqa: E731
    low = lower_and_run(fn, i)
    for got, want in zip(low.outputs, fn(i)):
        assert_close(got, want)


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_int32_remainder_and_division_by_tensors(mode):
    a, b = ints((129, 513), torch.int32, 9), ints((129, 513), torch.int32, 10)
    b[b == 0] = -5
    check(lambda a, b: torch.remainder(a, b), a, b)
    check(lambda a, b: torch.fmod(a, b), a, b)
    check(lambda a, b: torch.div(a, b, rounding_mode=mode), a, b)


def test_graph_of_int_chain_with_a_float_consumer():
    """An int64 chain feeding a float op: the chain exact, the cast rounded once, as eager."""
    x = ints((129, 513), torch.int64, 5, lim=2 ** 40)
    fn = lambda x: (x * 3 + 1).to(torch.float32) * 0.5  # noqa: E731
    low = lower_and_run(fn, x)
    assert_close(low.outputs[0], fn(x), rtol=0, atol=0)


def test_big_integer_constants_stay_exact():
    """Constants of 2**24 and more in an integer expression over a mask: not through fp32."""
    m = torch.rand(129, 513, generator=torch.Generator().manual_seed(11)) > 0.5
    check(lambda m: torch.where(m, 2 ** 40 + 1, -(2 ** 33) - 3), m)
    check(lambda m: torch.where(m, 2 ** 30 + 1, 5).to(torch.int32), m)


def test_a_wrong_result_fails():
    """The comparison is exact: a result one off (beyond 2**24, where fp32 would round) fails."""
    x = ints((129, 513), torch.int64, 6, lim=2 ** 40)
    low = lower_and_run(lambda x: x + 1, x)
    assert_close(low.outputs[0], x + 1)
    bad = low.outputs[0].clone()
    bad.view(-1)[777] += 1
    with pytest.raises(AssertionError, match="1 of 66177 elements differ"):
        assert_close(bad, x + 1)
    rounded = (x + 1).to(torch.float32).to(torch.int64)       # what an fp32 path would give
    with pytest.raises(AssertionError, match="elements differ"):
        assert_close(rounded, x + 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", ["and", "or", "xor", "mixed"])
def test_bitwise_ops_on_integers_are_bit_exact(op, shape, dtype):
    """Bitwise and/or/xor of int32/int64 tensors (and with constants, negative ones included):
    the bit patterns, word by word for int64, never through fp32."""
    fn = {"and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
          "mixed": lambda x, y: (x & 0x7FFF00FF) | (y ^ -3)}[op]
    check(fn, ints(shape, dtype, seed=1), ints(shape, dtype, seed=2))
