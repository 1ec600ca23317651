"""A decode block whose query row comes from the QKV projection and whose output row feeds the
next matmul, both resident in SBUF (tiling/attention/decode.py): the query reaches [128, pairs]
by TensorE transposes (``_q_rows``, no SBUF -> SBUF DMA) and the output is assembled into the
resident row by one transpose per head pair (``_resident_row``, no store DMA). Against eager
through the simulator, with the static cache's mask and its one-row update (the positions
crossing 128-key chunks and 512-key banks), on each cache ordering of
``passes/decode_cache.py`` (``ENABLED``: False, "values", True); a wrong result fails."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run
from runtime_sim import Op

H, D, S = 12, 64, 1024
E = H * D


def _update(cache, pos, row):
    return torch.ops.aten.index_put.default(cache, [None, None, pos], row)


def _block(x, w, wo, kc, vc, p):
    """GPT-2's attention block for one token: QKV projection, the rows into the cache, the
    masked attention over the cache, the output projection."""
    q, k, v = (x @ w).split(E, dim=-1)
    q, k, v = (t.view(1, 1, H, D).transpose(1, 2) for t in (q, k, v))
    k2, v2 = _update(kc, p, k), _update(vc, p, v)
    mask = (torch.arange(S) <= p).view(1, 1, 1, -1)
    o = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)
    return o.transpose(1, 2).reshape(1, E) @ wo, k2, v2


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, sc=1.0: (torch.randn(*s, generator=g) * sc).to(torch.bfloat16)  # noqa: E731
    return (r(1, E), r(E, 3 * E, sc=0.05), r(E, E, sc=0.05), r(1, H, S, D), r(1, H, S, D))


def _ops(program, op, dst_buf):
    return sum(1 for qu in program.streams.values() for ins in qu
               if ins.op is op and ins.dst is not None and dst_buf in ins.dst.buffer)


@pytest.mark.parametrize("enabled", [False, "values", True])
@pytest.mark.parametrize("pos,target", [(0, "trn3"), (511, "trn2"), (700, "trn3")])
def test_query_and_output_rows_by_transposes(monkeypatch, enabled, pos, target):
    import lowering.passes.decode_cache as dc
    monkeypatch.setattr(dc, "ENABLED", enabled)
    x, w, wo, kc, vc = _inputs(pos)
    p = torch.tensor([pos])
    low = lower_and_run(_block, x, w, wo, kc, vc, p, target=target, mutated=(3, 4))
    ref = _block(x, w, wo, kc, vc, p)
    tir = low.dumps["tir.txt"]
    assert any("heads of one query each" in ln for ln in tir.splitlines())
    prog = low.compiled.program
    # the query's pairs transposed into PSUM, the output's pairs into one PSUM row
    assert _ops(prog, Op.TRANSPOSE, "dqT") == H // 2, tir[:3000]
    assert _ops(prog, Op.TRANSPOSE, "dwrow") == H // 2
    assert _ops(prog, Op.DMA_COPY, ".dq") == 0          # no SBUF -> SBUF DMA of q
    post = low.dumps["ir_post_fusion.txt"]
    assert ("decode attention before its cache update" in post) == bool(enabled)
    assert_close(low.outputs[0], ref[0], scale=2.0)
    assert torch.equal(low.outputs[1], ref[1]) and torch.equal(low.outputs[2], ref[2])
    # the tolerance can fail: two heads' outputs swapped (a wrong pair column), the last pair
    # dropped, the stale value row at the position (the only visible key at position 0)
    q = (x @ w)[:, :E].view(1, 1, H, D).transpose(1, 2)
    mask = (torch.arange(S) <= pos).view(1, 1, 1, -1)
    sw = F.scaled_dot_product_attention(q, ref[1], ref[2], attn_mask=mask)
    sw[:, [0, 1]] = sw[:, [1, 0]]
    drop = F.scaled_dot_product_attention(q, ref[1], ref[2], attn_mask=mask)
    drop[:, -2:] = 0
    stale = F.scaled_dot_product_attention(q, ref[1], vc, attn_mask=mask)
    for o in (sw, drop) + ((stale,) if pos == 0 else ()):
        with pytest.raises(AssertionError):
            assert_close(o.transpose(1, 2).reshape(1, E) @ wo, ref[0], scale=2.0)
