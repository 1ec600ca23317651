"""P^T by DMA transposes on the two-phase attention path (tiling/attention/rows.py), trn2: a
unit of four full key blocks takes its first two banks' P^T by SBUF -> SBUF DMA transposes
(``attention.plan.dma_transposes``), and its second products run in the order the P^T lands
(the first DMA bank, the TensorE banks, the second DMA bank): the accumulation group starts at
the first product issued, whichever bank that is. A DMA bank's exp runs per 128 keys, each
piece's transfer behind it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run


def test_two_banks_by_dma_transposes_and_second_products_in_landing_order():
    g = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(1, 2, n, 128, generator=g).to(torch.bfloat16) for n in (384, 2048, 2048))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    low = lower_and_run(fn, q, k, v, target="trn2")
    notes = [ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ")]
    assert any("also the next bank's" in n for n in notes), notes
    assert "transpose=True" in low.dumps["program.txt"]
    assert_close(low.outputs[0], fn(q, k, v))
