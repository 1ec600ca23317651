"""NKI's x4 MX types as machine dtypes (isa.X4_ELEMENT: ``FP8_E4M3_X4`` / ``FP8_E5M2_X4``, four
fp8 in a 32-bit element; ``FP4_E2M1_X4``, four fp4 in a 16-bit element, value j in bits
[4j, 4j+4) as AWS's pack_mx_data_into_x4 packs): the MX matmul reading them gives exactly what
the fp8 ``[P, F, 4]`` form gives and costs the same; MXFP4 values against numpy; quantize_mx
writes x4 fp8 (never fp4: ISA3 L2767); from_numpy never returns an x4 type."""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from runtime_sim import (TENSOR, TRN3, VECTOR, DType, Instr, MatmulMxAttrs, Op, OperandError,
                         QuantizeMxAttrs, TensorCopyAttrs, ap, instr_cost, tile_ap)
from runtime_sim.checks import check_instr_shape
from runtime_sim.isa import X4_ELEMENT, matmul_kmn
from test_trn3_mx import _mx_prog, _mx_scales_hw

F32, BF16, U8 = DType.FP32, DType.BF16, DType.UINT8
X4 = {DType.FP8_E4M3: DType.FP8_E4M3_X4, DType.FP8_E5M2: DType.FP8_E5M2_X4}
RNG = np.random.default_rng(5)


def _as_x4(a):
    """An fp8 [P, F, 4] AP as the x4 dtype over the same bytes: [P, F]."""
    (s, f), _ = a.dims
    return dataclasses.replace(a, dims=((1, f),), dtype=X4[a.dtype])


@pytest.mark.parametrize("p,m,n", [(128, 128, 512), (64, 32, 100)])
def test_fp8_x4_dtype_reads_like_the_fp8_form(p, m, n):
    b, ref, _ = _mx_prog(p, m, n)
    want = out(b.run(), "r", F32, (m, n))
    mm = b.streams[TENSOR][0]
    x4 = dataclasses.replace(mm, srcs=(_as_x4(mm.srcs[0]), _as_x4(mm.srcs[1])) + mm.srcs[2:])
    assert matmul_kmn(x4) == matmul_kmn(mm) == (4 * p, m, n)
    assert instr_cost(x4, TENSOR, TRN3).busy_ns == instr_cost(mm, TENSOR, TRN3).busy_ns
    b.streams[TENSOR][0] = x4
    np.testing.assert_array_equal(out(b.run(), "r", F32, (m, n)), want)


def _pack_fp4(v: np.ndarray) -> np.ndarray:
    """fp4 values [P, F, 4] -> uint16 [P, F]: value j in bits [4j, 4j + 4)."""
    nib = v.view(np.uint8).astype(np.uint16) & 0xF
    return (nib << np.array([0, 4, 8, 12], np.uint16)).sum(axis=2).astype(np.uint16)


def test_mxfp4_matmul_against_numpy_and_a_wrong_packing_fails():
    p, m, n = 128, 64, 256
    fp4 = np.dtype(ml_dtypes.float4_e2m1fn)
    st = RNG.uniform(-6, 6, (p, m, 4)).astype(fp4)
    mv = RNG.uniform(-6, 6, (p, n, 4)).astype(np.float32).astype(ml_dtypes.float8_e5m2)
    ss = RNG.integers(120, 135, (p // 8, m)).astype(np.uint8)
    sm = RNG.integers(120, 135, (p // 8, n)).astype(np.uint8)
    fs = lambda s: np.repeat(2.0 ** (s.astype(np.float64) - 127), 8, axis=0)[:, :, None]
    ref = np.einsum("pmj,pnj->mn", st.astype(np.float64) * fs(ss), mv.astype(np.float64) * fs(sm))
    b = B("trn3")
    ts, s0 = b.load("st", _pack_fp4(st), DType.FP4_E2M1_X4)
    tm, s1 = b.load("mv", mv.reshape(p, -1).view(np.uint32), DType.FP8_E5M2_X4)
    a, s2 = b.load("ss", _mx_scales_hw(ss, p, 0), U8)
    c, s3 = b.load("sm", _mx_scales_hw(sm, p, 0), U8)
    d = tile_ap(b.psum("ps", n * 4), F32, m, n)
    mm, cp = b.sem(), b.sem()
    ins = Instr(Op.MATMUL, d, (ts, tm, a, c), MatmulMxAttrs(), waits=((s0, 1), (s1, 1), (s2, 1), (s3, 1)),
                signals=(mm,))
    assert matmul_kmn(ins) == (4 * p, m, n)
    b.add(TENSOR, ins)
    r = tile_ap(b.sbuf("r", n * 4), F32, m, n)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (d,), TensorCopyAttrs(), waits=((mm, 1),), signals=(cp,)))
    b.store("r", r, ((cp, 1),))
    got = out(b.run(), "r", F32, (m, n)).astype(np.float64)
    tol = 4 * p * 2.0 ** -24 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    swapped = np.einsum("pmj,pnj->mn", st[:, :, ::-1].astype(np.float64) * fs(ss), mv.astype(np.float64) * fs(sm))
    assert not np.allclose(swapped, ref, rtol=0, atol=tol)      # the nibble order matters


def test_quantize_mx_into_x4_fp8_is_the_fp8_form_packed():
    p, f = 64, 64
    x = (RNG.standard_normal((p, 4 * f)) * 3).astype(ml_dtypes.bfloat16)
    res = {}
    for x4 in (False, True):
        b = B("trn3")
        src, s0 = b.load("x", x, BF16)
        q = b.sbuf("q", 4 * f)
        dst = tile_ap(q, DType.FP8_E5M2_X4, p, f) if x4 else ap(q, DType.FP8_E5M2, [(4, f), (1, 4)], partitions=p)
        sc = tile_ap(b.sbuf("sc", f), U8, p, f)
        done = b.sem()
        b.add(VECTOR, Instr(Op.QUANTIZE_MX, dst, (src,), QuantizeMxAttrs(), waits=((s0, 1),), signals=(done,),
                            accum=sc))
        b.store("q", tile_ap(q, U8, p, 4 * f), ((done, 1),))
        res[x4] = out(b.run(), "q", U8, (p, 4 * f))
    np.testing.assert_array_equal(res[True], res[False])


def test_quantize_mx_refuses_fp4_and_wrong_x4_sizes():
    b = B("trn3")
    src = tile_ap(b.sbuf("x", 512), BF16, 64, 256)
    sc = tile_ap(b.sbuf("sc", 64), U8, 64, 64)
    bad = Instr(Op.QUANTIZE_MX, tile_ap(b.sbuf("q", 512), DType.FP4_E2M1_X4, 64, 64), (src,), QuantizeMxAttrs(), accum=sc)
    with pytest.raises(OperandError, match="quantize_mx dst must be float8_e4m3fn or float8_e5m2 in SBUF"):
        check_instr_shape(bad, VECTOR, TRN3)
    bad = dataclasses.replace(bad, dst=tile_ap(b.buffers[-1], DType.FP8_E4M3_X4, 64, 32))
    with pytest.raises(OperandError, match=r"expected \[64, 64\] x4 elements for src \[64, 256\], got \[64, 32\]"):
        check_instr_shape(bad, VECTOR, TRN3)


def test_numpy_dtypes_never_map_to_x4_types():
    assert DType.from_numpy(np.uint32) is DType.UINT32
    with pytest.raises(ValueError):
        DType.from_numpy(np.uint16)
    assert {d.itemsize for d in X4_ELEMENT} == {4, 2} and not any(d.is_float for d in X4_ELEMENT)
