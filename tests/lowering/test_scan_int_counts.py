"""cumsum of a bool mask cast to an integer type first (RoBERTa's position ids:
``(ids != pad).int().cumsum(1).type_as(mask) * mask + pad``) runs on the device, exact in fp32
below 2**24 elements; an integer input whose values are not known to be 0 or 1 still falls back
with its reason. Checked against eager, shapes crossing partition and chunk edges."""
from __future__ import annotations

import pytest
import torch

from lowering_helpers import check, lower_and_run, trace, unsupported_nodes


PAD = 1


def _roberta_positions(ids):
    mask = ids.ne(PAD).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + PAD


@pytest.mark.parametrize("shape", [(2, 24), (130, 700), (1, 3000)])
def test_position_ids_from_an_int32_mask_run_on_the_device(shape):
    g = torch.Generator().manual_seed(sum(shape))
    ids = torch.randint(0, 4, shape, generator=g)
    low = check(_roberta_positions, ids)
    out = low.outputs[0]
    assert torch.equal(out, _roberta_positions(ids))
    wrong = _roberta_positions(torch.where(ids == 1, 2, ids))      # padding ignored
    assert not torch.equal(out, wrong)


@pytest.mark.parametrize("cast", [torch.int64, torch.int32])
def test_a_cast_bool_mask_counts_exactly(cast):
    g = torch.Generator().manual_seed(3)
    m = torch.rand(5, 1000, generator=g) > 0.3
    fn = lambda m: torch.cumsum(m.to(cast).transpose(0, 1), dim=0)  # noqa: E731
    low = lower_and_run(fn, m)
    assert torch.equal(low.outputs[0], fn(m))


def test_integers_not_known_to_be_0_or_1_fall_back_with_the_reason():
    x = torch.randint(-5, 5, (4, 16), dtype=torch.int32)
    bad = unsupported_nodes(trace(lambda x: torch.cumsum(x, 1), x))
    assert bad and "not known to be 0 or 1" in bad[0]
