"""A decode attention reads the KV cache before its one-row update (``passes/decode_cache.py``)
and puts the new key and value rows in by value at the runtime position
(``tiling/attention/decode.py``, ``new_kv``). Against eager through the simulator: positions at
0, 127, 128 and the last key (128-key chunks and 512-key score banks crossed), caches whose stale
row at the position differs from the new one (a wrong position, a stale row read or a dropped new
row fails), the mask of GPT-2's static cache (keys after the position hidden by value), and the
updated caches equal eager's exactly. The pass is on by default (``decode_cache.ENABLED``); these
tests set it explicitly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run
from runtime_sim import Op

NOTE = "decode attention before its cache update"


@pytest.fixture(autouse=True)
def _enabled(monkeypatch):
    import lowering.passes.decode_cache as dc
    monkeypatch.setattr(dc, "ENABLED", True)


def _update(cache, pos, row):
    return torch.ops.aten.index_put.default(cache, [None, None, pos], row)


def _step(q, k, v, kr, vr, p):
    """GPT-2's decode step over a static cache: write the rows, attend with keys <= p visible."""
    k2, v2 = _update(k, p, kr), _update(v, p, vr)
    mask = (torch.arange(k.shape[-2]) <= p).view(1, 1, 1, -1)      # bool, as transformers'
    return F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask), k2, v2


def _inputs(h, s, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: (torch.randn(1, h, n, d, generator=g) * 2).to(dtype)   # noqa: E731
    return r(1), r(s), r(s), r(1), r(1)


def _run(h, s, d, pos, dtype=torch.bfloat16, target="trn2", fn=_step, seed=0, aligned=False):
    q, k, v, kr, vr = _inputs(h, s, d, dtype, seed + pos)
    if aligned:         # the new key near the query: its row carries a large share of the output
        kr = q.clone()
    p = torch.tensor([pos])
    low = lower_and_run(fn, q, k, v, kr, vr, p, target=target, mutated=(1, 2))
    return low, fn(q, k, v, kr, vr, p), (q, k, v, kr, vr, p)


def _ops(program, op):
    return sum(1 for qu in program.streams.values() for ins in qu if ins.op is op)


@pytest.mark.parametrize("h,s,d,pos,dtype,target", [
    (12, 1024, 64, 0, torch.bfloat16, "trn2"),
    (12, 1024, 64, 127, torch.bfloat16, "trn2"),
    (12, 1024, 64, 128, torch.bfloat16, "trn3"),
    (12, 1024, 64, 1023, torch.bfloat16, "trn2"),
    (12, 1024, 64, 511, torch.bfloat16, "trn2"),
    (12, 1024, 64, 512, torch.bfloat16, "trn2"),
    (5, 300, 64, 299, torch.bfloat16, "trn2"),      # odd heads, a partial 128-key chunk
    (4, 129, 32, 128, torch.float32, "trn3"),       # half-width heads, fp32
    (3, 200, 128, 150, torch.bfloat16, "trn2"),     # one head per product
])
def test_new_rows_by_value_match_eager(h, s, d, pos, dtype, target):
    low, ref, _ = _run(h, s, d, pos, dtype, target)
    post = low.dumps["ir_post_fusion.txt"]
    assert NOTE in post, post[-2000:]
    assert "new_kv=" in post
    assert any("heads of one query each" in ln for ln in low.dumps["tir.txt"].splitlines()[:40])
    assert _ops(low.compiled.program, Op.DMA_SCATTER) == 2
    assert_close(low.outputs[0], ref[0])
    assert torch.equal(low.outputs[1], ref[1]) and torch.equal(low.outputs[2], ref[2])


@pytest.mark.parametrize("pos", [0, 128, 1023])
def test_a_wrong_row_fails_the_tolerance(pos):
    """The stale rows differ from the new ones: attending with the stale key or value row, or
    with the new rows at another position, is outside the tolerance."""
    low, ref, (q, k, v, kr, vr, p) = _run(12, 1024, 64, pos, aligned=True)
    assert_close(low.outputs[0], ref[0])
    mask = (torch.arange(1024) <= pos).view(1, 1, 1, -1)
    other = (pos + 1) % 1024
    wrong = [
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),                     # stale rows
        F.scaled_dot_product_attention(q, _update(k, p, kr), v, attn_mask=mask),     # stale value
        F.scaled_dot_product_attention(q, k, _update(v, p, vr), attn_mask=mask),     # stale key
        F.scaled_dot_product_attention(q, _update(k, torch.tensor([other]), kr),     # elsewhere
                                       _update(v, torch.tensor([other]), vr), attn_mask=mask),
    ]
    for i, w in enumerate(wrong):
        if (i, pos) in ((2, 0), (3, 1023)):   # one visible key: its score does not matter;
            continue                          # the dominant row moved to a visible key 0
        with pytest.raises(AssertionError):
            assert_close(w, ref[0])


def test_scatters_follow_the_attention_and_cache_loads_wait_for_nothing_computed():
    low, ref, _ = _run(12, 1024, 64, 700)
    kernels = [ln for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]
    at = next(i for i, ln in enumerate(kernels) if "= attention[" in ln)
    sc = [i for i, ln in enumerate(kernels) if "= scatter[" in ln]
    assert len(sc) == 2 and min(sc) > at
    assert_close(low.outputs[0], ref[0])


def test_cache_read_again_between_update_and_attention_keeps_the_order():
    """A kernel reading the updated cache before the attention: no rewrite, still eager's values."""
    def fn(q, k, v, kr, vr, p):
        k2, v2 = _update(k, p, kr), _update(v, p, vr)
        s = k2.float().sum()
        return F.scaled_dot_product_attention(q, k2, v2), k2, v2, s
    low, ref, _ = _run(4, 256, 64, 100, fn=fn)
    assert NOTE not in low.dumps["ir_post_fusion.txt"]
    assert_close(low.outputs[0], ref[0])
    assert torch.equal(low.outputs[1], ref[1])


def test_off_by_default(monkeypatch):
    import lowering.passes.decode_cache as dc
    monkeypatch.setattr(dc, "ENABLED", False)
    low, ref, _ = _run(4, 256, 64, 100)
    assert NOTE not in low.dumps["ir_post_fusion.txt"]
    assert_close(low.outputs[0], ref[0])
