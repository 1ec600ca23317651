"""trn3 (NeuronCore-v4) as its own machine: each NC-v4 feature of the ISA with a hand-written
program -- values against numpy, cost against the documented rate, and the check that rejects it
on an NC-v2/NC-v3 target (trn1/trn2) naming the instruction, the target and the constraint. The
MX matmul and quantize_mx are in test_trn3_mx.py.

Sources (aws-neuron-sdk@81ce03a): trainium3_arch.rst "Fast Exponential Evaluation" (L176-201),
"BF16 Matmul Results in PSUM" (L124-143), "Background Transpose" (L145-150); the nki.isa API
docstrings nki/api/nki/isa/__init__.py: nc_matmul (dst dtype L587-589, moving free size
L612-615), exponential (L2283-2385)."""
from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from runtime_sim import (SCALAR, TENSOR, TRN1, TRN2, TRN3, VECTOR, ActFunc, ActivationAttrs, AluOp,
                         Buffer, DType, EngineError, Instr, MatmulAttrs, Memory, MemsetAttrs, Op,
                         OperandError, Program, PsumAccumulateError, TensorCopyAttrs, TensorScalarAttrs,
                         TransposeAttrs, ap, check_program, instr_cost, simulate, tile_ap,
                         to_chrome_trace)
from runtime_sim.checks import check_instr_shape
from runtime_sim.isa import ExponentialAttrs
from runtime_sim.loops import Index, Loop, Looped, Stream

F32, BF16, FP16, E4 = DType.FP32, DType.BF16, DType.FP16, DType.FP8_E4M3
I32, I64 = DType.INT32, DType.INT64
RNG = np.random.default_rng(22)
SB = Buffer("sb", Memory.SBUF, 128, 96 * 1024, 0)
PS = Buffer("ps", Memory.PSUM, 128, 16 * 1024, 0)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bf16 (ml_dtypes: round to nearest, ties to even), back as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


# ---- 1. VectorE fast exponential (nki.isa.exponential) -------------------------------------

def _exp_prog(x: np.ndarray, sdt: DType, ddt: DType, *, mx: np.ndarray | None = None,
              max_value: float = 0.0, init: np.ndarray | None = None, accum: bool = True,
              target: str = "trn3") -> tuple[B, tuple[int, int]]:
    """exponential(dst, src = x, max_value = mx column or the constant, reduce_res = sum), both
    results stored: o_y [P, F] (ddt) and o_s [P, 1] fp32."""
    b = B(target)
    p, f = x.shape
    xs, s0 = b.load("x", x, sdt)
    srcs, waits = [xs], [(s0, 1)]
    if mx is not None:
        t, s = b.load("mx", mx.reshape(p, 1), F32)
        srcs.append(t)
        waits.append((s, 1))
    if init is not None:
        t, s = b.load("init", init.reshape(p, 1), F32)
        srcs.append(t)
        waits.append((s, 1))
    y = tile_ap(b.sbuf("y", f * ddt.itemsize), ddt, p, f)
    acc = tile_ap(b.sbuf("acc", 4), F32, p, 1) if accum else None
    done = b.sem()
    attrs = ExponentialAttrs(max_value=max_value, max_from_src=mx is not None,
                             init_from_src=init is not None)
    b.add(VECTOR, Instr(Op.EXPONENTIAL, y, tuple(srcs), attrs, waits=tuple(waits), signals=(done,),
                        accum=acc))
    b.store("y", y, ((done, 1),))
    if acc is not None:
        b.store("s", acc, ((done, 1),))
    return b, (p, f)


@pytest.mark.parametrize("sdt,ddt", [(F32, F32), (BF16, BF16), (BF16, F32), (F32, BF16), (FP16, FP16)])
def test_exponential_subtracts_the_row_max_and_sums_the_row(sdt, ddt):
    p, f = 128, 300
    x = (RNG.standard_normal((p, f)) * 4).astype(np.float32).astype(sdt.np)
    xf = x.astype(np.float64)
    mx = xf.max(axis=1).astype(np.float32)                      # softmax's row max, fp32
    b, _ = _exp_prog(x, sdt, ddt, mx=mx)
    res = b.run()
    y = out(res, "y", ddt, (p, f)).astype(np.float64)
    s = out(res, "s", F32, (p, 1))[:, 0].astype(np.float64)
    # exactly the documented computation: fp32 subtract, exp rounded to fp32, then dst's dtype
    z = (x.astype(np.float32) - mx[:, None]).astype(np.float32)
    ref32 = np.exp(z.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(y, ref32.astype(ddt.np).astype(np.float64))
    # against float64 math: the fp32 subtraction (2^-24 |z| after exp), exp's fp32 rounding and
    # dst's rounding (can fail: see below)
    zf = xf - mx[:, None].astype(np.float64)
    ref = np.exp(zf)
    assert _exp_err(y, ref, zf, ddt) <= 1.0
    np.testing.assert_allclose(s, ref.sum(axis=1), rtol=1e-5)
    # the tolerances fail for an instruction that forgot the max or summed half the row
    assert _exp_err(y, np.exp(xf), xf, ddt) > 1.0
    assert not np.allclose(s, ref[:, : f // 2].sum(axis=1), rtol=1e-5)


def _exp_err(y: np.ndarray, ref: np.ndarray, z: np.ndarray, ddt: DType) -> float:
    """Largest error of y against ref = exp(z) in units of its bound: half an ulp of dst's type
    (2^-8 bf16, 2^-11 fp16, 2^-24 fp32; fp16 subnormals 2^-25 absolute), plus exp's fp32
    rounding, plus the fp32 subtraction's 2^-24 |z| carried through exp."""
    u = {F32: 2.0 ** -24, BF16: 2.0 ** -8, FP16: 2.0 ** -11}[ddt]
    bound = ref * (u + 2.0 ** -24 * (1.0 + np.abs(z)) * 1.01) + (2.0 ** -25 if ddt is FP16 else 0.0)
    return float(np.max(np.abs(y - ref) / bound))


def test_exponential_sum_is_a_sequential_fp32_loop():
    """trainium3_arch.rst L189-193: ``for j in range(N): # sequential (free) dimension ...
    reduce_res[i, 0] += dst[i, j]``: every add rounds to fp32, in order. 1.0 then 1000 values of
    exp(-17.5) ~ 2.5e-8, each below half an ulp of 1.0: in order the sum stays exactly 1.0
    (a pairwise or float64 sum gives 1 + 2.5e-5)."""
    x = np.full((32, 1001), -17.5, np.float32)
    x[:, 0] = 0.0
    b, _ = _exp_prog(x, F32, F32, max_value=0.0)
    s = out(b.run(), "s", F32, (32, 1))[:, 0]
    assert np.all(s == np.float32(1.0))
    assert np.exp(-17.5) < 2.0 ** -24
    assert float(np.sum(np.exp(x.astype(np.float64)), axis=1)[0]) > 1.00002


def test_exponential_constant_max_and_load_reduce_from_a_source():
    p, f = 64, 50
    x = RNG.uniform(-3, 3, (p, f)).astype(np.float32)
    init = RNG.uniform(0, 10, p).astype(np.float32)
    b, _ = _exp_prog(x, F32, F32, max_value=1.5, init=init)
    res = b.run()
    y = out(res, "y", F32, (p, f)).astype(np.float64)
    s = out(res, "s", F32, (p, 1))[:, 0]
    z = x.astype(np.float64) - 1.5
    assert _exp_err(y, np.exp(z), z, F32) <= 1.0
    np.testing.assert_allclose(s, init + y.sum(axis=1), rtol=1e-6)
    assert not np.allclose(s, y.sum(axis=1), rtol=1e-6)         # the init is there


def test_exponential_without_accum_writes_only_dst():
    x = RNG.uniform(-2, 2, (128, 64)).astype(np.float32)
    b, _ = _exp_prog(x, F32, BF16, accum=False)
    y = out(b.run(), "y", BF16, (128, 64)).astype(np.float64)
    np.testing.assert_array_equal(y, _bf16(np.exp(x.astype(np.float64)).astype(np.float32)))


def _exp(n: int, dt: DType = BF16, ddt: DType | None = None, **kw) -> Instr:
    ddt = dt if ddt is None else ddt
    return Instr(Op.EXPONENTIAL, tile_ap(SB, ddt, 128, n, elem_offset=32768 // ddt.itemsize),
                 (tile_ap(SB, dt, 128, n),), ExponentialAttrs(**kw))


def _act_exp(n: int, dt: DType = BF16) -> Instr:
    return Instr(Op.ACTIVATION, tile_ap(SB, dt, 128, n, elem_offset=32768 // dt.itemsize),
                 (tile_ap(SB, dt, 128, n),), ActivationAttrs(ActFunc.EXP))


@pytest.mark.parametrize("dt,width", [(BF16, 4), (FP16, 4), (F32, 2)])
@pytest.mark.parametrize("n", [4096, 1000])
def test_exponential_cost_is_four_times_scalar_exp_capped_by_the_vector_datapath(dt, width, n):
    """c_exponential: max(ScalarE activation(exp) time / 4, N / VectorE width) in VectorE cycles,
    floored at MIN_II. On trn3 the width (trainium3_arch.rst L52: 512 2-byte / 256 other
    elements per cycle = 4 / 2 per lane) binds: N/4 cycles for bf16/fp16, N/2 for fp32."""
    t = TRN3
    got = instr_cost(_exp(n, dt), VECTOR, t)
    assert got.busy_ns == pytest.approx(n / width / t.vector_clock_ghz, rel=1e-12)
    act = instr_cost(_act_exp(n, dt), SCALAR, t).busy_ns
    # against the model's ScalarE exp (trn3: 2-byte at 2 elements per lane per cycle): 2x
    assert act / got.busy_ns == pytest.approx(2.0)
    # "4x the throughput" of ScalarE's one element per lane per cycle holds for 2-byte types
    base = n / t.scalar_clock_ghz
    assert base / got.busy_ns == pytest.approx(4.0 if width == 4 else 2.0)
    assert got.work_ns == pytest.approx(n / width / t.vector_clock_ghz)
    assert got.latency_ns == pytest.approx(t.access_overhead_cycles / t.vector_clock_ghz)


def test_exponential_cost_follows_the_4x_rule_where_the_datapath_is_wider():
    """With a (hypothetical) VectorE datapath 4x wider, the documented 4x binds: exactly a
    quarter of ScalarE's activation(exp) time on the same operands, for every dtype."""
    wide = dataclasses.replace(TRN3, vector_fast_copy_factor=16)
    for dt in (BF16, F32):
        e = instr_cost(_exp(4096, dt), VECTOR, wide).busy_ns
        a = instr_cost(_act_exp(4096, dt), SCALAR, wide).busy_ns
        assert a / e == pytest.approx(4.0)


def test_exponential_floors_min_ii_and_pays_the_dependency_penalty():
    t = TRN3
    small = instr_cost(_exp(64), VECTOR, t)                      # 16 cycles of work
    assert small.busy_ns == pytest.approx(t.min_ii_cycles / t.vector_clock_ghz)
    assert small.work_ns == pytest.approx(16 / t.vector_clock_ghz)
    big = _exp(4096)
    prev = Instr(Op.TENSOR_SCALAR, big.srcs[0], (tile_ap(SB, BF16, 128, 4096, elem_offset=40000),),
                 TensorScalarAttrs(AluOp.ADD, 1.0))
    alone = instr_cost(big, VECTOR, t).busy_ns
    dep = instr_cost(big, VECTOR, t, prev).busy_ns
    assert dep - alone == pytest.approx(t.dependent_vector_penalty_cycles / t.vector_clock_ghz)
    # strided source (innermost stride 8 x 2 B > 16 B): twice the elements streamed
    strided = Instr(Op.EXPONENTIAL, big.dst, (ap(SB, BF16, [(9, 4096)], partitions=128),), ExponentialAttrs())
    assert instr_cost(strided, VECTOR, t).busy_ns == pytest.approx(2 * alone)


def test_exponential_timed_in_a_program():
    """The simulated VectorE busy time of one exponential is its cost (N = 2048 bf16: 512 cycles)."""
    x = RNG.uniform(-1, 1, (128, 2048)).astype(np.float32)
    b, _ = _exp_prog(x, BF16, BF16, accum=False)
    st = b.run(mode="timing").stats
    assert st.engine_busy_ns["dve"] == pytest.approx(512 / TRN3.vector_clock_ghz)


@pytest.mark.parametrize("target", ["trn2", "trn1"])
def test_exponential_is_rejected_before_nc_v4(target):
    x = RNG.uniform(-1, 1, (128, 64)).astype(np.float32)
    b, _ = _exp_prog(x, F32, F32, target=target)
    core = {"trn1": "NeuronCore-v2", "trn2": "NeuronCore-v3"}[target]
    with pytest.raises(EngineError, match=re.escape(f"exponential (VectorE fast exponential) is not "
                                                    f"available on {target} ({core})")) as e:
        check_program(b.program())
    assert str(e.value).startswith("dve #0: exponential(")       # names the instruction
    assert "NeuronCore-v4" in str(e.value)
    with pytest.raises(EngineError, match="not available on"):
        b.run()
    b.target = "trn3"
    check_program(b.program())


@pytest.mark.parametrize("ins,msg", [
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, I64, 128, 8),), ExponentialAttrs()),
     "exponential src dtype int64"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, DType.BOOL, 128, 8), (tile_ap(SB, F32, 128, 8),), ExponentialAttrs()),
     "exponential dst dtype bool"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 8), tile_ap(SB, BF16, 128, 1)),
           ExponentialAttrs(max_from_src=True)), "exponential max_value must be fp32"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 8), tile_ap(SB, F32, 128, 2)),
           ExponentialAttrs(max_from_src=True)), "exponential max_value: expected a [128, 1]"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 8),),
           ExponentialAttrs(reduce_init=1.0)), "reduce_init applies to a reduction"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 8),), ExponentialAttrs(),
           accum=tile_ap(SB, I32, 128, 1)), "accum (reduce_res) must be a float type"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 9),), ExponentialAttrs()),
     "exponential dst: expected [128 partitions x 9]"),
    (Instr(Op.EXPONENTIAL, tile_ap(SB, F32, 128, 8), (tile_ap(SB, F32, 128, 8),),
           ExponentialAttrs(max_from_src=True)), "exponential takes 2 source APs here, got 1"),
])
def test_exponential_operand_checks(ins, msg):
    with pytest.raises(OperandError, match=re.escape(msg)):
        check_instr_shape(ins, VECTOR, TRN3)


def test_exponential_runs_on_vector_engine_only():
    with pytest.raises(EngineError, match="cannot run on act"):
        check_instr_shape(_exp(64), SCALAR, TRN3)


# ---- 2. BF16 matmul results in PSUM ------------------------------------------------------------

def _mm_prog(target: str, st: np.ndarray, mvs: list[np.ndarray], dt: DType, ddt: DType,
             n_offset_bytes: int = 0) -> B:
    """st [K, M]; one matmul per moving [K, N] into one PSUM tile (the first opens the group, the
    others accumulate), then a VectorE copy to an SBUF tile of ddt and a store (o_r)."""
    b = B(target)
    k, m = st.shape
    n = mvs[0].shape[1]
    ts, s0 = b.load("st", st, dt)
    ps = b.psum("ps", n_offset_bytes + n * ddt.itemsize)
    d = tile_ap(ps, ddt, m, n, elem_offset=n_offset_bytes // ddt.itemsize)
    mm = b.sem()
    for j, mv in enumerate(mvs):
        tm, s1 = b.load(f"mv{j}", mv, dt)
        b.add(TENSOR, Instr(Op.MATMUL, d, (ts, tm), MatmulAttrs(accumulate=j > 0),
                            waits=((s0, 1), (s1, 1)), signals=(mm,)))
    rb = b.sbuf("r", n * ddt.itemsize)
    cp = b.sem()
    chunks = range(0, n, 2048)         # VectorE reads at most 4096 elements from PSUM
    for c in chunks:
        w = min(2048, n - c)
        b.add(VECTOR, Instr(Op.TENSOR_COPY, tile_ap(rb, ddt, m, w, elem_offset=c),
                            (tile_ap(ps, ddt, m, w, elem_offset=n_offset_bytes // ddt.itemsize + c),),
                            TensorCopyAttrs(), waits=((mm, len(mvs)),), signals=(cp,)))
    b.store("r", tile_ap(rb, ddt, m, n), ((cp, len(chunks)),))
    return b


def test_bf16_psum_rounds_to_nearest_even_before_the_write():
    """trainium3_arch.rst L131: "the downcast from FP32 to BF16 is performed immediately before
    the write" with RNE. Exact fp32 results on the bf16 grid's ties (spacing 2 at 256..512): 257
    -> 256, 259 -> 260, 261 -> 260, 263 -> 264; truncation would give 256, 258, 260, 262."""
    vals = np.array([[257, 259, 261, 263, 255.5, 1, -259, 1025]], np.float32)
    b = _mm_prog("trn3", np.ones((1, 1), np.float32), [vals], F32, BF16)
    got = out(b.run(), "r", BF16, (1, 8))[0].astype(np.float64)
    np.testing.assert_array_equal(got, [256, 260, 260, 264, 256, 1, -260, 1024])
    np.testing.assert_array_equal(got, _bf16(vals[0]))


def test_bf16_psum_accumulates_at_fp32_and_rounds_each_write():
    """L137-141: upcast the bf16 PSUM value, add at fp32, round to bf16 on the write. 257 is
    stored as 256; adding 1 gives 257 again, stored as 256 (an fp32 accumulator would hold 258);
    adding 3 gives 259 -> 260."""
    one = np.ones((1, 1), np.float32)
    b = _mm_prog("trn3", one, [np.array([[257, 257]], np.float32), np.array([[1, 3]], np.float32)], F32, BF16)
    got = out(b.run(), "r", BF16, (1, 2))[0].astype(np.float64)
    np.testing.assert_array_equal(got, [256, 260])


@pytest.mark.parametrize("k_tiles", [1, 3])
def test_bf16_psum_random_matmul_against_numpy(k_tiles):
    k, m, n = 128, 96, 200
    st = RNG.standard_normal((k, m)).astype(np.float32).astype(ml_dtypes.bfloat16)
    mvs = [RNG.standard_normal((k, n)).astype(np.float32).astype(ml_dtypes.bfloat16) for _ in range(k_tiles)]
    b = _mm_prog("trn3", st, mvs, BF16, BF16)
    got = out(b.run(), "r", BF16, (m, n)).astype(np.float64)
    s64 = st.astype(np.float64)
    acc = None
    for mv in mvs:    # bf16 operands: products exact, K-order fp32 sums (einsum's loop), then RNE
        r = np.einsum("km,kn->mn", s64.astype(np.float32), mv.astype(np.float32), optimize=False)
        acc = _bf16(r) if acc is None else _bf16((acc.astype(np.float32) + r).astype(np.float32))
    np.testing.assert_array_equal(got, acc)
    partials = np.cumsum([s64.T @ mv.astype(np.float64) for mv in mvs], axis=0)
    exact = partials[-1]
    # each write rounds to bf16: at most 2^-8 of the running sum per write (plus fp32 sums)
    bound = 2.0 ** -8 * np.abs(partials).sum(axis=0) + 1e-4
    assert np.all(np.abs(got - exact) <= bound)
    if k_tiles > 1:   # a dropped K tile is far outside that bound
        assert not np.all(np.abs(got - (exact - partials[0])) <= bound)


def test_bf16_psum_tile_takes_half_the_bytes_and_costs_the_fp32_time():
    """A [128, 1024] bf16 destination is one 2 KiB bank, its fp32 twin two; the matmul's cost
    does not depend on the destination dtype (no document gives a difference)."""
    st, mv = tile_ap(SB, BF16, 128, 128), tile_ap(SB, BF16, 128, 1024, elem_offset=128)
    d16, d32 = tile_ap(PS, BF16, 128, 1024), tile_ap(PS, F32, 128, 1024)
    assert d16.byte_extent() == (0, TRN3.psum_bank_bytes) and d32.byte_extent() == (0, 2 * TRN3.psum_bank_bytes)
    c16 = instr_cost(Instr(Op.MATMUL, d16, (st, mv), MatmulAttrs()), TENSOR, TRN3)
    c32 = instr_cost(Instr(Op.MATMUL, d32, (st, mv), MatmulAttrs()), TENSOR, TRN3)
    assert c16 == c32
    assert c16.busy_ns == pytest.approx(1024 / TRN3.tensor_clock_ghz)


@pytest.mark.parametrize("tgt", [TRN2, TRN1])
def test_bf16_psum_is_rejected_before_nc_v4(tgt):
    b = _mm_prog(tgt.name, np.ones((1, 1), np.float32), [np.ones((1, 8), np.float32)], F32, BF16)
    with pytest.raises(OperandError, match=re.escape(
            f"matmul destination bfloat16 in PSUM needs BF16 PSUM results (NeuronCore-v4")) as e:
        check_program(b.program())
    assert f"target {tgt.name} is {tgt.neuron_core}: the destination must be fp32" in str(e.value)
    assert str(e.value).startswith("pe #0: matmul(")
    with pytest.raises(OperandError, match="must be fp32 or bf16 in PSUM, got float16"):
        check_instr_shape(Instr(Op.MATMUL, tile_ap(PS, FP16, 128, 8), (tile_ap(SB, BF16, 128, 128),
                                                                      tile_ap(SB, BF16, 128, 8)), MatmulAttrs()),
                          TENSOR, TRN3)


# ---- 3. moving free size beyond one PSUM bank ---------------------------------------------

def _mm(n: int, ddt: DType = F32, *, offset: int = 0, acc: bool = False, m: int = 128) -> Instr:
    return Instr(Op.MATMUL, tile_ap(PS, ddt, m, n, elem_offset=offset // ddt.itemsize),
                 (tile_ap(SB, BF16, 128, m), tile_ap(SB, BF16, 128, n, elem_offset=128)), MatmulAttrs(accumulate=acc))


def _prog(target: str, *ins: Instr) -> Program:
    return Program(target, (SB, PS), {TENSOR: tuple(ins)})


def test_multibank_matmul_values():
    """N = 2048 fp32 (4 banks) in one instruction, accumulated over 2 K tiles, against numpy."""
    k, m, n = 128, 64, 2048
    st = RNG.standard_normal((k, m)).astype(np.float32).astype(ml_dtypes.bfloat16)
    mvs = [RNG.standard_normal((k, n)).astype(np.float32).astype(ml_dtypes.bfloat16) for _ in range(2)]
    b = _mm_prog("trn3", st, mvs, BF16, F32)
    got = out(b.run(), "r", F32, (m, n)).astype(np.float64)
    exact = sum(st.astype(np.float64).T @ mv.astype(np.float64) for mv in mvs)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4)
    assert not np.allclose(got[:, 512:], (st.astype(np.float64).T @ mvs[0].astype(np.float64))[:, 512:],
                           rtol=1e-5, atol=1e-4)      # every bank accumulated, not only the first


@pytest.mark.parametrize("n,ddt", [(2048, F32), (4096, F32), (8192, BF16), (600, F32)])
def test_multibank_matmul_cost_scales_with_n(n, ddt):
    c = instr_cost(_mm(n, ddt), TENSOR, TRN3)
    assert c.busy_ns == pytest.approx(n / TRN3.tensor_clock_ghz)
    check_program(_prog("trn3", _mm(n, ddt)))
    # in a program: TensorE busy for N cycles (past the power ramp: trn3 starts at half speed)
    st = dataclasses.replace(TRN3, pe_ramp_start_speed=1.0)
    b = _mm_prog("trn3", np.ones((128, 128), np.float32), [np.ones((128, n), np.float32)], BF16, ddt)
    res = simulate(b.program(), mode="timing", target=st)
    ls = 128 / TRN3.load_stationary_speedup   # the exposed LoadStationary of a first matmul
    assert res.stats.engine_busy_ns["pe"] == pytest.approx((n + ls) / TRN3.tensor_clock_ghz)


@pytest.mark.parametrize("ins,tgt,msg", [
    (_mm(4097), TRN3, "matmul moving free size N=4097 > 4096 (8 PSUM banks of float32 on trn3)"),
    (_mm(8193, BF16), TRN3, "matmul moving free size N=8193 > 8192 (8 PSUM banks of bfloat16 on trn3)"),
    (_mm(513), TRN2, "matmul moving free size N=513 > 512"),
    (_mm(513), TRN1, "matmul moving free size N=513 > 512"),
])
def test_moving_free_size_limits(ins, tgt, msg):
    with pytest.raises(OperandError, match=re.escape(msg) + "$"):
        check_instr_shape(ins, TENSOR, tgt)


def test_multibank_destination_starts_at_a_bank_boundary():
    check_program(_prog("trn3", _mm(1024, offset=2048)))         # banks 1-2
    check_program(_prog("trn3", _mm(256, offset=1024)))          # inside bank 0
    with pytest.raises(OperandError, match=r"cross a 2048 B PSUM bank boundary without starting at one"):
        check_program(_prog("trn3", _mm(1024, offset=1024)))
    with pytest.raises(OperandError, match=r"pe #0: .*\n.*cross a 2048 B PSUM bank boundary$"):
        check_program(_prog("trn2", _mm(256, offset=1536)))
    with pytest.raises(OperandError, match="without starting at one"):
        check_program(_prog("trn3", _mm(256, offset=1536)))


def test_multibank_accumulation_groups_per_bank():
    """An accumulating 2-bank matmul must lie in the open group of each of its banks."""
    check_program(_prog("trn3", _mm(1024), _mm(1024, acc=True)))
    check_program(_prog("trn3", _mm(512), _mm(512, offset=2048), _mm(1024, acc=True)))
    with pytest.raises(PsumAccumulateError, match="pe #1: .*\n.*bank 1 .*no accumulation group is open"):
        check_program(_prog("trn3", _mm(512), _mm(1024, acc=True)))
    # a later one-bank group in bank 1 replaces that bank's piece of the 2-bank group
    with pytest.raises(PsumAccumulateError, match="pe #2: (?s:.*)outside the bank's open accumulation group"):
        check_program(_prog("trn3", _mm(1024), _mm(256, offset=2048), _mm(1024, acc=True)))


def _looped(step: int, acc_bank_piece: bool = True) -> Program:
    """for j in 0..2: a 2-bank fp32 group at 4096*j, then an accumulating 2-bank product at
    4096*j (or, ``acc_bank_piece=False``, at 6144*j: at j = 1, banks 3-4, bank 4 has no group)."""
    V = lambda *terms, const=0: Index(const, tuple(terms), None)   # noqa: E731
    opener = Looped(_mm(1024), (V(("j", step)), None, None, None))
    off = V(("j", step)) if acc_bank_piece else V(("j", step // 2 * 3 if step else 0))
    accum = Looped(_mm(1024, acc=True), (off, None, None, None))
    return Program("trn3", (SB, PS), {TENSOR: Stream([Loop("j", 3, (opener, accum))])})


def test_multibank_accumulation_groups_in_looped_streams():
    check_program(_looped(4096))
    with pytest.raises(PsumAccumulateError) as e:
        check_program(_looped(4096, acc_bank_piece=False))       # j = 1: 6144, bank 3 has no group
    assert "no accumulation group is open" in str(e.value) and "j=1" in str(e.value)
    with pytest.raises(OperandError, match="without starting at one"):
        check_program(Program("trn3", (SB, PS), {TENSOR: Stream([Loop("j", 3, (
            Looped(_mm(1024), (Index(0, (("j", 1024),), None), None, None, None)),))])}))


# ---- 4. background transpose (TensorE) ----------------------------------------------------

NORAMP3 = dataclasses.replace(TRN3, pe_ramp_start_speed=1.0)   # cycle counts without the ramp
NORAMP2 = dataclasses.replace(TRN2, pe_ramp_start_speed=1.0)


def _pe_prog(target: str, kinds: str, *, consumer_of: int | None = None) -> tuple[B, np.ndarray, np.ndarray]:
    """TensorE runs ``kinds`` in order ("T": transpose [128, 128] bf16 into PSUM bank 0, 256 B
    apart, 128 cycles; "M": matmul [128, 128] x [128, 512] bf16 into bank 1+, 512 cycles), after
    the loads of its operands (every instruction waits for both). With ``consumer_of=k``, a VectorE copy waits on instruction k's
    semaphore. Every transpose result is stored (o_t<k>)."""
    b = B(target)
    x = RNG.standard_normal((128, 128)).astype(np.float32)
    mv = RNG.standard_normal((128, 512)).astype(np.float32)
    tx, s0 = b.load("x", x, BF16)
    tm, s1 = b.load("mv", mv, BF16)
    ps = b.psum("ps", 16 * 1024)
    sems = []
    nt = nm = 0
    for k, c in enumerate(kinds):
        s = b.sem()
        sems.append(s)
        if c == "T":
            d = tile_ap(ps, BF16, 128, 128, elem_offset=128 * nt)
            b.add(TENSOR, Instr(Op.TRANSPOSE, d, (tx,), TransposeAttrs(), waits=((s0, 1), (s1, 1)), signals=(s,)))
            r = tile_ap(b.sbuf(f"t{k}", 256), BF16, 128, 128)
            cs = b.sem()
            b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (d,), TensorCopyAttrs(), waits=((s, 1),), signals=(cs,)))
            b.store(f"t{k}", r, ((cs, 1),))
            nt += 1
        else:
            d = tile_ap(ps, F32, 128, 512, elem_offset=512 * (1 + nm % 7))
            b.add(TENSOR, Instr(Op.MATMUL, d, (tx, tm), MatmulAttrs(), waits=((s0, 1), (s1, 1)), signals=(s,)))
            nm += 1
    if consumer_of is not None:
        r = tile_ap(b.sbuf("c", 4), F32, 128, 1)
        b.add(VECTOR, Instr(Op.MEMSET, r, (), MemsetAttrs(0.0), waits=((sems[consumer_of], 1),)))
    return b, x, mv


def _pe_span(res) -> tuple[float, float]:
    """(first TensorE start, last TensorE busy end) in ns, over both lanes' tracks."""
    ev = [e for e in res.trace if e.queue in ("pe", "pe.bg")]
    return min(e.start_ns for e in ev), max(e.start_ns + e.dur_ns for e in ev)


@pytest.mark.parametrize("kinds,cycles3,cycles2", [
    ("TTTTTTTT", 4 * 128, 8 * 128),        # a chain of transposes: two at a time ("close to double")
    ("TTTTTTT", 4 * 128, 7 * 128),
    ("MTTTT", 32 + 512, 32 + 512 + 4 * 128),   # four transposes behind a matmul (LoadStationary: 32)
    ("MTTTTT", 512 + 128, 32 + 512 + 5 * 128),   # the fifth: background again, [512, 640)
    ("TM", 128 + 512, 128 + 512),          # a matmul never goes to the background
    ("MM", 32 + 512 + 512, 32 + 512 + 512),
])
def test_background_transpose_timing(kinds, cycles3, cycles2):
    """trainium3_arch.rst L148: a transpose runs "in parallel to another matrix multiplication
    (or another transpose)". TensorE time from its first start to its last end, in cycles of the
    documented costs (transpose max(P, min(64, F)) = 128, matmul max(min(64, M), N) = 512, the
    first matmul's exposed LoadStationary ceil(128 / 4) = 32): trn3 overlaps, trn2 does not."""
    for tgt, cyc in ((NORAMP3, cycles3), (NORAMP2, cycles2)):
        b, _, _ = _pe_prog(tgt.name, kinds)
        res = simulate(b.program(), b.feeds, target=tgt, trace=True)
        t0, t1 = _pe_span(res)
        assert t1 - t0 == pytest.approx(cyc / tgt.tensor_clock_ghz), tgt.name
        # TensorE busy time counts overlapped time once: the union of the lanes
        assert res.stats.engine_busy_ns["pe"] == pytest.approx(cyc / tgt.tensor_clock_ghz), tgt.name


def test_background_transpose_values_and_trace_tracks():
    b, x, _ = _pe_prog("trn3", "MTTTT")
    res = b.run(trace=True)
    xb = x.astype(ml_dtypes.bfloat16)
    for k in range(1, 5):
        np.testing.assert_array_equal(out(res, f"t{k}", BF16, (128, 128)), xb.T)
    tracks = {e.queue: [] for e in res.trace}
    for e in res.trace:
        tracks[e.queue].append(e)
    assert [e.name for e in tracks["pe"]] == ["matmul"] and len(tracks["pe.bg"]) == 4
    for evs in tracks.values():              # events on one track never overlap
        evs.sort(key=lambda e: e.start_ns)
        assert all(a.start_ns + a.dur_ns <= c.start_ns + 1e-9 for a, c in zip(evs, evs[1:]))
    names = [e["args"]["name"] for e in to_chrome_trace(res, engine_labels=True)["traceEvents"]
             if e["name"] == "thread_name"]
    assert names[:2] == ["pe (TensorE)", "pe.bg (TensorE background transpose)"]


def test_background_transpose_completes_in_program_order():
    """A background transpose's semaphore is signalled no earlier than the matmul before it
    completes (ASSUMED: completion in program order, so a queue's n-th signal still means its
    first n instructions are done): its consumer waits for the matmul too."""
    b, _, _ = _pe_prog("trn3", "MT", consumer_of=1)
    res = simulate(b.program(), b.feeds, target=NORAMP3, trace=True)
    mm = next(e for e in res.trace if e.name == "matmul")
    tr = next(e for e in res.trace if e.queue == "pe.bg")
    ms = next(e for e in res.trace if e.name == "memset")
    assert tr.start_ns == pytest.approx(mm.start_ns)               # it ran beside the matmul
    assert tr.start_ns + tr.dur_ns < mm.start_ns + mm.dur_ns
    assert ms.start_ns >= float(mm.args["completed_ns"]) - 1e-9    # but completes after it
    assert float(tr.args["completed_ns"]) == pytest.approx(float(mm.args["completed_ns"]))


def test_background_transpose_with_the_power_ramp_counts_busy_time_once():
    """With trn3's power ramp on, the overlapped program is still faster than on one lane and
    TensorE's busy time (the union of the lanes) never exceeds the elapsed TensorE time."""
    b, _, _ = _pe_prog("trn3", "TTTTTTTTTTTTTTTT")
    res = simulate(b.program(), b.feeds, trace=True)
    t0, t1 = _pe_span(res)
    assert res.stats.engine_busy_ns["pe"] == pytest.approx(t1 - t0)
    one = dataclasses.replace(TRN3, background_transpose=False)
    r1 = simulate(b.program(), b.feeds, target=one, trace=True)
    s0, s1 = _pe_span(r1)
    assert (t1 - t0) < 0.6 * (s1 - s0)


def test_background_transpose_in_a_looped_stream_times_like_straight_line():
    """sim_prepare_loops prepares a looped TensorE stream per static instruction: the lanes see
    the same transposes (timing mode, static checks: the looped path)."""
    x = Buffer("x", Memory.SBUF, 128, 256, 0)
    ps = Buffer("pq", Memory.PSUM, 128, 2048, 0)
    tr = Looped(Instr(Op.TRANSPOSE, tile_ap(ps, BF16, 128, 128), (tile_ap(x, BF16, 128, 128),), TransposeAttrs()),
                (Index(0, (("i", 256),), None), None, None))
    mm = Instr(Op.MATMUL, tile_ap(ps, F32, 128, 128, elem_offset=0), (tile_ap(x, BF16, 128, 128),) * 2, MatmulAttrs())
    looped = Program("trn3", (x, ps), {TENSOR: Stream([mm, Loop("i", 6, (tr,))])})
    flat = looped.flat()
    for tgt in (TRN3, NORAMP3, TRN2):
        a = simulate(looped, mode="timing", checks="static", target=tgt).stats
        f = simulate(flat, mode="timing", checks="static", target=tgt).stats
        assert a.total_ns == f.total_ns and a.engine_busy_ns == f.engine_busy_ns, tgt.name
    st = simulate(looped, mode="timing", checks="static", target=NORAMP3).stats
    # lanes (cycles): fg matmul [0, 160) (128 + 32 LoadStationary); bg T [0, 128), [128, 256);
    # fg T [160, 288); bg T [256, 384); fg T [288, 416); bg T [384, 512)
    assert st.engine_busy_ns["pe"] == pytest.approx(512 / 2.4)
