"""trn3 (NeuronCore-v4) MXFP8: the MX matmul (``MatmulMxAttrs``, NKI ``nc_matmul_mx``) and VectorE
``quantize_mx``, each with a hand-written program -- values against numpy (and AWS's golden
model's layout), cost against the documented rate, the check firing on trn1/trn2. The other NC-v4
features are in test_trn3_features.py.

Sources (aws-neuron-sdk@81ce03a): trainium3_arch.rst "Quad-MXFP8/MXFP4 Matmul Performance"
(L70-122) and "MX data-type Quantization" (L157-174); nki/api/nki/isa/__init__.py nc_matmul_mx
(L714-826) and quantize_mx (L2741-2816); nki/deep-dives/mxfp-matmul.rst and its golden model
nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py."""
from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from runtime_sim import (TENSOR, TRN3, VECTOR, Buffer, DmaAttrs, DType, EngineError, Instr, MatmulAttrs,
                         MatmulMxAttrs, MatmulPerfMode, Memory, MemsetAttrs, Op, OperandError,
                         QuantizeMxAttrs, TensorCopyAttrs, ap, check_program, instr_cost, tile_ap)
from runtime_sim.checks import check_instr_shape
from runtime_sim.isa import matmul_kmn, mx_scale_rows

F32, BF16, E4, E5 = DType.FP32, DType.BF16, DType.FP8_E4M3, DType.FP8_E5M2
I32, U8 = DType.INT32, DType.UINT8
RNG = np.random.default_rng(23)
PS = Buffer("ps", Memory.PSUM, 128, 16 * 1024, 0)


def _mx_scales_hw(s: np.ndarray, p: int, offset: int) -> np.ndarray:
    """Logical scales [p // 8, F] -> the hardware layout [p, F] (rows 32 * (i // 4) + offset +
    i % 4, as AWS's get_p_contiguous_scale reads them back); other rows 0 (never read)."""
    hw = np.zeros((p, s.shape[1]), np.uint8)
    for i in range(p // 8):
        hw[32 * (i // 4) + offset + i % 4] = s[i]
    return hw


def _mx_ref(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """MX data [P, F, 4] (fp8 values) and logical scales [P // 8, F] -> float64 [P, F, 4]."""
    return x.astype(np.float64) * np.repeat(2.0 ** (s.astype(np.float64) - 127), 8, axis=0)[:, :, None]


def _mx_prog(p: int, m: int, n: int, dts=(E4, E5), offsets=(0, 4), ddt: DType = F32, *,
             target: str = "trn3", write_rows: str = "scales") -> tuple[B, np.ndarray, np.ndarray]:
    """One MX matmul: stationary [p, m, 4] (dts[0]), moving [p, n, 4] (dts[1]), random E8M0
    scales placed at ``offsets`` within each quadrant of [p, F] uint8 tiles. ``write_rows``:
    "scales" loads only the scale rows (the other rows stay never-written), "all" the whole tile.
    Returns the program, the float64 reference [m, n] and the same without the scales."""
    b = B(target)
    st = RNG.standard_normal((p, m, 4)).astype(np.float32).astype(dts[0].np)
    mv = RNG.standard_normal((p, n, 4)).astype(np.float32).astype(dts[1].np)
    ss = RNG.integers(120, 135, (p // 8, m)).astype(np.uint8)
    sm = RNG.integers(120, 135, (p // 8, n)).astype(np.uint8)
    ref = np.einsum("pmj,pnj->mn", _mx_ref(st, ss), _mx_ref(mv, sm))
    unscaled = np.einsum("pmj,pnj->mn", st.astype(np.float64), mv.astype(np.float64))
    ts, s0 = b.load("st", st.reshape(p, -1), dts[0])
    tm, s1 = b.load("mv", mv.reshape(p, -1), dts[1])
    ts = ap(b.buffers[-3], dts[0], [(4, m), (1, 4)], partitions=p)
    tm = ap(b.buffers[-1], dts[1], [(4, n), (1, 4)], partitions=p)
    waits = [(s0, 1), (s1, 1)]
    scale_aps = []
    for name, s, f, off in (("ss", ss, m, offsets[0]), ("sm", sm, n, offsets[1])):
        hw = _mx_scales_hw(s, p, off)
        buf = b.sbuf(name, f)
        if write_rows == "all":
            t, sem = b.load(name + "_all", hw, U8)
            buf = b.buffers[-1]
            waits.append((sem, 1))
        else:   # one DMA per quadrant, from its first row (aligned) through the scale rows;
            for q0 in range(0, p, 32):      # the rows after them stay never-written
                rows = off + min(4, p // 8 - q0 // 8)
                h = b.hbm(f"in_{name}{q0}", rows * f, data=hw[q0:q0 + rows])
                sem = b.sem()
                b.add(b.next_dma(), Instr(Op.DMA_COPY, ap(buf, U8, [(1, f)], partition_start=q0, partitions=rows),
                                          (ap(h, U8, [(f, rows), (1, f)]),), DmaAttrs(), signals=(sem,)))
                waits.append((sem, 1))
        scale_aps.append(ap(buf, U8, [(1, f)], partitions=p))
    ps = b.psum("ps", n * ddt.itemsize)
    d = tile_ap(ps, ddt, m, n)
    mm, cp = b.sem(), b.sem()
    attrs = MatmulMxAttrs(stationary_scale_offset=offsets[0], moving_scale_offset=offsets[1])
    b.add(TENSOR, Instr(Op.MATMUL, d, (ts, tm, *scale_aps), attrs, waits=tuple(waits), signals=(mm,)))
    r = tile_ap(b.sbuf("r", n * ddt.itemsize), ddt, m, n)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (d,), TensorCopyAttrs(), waits=((mm, 1),), signals=(cp,)))
    b.store("r", r, ((cp, 1),))
    return b, ref, unscaled


@pytest.mark.parametrize("p,m,n,offsets", [(128, 128, 512, (0, 4)), (64, 32, 100, (8, 12)), (32, 2, 8, (12, 0)),
                                           (96, 64, 256, (4, 4))])
def test_mx_matmul_values_against_numpy(p, m, n, offsets):
    """dst = sum over the 4P K rows of dequantized products (scales of 8 partitions x 4 values),
    against float64: within fp32 summation error, and only the scale rows are read (the other
    rows of the scale tiles are never written: an uninitialised read would raise)."""
    b, ref, unscaled = _mx_prog(p, m, n, offsets=offsets)
    got = out(b.run(), "r", F32, (m, n)).astype(np.float64)
    tol = 4 * p * 2.0 ** -24 * np.abs(ref).max()         # fp32 sums over K = 4p
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    # the tolerance fails without the scales, or with one packed K row dropped
    assert not np.allclose(unscaled * np.abs(ref).max() / np.abs(unscaled).max(), ref, rtol=0, atol=tol)
    assert not np.allclose(got, ref - _drop_row(b, p, m, n), rtol=0, atol=tol)


def _drop_row(b: B, p: int, m: int, n: int) -> np.ndarray:
    """The contribution of packed row j = 3 to the MX product of ``_mx_prog``'s program."""
    st = b.feeds["in_st"].view(DType.FP8_E4M3.np).reshape(p, m, 4)[:, :, 3].astype(np.float64)
    mv = b.feeds["in_mv"].view(DType.FP8_E5M2.np).reshape(p, n, 4)[:, :, 3].astype(np.float64)
    ss = _p_contiguous(b.feeds, "ss", p)
    sm = _p_contiguous(b.feeds, "sm", p)
    fs = np.repeat(2.0 ** (ss - 127.0), 8, axis=0)
    fm = np.repeat(2.0 ** (sm - 127.0), 8, axis=0)
    return (st * fs).T @ (mv * fm)


def _p_contiguous(feeds: dict, name: str, p: int) -> np.ndarray:
    """The logical [p // 8, F] scales of ``_mx_prog``'s per-quadrant scale loads (each load's
    last rows are the quadrant's scales)."""
    rows = []
    for q0 in range(0, p, 32):
        hw = feeds[f"in_{name}{q0}"]
        rows.append(hw[hw.shape[0] - min(4, p // 8 - q0 // 8):])
    return np.concatenate(rows).astype(np.float64)


def test_mx_matmul_bf16_psum_and_scale_layout_matters():
    """bf16 dst (RNE of the fp32 result); and the scale rows really are per quadrant: reading the
    same tiles with another offset gives other values."""
    b, ref, _ = _mx_prog(128, 64, 128, ddt=BF16, write_rows="all")
    got = out(b.run(), "r", BF16, (64, 128)).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2.0 ** -8, atol=1e-3 * np.abs(ref).max())
    ins = b.streams[TENSOR][0]
    b.streams[TENSOR][0] = dataclasses.replace(ins, attrs=MatmulMxAttrs(moving_scale_offset=8))
    moved = out(b.run(), "r", BF16, (64, 128)).astype(np.float64)   # rows 8.. of the moving scales: 0
    assert not np.allclose(moved, ref, rtol=2.0 ** -8, atol=1e-3 * np.abs(ref).max())


def test_mx_matmul_costs_the_bf16_instruction_of_the_same_m_n():
    """ARCH3 L75: "4x the throughput compared to a BF16/FP16 matmul": K = 512 in the time of
    bf16's K = 128 (max(min(64, M), N) cycles); 4x the FLOPs at the mxfp8 peak."""
    sb = Buffer("sbm", Memory.SBUF, 128, 8192, 0)
    mx = Instr(Op.MATMUL, tile_ap(PS, F32, 128, 512),
               (ap(sb, E4, [(4, 128), (1, 4)], partitions=128), ap(sb, E4, [(4, 512), (1, 4)], partitions=128),
                ap(sb, U8, [(1, 128)], partitions=128), ap(sb, U8, [(1, 512)], partitions=128)), MatmulMxAttrs())
    bf = Instr(Op.MATMUL, tile_ap(PS, F32, 128, 512), (tile_ap(sb, BF16, 128, 128), tile_ap(sb, BF16, 128, 512)),
               MatmulAttrs())
    assert instr_cost(mx, TENSOR, TRN3).busy_ns == pytest.approx(instr_cost(bf, TENSOR, TRN3).busy_ns)
    assert instr_cost(mx, TENSOR, TRN3).busy_ns == pytest.approx(512 / TRN3.tensor_clock_ghz)
    assert matmul_kmn(mx) == (512, 128, 512)
    b, _, _ = _mx_prog(128, 128, 512)
    st = b.run(mode="timing", checks="static").stats
    assert st.flops == 2 * 512 * 128 * 512
    assert st.roofline_tensor_ns == pytest.approx(2 * 128 * 128 * 512 / TRN3.tensor_peak_flops_per_ns)


@pytest.mark.parametrize("target,core", [("trn2", "NeuronCore-v3"), ("trn1", "NeuronCore-v2")])
def test_mx_matmul_is_rejected_before_nc_v4(target, core):
    b, _, _ = _mx_prog(32, 8, 8, target=target)
    with pytest.raises(EngineError, match=re.escape(f"matmul perf_mode=mx (nc_matmul_mx, MXFP8 with E8M0 "
                                                    f"scales) is not available on {target} ({core})")) as e:
        check_program(b.program())
    assert str(e.value).startswith("pe #0: matmul(accumulate=False, perf_mode=mx, stationary_scale_offset=0")


def _mxi(p=128, m=16, n=64, *, sdt=E4, mdt=E4, ss=None, sm=None, attrs=None, inner=4) -> Instr:
    sb = Buffer("sbm", Memory.SBUF, 128, 8192, 0)
    st = ap(sb, sdt, [(inner, m), (1, inner)], partitions=p)
    mv = ap(sb, mdt, [(inner, n), (1, inner)], partitions=p, byte_offset=1024)
    ss = ap(sb, U8, [(1, m)], partitions=p, byte_offset=4096) if ss is None else ss
    sm = ap(sb, U8, [(1, n)], partitions=p, byte_offset=5120) if sm is None else sm
    return Instr(Op.MATMUL, tile_ap(PS, F32, m, n), (st, mv, ss, sm), MatmulMxAttrs() if attrs is None else attrs)


_SB = Buffer("sbm", Memory.SBUF, 128, 8192, 0)


@pytest.mark.parametrize("ins,msg", [
    (_mxi(sdt=BF16), "matmul perf_mode=mx stationary must be float8_e4m3fn or float8_e5m2 in SBUF"),
    (_mxi(inner=2), "matmul perf_mode=mx stationary: the innermost dim must be (1, 4)"),
    (_mxi(p=48), "partitions must be a multiple of 32"),
    (_mxi(m=15), "the stationary's free size M=15 (x4 elements) must be even"),
    (_mxi(ss=ap(_SB, I32, [(1, 16)], partitions=128)), "stationary_scale must be uint8 (E8M0) in SBUF"),
    (_mxi(attrs=MatmulMxAttrs(moving_scale_offset=2)), "moving_scale offset must be one of (0, 4, 8, 12)"),
    (_mxi(p=32, sm=ap(_SB, U8, [(1, 64)], partitions=3)), "moving_scale must reach row 3"),
    (_mxi(p=128, ss=ap(_SB, U8, [(1, 16)], partitions=99)), "must reach row 99 (scales of 128 partitions"),
    (_mxi(p=32, ss=ap(_SB, U8, [(1, 16)], partitions=4, partition_start=32)), "must start on its data's first partition 0"),
    (_mxi(sm=ap(_SB, U8, [(1, 63)], partitions=128)), "moving_scale: expected 64 scales per partition, got 63"),
    (dataclasses.replace(_mxi(), attrs=MatmulAttrs(perf_mode=MatmulPerfMode.MX)), "goes with MatmulMxAttrs"),
    (dataclasses.replace(_mxi(), srcs=_mxi().srcs[:2]), "matmul takes 4 source APs here, got 2"),
])
def test_mx_matmul_operand_checks(ins, msg):
    with pytest.raises(OperandError, match=re.escape(msg)):
        check_instr_shape(ins, TENSOR, TRN3)


def test_mx_matmul_mixes_fp8_formats_and_accumulates():
    """Stationary e4m3fn x moving e5m2 (ARCH3 L77: mixing is allowed), two K tiles accumulated."""
    b, ref, _ = _mx_prog(64, 16, 32, dts=(E4, E5))
    ins = b.streams[TENSOR][0]
    b.streams[TENSOR].append(dataclasses.replace(ins, attrs=MatmulMxAttrs(accumulate=True, moving_scale_offset=4),
                                                 waits=(), signals=ins.signals))
    b.streams[VECTOR][0] = dataclasses.replace(b.streams[VECTOR][0], waits=((ins.signals[0], 2),))
    got = out(b.run(), "r", F32, (16, 32)).astype(np.float64)
    np.testing.assert_allclose(got, 2 * ref, rtol=0, atol=8 * 64 * 2.0 ** -24 * np.abs(ref).max())


def _qmx_prog(x: np.ndarray, dt: DType = E4, offset: int = 0, sdt: DType = BF16, target: str = "trn3") -> B:
    b = B(target)
    p, f = x.shape
    xs, s0 = b.load("x", x, sdt)
    d = ap(b.sbuf("q", f), dt, [(4, f // 4), (1, 4)], partitions=p)
    sc = ap(b.sbuf("sc", f // 4), U8, [(1, f // 4)], partitions=p)
    done = b.sem()
    # the scale tile starts as 7 everywhere: quantize_mx must overwrite exactly its scale rows
    b.add(VECTOR, Instr(Op.MEMSET, sc, (), MemsetAttrs(7.0)))
    b.add(VECTOR, Instr(Op.QUANTIZE_MX, d, (xs,), QuantizeMxAttrs(scale_offset=offset), waits=((s0, 1),),
                        signals=(done,), accum=sc))
    b.store("q", d, ((done, 1),))
    b.store("sc", sc, ((done, 1),))
    return b


def _qmx_ref(x: np.ndarray, dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """ISA3 L2790-2812: X = 2^(floor(log2 amax) - (E_max - 1)); all-zero group 2^-127."""
    p, f = x.shape
    g = x.astype(np.float64).reshape(p // 8, 8, f // 4, 4)
    amax = np.abs(g).max(axis=(1, 3))
    emax = {E4: 8, E5: 15}[dt]
    e = np.floor(np.log2(np.where(amax == 0, 1, amax)))
    s = np.where(amax == 0, 0, e - (emax - 1) + 127).astype(np.int64)
    q = (x.astype(np.float64) / np.repeat(np.repeat(2.0 ** (s - 127), 8, 0), 4, 1)).astype(np.float32).astype(dt.np)
    return q, s.astype(np.uint8)


@pytest.mark.parametrize("dt", [E4, E5])
def test_quantize_mx_values_and_scales(dt):
    p, f = 128, 64
    x = (RNG.standard_normal((p, f)) * np.exp(RNG.uniform(-6, 6, (p, 1)))).astype(np.float32).astype(ml_dtypes.bfloat16)
    x[0:8, 0:4] = 0                                   # an all-zero group: scale 2^-127
    x[8:16, 4:8] = 1.5                                # amax 1.5: floor(log2) = 0
    b = _qmx_prog(x, dt, offset=4)
    res = b.run()
    q = out(res, "q", dt, (p, f))
    tile = out(res, "sc", U8, (p, f // 4))
    qr, sr = _qmx_ref(x, dt)
    np.testing.assert_array_equal(tile, np.where(_mx_scales_hw(np.ones_like(sr), p, 4) == 1,
                                                 _mx_scales_hw(sr, p, 4), 7))   # other rows untouched
    scales = np.concatenate([tile[r0:r0 + n] for r0, n in mx_scale_rows(p, 4)])
    np.testing.assert_array_equal(scales, sr)
    np.testing.assert_array_equal(q.astype(np.float32), qr.astype(np.float32))
    assert scales[0, 0] == 0                          # 2^-127
    # the documented scale is twice OCP's sample algorithm: 2^(0 - (E_max - 1)), not 2^(0 - E_max)
    assert scales[1, 1] == 127 - ({E4: 8, E5: 15}[dt] - 1)
    # dequantized: within the fp8 rounding of each value (relative 2^-4 e4m3, 2^-3 e5m2), no saturation
    deq = _mx_ref(q.reshape(p, f // 4, 4), scales).reshape(p, f)
    u = 2.0 ** -4 if dt is E4 else 2.0 ** -3
    xf = x.astype(np.float64)
    amax = np.repeat(np.repeat(np.abs(xf).reshape(p // 8, 8, f // 4, 4).max(axis=(1, 3)), 8, 0), 4, 1)
    assert np.all(np.abs(deq - xf) <= u * np.abs(xf) + amax * 2.0 ** -({E4: 9, E5: 16}[dt]) + 1e-30)
    assert np.all(np.abs(q.astype(np.float32)) < {E4: 256, E5: 2 ** 15}[dt] + 1)


def test_quantize_then_mx_matmul_against_the_bf16_product():
    """quantize_mx on VectorE feeding an MX matmul: the result of an MXFP8 e4m3 matmul of bf16
    data, against the float64 product, within the quantization error (and not a dropped row)."""
    p, m, n = 128, 32, 64
    rng = np.random.default_rng(5)
    a = rng.standard_normal((p, m * 4)).astype(np.float32).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((p, n * 4)).astype(np.float32).astype(ml_dtypes.bfloat16)
    b = B("trn3")
    xa, sa = b.load("a", a, BF16)
    xc, sc_ = b.load("c", c, BF16)
    qa = ap(b.sbuf("qa", m * 4), E4, [(4, m), (1, 4)], partitions=p)
    qc = ap(b.sbuf("qc", n * 4), E4, [(4, n), (1, 4)], partitions=p)
    scales = b.sbuf("scales", m + n)                   # both scale tensors packed in one tile:
    s_a = ap(scales, U8, [(1, m)], partitions=p)       # offset 0 ...
    s_c = ap(scales, U8, [(1, n)], partitions=p, byte_offset=m)   # ... and at another byte offset
    qd = b.sem()
    b.add(VECTOR, Instr(Op.QUANTIZE_MX, qa, (xa,), QuantizeMxAttrs(), waits=((sa, 1),), signals=(qd,), accum=s_a))
    b.add(VECTOR, Instr(Op.QUANTIZE_MX, qc, (xc,), QuantizeMxAttrs(scale_offset=4), waits=((sc_, 1),),
                        signals=(qd,), accum=s_c))
    ps = b.psum("ps", n * 4)
    d = tile_ap(ps, F32, m, n)
    mm, cp = b.sem(), b.sem()
    b.add(TENSOR, Instr(Op.MATMUL, d, (qa, qc, s_a, s_c), MatmulMxAttrs(moving_scale_offset=4),
                        waits=((qd, 2),), signals=(mm,)))
    r = tile_ap(b.sbuf("r", n * 4), F32, m, n)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (d,), TensorCopyAttrs(), waits=((mm, 1),), signals=(cp,)))
    b.store("r", r, ((cp, 1),))
    got = out(b.run(), "r", F32, (m, n)).astype(np.float64)
    exact = np.einsum("pmj,pnj->mn", a.astype(np.float64).reshape(p, m, 4), c.astype(np.float64).reshape(p, n, 4))
    # worst case: each operand within 2^-4 relative (e4m3 RNE): |err| <= (2^-3 + 2^-8) sum |a||c|
    bound = (2.0 ** -3 + 2.0 ** -8) * np.einsum("pmj,pnj->mn", np.abs(a.astype(np.float64)).reshape(p, m, 4),
                                                np.abs(c.astype(np.float64)).reshape(p, n, 4))
    assert np.all(np.abs(got - exact) <= bound)
    # typical: e4m3's 3 mantissa bits give ~5% relative error on the whole product (Frobenius),
    # a dropped packed row (a quarter of K) ~50%
    rel = lambda y: np.linalg.norm(y - exact) / np.linalg.norm(exact)   # noqa: E731
    part = np.einsum("pmj,pnj->mn", a.astype(np.float64).reshape(p, m, 4)[:, :, :3],
                     c.astype(np.float64).reshape(p, n, 4)[:, :, :3])
    assert rel(got) < 0.1 and rel(part) > 0.1


def test_quantize_mx_cost_and_rejection():
    """ARCH3 L172: "four input elements per partition, per cycle": N / 4 cycles."""
    x = RNG.standard_normal((128, 2048)).astype(np.float32)
    b = _qmx_prog(x)
    st = b.run(mode="timing").stats
    # 2048 / 4 = 512 cycles, after the scale tile's memset (512 uint8 per partition: N = 512)
    assert st.engine_busy_ns["dve"] == pytest.approx((512 + 512) / TRN3.vector_clock_ghz)
    small = _qmx_prog(RNG.standard_normal((32, 16)).astype(np.float32)).streams[VECTOR][1]
    assert instr_cost(small, VECTOR, TRN3).busy_ns == pytest.approx(64 / TRN3.vector_clock_ghz)   # MIN_II
    for target, core in (("trn2", "NeuronCore-v3"), ("trn1", "NeuronCore-v2")):
        bad = _qmx_prog(RNG.standard_normal((32, 16)).astype(np.float32), target=target)
        with pytest.raises(EngineError, match=re.escape(f"quantize_mx (MXFP8 quantization) is not available "
                                                        f"on {target} ({core})")) as e:
            check_program(bad.program())
        assert str(e.value).startswith("dve #1: quantize_mx(")


@pytest.mark.parametrize("mut,msg", [
    (lambda i: dataclasses.replace(i, srcs=(dataclasses.replace(i.srcs[0], dtype=F32),)),
     "quantize_mx src must be bfloat16 or float16 in SBUF"),
    (lambda i: dataclasses.replace(i, accum=None), "writes its scales to accum"),
    (lambda i: dataclasses.replace(i, attrs=QuantizeMxAttrs(scale_offset=16)), "offset must be one of (0, 4, 8, 12)"),
    (lambda i: dataclasses.replace(i, dst=dataclasses.replace(i.dst, dtype=BF16)),
     "quantize_mx dst must be float8_e4m3fn or float8_e5m2"),
])
def test_quantize_mx_operand_checks(mut, msg):
    ins = _qmx_prog(RNG.standard_normal((64, 32)).astype(np.float32)).streams[VECTOR][1]
    check_instr_shape(ins, VECTOR, TRN3)
    with pytest.raises(OperandError, match=re.escape(msg)):
        check_instr_shape(mut(ins), VECTOR, TRN3)
