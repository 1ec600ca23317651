"""matmul ``perf_mode=double_row`` (nki.isa.nc_matmul, trainium2_arch.rst "Double FP8 Matmul
Performance"): semantics against numpy, the cost rule against bf16, the FLOP count, and every
operand check raising with the instruction's constraint."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from runtime_sim import (TENSOR, TRN1, TRN2, TRN3, VECTOR, Buffer, DType, Instr, MatmulAttrs,
                         Memory, Op, OperandError, TensorCopyAttrs, ap, instr_cost, tile_ap)
from runtime_sim.checks import check_instr_shape
from runtime_sim.isa import MatmulPerfMode, matmul_kmn

F32, BF16, E4, E5 = DType.FP32, DType.BF16, DType.FP8_E4M3, DType.FP8_E5M2
DR = MatmulAttrs(perf_mode=MatmulPerfMode.DOUBLE_ROW)
SB = Buffer("sb", Memory.SBUF, 128, 64 * 1024, 0)
SB2 = Buffer("sb2", Memory.SBUF, 128, 64 * 1024, 64 * 1024)
PS = Buffer("ps", Memory.PSUM, 128, 16 * 1024, 0)
RNG = np.random.default_rng(7)


def packed(buf, dt, p, f):
    """[p, 2, f] tile: the packed axis outermost, stride f."""
    return ap(buf, dt, [(f, 2), (1, f)], partitions=p)


def dr(m, n, p=128, dt=E4, attrs=DR):
    return Instr(Op.MATMUL, tile_ap(PS, F32, m, n), (packed(SB, dt, p, m), packed(SB2, dt, p, n)), attrs)


def _fp8(shape, dt):
    return RNG.standard_normal(shape).astype(np.float32).astype(dt.np)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("p,m,n,dts", [(128, 128, 512, (E4, E4)), (65, 7, 300, (E5, E5)), (1, 1, 1, (E4, E4))])
def test_double_row_contracts_both_packed_rows(target, p, m, n, dts):
    st = _fp8((p, 2, m), dts[0])
    mv = _fp8((p, 2, n), dts[1])
    b = B(target)
    ts, ss = b.load("st", st.reshape(p, -1), dts[0])
    tm, sm = b.load("mv", mv.reshape(p, -1), dts[1])
    ts = ap(b.buffers[-3], dts[0], [(m, 2), (1, m)], partitions=p)
    tm = ap(b.buffers[-1], dts[1], [(n, 2), (1, n)], partitions=p)
    ps = b.psum("ps", n * 4)
    mm, cp = b.sem(), b.sem()
    b.add(TENSOR, Instr(Op.MATMUL, tile_ap(ps, F32, m, n), (ts, tm), DR, waits=((ss, 1), (sm, 1)),
                        signals=(mm,)))
    res = b.sbuf("res", n * 4)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, tile_ap(res, F32, m, n), (tile_ap(ps, F32, m, n),), TensorCopyAttrs(),
                        waits=((mm, 1),), signals=(cp,)))
    b.store("o", tile_ap(res, F32, m, n), ((cp, 1),))
    got = out(b.run(), "o", F32, (m, n))
    # every fp8 product is exact in fp32; the reference sums in float64 over both P and j
    ref = np.einsum("pjm,pjn->mn", st.astype(np.float64), mv.astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    # dropping either packed row is far outside that tolerance (the check can fail)
    for j in (0, 1):
        half = np.einsum("pm,pn->mn", st[:, j].astype(np.float64), mv[:, j].astype(np.float64))
        assert not np.allclose(got, half, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("tgt", [TRN2, TRN3])
@pytest.mark.parametrize("m,n", [(128, 512), (32, 16), (128, 16), (128, 100)])
def test_double_row_costs_the_bf16_instruction_of_the_same_m_n(tgt, m, n):
    """trainium2_arch.rst: the double FP8 instruction with K = 256 "takes the same amount of time
    as the regular BF16/FP16 ... instruction with a 128 contraction dimension": twice the FLOPs
    in the same time."""
    bf = Instr(Op.MATMUL, tile_ap(PS, F32, m, n), (tile_ap(SB, BF16, 128, m), tile_ap(SB2, BF16, 128, n)),
               MatmulAttrs())
    plain8 = Instr(Op.MATMUL, tile_ap(PS, F32, m, n), (tile_ap(SB, E4, 128, m), tile_ap(SB2, E4, 128, n)),
                   MatmulAttrs())
    d = instr_cost(dr(m, n), TENSOR, tgt).busy_ns
    assert d == pytest.approx(instr_cost(bf, TENSOR, tgt).busy_ns)
    assert d == pytest.approx(max(min(64, m), n) / tgt.tensor_clock_ghz)
    assert instr_cost(plain8, TENSOR, tgt).busy_ns == pytest.approx(d)   # K <= 128: bf16 time
    assert matmul_kmn(dr(m, n)) == (256, m, n)
    assert matmul_kmn(plain8) == (128, m, n)


def test_double_row_flops_and_load_stationary_count_m_not_the_packed_axis():
    b = B("trn2")
    ts, ss = b.load("st", _fp8((128, 256), E4), E4)
    tm, sm = b.load("mv", _fp8((128, 1024), E4), E4)
    ts = ap(b.buffers[-3], E4, [(128, 2), (1, 128)], partitions=128)
    tm = ap(b.buffers[-1], E4, [(512, 2), (1, 512)], partitions=128)
    ps = b.psum("ps", 512 * 4)
    mm = b.sem()
    b.add(TENSOR, Instr(Op.MATMUL, tile_ap(ps, F32, 128, 512), (ts, tm), DR, waits=((ss, 1), (sm, 1)),
                        signals=(mm,)))
    st = b.run(checks="static", mode="timing").stats
    assert st.flops == 2 * 256 * 128 * 512
    # at the fp8 peak (2x bf16 on trn2): the same time as a bf16 [128x128] @ [128x512] at its peak
    assert st.roofline_tensor_ns == pytest.approx(2 * 128 * 128 * 512 / TRN2.tensor_peak_flops_per_ns)


@pytest.mark.parametrize("ins,tgt,msg", [
    (dr(128, 512), TRN1, "fp8_matmul_speedup=1"),
    (dr(128, 512, dt=BF16), TRN2, "takes fp8 operands, stationary is bfloat16"),
    (Instr(Op.MATMUL, tile_ap(PS, F32, 128, 512), (packed(SB, E4, 128, 128), ap(SB2, E4, [(1, 1024)], partitions=128)),
           DR), TRN2, "moving's outermost free axis must have size 2"),
    (Instr(Op.MATMUL, tile_ap(PS, F32, 64, 512), (ap(SB, E4, [(64, 4), (1, 64)], partitions=128),
                                                  packed(SB2, E4, 128, 512)), DR), TRN2,
     "stationary's outermost free axis must have size 2"),
    (dr(128, 512, p=129), TRN2, "matmul K=258 on 129 partitions > 128 partitions"),
    (dr(128, 513), TRN2, "moving free size N=513"),
    (dr(130, 16), TRN2, "stationary free size M=130"),
    (Instr(Op.MATMUL, tile_ap(PS, F32, 128, 1024), (packed(SB, E4, 128, 128), packed(SB2, E4, 128, 512)), DR),
     TRN2, "destination must be [M=128, N=512]"),
])
def test_double_row_checks_raise(ins, tgt, msg):
    with pytest.raises(OperandError, match=re.escape(msg)):
        check_instr_shape(ins, TENSOR, tgt)


def test_double_row_is_named_in_the_printed_instruction():
    assert "perf_mode=double_row" in str(dr(128, 512))
    assert float(ml_dtypes.float8_e4m3fn(1.0)) == 1.0
