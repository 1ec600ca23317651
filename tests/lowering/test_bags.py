"""``F.embedding_bag`` (``_embedding_bag_forward_only`` / ``_embedding_bag``) through
``torch.compile``: sum, mean and max bags (empty bags included), padding_idx,
include_last_offset, per_sample_weights and 2-d inputs, fp32 and bf16, over rows that cross the
512-element edge and lookups that cross 128 partitions; the fallback reason when the auxiliary
outputs are needed (training); a known-wrong result for the tolerance.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import rand
from neuron_compiler.testing import assert_close, assert_matches_eager

OFFSETS = torch.tensor([0, 4, 4, 60, 129, 200, 299])     # bag 1 empty, the last one of 1 lookup


def _idx(n=300, v=130, seed=0):
    return torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("pad", [None, 3])
def test_embedding_bag(dtype, mode, pad):
    w = rand(130, 513 if mode != "max" else 65, dtype=dtype, seed=1)
    d = assert_matches_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=pad),
                             w, _idx(), OFFSETS)
    assert d["fallback_nodes"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_bag_variants(dtype):
    w = rand(130, 65, dtype=dtype, seed=2)
    last = torch.cat([OFFSETS, torch.tensor([300])])
    assert_matches_eager(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", include_last_offset=True),
                         w, _idx(), last)
    assert_matches_eager(lambda w, i, o, p: F.embedding_bag(i, w, o, per_sample_weights=p, mode="sum"),
                         w, _idx(), OFFSETS, rand(300, dtype=dtype, seed=3))
    assert_matches_eager(lambda w, i: F.embedding_bag(i, w, mode="max"), w, _idx().view(30, 10))


def test_training_falls_back_with_a_reason():
    w = torch.nn.Parameter(rand(130, 65, seed=4))
    d = assert_matches_eager(lambda i, o: F.embedding_bag(i, w, o, mode="sum").sum(), _idx(), OFFSETS,
                             min_device_fraction=0.0)
    assert any("auxiliary outputs" in f["reason"] for f in d["fallbacks"]), d["fallbacks"]


def test_tolerances_can_fail():
    w = rand(130, 513, seed=5)
    want = F.embedding_bag(_idx(), w, OFFSETS, mode="mean")
    dropped = F.embedding_bag(_idx()[:-1], w, OFFSETS, mode="mean")   # the last lookup lost
    for wrong in (want * 0.5, dropped):
        with pytest.raises(AssertionError):
            assert_close(wrong, want)
