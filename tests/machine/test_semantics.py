"""Each semantics rule of the ISA against numpy, through complete programs (DMA in, op, DMA out)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from runtime_sim.isa import BITVEC_OPS
from runtime_sim import (GPSIMD, SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp,
                         BnAggrAttrs, BnStatsAttrs, DmaAttrs, DType, Instr, IotaAttrs,
                         MatmulAttrs, MemsetAttrs, Op, SelectAttrs, TensorCopyAttrs,
                         TensorReduceAttrs, TensorScalarAttrs, TensorTensorAttrs, TransposeAttrs,
                         ap, dma_queue, tile_ap)

F32, BF16 = DType.FP32, DType.BF16
RNG = np.random.default_rng(0)


def run_compute(queue, op, attrs, srcs, dst, *, accum=None, dst_dims=None):
    """srcs: [(array [P, F], dtype)]; dst: (P, F, dtype). Returns dst (and accum) as numpy."""
    b = B()
    aps, sems = [], []
    for k, (x, dt) in enumerate(srcs):
        a, s = b.load(f"x{k}", x, dt)
        aps.append(a)
        sems.append(s)
    P, F, dt = dst
    d = b.sbuf("y", F * dt.itemsize)
    dap = ap(d, dt, dst_dims or [(1, F)], partitions=P)
    acc_ap = None
    if accum is not None:
        acc_ap = ap(b.sbuf("acc", 4), accum, [(1, 1)], partitions=P)
    done = b.sem()
    b.add(queue, Instr(op, dap, tuple(aps), attrs, waits=tuple((s, 1) for s in sems), signals=(done,),
                       accum=acc_ap))
    b.store("y", dap, ((done, 1),))
    if acc_ap is not None:
        b.store("acc", acc_ap, ((done, 1),))
    res = b.run()
    y = out(res, "y", dt, (P, F))
    if acc_ap is not None:
        return y, out(res, "acc", accum, (P, 1))
    return y


def test_dma_copy_reshapes_in_row_major_order_and_reads_strided_hbm():
    b = B()
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    h = b.hbm("x", x.nbytes, data=x)
    s = b.sbuf("t", 3 * 4)
    # columns 2..4 of every row (strided HBM read) into a [6, 3] tile
    done = b.sem()
    b.add(dma_queue(0), Instr(Op.DMA_COPY, ap(s, F32, [(1, 3)], partitions=6),
                              (ap(h, F32, [(8, 6), (1, 3)], byte_offset=2 * 4),), DmaAttrs(), signals=(done,)))
    # store the 18 elements as a [3, 6] array: element order is row-major on both sides
    o = b.hbm("o_o", 18 * 4, output=True)
    b.add(dma_queue(1), Instr(Op.DMA_COPY, ap(o, F32, [(6, 3), (1, 6)]), (ap(s, F32, [(1, 3)], partitions=6),),
                              DmaAttrs(), waits=((done, 1),)))
    res = b.run()
    np.testing.assert_array_equal(out(res, "o", F32, (3, 6)), x[:, 2:5].reshape(3, 6))


def test_dma_transpose_2byte():
    b = B()
    x = RNG.standard_normal((16, 32)).astype(ml_dtypes.bfloat16)
    h = b.hbm("x", x.nbytes, data=x)
    s = b.sbuf("t", 16 * 2)
    done = b.sem()
    b.add(dma_queue(0), Instr(Op.DMA_COPY, ap(s, BF16, [(1, 16)], partitions=32),
                              (ap(h, BF16, [(32, 16), (1, 32)]),), DmaAttrs(transpose=True), signals=(done,)))
    b.store("o", ap(s, BF16, [(1, 16)], partitions=32), ((done, 1),))
    np.testing.assert_array_equal(out(b.run(), "o", BF16, (32, 16)), x.T)


@pytest.mark.parametrize("dt", [BF16, F32])
def test_matmul_accumulates_over_k_tiles_in_psum(dt):
    K, M, N = 256, 96, 200
    a = RNG.standard_normal((K, M)).astype(dt.np)
    w = RNG.standard_normal((K, N)).astype(dt.np)
    b = B()
    ta = [b.load(f"a{k}", a[k * 128:(k + 1) * 128], dt) for k in range(2)]
    tw = [b.load(f"w{k}", w[k * 128:(k + 1) * 128], dt) for k in range(2)]
    ps = b.psum("ps", N * 4)
    mm = b.sem()
    for k in range(2):
        b.add(TENSOR, Instr(Op.MATMUL, tile_ap(ps, F32, M, N), (ta[k][0], tw[k][0]), MatmulAttrs(accumulate=k > 0),
                            waits=((ta[k][1], 1), (tw[k][1], 1)), signals=(mm,)))
    sb = b.sbuf("res", N * 4)
    cp = b.sem()
    b.add(VECTOR, Instr(Op.TENSOR_COPY, tile_ap(sb, F32, M, N), (tile_ap(ps, F32, M, N),), TensorCopyAttrs(),
                        waits=((mm, 2),), signals=(cp,)))
    b.store("o", tile_ap(sb, F32, M, N), ((cp, 1),))
    got = out(b.run(), "o", F32, (M, N))
    ref = a.astype(np.float64).T @ w.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_bf16_rounding_is_round_to_nearest_even():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7 in bf16 -> rounds to even (1.0);
    # 1 + 3*2^-8 is a tie between 1+2^-7 and 1+2^-6 -> rounds to even (1 + 2^-6)
    vals = np.array([[1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -2.5e-3, 3.0e38, 1e-40]], dtype=np.float32)
    y = run_compute(VECTOR, Op.TENSOR_COPY, TensorCopyAttrs(), [(vals, F32)], (1, 6, BF16))
    np.testing.assert_array_equal(y, vals.astype(ml_dtypes.bfloat16))
    assert float(y[0, 0]) == 1.0 and float(y[0, 1]) == 1 + 2 ** -6


def test_tensor_copy_float_to_int_truncates_and_saturates():
    vals = np.array([[1.7, -1.7, 3e9, np.nan]], dtype=np.float32)
    y = run_compute(VECTOR, Op.TENSOR_COPY, TensorCopyAttrs(), [(vals, F32)], (1, 4, DType.INT32))
    np.testing.assert_array_equal(y, [[1, -1, 2 ** 31 - 1, 0]])


@pytest.mark.parametrize("queue", [TENSOR, VECTOR])
def test_transpose_is_exact(queue):
    P, F = (96, 128) if queue == TENSOR else (32, 24)
    x = RNG.standard_normal((P, F)).astype(np.float32)
    b = B()
    t, s = b.load("x", x, F32)
    dst = tile_ap(b.psum("ps", P * 4) if queue == TENSOR else b.sbuf("y", P * 4), F32, F, P)
    done = b.sem()
    b.add(queue, Instr(Op.TRANSPOSE, dst, (t,), TransposeAttrs(), waits=((s, 1),), signals=(done,)))
    res_sb = b.sbuf("r", P * 4)
    cp = b.sem()
    b.add(VECTOR, Instr(Op.TENSOR_COPY, tile_ap(res_sb, F32, F, P), (dst,), TensorCopyAttrs(), waits=((done, 1),),
                        signals=(cp,)))
    b.store("o", tile_ap(res_sb, F32, F, P), ((cp, 1),))
    np.testing.assert_array_equal(out(b.run(), "o", F32, (F, P)), x.T)


def _ref_act(f: ActFunc, z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    erf = np.vectorize(math.erf)
    sig = 1 / (1 + np.exp(-z))
    return {
        ActFunc.IDENTITY: z, ActFunc.COPY: z, ActFunc.EXP: np.exp(z), ActFunc.LOG: np.log(np.abs(z) + 1),
        ActFunc.TANH: np.tanh(z), ActFunc.SIGMOID: sig, ActFunc.RELU: np.maximum(z, 0),
        ActFunc.GELU: 0.5 * z * (1 + erf(z / math.sqrt(2))),
        ActFunc.GELU_TANH: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))),
        ActFunc.SILU: z * sig, ActFunc.SQRT: np.sqrt(np.abs(z) + 1), ActFunc.RSQRT: 1 / np.sqrt(np.abs(z) + 1),
        ActFunc.RECIPROCAL: 1 / z, ActFunc.SQUARE: z * z, ActFunc.ABS: np.abs(z), ActFunc.SIGN: np.sign(z),
        ActFunc.ERF: erf(z), ActFunc.SIN: np.sin(z), ActFunc.COS: np.cos(z), ActFunc.NEG: -z,
        ActFunc.ARCTAN: np.where(np.abs(z) <= float(np.float32(math.pi / 2)), np.vectorize(math.atan)(z), np.nan),
    }[f]


@pytest.mark.parametrize("func", list(ActFunc))
def test_activation_functions(func):
    x = RNG.standard_normal((8, 64)).astype(np.float32) * 3
    if func in (ActFunc.LOG, ActFunc.SQRT, ActFunc.RSQRT):
        x = np.abs(x) + 1   # positive domain; reference applies |z| + 1 to z = x
        ref = {ActFunc.LOG: np.log, ActFunc.SQRT: np.sqrt, ActFunc.RSQRT: lambda v: 1 / np.sqrt(v)}[func](x.astype(np.float64))
    else:
        ref = _ref_act(func, x)
    y = run_compute(SCALAR, Op.ACTIVATION, ActivationAttrs(func), [(x, F32)], (8, 64, F32))
    np.testing.assert_allclose(y, ref.astype(np.float32), rtol=2e-7, atol=1e-30)


def test_arctan_valid_range_and_invalid_outside():
    """ScalarE arctan: exact (float64 atan rounded once) on its valid input [-pi/2, pi/2]
    (nki.api.shared.rst "Valid Input Range"), NaN outside it (the hardware result is invalid
    there), applied to the affine argument x * scale + bias."""
    x = np.linspace(-math.pi / 2, math.pi / 2, 8 * 64).astype(np.float32).reshape(8, 64)
    x[0, 0], x[0, 1] = np.float32(-math.pi / 2) / np.float32(1.0000001), -0.0
    y = run_compute(SCALAR, Op.ACTIVATION, ActivationAttrs(ActFunc.ARCTAN), [(x, F32)], (8, 64, F32))
    ref = np.vectorize(math.atan)(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(y, ref)
    assert np.signbit(y[0, 1])
    x2 = np.array([[1.0, 1.6, -1.6, np.nan, np.inf, 0.5, -0.25, 1.5]], np.float32)
    y2 = run_compute(SCALAR, Op.ACTIVATION, ActivationAttrs(ActFunc.ARCTAN, scale=1.0, bias=0.0),
                     [(x2, F32)], (1, 8, F32))
    assert np.isnan(y2[0, [1, 2, 3, 4]]).all()
    np.testing.assert_array_equal(y2[0, [0, 5, 6, 7]], np.arctan(x2[0, [0, 5, 6, 7]].astype(np.float64)).astype(np.float32))
    y3 = run_compute(SCALAR, Op.ACTIVATION, ActivationAttrs(ActFunc.ARCTAN, scale=2.0), [(x2[:, :1], F32)],
                     (1, 1, F32))
    assert np.isnan(y3[0, 0])                                  # 2 * 1.0 is outside the range


def test_activation_scale_bias_from_src_and_reduce():
    x = RNG.standard_normal((16, 40)).astype(np.float32)
    bias = RNG.standard_normal((16, 1)).astype(np.float32)
    scale = RNG.standard_normal((16, 1)).astype(np.float32)
    attrs = ActivationAttrs(ActFunc.EXP, bias_from_src=True, scale_from_src=True, reduce=AluOp.ADD)
    y, acc = run_compute(SCALAR, Op.ACTIVATION, attrs, [(x, F32), (bias, F32), (scale, F32)], (16, 40, BF16),
                         accum=F32)
    e = np.exp((x * scale + bias).astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(y, e.astype(ml_dtypes.bfloat16))
    np.testing.assert_allclose(acc[:, 0], e.sum(axis=1), rtol=1e-6)
    y2 = run_compute(SCALAR, Op.ACTIVATION, ActivationAttrs(ActFunc.RELU, scale=2.0, bias=-0.5), [(x, F32)],
                     (16, 40, F32))
    np.testing.assert_array_equal(y2, np.maximum(x * np.float32(2) - np.float32(0.5), 0))


ALU_REF = {
    AluOp.BYPASS: lambda a, b: a, AluOp.ADD: np.add, AluOp.SUBTRACT: np.subtract,
    AluOp.MULTIPLY: np.multiply, AluOp.DIVIDE: np.divide, AluOp.MAX: np.maximum, AluOp.MIN: np.minimum,
    AluOp.POW: lambda a, b: np.power(np.abs(a), b), AluOp.MOD: np.mod,
    AluOp.IS_EQUAL: lambda a, b: (a == b) * 1.0, AluOp.NOT_EQUAL: lambda a, b: (a != b) * 1.0,
    AluOp.IS_GT: lambda a, b: (a > b) * 1.0, AluOp.IS_GE: lambda a, b: (a >= b) * 1.0,
    AluOp.IS_LT: lambda a, b: (a < b) * 1.0, AluOp.IS_LE: lambda a, b: (a <= b) * 1.0,
    AluOp.LOGICAL_AND: lambda a, b: ((a != 0) & (b != 0)) * 1.0,
    AluOp.LOGICAL_OR: lambda a, b: ((a != 0) | (b != 0)) * 1.0,
    AluOp.LOGICAL_XOR: lambda a, b: ((a != 0) ^ (b != 0)) * 1.0,
    AluOp.ABS_MAX: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
}


@pytest.mark.parametrize("op", [o for o in AluOp if o not in BITVEC_OPS])   # bitvec: test_int_alu.py
def test_tensor_tensor_alu_ops(op):
    a = np.round(RNG.standard_normal((4, 32)).astype(np.float32) * 4) / 2
    b = np.round(RNG.standard_normal((4, 32)).astype(np.float32) * 4) / 2
    b[b == 0] = 1.5
    if op is AluOp.POW:
        a = np.abs(a)
    y = run_compute(VECTOR, Op.TENSOR_TENSOR, TensorTensorAttrs(op), [(a, F32), (b, F32)], (4, 32, F32))
    with np.errstate(all="ignore"):
        ref = ALU_REF[op](a, b).astype(np.float32)
    np.testing.assert_array_equal(y, ref)


def test_tensor_tensor_bf16_output_rounds_once():
    a = RNG.standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    y = run_compute(GPSIMD, Op.TENSOR_TENSOR, TensorTensorAttrs(AluOp.MULTIPLY), [(a, BF16), (b, BF16)], (4, 32, BF16))
    np.testing.assert_array_equal(y, (a.astype(np.float32) * b.astype(np.float32)).astype(ml_dtypes.bfloat16))


def test_tensor_scalar_chained_reverse_and_per_partition_operand():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    c = RNG.standard_normal((8, 1)).astype(np.float32) + 3
    attrs = TensorScalarAttrs(AluOp.SUBTRACT, operand0_from_src=True, reverse0=True, op1=AluOp.MULTIPLY, operand1=0.5)
    y = run_compute(VECTOR, Op.TENSOR_SCALAR, attrs, [(x, F32), (c, F32)], (8, 16, F32))
    np.testing.assert_array_equal(y, (c - x) * np.float32(0.5))
    attrs = TensorScalarAttrs(AluOp.DIVIDE, operand0=1.0, reverse0=True)
    y = run_compute(SCALAR, Op.TENSOR_SCALAR, attrs, [(x, F32)], (8, 16, F32))
    np.testing.assert_array_equal(y, np.float32(1) / x)


@pytest.mark.parametrize("op,num_axes,negate", [(AluOp.ADD, 1, False), (AluOp.MAX, 2, False),
                                                (AluOp.MIN, 1, True), (AluOp.MULTIPLY, 1, False)])
def test_tensor_reduce_innermost_axes(op, num_axes, negate):
    x = RNG.standard_normal((8, 4 * 6)).astype(np.float32)
    b = B()
    t, s = b.load("x", x, F32)
    src = ap(b.buffers[-1], F32, [(6, 4), (1, 6)], partitions=8)
    keep = 4 if num_axes == 1 else 1
    d = tile_ap(b.sbuf("y", 16), F32, 8, keep)
    done = b.sem()
    b.add(VECTOR, Instr(Op.TENSOR_REDUCE, d, (src,), TensorReduceAttrs(op, num_axes, negate), waits=((s, 1),),
                        signals=(done,)))
    b.store("o", d, ((done, 1),))
    x3 = x.reshape(8, 4, 6)
    f = {AluOp.ADD: np.sum, AluOp.MAX: np.max, AluOp.MIN: np.min, AluOp.MULTIPLY: np.prod}[op]
    ref = f(x3, axis=(2,) if num_axes == 1 else (1, 2)).reshape(8, keep)
    np.testing.assert_allclose(out(b.run(), "o", F32, (8, keep)), -ref if negate else ref, rtol=1e-6)


def test_memset_iota_select():
    b = B()
    m = tile_ap(b.sbuf("m", 4 * 8), F32, 4, 8)
    io = ap(b.sbuf("io", 4 * 8), DType.INT32, [(4, 2), (1, 4)], partitions=4)
    s1, s2 = b.sem(), b.sem()
    b.add(VECTOR, Instr(Op.MEMSET, m, (), MemsetAttrs(2.5), signals=(s1,)))
    b.add(GPSIMD, Instr(Op.IOTA, io, (), IotaAttrs(base=3, partition_step=100, steps=(10, 1)), signals=(s2,)))
    b.store("m", m, ((s1, 1),))
    b.store("io", io, ((s2, 1),))
    # select on iota parity: where(io is odd) -> io else memset value
    cond = tile_ap(b.sbuf("c", 32), F32, 4, 8)
    sel = tile_ap(b.sbuf("sel", 32), F32, 4, 8)
    s3, s4 = b.sem(), b.sem()
    b.add(VECTOR, Instr(Op.TENSOR_SCALAR, cond, (io,), TensorScalarAttrs(AluOp.MOD, 2.0), waits=((s2, 1),), signals=(s3,)))
    b.add(VECTOR, Instr(Op.SELECT, sel, (cond, io, m), SelectAttrs(), waits=((s3, 1), (s1, 1)), signals=(s4,)))
    b.store("sel", sel, ((s4, 1),))
    res = b.run()
    np.testing.assert_array_equal(out(res, "m", F32, (4, 8)), np.full((4, 8), 2.5, np.float32))
    ref_io = 3 + 100 * np.arange(4)[:, None, None] + 10 * np.arange(2)[None, :, None] + np.arange(4)[None, None, :]
    ref_io = ref_io.reshape(4, 8)
    np.testing.assert_array_equal(out(res, "io", DType.INT32, (4, 8)), ref_io)
    np.testing.assert_array_equal(out(res, "sel", F32, (4, 8)), np.where(ref_io % 2 == 1, ref_io, 2.5))


def test_bn_stats_and_bn_aggr():
    x = RNG.standard_normal((16, 3 * 100)).astype(np.float32) * 2 + 1
    b = B()
    t, s = b.load("x", x, F32)
    xb = b.buffers[-1]
    st = b.sbuf("st", 6 * 4)
    sems = []
    for k in range(3):
        sk = b.sem()
        sems.append((sk, 1))
        b.add(VECTOR, Instr(Op.BN_STATS, ap(st, F32, [(1, 2)], partitions=16, byte_offset=8 * k),
                            (ap(xb, F32, [(1, 100)], partitions=16, byte_offset=400 * k),), BnStatsAttrs(),
                            waits=((s, 1),), signals=(sk,)))
    ag = tile_ap(b.sbuf("ag", 8), F32, 16, 2)
    done = b.sem()
    b.add(VECTOR, Instr(Op.BN_AGGR, ag, (tile_ap(st, F32, 16, 6),), BnAggrAttrs(), waits=tuple(sems), signals=(done,)))
    b.store("o", ag, ((done, 1),))
    got = out(b.run(), "o", F32, (16, 2))
    np.testing.assert_allclose(got[:, 0], x.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 1], x.var(axis=1), rtol=1e-5)


def test_inplace_op_reads_old_values():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    b = B()
    t, s = b.load("x", x, F32)
    done = b.sem()
    b.add(VECTOR, Instr(Op.TENSOR_TENSOR, t, (t, t), TensorTensorAttrs(AluOp.ADD), waits=((s, 1),), signals=(done,)))
    b.store("o", t, ((done, 1),))
    np.testing.assert_array_equal(out(b.run(), "o", F32, (4, 8)), x + x)


@pytest.mark.parametrize("target,reduce,ok", [("trn1", AluOp.ADD, True), ("trn1", AluOp.MAX, False),
                                              ("trn1", AluOp.MIN, False), ("trn2", AluOp.MAX, True),
                                              ("trn3", AluOp.MIN, True)])
def test_activation_reduce_ops_per_generation(target, reduce, ok):
    """ScalarE's fused reduce takes only add on NeuronCore-v2 ("On NeuronCore-v2, the reduce_op
    must be nl.add", ISA L1476); NC-v3/v4 take max/min (``Target.scalar_reduce_any_op``)."""
    from runtime_sim.checks import check_instr_shape
    from runtime_sim.errors import OperandError
    from runtime_sim.isa import AP, Instr, Memory
    from runtime_sim.targets import TARGETS

    def ap(n):
        return AP("x", Memory.SBUF, 0, 16, 0, ((1, n),), F32)
    ins = Instr(Op.ACTIVATION, ap(40), (ap(40),), ActivationAttrs(ActFunc.COPY, reduce=reduce),
                accum=ap(1))
    if ok:
        check_instr_shape(ins, SCALAR, TARGETS[target])
    else:
        with pytest.raises(OperandError, match="only add"):
            check_instr_shape(ins, SCALAR, TARGETS[target])
