"""Greedy generation with a static KV cache through ``torch.compile``: a prefill graph and one
decode graph, every decode step's attention on the decode path (all heads at once), tokens
equal to eager's."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import neuron_compiler

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpt2_static_cache_generation_matches_eager_on_the_decode_path(tmp_path: Path, dtype):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval().to(dtype)
    ids = torch.randint(1, 1000, (1, 8))
    kw = dict(max_new_tokens=24, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="neuron",
                                  options={"target": "trn2", "dump_dir": str(tmp_path)})
    with torch.no_grad(), neuron_compiler.profile() as prof:
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref), (out, ref)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0, d["fallbacks"]
    assert len(d["graphs"]) <= 2, [g["name"] for g in d["graphs"]]    # prefill and decode (<= 4 asked)
    tirs = "".join(p.read_text() for p in tmp_path.rglob("tir.txt"))
    assert "heads of one query each" in tirs
