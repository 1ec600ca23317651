"""NKI's bn_stats / bn_aggr layout (isa.BnStatsNkiAttrs / BnAggrNkiAttrs; nki.isa.bn_stats: six
values per partition, (count, mean, variance * count) of the even then the odd elements):
values, the operand rules and the cost (hardware.md: bn_stats N, bn_aggr 13N/3 cycles)."""
from __future__ import annotations

import numpy as np
import pytest

from progs import B, out
from runtime_sim import VECTOR, DType, Instr, Op, TRN2, ap, instr_cost, tile_ap
from runtime_sim.checks import OperandError, check_instr_shape
from runtime_sim.isa import BnAggrNkiAttrs, BnStatsAttrs, BnStatsNkiAttrs

F32 = DType.FP32
RNG = np.random.default_rng(1)


def _stats_program(x: np.ndarray, pieces: list[int]):
    """bn_stats of consecutive column pieces of ``x`` side by side, then one bn_aggr."""
    p = x.shape[0]
    b = B()
    _, s = b.load("x", x, F32)
    xb = b.buffers[-1]
    st = b.sbuf("st", 6 * 4 * len(pieces))
    sems, col = [], 0
    for k, n in enumerate(pieces):
        sk = b.sem()
        sems.append((sk, 1))
        b.add(VECTOR, Instr(Op.BN_STATS, ap(st, F32, [(1, 6)], partitions=p, byte_offset=24 * k),
                            (ap(xb, F32, [(1, n)], partitions=p, byte_offset=4 * col),), BnStatsNkiAttrs(),
                            waits=((s, 1),), signals=(sk,)))
        col += n
    ag = tile_ap(b.sbuf("ag", 8), F32, p, 2)
    done = b.sem()
    b.add(VECTOR, Instr(Op.BN_AGGR, ag, (tile_ap(st, F32, p, 6 * len(pieces)),), BnAggrNkiAttrs(),
                        waits=tuple(sems), signals=(done,)))
    b.store("st", tile_ap(st, F32, p, 6 * len(pieces)), ((done, 1),))
    b.store("ag", ag, ((done, 1),))
    res = b.run()
    return out(res, "st", F32, (p, 6 * len(pieces))), out(res, "ag", F32, (p, 2))


def test_six_values_even_then_odd_elements():
    x = RNG.standard_normal((8, 7)).astype(np.float32) * 3 + 2
    st, _ = _stats_program(x, [7])
    ev, od = x[:, 0::2].astype(np.float64), x[:, 1::2].astype(np.float64)
    np.testing.assert_array_equal(st[:, 0], 4)
    np.testing.assert_array_equal(st[:, 3], 3)
    np.testing.assert_allclose(st[:, 1], ev.mean(1), rtol=1e-6)
    np.testing.assert_allclose(st[:, 4], od.mean(1), rtol=1e-6)
    np.testing.assert_allclose(st[:, 2], ev.var(1) * 4, rtol=1e-5)
    np.testing.assert_allclose(st[:, 5], od.var(1) * 3, rtol=1e-5)


@pytest.mark.parametrize("pieces", [[512, 512], [512, 488], [1], [3, 500, 17]])
def test_aggregate_of_unequal_pieces_is_the_row_mean_and_variance(pieces):
    x = RNG.standard_normal((128, sum(pieces))).astype(np.float32) * 2 + 1
    _, ag = _stats_program(x, pieces)
    np.testing.assert_allclose(ag[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ag[:, 1], x.astype(np.float64).var(1), rtol=1e-4, atol=1e-7)
    # the older (mean, var)-pair reading of the same statistics is wrong for unequal pieces:
    if len(set(pieces)) > 1:
        assert not np.allclose(ag[:, 0], x[:, :pieces[0]].mean(1), rtol=1e-3)


def test_operand_rules_name_the_layout():
    sb = B().sbuf("t", 4096)
    x = tile_ap(sb, F32, 128, 512)
    with pytest.raises(OperandError, match=r"bn_stats dst: expected \[128, 6\], got \[128, 2\]"):
        check_instr_shape(Instr(Op.BN_STATS, tile_ap(sb, F32, 128, 2, elem_offset=600), (x,), BnStatsNkiAttrs()), VECTOR, TRN2)
    with pytest.raises(OperandError, match="multiple of 3, got 8"):
        check_instr_shape(Instr(Op.BN_AGGR, tile_ap(sb, F32, 128, 2, elem_offset=600), (tile_ap(sb, F32, 128, 8),),
                          BnAggrNkiAttrs()), VECTOR, TRN2)
    # the machine's own (mean, var) layout is unchanged
    check_instr_shape(Instr(Op.BN_STATS, tile_ap(sb, F32, 128, 2, elem_offset=600), (x,), BnStatsAttrs()), VECTOR, TRN2)


def test_costs_follow_the_documented_formulas():
    sb = B().sbuf("t", 8192)
    st = Instr(Op.BN_STATS, tile_ap(sb, F32, 128, 6, elem_offset=1024), (tile_ap(sb, F32, 128, 512),), BnStatsNkiAttrs())
    assert instr_cost(st, VECTOR, TRN2).busy_ns == pytest.approx(512 / 0.96)
    ag = Instr(Op.BN_AGGR, tile_ap(sb, F32, 128, 2, elem_offset=1024), (tile_ap(sb, F32, 128, 12),), BnAggrNkiAttrs())
    assert instr_cost(ag, VECTOR, TRN2).busy_ns == pytest.approx(64 / 0.96)       # MIN_II
    ag = Instr(Op.BN_AGGR, tile_ap(sb, F32, 128, 2, elem_offset=1024), (tile_ap(sb, F32, 128, 60),), BnAggrNkiAttrs())
    assert instr_cost(ag, VECTOR, TRN2).busy_ns == pytest.approx(260 / 0.96)
