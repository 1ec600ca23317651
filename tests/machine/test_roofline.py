"""The roofline is the physical floor of a program's work, never the work it happens to do.

floor = max(matmul FLOPs / TensorE peak for their dtype, transcendental activation elements /
ScalarE rate, compulsory HBM bytes (inputs read once + outputs written once) / the core's HBM
share); the bytes actually moved are reported beside it as ``traffic_ratio``. Each expected
value below is computed from the target description, independently of the simulator.
"""
from __future__ import annotations

import numpy as np
import pytest

from progs import B
from runtime_sim import (SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, DmaAttrs,
                         DType, Instr, MatmulAttrs, Op, TensorCopyAttrs, TensorScalarAttrs,
                         TensorTensorAttrs, ap, get_target, simulate, tile_ap)

F32, BF16 = DType.FP32, DType.BF16
P, F = 128, 512


def _hbm_floor(target: str, nbytes: int) -> float:
    t = get_target(target)
    return nbytes / (t.hbm_bytes_per_ns / t.cores_per_chip)


def _stream(reads: int, vector_passes: int, target: str = "trn2") -> B:
    """Load x [P, F] fp32 ``reads`` times (into separate tiles), sum the copies, run
    ``vector_passes`` VectorE scalings and store y: the compulsory bytes are 2 x P x F x 4
    whatever ``reads`` and ``vector_passes`` are."""
    b = B(target)
    h = b.hbm("x", P * F * 4, data=np.ones((P, F), np.float32))
    tiles = []
    for r in range(reads):
        t = tile_ap(b.sbuf(f"x{r}", F * 4), F32, P, F)
        sem = b.sem()
        b.add(b.next_dma(), Instr(Op.DMA_COPY, t, (ap(h, F32, [(F, P), (1, F)]),), DmaAttrs(),
                                  signals=(sem,)))
        tiles.append((t, sem))
    acc, sem = tiles[0]
    waits: tuple = ((sem, 1),)
    bufs = [tile_ap(b.sbuf(f"acc{i}", F * 4), F32, P, F) for i in range(2)]
    n = 0
    for t, s in tiles[1:]:
        sig = b.sem()
        b.add(VECTOR, Instr(Op.TENSOR_TENSOR, bufs[n % 2], (acc, t), TensorTensorAttrs(AluOp.ADD),
                            waits=waits + ((s, 1),), signals=(sig,)))
        acc, waits, n = bufs[n % 2], ((sig, 1),), n + 1
    for _ in range(vector_passes):
        sig = b.sem()
        b.add(VECTOR, Instr(Op.TENSOR_SCALAR, bufs[n % 2], (acc,),
                            TensorScalarAttrs(AluOp.MULTIPLY, 1.0), waits=waits, signals=(sig,)))
        acc, waits, n = bufs[n % 2], ((sig, 1),), n + 1
    b.store("y", acc, waits)
    return b


def test_floor_ignores_rereads_and_vector_work():
    once = simulate(_stream(1, 1).program(), mode="timing").stats
    heavy = simulate(_stream(3, 8).program(), mode="timing").stats
    compulsory = 2 * P * F * 4
    for st in (once, heavy):
        assert st.min_hbm_bytes == compulsory
        assert st.roofline_ns == pytest.approx(_hbm_floor("trn2", compulsory))
        assert st.roofline_hbm_ns == st.roofline_ns and st.roofline_bound() == "hbm"
        assert st.roofline_tensor_ns == 0.0 and st.roofline_scalar_ns == 0.0
        assert 0 < st.roofline_ns <= st.total_ns
    # 8 VectorE passes take longer than the HBM floor: a floor built from per-engine work would
    # be higher for the heavy program; the physical floor is not
    assert heavy.engine_busy_ns["dve"] > heavy.roofline_ns
    assert heavy.roofline_ns == once.roofline_ns
    # ... and the traffic it does move is reported beside the floor
    assert once.hbm_bytes == compulsory and once.traffic_ratio() == pytest.approx(1.0)
    assert heavy.hbm_bytes == 4 * P * F * 4 and heavy.traffic_ratio() == pytest.approx(2.0)
    d = heavy.to_dict()
    assert d["traffic_ratio"] == pytest.approx(2.0) and d["roofline_bound"] == "hbm"
    assert d["roofline_ns"] == heavy.roofline_ns and d["min_hbm_bytes"] == compulsory


def _activations(funcs: list[ActFunc], target: str, dtype: DType) -> B:
    """Load x [P, F], apply each activation in turn on ScalarE (SBUF -> SBUF), store."""
    b = B(target)
    t, s = b.load("x", np.full((P, F), 0.5, np.float32), dtype)
    bufs = [tile_ap(b.sbuf(f"a{i}", F * dtype.itemsize), dtype, P, F) for i in range(2)]
    acc, waits = t, ((s, 1),)
    for i, fn in enumerate(funcs):
        sig = b.sem()
        b.add(SCALAR, Instr(Op.ACTIVATION, bufs[i % 2], (acc,), ActivationAttrs(fn),
                            waits=waits, signals=(sig,)))
        acc, waits = bufs[i % 2], ((sig, 1),)
    b.store("y", acc, waits)
    return b


@pytest.mark.parametrize("target,dtype,lanes_factor", [("trn2", BF16, 1), ("trn3", BF16, 2),
                                                       ("trn3", F32, 1), ("trn1", BF16, 1)])
def test_scalar_floor_counts_transcendental_elements(target, dtype, lanes_factor):
    tgt = get_target(target)
    funcs = [ActFunc.EXP, ActFunc.TANH, ActFunc.GELU, ActFunc.SILU, ActFunc.EXP, ActFunc.LOG]
    st = simulate(_activations(funcs, target, dtype).program(), mode="timing").stats
    elems = len(funcs) * P * F
    expect = elems / (128 * tgt.scalar_clock_ghz * lanes_factor)   # 128 lanes x clock
    assert st.transcendental_elements == elems
    assert st.roofline_scalar_ns == pytest.approx(expect)
    assert st.roofline_ns == pytest.approx(max(expect, _hbm_floor(target, 2 * P * F * dtype.itemsize)))
    assert st.roofline_bound() == "scalar"
    assert 0 < st.roofline_ns <= st.total_ns


def test_non_transcendental_activations_are_not_scalar_floor():
    """identity/copy/relu/square and sqrt/rsqrt/reciprocal (VectorE has pow and divide) are not
    compulsory ScalarE work: the floor is the HBM floor."""
    funcs = [ActFunc.IDENTITY, ActFunc.COPY, ActFunc.RELU, ActFunc.SQUARE, ActFunc.SQRT,
             ActFunc.RSQRT, ActFunc.RECIPROCAL, ActFunc.ABS]
    st = simulate(_activations(funcs, "trn2", BF16).program(), mode="timing").stats
    assert st.transcendental_elements == 0 and st.roofline_scalar_ns == 0.0
    assert st.roofline_ns == pytest.approx(_hbm_floor("trn2", 2 * P * F * 2))
    assert st.engine_busy_ns["act"] > st.roofline_ns   # ScalarE was busier than the floor
    # one exp among them counts its elements only, also when the per-signature static facts
    # are shared without checks (the function is part of the signature)
    for checks in (True, "static", False):
        st1 = simulate(_activations(funcs + [ActFunc.EXP], "trn2", BF16).program(),
                       mode="timing", checks=checks).stats
        assert st1.transcendental_elements == P * F, checks


@pytest.mark.parametrize("dtype,slowdown", [(BF16, 1), (F32, 4)])
def test_tensor_floor_is_flops_at_the_dtype_peak(dtype, slowdown):
    tgt = get_target("trn2")
    b = B("trn2")
    a, s = b.load("a", np.ones((P, 128), np.float32), dtype)
    m, s2 = b.load("m", np.ones((P, 512), np.float32), dtype)
    ps = tile_ap(b.psum("ps", 512 * 4), F32, 128, 512)
    reps = 16
    for i in range(reps):
        b.add(TENSOR, Instr(Op.MATMUL, ps, (a, m), MatmulAttrs(), waits=((s, 1), (s2, 1)),
                            signals=("mm",) if i == reps - 1 else ()))
    r = tile_ap(b.sbuf("r", 512 * 4), F32, 128, 512)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (ps,), TensorCopyAttrs(), waits=(("mm", 1),),
                        signals=("cp",)))
    b.store("r", r, (("cp", 1),))
    st = simulate(b.program(), mode="timing").stats
    flops = reps * 2 * 128 * 128 * 512
    assert st.flops == flops
    peak = 128 * 128 * 2 * tgt.tensor_clock_ghz / slowdown
    assert st.roofline_tensor_ns == pytest.approx(flops / peak)
    assert st.roofline_ns == pytest.approx(max(flops / peak, st.roofline_hbm_ns))
    assert st.roofline_bound() == "tensor"
    assert 0 < st.roofline_ns <= st.total_ns
