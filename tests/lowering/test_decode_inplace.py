"""A static KV cache's one-row update (``index_copy_`` -> ``index_put`` into a graph input
returned as an output) written into the input's own buffer (``lowering/passes/inplace.py``): no
whole-cache copy, the scatter updates the input in place, the program returns that buffer, and
the values equal eager's exactly. Where the input is read again after the update (or returned
itself) the copy stays, and the values still match."""
from __future__ import annotations

import pytest
import torch

from lowering_helpers import lower_and_run
from runtime_sim import Op

G = torch.Generator().manual_seed(3)


def _cache(h=12, s=300, d=64, dtype=torch.bfloat16):
    return torch.randn(1, h, s, d, generator=G).to(dtype)


def _ops(program, op):
    return sum(1 for q in program.streams.values() for ins in q if ins.op is op)


def _copies(kir: str) -> list[str]:
    """The whole-tensor copy kernels of an input (``out = cast(in0)`` of an input buffer)."""
    return [ln for ln in kir.splitlines() if "= pointwise[cast(in0)" in ln and "](%in" in ln]


def _update(cache, pos, row):
    return torch.ops.aten.index_put.default(cache, [None, None, pos], row)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("s,pos", [(300, 299), (129, 0), (128, 127)])
def test_cache_update_in_place_matches_eager(dtype, s, pos):
    cache, row = _cache(s=s, dtype=dtype), _cache(s=1, dtype=dtype)
    p = torch.tensor([pos])
    low = lower_and_run(lambda c, p, r: _update(c, p, r), cache, p, row, mutated=(0,))
    ref = _update(cache, p, row)
    assert torch.equal(low.outputs[0], ref)
    cg = low.compiled
    assert cg.outputs[0].buffer == cg.program.inputs[0]          # the input's own buffer
    assert cg.program.inputs[0] in cg.program.outputs
    assert _ops(cg.program, Op.DMA_SCATTER) == 1
    assert "written in place" in low.dumps["ir_post_fusion.txt"]
    assert not _copies(low.dumps["ir_post_fusion.txt"])
    # the cache is not moved whole: far fewer HBM bytes than one copy (read + write)
    assert low.result.stats.hbm_bytes < cache.numel() * cache.element_size()


def test_cache_update_then_attention_reads_it():
    """Two caches updated and read by a decode attention, as GPT-2's static cache is."""
    k, v = _cache(s=257), _cache(s=257)
    q, kr, vr = _cache(s=1), _cache(s=1), _cache(s=1)
    p = torch.tensor([200])

    def fn(q, k, v, kr, vr, p):
        k2, v2 = _update(k, p, kr), _update(v, p, vr)
        a = torch.nn.functional.scaled_dot_product_attention(q, k2[:, :, :201], v2[:, :, :201])
        return a, k2, v2
    low = lower_and_run(fn, q, k, v, kr, vr, p, mutated=(1, 2))
    ref = fn(q, k, v, kr, vr, p)
    assert torch.equal(low.outputs[1], ref[1]) and torch.equal(low.outputs[2], ref[2])
    err = (low.outputs[0].float() - ref[0].float()).abs().max().item()
    assert err < 2e-2, err
    assert low.dumps["ir_post_fusion.txt"].count("written in place") == 1
    assert low.dumps["ir_post_fusion.txt"].split("# outputs written in place")[1].count("<-") == 2


@pytest.mark.parametrize("case", ["read_after", "returned"])
def test_copy_kept_when_the_input_is_read_again(case):
    cache, row = _cache(s=130), _cache(s=1)
    p = torch.tensor([5])
    if case == "read_after":
        fn = lambda c, p, r: (_update(c, p, r), c * 2)         # the old cache is read after
    else:
        fn = lambda c, p, r: (_update(c, p, r), c)             # the old cache is returned
    low = lower_and_run(fn, cache, p, row, mutated=(0,))
    ref = fn(cache, p, row)
    assert torch.equal(low.outputs[0], ref[0]) and torch.equal(low.outputs[1], ref[1])
    assert "written in place" not in low.dumps["ir_post_fusion.txt"]
    assert len(_copies(low.dumps["ir_post_fusion.txt"])) == 1


def test_copy_kept_when_the_input_is_not_mutated():
    """An out-of-place index_put of an input the caller keeps (not an input mutation) keeps its
    copy: on the hardware the update must not write over the caller's tensor."""
    cache, row = _cache(s=130), _cache(s=1)
    p = torch.tensor([5])
    low = lower_and_run(lambda c, p, r: _update(c, p, r), cache, p, row)
    assert torch.equal(low.outputs[0], _update(cache, p, row))
    assert "written in place" not in low.dumps["ir_post_fusion.txt"]
    assert len(_copies(low.dumps["ir_post_fusion.txt"])) == 1


@pytest.mark.parametrize("in_place", [True, False])
def test_compiled_index_copy_updates_in_place_only_when_it_mutates(tmp_path, in_place):
    """Through torch.compile: ``cache.index_copy_`` (an input mutation, AOTAutograd's metadata)
    is written into the cache's buffer; ``cache.index_copy`` (out of place, the caller keeps
    ``cache``) keeps the copy. Values equal eager's both ways, the caller's tensor as eager leaves it."""
    import neuron_compiler

    def f(c, p, r):
        return c.index_copy_(2, p, r) if in_place else c.index_copy(2, p, r)

    cache, row, p = _cache(s=130, dtype=torch.float32), _cache(s=1, dtype=torch.float32), torch.tensor([7])
    ref_cache = cache.clone()
    ref = f(ref_cache, p, row)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="neuron", options={"target": "trn2", "dump_dir": str(tmp_path)})
    with neuron_compiler.profile() as prof:
        out = cf(cache, p, row)
    assert prof.to_dict()["fallback_nodes"] == 0
    assert torch.equal(out, ref) and torch.equal(cache, ref_cache)
    post = "".join(q.read_text() for q in tmp_path.rglob("ir_post_fusion.txt"))
    assert ("written in place" in post) == in_place, post
