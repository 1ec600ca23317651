"""The dynamic parts of the timing model: TensorE power ramp (trn2/trn3), exposed LoadStationary,
NC-v2 shared SBUF/PSUM ports, and the statistics derived from a run."""
from __future__ import annotations

import math

import pytest

from progs import B
from runtime_sim import (GPSIMD, SCALAR, TENSOR, TRN1, TRN2, VECTOR, ActFunc, ActivationAttrs, DType, Instr,
                         MatmulAttrs, MemsetAttrs, Op, TensorCopyAttrs, tile_ap)

F32, BF16 = DType.FP32, DType.BF16


def _matmuls(target: str, n: int, *, gap_after: int | None = None, same_stationary: bool = True) -> B:
    """n back-to-back [128x128] x [128x512] bf16 matmuls (each 512 PE cycles); optionally a long
    idle gap after matmul ``gap_after`` (the next one waits for a slow VectorE memset)."""
    b = B(target)
    st = [b.sbuf(f"st{k}", 256) for k in range(2)]
    mv = b.sbuf("mv", 1024)
    ps = [b.psum(f"ps{k}", 2048) for k in range(2)]
    big = b.sbuf("big", 64 * 1024)
    for k in range(n):
        waits = ()
        if gap_after is not None and k == gap_after + 1:
            waits = (("slow", 1),)
        s = st[0] if same_stationary else st[k % 2]
        b.add(TENSOR, Instr(Op.MATMUL, tile_ap(ps[k % 2], F32, 128, 512), (tile_ap(s, BF16, 128, 128),
                                                                            tile_ap(mv, BF16, 128, 512)),
                            MatmulAttrs(), waits=waits))
    if gap_after is not None:   # ~20 us of VectorE work: a long idle window for TensorE
        b.add(VECTOR, Instr(Op.MEMSET, tile_ap(big, F32, 128, 16384), (), MemsetAttrs(1.0), signals=("slow",)))
    return b


def _pe_durations(res) -> list[float]:
    return [e.dur_ns for e in sorted((e for e in res.trace if e.queue == "pe"), key=lambda e: e.start_ns)]


def test_power_ramp_starts_at_half_speed_and_reaches_full_speed():
    full = 512 / 2.4
    d = _pe_durations(_matmuls("trn2", 40).run(mode="timing", trace=True))
    assert d[0] == pytest.approx(2 * (full + 32 / 2.4))  # cold: 50% speed (+ the first LoadStationary)
    assert all(x >= y - 1e-9 for x, y in zip(d, d[1:]))  # speeds up monotonically
    assert d[-1] == pytest.approx(full)                  # warm after ~3 us of work
    warm = next(k for k, x in enumerate(d) if x == pytest.approx(full))
    assert 2000 <= sum(d[:warm]) <= 4000                 # "ramps to full over ~3 us"
    # trn1: no ramp documented; every matmul takes its nominal 512 cycles at 2.8 GHz
    d1 = _pe_durations(_matmuls("trn1", 10).run(mode="timing", trace=True))
    assert d1 == pytest.approx([(512 + 32) / 2.8] + [512 / 2.8] * 9)   # (+ the first LoadStationary)


def test_power_ramp_falls_back_after_an_idle_window():
    full = 512 / 2.4
    d = _pe_durations(_matmuls("trn2", 40, gap_after=30).run(mode="timing", trace=True))
    assert d[30] == pytest.approx(full)                  # warm before the gap
    assert d[31] == pytest.approx(2 * full)              # >3 us idle: back to half speed
    res = _matmuls("trn2", 40).run(mode="timing")
    assert res.stats.engine_busy_ns["pe"] > 40 * full    # ramp time counts as busy


def test_exposed_load_stationary_after_idle():
    # trn1 (no ramp): after an idle gap, a matmul with a new stationary pays ceil(128 / 4) cycles
    d = _pe_durations(_matmuls("trn1", 34, gap_after=30, same_stationary=False).run(mode="timing", trace=True))
    nominal = 512 / 2.8
    assert d[0] == pytest.approx(nominal + math.ceil(128 / TRN1.load_stationary_speedup) / 2.8)  # starts idle
    assert d[1:31] == pytest.approx([nominal] * 30)      # back-to-back: loaded in the background
    assert d[31] == pytest.approx(nominal + 32 / 2.8)
    same = _pe_durations(_matmuls("trn1", 34, gap_after=30).run(mode="timing", trace=True))
    assert same[31] == pytest.approx(nominal)            # same stationary: nothing to load


def _pair(target: str, q1, ins1, q2, ins2) -> float:
    b = B(target)
    b.add(q1, ins1(b))
    b.add(q2, ins2(b))
    return b.run(mode="timing", checks=False).stats.total_ns


def _psum_reader(engine):
    def make(b: B) -> Instr:
        src = tile_ap(b.psum(f"p_{engine.name}", 2048), F32, 128, 512)
        dst = tile_ap(b.sbuf(f"d_{engine.name}", 2048), F32, 128, 512)
        if engine is SCALAR:
            return Instr(Op.ACTIVATION, dst, (src,), ActivationAttrs(ActFunc.COPY))
        return Instr(Op.TENSOR_COPY, dst, (src,), TensorCopyAttrs())
    return make


def _sbuf_memset(engine):
    return lambda b: Instr(Op.MEMSET, tile_ap(b.sbuf(f"m_{engine.name}", 4096), F32, 128, 1024), (), MemsetAttrs(1.0))


@pytest.mark.parametrize("kind", ["psum", "sbuf"])
def test_nc_v2_shared_ports_serialise_engines(kind):
    if kind == "psum":      # VectorE and ScalarE both read PSUM
        args = (VECTOR, _psum_reader(VECTOR), SCALAR, _psum_reader(SCALAR))
    else:                   # VectorE and GpSimdE both write SBUF
        args = (VECTOR, _sbuf_memset(VECTOR), GPSIMD, _sbuf_memset(GPSIMD))
    t1 = _pair("trn1", *args)
    t2 = _pair("trn2", *args)
    one = B("trn1")
    one.add(args[0], args[1](one))
    alone = one.run(mode="timing", checks=False).stats.total_ns
    assert TRN1.shared_ports and not TRN2.shared_ports
    assert t1 > alone * 1.5                  # trn1: the second engine waits for the port
    # trn2 (no shared ports): the two run side by side; the slower of the two bounds the pair
    b2 = B("trn2")
    b2.add(args[2], args[3](b2))
    assert t2 == pytest.approx(max(b2.run(mode="timing", checks=False).stats.total_ns,
                                   _single_time("trn2", args[0], args[1])))


def _single_time(target, q, make) -> float:
    b = B(target)
    b.add(q, make(b))
    return b.run(mode="timing", checks=False).stats.total_ns
