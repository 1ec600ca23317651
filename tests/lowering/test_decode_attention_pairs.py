"""Decode attention with heads of 64 features: the two heads of a partition slot (partitions
0-63 and 64-127) share each score product (tiling/attention/decode.py, ``paired``); an odd
head count leaves the last slot's upper half unwritten, and its product reads the lower half
only. Matches eager over 128-key chunk and 512-key bank edges; a wrong result fails."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run
from runtime_sim import Op

CASES = [(5, 300, torch.bfloat16, "trn2"), (7, 1024, torch.float32, "trn3"),
         (12, 513, torch.bfloat16, "trn3"), (3, 129, torch.bfloat16, "trn2")]


def _score_products(program, H: int, Sk: int) -> int:
    """Matmuls writing H score rows (the products' outputs have H partitions)."""
    return sum(1 for q in program.streams.values() for ins in q
               if ins.op is Op.MATMUL and ins.dst.partitions == H)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}".replace("torch.", ""))
def test_paired_heads_match_eager(case):
    H, Sk, dtype, target = case
    g = torch.Generator().manual_seed(H * Sk)
    q = torch.randn(1, H, 1, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, H, Sk, 64, generator=g).to(dtype) for _ in range(2))
    fn = F.scaled_dot_product_attention
    low = lower_and_run(fn, q, k, v, target=target)
    assert any("heads of one query each" in ln for ln in low.dumps["tir.txt"].splitlines())
    ref = fn(q, k, v)
    assert_close(low.outputs[0], ref)
    # one product per slot of two heads and score bank of 512 keys
    assert _score_products(low.compiled.program, H, Sk) == -(-H // 2) * -(-Sk // 512)
    bad = low.outputs[0].clone()         # the tolerance can fail: the lone last head dropped
    bad[:, H - 1] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)
