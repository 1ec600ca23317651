"""The 32-bit integer ALU (semantics.py, "Integer ALU" and "Bitvec ops"): exact int32
arithmetic with wraparound on GpSimdE, the fp32 path elsewhere, bitvec ops on bit patterns.

Values beyond 2**24 are chosen on purpose: the fp32 path rounds them, so these tests fail if
the integer path is not taken."""
from __future__ import annotations

import numpy as np
import pytest

from progs import B, out  # noqa: F401  (conftest puts tests/machine on the path)
from test_semantics import run_compute
from runtime_sim import GPSIMD, VECTOR, AluOp, DType, Op, SelectAttrs, TensorScalarAttrs, TensorTensorAttrs
from runtime_sim.checks import OperandError
from runtime_sim.semantics import wrap32

I32 = DType.INT32
RNG = np.random.default_rng(7)


def big(shape):
    """int32 values over the whole range, with the extremes and small ones mixed in."""
    x = RNG.integers(-2 ** 31, 2 ** 31, size=shape, dtype=np.int64)
    x.flat[:6] = [2 ** 31 - 1, -2 ** 31, 0, -1, 2 ** 24 + 1, 3]
    return x.astype(np.int32)


def ref_int(op, a, b):
    a, b = a.astype(np.int64), b.astype(np.int64)
    with np.errstate(all="ignore"):
        r = {
            AluOp.ADD: a + b, AluOp.SUBTRACT: a - b, AluOp.MULTIPLY: a * b,
            AluOp.MAX: np.maximum(a, b), AluOp.MIN: np.minimum(a, b),
            AluOp.IS_LT: (a < b) * 1, AluOp.IS_EQUAL: (a == b) * 1, AluOp.IS_GE: (a >= b) * 1,
            AluOp.BITWISE_AND: a & b, AluOp.BITWISE_OR: a | b, AluOp.BITWISE_XOR: a ^ b,
            AluOp.DIVIDE: np.where(b == 0, -1, np.trunc(a / np.where(b == 0, 1, b))),
            AluOp.MOD: np.where(b == 0, a, np.mod(a, np.where(b == 0, 1, b))),
        }[op]
    return ((r.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


@pytest.mark.parametrize("op", [AluOp.ADD, AluOp.SUBTRACT, AluOp.MULTIPLY, AluOp.MAX, AluOp.MIN,
                                AluOp.IS_LT, AluOp.IS_EQUAL, AluOp.IS_GE, AluOp.BITWISE_AND,
                                AluOp.BITWISE_OR, AluOp.BITWISE_XOR, AluOp.DIVIDE, AluOp.MOD])
def test_tensor_tensor_int32_on_gpsimd_is_exact_and_wraps(op):
    a, b = big((4, 40)), big((4, 40))
    b[0, :3] = [0, -1, 7]
    a[0, 1] = -2 ** 31                                     # INT_MIN / -1 wraps
    y = run_compute(GPSIMD, Op.TENSOR_TENSOR, TensorTensorAttrs(op), [(a, I32), (b, I32)], (4, 40, I32))
    np.testing.assert_array_equal(y, ref_int(op, a, b))


def test_int32_on_vector_takes_the_fp32_path():
    a = np.full((2, 8), 2 ** 24 + 1, dtype=np.int32)
    one = np.ones((2, 8), dtype=np.int32)
    y = run_compute(VECTOR, Op.TENSOR_TENSOR, TensorTensorAttrs(AluOp.ADD), [(a, I32), (one, I32)], (2, 8, I32))
    np.testing.assert_array_equal(y, np.full((2, 8), 2 ** 24))      # 2**24 + 1 rounds in fp32
    g = run_compute(GPSIMD, Op.TENSOR_TENSOR, TensorTensorAttrs(AluOp.ADD), [(a, I32), (one, I32)], (2, 8, I32))
    np.testing.assert_array_equal(g, np.full((2, 8), 2 ** 24 + 2))
    assert not np.array_equal(y, g)


def test_tensor_scalar_int32_two_steps_wrap_each():
    x = big((3, 33))
    attrs = TensorScalarAttrs(AluOp.MULTIPLY, operand0=65537.0, op1=AluOp.SUBTRACT, operand1=5.0, reverse1=True)
    y = run_compute(GPSIMD, Op.TENSOR_SCALAR, attrs, [(x, I32)], (3, 33, I32))
    np.testing.assert_array_equal(y, wrap32(5 - wrap32(x.astype(np.int64) * 65537)).astype(np.int32))


def test_tensor_scalar_non_integer_constant_takes_the_fp32_path():
    x = np.full((2, 4), 7, dtype=np.int32)
    y = run_compute(GPSIMD, Op.TENSOR_SCALAR, TensorScalarAttrs(AluOp.MULTIPLY, operand0=0.5),
                    [(x, I32)], (2, 4, I32))
    np.testing.assert_array_equal(y, np.full((2, 4), 3))      # 3.5 truncated on the store


@pytest.mark.parametrize("op,shift", [(AluOp.LOGICAL_SHIFT_LEFT, 5), (AluOp.LOGICAL_SHIFT_RIGHT, 7),
                                      (AluOp.ARITH_SHIFT_RIGHT, 31), (AluOp.LOGICAL_SHIFT_RIGHT, 40),
                                      (AluOp.ARITH_SHIFT_RIGHT, 40)])
@pytest.mark.parametrize("queue", [VECTOR, GPSIMD])
def test_shifts_on_bit_patterns(op, shift, queue):
    x = big((2, 24))
    y = run_compute(queue, Op.TENSOR_SCALAR, TensorScalarAttrs(op, operand0=float(shift)), [(x, I32)], (2, 24, I32))
    u = x.astype(np.int64) & 0xFFFFFFFF
    if op is AluOp.LOGICAL_SHIFT_LEFT:
        ref = wrap32(u << shift)
    elif op is AluOp.LOGICAL_SHIFT_RIGHT:
        ref = wrap32(u >> shift) if shift < 32 else np.zeros_like(u)
    else:
        ref = x.astype(np.int64) >> min(shift, 31)
    np.testing.assert_array_equal(y, ref.astype(np.int32))


def test_bitvec_on_float_is_an_operand_error():
    x = np.ones((2, 4), dtype=np.float32)
    with pytest.raises(OperandError) as ei:
        run_compute(VECTOR, Op.TENSOR_SCALAR, TensorScalarAttrs(AluOp.BITWISE_AND, operand0=1.0),
                    [(x, DType.FP32)], (2, 4, DType.FP32))
    assert "bitvec" in str(ei.value) and "float32" in str(ei.value)


def test_select_int32_on_gpsimd_copies_exactly():
    c = (RNG.random((4, 20)) > 0.5).astype(np.float32)
    a, b = big((4, 20)), big((4, 20))
    y = run_compute(GPSIMD, Op.SELECT, SelectAttrs(), [(c, DType.FP32), (a, I32), (b, I32)], (4, 20, I32))
    np.testing.assert_array_equal(y, np.where(c != 0, a, b))
