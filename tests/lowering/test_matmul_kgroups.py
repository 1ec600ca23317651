"""K groups (lowering/tiling/matmul/kernel.py ``_kgroup``): a resident operand with short rows loads G
K tiles per DMA, partition p holding G consecutive rows, and the streamed operand's TensorE
transposes read the matching columns G apart. Checked against eager over M and N tile edges,
with the grouping visible in the dump, and not applied where K has a partial tile."""
from __future__ import annotations

import pytest
import torch

import lowering.tiling.matmul.kernel as mm
from lowering.tiling.matmul import plan as matmul_plan
from lowering_helpers import assert_close, check, rand


@pytest.fixture
def usual_form(monkeypatch):
    """The usual form only: with a partial m-tile (M = 130) the planner takes the transposed
    form (matmul/transposed.py, no K groups), whose products cost 130 columns per 128 n
    instead of two m-tiles' 512 per 512 n."""
    orig = matmul_plan.choose_blocking

    def choose(s, t):
        best, scored = orig(s, t)
        usual = [c for c in scored if not c.swap]
        return usual[0], usual
    monkeypatch.setattr(mm, "choose_blocking", choose)


@pytest.mark.parametrize("target,dtype,M,K,N,G", [
    ("trn1", torch.bfloat16, 200, 768, 1536, 2),  # 3 KiB rows: two per run
    ("trn1", torch.bfloat16, 200, 768, 768, 3),   # 1.5 KiB rows: three per run (4.5 KiB)
    ("trn1", torch.bfloat16, 130, 3072, 700, 3),  # partial m- and n-tiles, 24 K tiles
    ("trn1", torch.bfloat16, 100, 700, 768, 1),   # a partial K tile: no groups
])
def test_k_groups_match_eager(usual_form, target, dtype, M, K, N, G):
    """(On trn1 the streamed x^T comes from TensorE transposes and the planner keeps w
    resident for these shapes: the case the groups are for.)"""
    x, w = rand(M, K, dtype=dtype, seed=31), rand(K, N, dtype=dtype, seed=32, low=-0.1, high=0.1)
    low = check(lambda x, w: x @ w, x, w, target=target)
    notes = low.dumps["tir.txt"]
    assert (f"K in groups of {G} tiles" in notes) == (G > 1), notes.splitlines()[:3]
    if G > 1:   # the contraction pairs rows of w with the matching columns of x: a program
        # pairing them wrongly (rows of one group shifted) is caught
        perm = torch.arange(K).view(-1, 128, G).roll(1, dims=2).reshape(-1)
        with pytest.raises(AssertionError):
            assert_close(low.outputs[0], x @ w[perm])
