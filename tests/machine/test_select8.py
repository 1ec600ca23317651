"""The VectorE selection instructions ``max8``, ``nc_find_index8`` and ``nc_match_replace8``:
semantics against a numpy reference written independently (a per-partition Python loop, not the
simulator's vectorised code), their cost rule with the exact expected nanoseconds, and their
operand checks (each check raises naming the instruction's rule and the actual value)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from progs import B, out
from test_semantics import run_compute
from runtime_sim import (GPSIMD, TRN2, VECTOR, Buffer, DType, EngineError, Instr, Memory, Op,
                         OperandError, SemAttrs, instr_cost, tile_ap)
from runtime_sim.isa import FindIndex8Attrs, MatchReplace8Attrs, Max8Attrs
from runtime_sim.checks import check_instr_shape

F32, BF16, I32 = DType.FP32, DType.BF16, DType.INT32
RNG = np.random.default_rng(7)


def _run(op, attrs, srcs, dst):
    return run_compute(VECTOR, op, attrs, srcs, dst), None


def _key(v):
    """torch's order: NaN above everything."""
    return (1, 0.0) if np.isnan(v) else (0, float(v))


def _ref_max8(x):
    return np.array([[v for v in sorted(row, key=_key, reverse=True)[:8]] for row in x], np.float32)


def _ref_find(data, vals):
    out = np.full(vals.shape, -1, np.int64)
    for p in range(data.shape[0]):
        used: set[int] = set()
        for j, v in enumerate(vals[p]):
            for i, d in enumerate(data[p]):
                if i not in used and (d == v or (np.isnan(d) and np.isnan(v))):
                    out[p, j] = i
                    used.add(i)
                    break
    return out


def test_max8_descending_with_nan_first_and_duplicates():
    x = RNG.standard_normal((5, 37)).astype(np.float32)
    x[1, 3] = np.nan
    x[2] = np.minimum(x[2], 1.0)
    x[2, :10] = 1.5                       # duplicates of the maximum
    x[3, 5] = np.inf
    x[3, 6] = -np.inf
    x[4, :] = -np.inf
    x[4, 9] = np.nan
    y, _ = _run(Op.MAX8, Max8Attrs(), [(x, F32)], (5, 8, F32))
    np.testing.assert_array_equal(y, _ref_max8(x))
    assert np.isnan(y[1, 0]) and not np.isnan(y[1, 1:]).any()
    np.testing.assert_array_equal(y[2], np.full(8, 1.5, np.float32))


def test_max8_bf16_source_and_destination():
    x = RNG.standard_normal((3, 300)).astype(np.float32)
    xb = x.astype(ml_dtypes.bfloat16)
    y, _ = _run(Op.MAX8, Max8Attrs(), [(xb.astype(np.float32), BF16)], (3, 8, BF16))
    np.testing.assert_array_equal(y.astype(np.float32), _ref_max8(xb.astype(np.float32)))


def test_find_index8_first_match_duplicates_ascending_and_sentinel():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 5]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    y, _ = _run(Op.FIND_INDEX8, FindIndex8Attrs(), [(data, F32), (vals, F32)], (1, 8, I32))
    np.testing.assert_array_equal(y, [[2, 4, 5, 6, 7, 8, 9, 10]])
    vals2 = np.array([[5, 7, 1, 1, np.nan, 4, 2, 2]], np.float32)   # 7, the second 1/2 and NaN miss
    y2, _ = _run(Op.FIND_INDEX8, FindIndex8Attrs(), [(data, F32), (vals2, F32)], (1, 8, I32))
    np.testing.assert_array_equal(y2, [[11, -1, 0, -1, -1, 3, 1, -1]])


def test_find_index8_random_against_reference_with_nan():
    data = np.round(RNG.standard_normal((6, 40)) * 2).astype(np.float32)   # many ties
    data[0, 7] = data[0, 30] = np.nan
    vals = np.stack([data[p, RNG.choice(40, 8)] for p in range(6)])
    vals[0, 0] = np.nan
    vals[0, 1] = np.nan
    y, _ = _run(Op.FIND_INDEX8, FindIndex8Attrs(), [(data, F32), (vals, F32)], (6, 8, I32))
    np.testing.assert_array_equal(y, _ref_find(data, vals))
    assert y[0, 0] == 7 and y[0, 1] == 30


def test_match_replace8_replaces_the_matched_positions():
    data = np.round(RNG.standard_normal((4, 50)) * 2).astype(np.float32)
    data[1, 4] = np.nan
    vals = np.stack([data[p, RNG.choice(50, 8)] for p in range(4)])
    vals[1, 2] = np.nan
    vals[2, 0] = 99.0                                    # no match: replaces nothing
    y, _ = _run(Op.MATCH_REPLACE8, MatchReplace8Attrs(-np.inf), [(data, F32), (vals, F32)], (4, 50, F32))
    ref = data.copy()
    idx = _ref_find(data, vals)
    for p in range(4):
        for i in idx[p]:
            if i >= 0:
                ref[p, i] = -np.inf
    np.testing.assert_array_equal(y, ref)
    assert (y == -np.inf).sum() == (idx >= 0).sum()


def test_topk_by_max8_find_replace_rounds_is_a_stable_sort():
    """The instruction sequence the sort lowering uses, on raw ISA: 3 rounds of (max8,
    find_index8, match_replace8) give the 24 largest values and their positions, ties in index
    order."""
    x = np.round(RNG.standard_normal((2, 64)) * 3).astype(np.float32)
    b = B()
    t, s = b.load("x", x, F32)
    vb, ib = b.sbuf("v", 24 * 4), b.sbuf("i", 24 * 4)
    waits = ((s, 1),)
    for r in range(3):
        vr = tile_ap(vb, F32, 2, 8, elem_offset=8 * r)
        ir = tile_ap(ib, I32, 2, 8, elem_offset=8 * r)
        b.add(VECTOR, Instr(Op.MAX8, vr, (t,), Max8Attrs(), waits=waits))
        b.add(VECTOR, Instr(Op.FIND_INDEX8, ir, (t, vr), FindIndex8Attrs()))
        b.add(VECTOR, Instr(Op.MATCH_REPLACE8, t, (t, vr), MatchReplace8Attrs(-np.inf)))
        waits = ()
    done = b.sem()
    b.add(VECTOR, Instr(Op.SEM, None, (), SemAttrs(), signals=(done,)))
    b.store("v", tile_ap(vb, F32, 2, 24), ((done, 1),))
    b.store("i", tile_ap(ib, I32, 2, 24), ((done, 1),))
    res = b.run()
    got_v, got_i = out(res, "v", F32, (2, 24)), out(res, "i", I32, (2, 24))
    order = np.argsort(-x, axis=1, kind="stable")[:, :24]
    np.testing.assert_array_equal(got_i, order)
    np.testing.assert_array_equal(got_v, np.take_along_axis(x, order, 1))


SB = Buffer("sb", Memory.SBUF, 128, 96 * 1024, 0)
SB2 = Buffer("sb2", Memory.SBUF, 128, 1024, 96 * 1024)


@pytest.mark.parametrize("op,attrs", [(Op.MAX8, Max8Attrs()), (Op.FIND_INDEX8, FindIndex8Attrs()),
                                      (Op.MATCH_REPLACE8, MatchReplace8Attrs())])
@pytest.mark.parametrize("n", [8, 40, 1000, 16384])
def test_select8_cost_is_n_cycles_floored_at_min_ii(op, attrs, n):
    data = tile_ap(SB, F32, 128, n)
    vals = tile_ap(SB2, F32, 128, 8)
    srcs = (data,) if op is Op.MAX8 else (data, vals)
    dst = (tile_ap(SB2, I32 if op is Op.FIND_INDEX8 else F32, 128, 8, elem_offset=16)
           if op is not Op.MATCH_REPLACE8 else data)
    c = instr_cost(Instr(op, dst, srcs, attrs), VECTOR, TRN2)
    cycles = max(TRN2.min_ii_cycles, n)
    assert c.busy_ns == pytest.approx(cycles / TRN2.vector_clock_ghz)
    assert c.work_ns == pytest.approx(n / TRN2.vector_clock_ghz)


def test_select8_operand_checks_name_the_rule_and_value():
    data = tile_ap(SB, F32, 128, 16385)
    with pytest.raises(OperandError, match="8 to 16384 elements per partition, got 16385"):
        check_instr_shape(Instr(Op.MAX8, tile_ap(SB2, F32, 128, 8), (data,), Max8Attrs()), VECTOR, TRN2)
    with pytest.raises(OperandError, match="8 to 16384 elements per partition, got 7"):
        check_instr_shape(Instr(Op.MAX8, tile_ap(SB2, F32, 128, 8), (tile_ap(SB, F32, 128, 7),),
                                Max8Attrs()), VECTOR, TRN2)
    with pytest.raises(OperandError, match=r"max8 dst: expected \[128, 8\], got \[128, 16\]"):
        check_instr_shape(Instr(Op.MAX8, tile_ap(SB2, F32, 128, 16), (tile_ap(SB, F32, 128, 64),),
                                Max8Attrs()), VECTOR, TRN2)
    with pytest.raises(OperandError, match="writes int32 positions, got dst dtype float32"):
        check_instr_shape(Instr(Op.FIND_INDEX8, tile_ap(SB2, F32, 128, 8),
                                (tile_ap(SB, F32, 128, 64), tile_ap(SB2, F32, 128, 8, elem_offset=8)),
                                FindIndex8Attrs()), VECTOR, TRN2)
    with pytest.raises(OperandError, match="vals: expected"):
        check_instr_shape(Instr(Op.MATCH_REPLACE8, tile_ap(SB, F32, 128, 64),
                                (tile_ap(SB, F32, 128, 64), tile_ap(SB2, F32, 128, 4)),
                                MatchReplace8Attrs()), VECTOR, TRN2)
    with pytest.raises(EngineError, match="cannot run on pool"):
        check_instr_shape(Instr(Op.MAX8, tile_ap(SB2, F32, 128, 8), (tile_ap(SB, F32, 128, 64),),
                                Max8Attrs()), GPSIMD, TRN2)
