"""Causal attention on the two-phase path (``lowering/tiling/attention/rows.py``): short causal
rows go through the pipeline in units of query blocks that share a parity's score banks; a
unit whose first bank is a full key block takes its P^T by DMA transposes on trn2; the
diagonal masks are [128, 128] windows; when the cost model says so (always on a target without
VectorE's exponential) the row sums come from the second product (V with a column of ones).

Shapes cross the tile edges: partial last query blocks (600, 700, 1100 rows), partial key
blocks, causal offsets (more keys than queries) whose diagonal starts inside a key block
(the window's offset beyond 1), head widths 64 / 128. Every test compares with eager through
the simulator and checks that a wrong row fails the same tolerance.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _bottom_right(q, k, v):
    """The causal mask aligned to the last key (a decoder's chunk after a cache): query i sees
    keys up to i + Sk - S (the kernel's causal offset)."""
    S, Sk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) * D ** -0.5
    keep = torch.ones(S, Sk, dtype=torch.bool).tril(diagonal=Sk - S)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def _run(shape, target: str, causal: bool = True):
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S * 3 + Sk + D)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(torch.bfloat16) for n in (S, Sk, Sk))
    fn = (_causal if S == Sk else _bottom_right) if causal else F.scaled_dot_product_attention
    low = lower_and_run(fn, q, k, v, target=target)
    kernels = [ln.split("= ", 1)[1].split("[", 1)[0] for ln in low.dumps["ir_post_fusion.txt"].splitlines()
               if " = " in ln]
    assert kernels == ["attention"], kernels
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    return low, notes, ref, v


def _fails_on_a_wrong_row(low, ref, v, row: int) -> None:
    """The tolerance can fail: row ``row`` replaced by the first key's value."""
    bad = low.outputs[0].clone()
    bad[..., row, :] = v[..., 0, :]
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


UNITS = [((1, 2, 1100, 1100, 64), 3), ((2, 1, 600, 700, 64), 2), ((1, 1, 2048, 2048, 128), 4)]


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("shape,rows", UNITS, ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
def test_short_causal_rows_share_the_score_banks_in_units_and_match_eager(shape, rows, target):
    """Consecutive short causal rows are one pipeline step (a unit), each with its own
    statistics, as many as one parity's banks hold: three one-block rows of a 1100-key head
    (three banks), two rows of 600 queries on 700 keys (the mask aligned to the last key: the
    fourth block's diagonal starts 28 keys into the second key block, a mask window of its
    own), four rows of a 2048-key head."""
    low, notes, ref, v = _run(shape, target)
    assert any(f"units of up to {rows} query blocks" in n for n in notes), notes
    assert "causal=True" in low.dumps["ir_post_fusion.txt"]
    _fails_on_a_wrong_row(low, ref, v, 130)     # a row of the first unit's second query block


def test_dma_transposes_skip_a_first_bank_narrower_than_a_key_block_on_trn2():
    """On trn2 a unit whose first bank is a full key block takes that bank's P^T by SBUF ->
    SBUF DMA transposes; the first unit (four short rows, its first bank 128 keys wide) keeps
    TensorE's: fewer units than all take DMA transposes, and the values match eager."""
    low, notes, ref, v = _run((1, 1, 2048, 2048, 128), "trn2")
    dma = [n for n in notes if "take their first bank's P^T by DMA transposes" in n]
    assert dma, notes
    took, of = (int(x) for x in dma[0].split("attention: ", 1)[1].split(" units", 1)[0].split(" of "))
    assert 0 < took < of, dma
    assert "transpose=True" in low.dumps["program.txt"]
    _fails_on_a_wrong_row(low, ref, v, 1500)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_row_sums_come_from_the_second_product_when_the_plan_says_so(causal):
    """With the plan's ``ones`` (``attention.plan.exp_plan``, priced by the cost model) V
    carries a column of ones: the exps sum nothing and the store divides by the output's last
    column; without it ScalarE's exps sum (VectorE's exponential sums for free). trn2 (no
    VectorE exponential) takes the ones column; trn3 keeps the exps' sums at 1100 keys (three
    key blocks, one exp on VectorE) and takes the ones column at 2048 (four, exps split two
    and two). Values match eager on every case, over a partial last key block."""
    from lowering.tiling.attention.plan import exp_plan
    from lowering.tiling.attention.steps import KB
    from runtime_sim.isa import DType
    from runtime_sim.targets import TARGETS
    shape = (1, 2, 1100, 1100, 64) if causal else (1, 2, 384, 1100, 64)
    cases = [("trn2", shape, False), ("trn3", shape, True)]
    if not causal:
        cases.append(("trn3", (1, 1, 200, 2048, 64), False))
    for target, shp, sums in cases:
        seen = min(shp[2], shp[3]) if causal else shp[3]
        kbs = tuple((i * KB, min(KB, seen - i * KB)) for i in range(-(-seen // KB)))
        plan = exp_plan(TARGETS[target], kbs, 64, 64, DType.BF16, DType.BF16)
        assert plan[2] == (not sums), (target, shp, plan)
        low, _, ref, v = _run(shp, target, causal)
        program = low.dumps["program.txt"]
        exps = [ln for ln in program.splitlines() if "activation(func=exp" in ln]
        assert exps, target
        assert any("reduce=add" in ln for ln in exps) == sums, (target, exps[:2])
        assert ("memset(value=1.0)" in program) == (not sums), target
        _fails_on_a_wrong_row(low, ref, v, 150)
