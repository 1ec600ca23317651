"""Prompt-length buckets (``neuron_compiler.bucket_prompt``): a left-padded, masked prompt gives
the unpadded prompt's tokens, and every prompt length of a bucket reuses one prefill compile."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import neuron_compiler
from neuron_compiler import bucket_prompt, prompt_buckets

transformers = pytest.importorskip("transformers")


def test_bucket_prompt_left_pads_and_masks():
    ids = torch.tensor([[5, 6, 7]])
    b = bucket_prompt(ids, buckets=(2, 4, 8), pad_token_id=9)
    assert (b.bucket, b.length, b.padding) == (4, 3, 1)
    assert b.input_ids.tolist() == [[9, 5, 6, 7]] and b.attention_mask.tolist() == [[0, 1, 1, 1]]
    ids2, mask2 = bucket_prompt(ids, torch.tensor([[0, 1, 1]]), buckets=[3])   # exact fit, caller's mask kept
    assert ids2.tolist() == [[5, 6, 7]] and mask2.tolist() == [[0, 1, 1]]
    assert prompt_buckets(100) == (16, 32, 64, 100) and prompt_buckets(16) == (16,)
    assert prompt_buckets(10, smallest=4) == (4, 8, 10)


@pytest.mark.parametrize("call, words", [
    (lambda: bucket_prompt(torch.ones(1, 9, dtype=torch.long), buckets=(4, 8)), "9 tokens is longer than the largest bucket, 8"),
    (lambda: bucket_prompt(torch.ones(1, 3), buckets=(4,)), "integer tensor"),
    (lambda: bucket_prompt(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 4), buckets=(4,)), "attention_mask has shape"),
    (lambda: bucket_prompt(torch.ones(1, 3, dtype=torch.long), buckets=()), "buckets must be lengths"),
])
def test_bucket_prompt_rejects_what_it_cannot_pad(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_prompts_of_one_bucket_share_one_prefill_compile_and_keep_eager_tokens(tmp_path: Path):
    """Compiled GPT-2 (tiny), static cache: prompts of 5, 9 and 13 tokens padded to the bucket
    of 16: the first generation compiles the prefill and the decode graph, the next two
    compile nothing (no Dynamo graph, no lowering), and every generation's tokens are the
    unpadded prompt's eager tokens."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    prompts = [torch.randint(1, 1000, (1, L)) for L in (5, 9, 13)]
    with torch.no_grad():
        refs = [model.generate(p, attention_mask=torch.ones_like(p), **kw)[:, p.shape[1]:] for p in prompts]
    from neuron_compiler.eval.measure import CountingBackend
    torch._dynamo.reset()
    backend = CountingBackend({"target": "trn2"})
    model.forward = torch.compile(model.forward, backend=backend)
    compiles, graphs = [], []
    for p, ref in zip(prompts, refs):
        ids, mask = bucket_prompt(p, buckets=(16, 32))
        with torch.no_grad(), neuron_compiler.profile() as prof:
            out = model.generate(ids, attention_mask=mask, **kw)
        assert torch.equal(out[:, 16:], ref), (p.shape, out[:, 16:], ref)
        d = prof.to_dict()
        assert d["fallback_nodes"] == 0, d["fallbacks"]
        compiles.append(d["compiles"])
        graphs.append(backend.graphs)
    assert compiles[0] >= 2 and compiles[1:] == [0, 0], compiles
    assert graphs[0] == 2 and graphs[1:] == [2, 2], graphs             # prefill + decode, once
