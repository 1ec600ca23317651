"""``rand_philox`` (GpSimdE): Philox4x32-10 against the Random123 known-answer vectors, the
counter layout of the instruction (element e takes word e % 4 of block e // 4, whatever the
tile shape), the uniform scaling per ``bits``, its cost rule and its operand checks."""
from __future__ import annotations

import numpy as np
import pytest

from progs import B, out
from runtime_sim import GPSIMD, TRN2, VECTOR, Buffer, DType, EngineError, Instr, Memory, Op, OperandError
from runtime_sim import instr_cost, tile_ap
from runtime_sim.checks import check_instr_shape
from runtime_sim.isa import RandPhiloxAttrs
from runtime_sim.semantics import philox4x32_10

I32, F32 = DType.INT32, DType.FP32

# Random123 kat_vectors, philox4x32 with 10 rounds: (counter, key, result)
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox4x32_10_known_answers(ctr, key, want):
    got = philox4x32_10(np.array(ctr, np.uint64), np.array(key, np.uint64))
    assert [int(v) for v in got] == list(want)


def _run(key, base, p, f, bits=24, dtype=F32, steps=(1,)):
    b = B()
    k, s1 = b.load("k", np.tile(np.array(key, np.int64).astype(np.int32), (p, 1)), I32)
    c, s2 = b.load("c", base.reshape(p, 1).astype(np.int32), I32)
    d = b.sbuf("u", f * dtype.itemsize)
    dst = tile_ap(d, dtype, p, f)
    done = b.sem()
    b.add(GPSIMD, Instr(Op.RAND_PHILOX, dst, (k, c), RandPhiloxAttrs(steps, bits),
                        waits=((s1, 1), (s2, 1)), signals=(done,)))
    b.store("u", dst, ((done, 1),))
    return out(b.run(), "u", dtype, (p, f))


def test_rand_philox_counter_layout_and_scaling():
    key = (12345, -7)
    ref_words = philox4x32_10(np.stack([np.arange(40) // 4 & 0xffffffff, np.zeros(40), np.zeros(40),
                                        np.zeros(40)], -1).astype(np.uint64),
                              np.array([12345, (-7) & 0xffffffff], np.uint64))
    w = ref_words[np.arange(40), np.arange(40) % 4]
    ref = (w >> 8).astype(np.float64) * 2.0 ** -24
    u = _run(key, np.array([0, 10, 20, 30]), 4, 10)         # rows of 10 consecutive counters
    np.testing.assert_array_equal(u.reshape(-1), ref.astype(np.float32))
    u2 = _run(key, np.array([0, 20]), 2, 20)                 # another tiling, the same numbers
    np.testing.assert_array_equal(u2.reshape(-1), ref.astype(np.float32))
    u8 = _run(key, np.array([0, 20]), 2, 20, bits=8, dtype=DType.BF16)
    np.testing.assert_array_equal(u8.astype(np.float64).reshape(-1), (w >> 24) * 2.0 ** -8)
    assert u8.astype(np.float32).max() < 1.0


def test_rand_philox_uniform_statistics():
    u = _run((1, 2), np.arange(128) * 512, 128, 512).reshape(-1).astype(np.float64)
    assert 0.0 <= u.min() and u.max() < 1.0
    hist = np.histogram(u, bins=16, range=(0, 1))[0]
    expected = u.size / 16
    chi2 = ((hist - expected) ** 2 / expected).sum()
    assert chi2 < 37.7                                        # chi-square, 15 dof, p = 0.001
    assert abs(u.mean() - 0.5) < 0.005


def test_rand_philox_cost_and_checks():
    sb = Buffer("sb", Memory.SBUF, 128, 8192, 0)
    dst = tile_ap(sb, F32, 128, 1000)
    key = tile_ap(sb, I32, 128, 2, elem_offset=1024)
    ctr = tile_ap(sb, I32, 128, 1, elem_offset=1030)
    ins = Instr(Op.RAND_PHILOX, dst, (key, ctr), RandPhiloxAttrs())
    c = instr_cost(ins, GPSIMD, TRN2)
    assert c.busy_ns == pytest.approx(1000 * TRN2.philox_cycles_per_element / TRN2.gpsimd_clock_ghz)
    with pytest.raises(EngineError, match="cannot run on dve"):
        check_instr_shape(ins, VECTOR, TRN2)
    with pytest.raises(OperandError, match="key: expected \\[128, 2\\], got \\[128, 1\\]"):
        check_instr_shape(Instr(Op.RAND_PHILOX, dst, (ctr, ctr), RandPhiloxAttrs()), GPSIMD, TRN2)
    with pytest.raises(OperandError, match="counter must be int32/int64, got float32"):
        check_instr_shape(Instr(Op.RAND_PHILOX, dst, (key, tile_ap(sb, F32, 128, 1, elem_offset=1040)),
                                RandPhiloxAttrs()), GPSIMD, TRN2)
    with pytest.raises(OperandError, match="bits must be in \\[1, 32\\], got 40"):
        check_instr_shape(Instr(Op.RAND_PHILOX, dst, (key, ctr), RandPhiloxAttrs((1,), 40)), GPSIMD, TRN2)
