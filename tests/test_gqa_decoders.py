"""Decoders with grouped-query attention through ``torch.compile``, against eager.

transformers writes grouped-query attention out as ``repeat_kv`` (expand + reshape of the
key/value heads) when ``attn_implementation="eager"``, and calls SDPA otherwise. The written-out
form is fused into one ATTENTION kernel whose batch axes ([N, Hkv, G]) differ from the batched
products' ([N*H]); the mask it computes from query/key indices must follow that change (it did
not: with 1 < key/value heads < query heads every logit was wrong, silently). Each case asserts
that every node ran on the device and that an ATTENTION kernel was formed, so a fallback or a
refused fusion cannot make the comparison pass.
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler

transformers = pytest.importorskip("transformers")

HEADS = 8


def _decoder(family: str, kv_heads: int, impl: str) -> torch.nn.Module:
    kw = dict(hidden_size=64, intermediate_size=96, num_attention_heads=HEADS,
              num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=160,
              max_position_embeddings=64, attn_implementation=impl)
    if family == "Gemma":
        kw["head_dim"] = 8
    cfg = getattr(transformers, f"{family}Config")(**kw)
    return getattr(transformers, f"{family}ForCausalLM")(cfg).eval()


def _attention_kernels(dump) -> int:
    return sum(p.read_text().count("= attention[") for p in dump.rglob("ir_post_fusion.txt"))


CASES = ([("Llama", kv, impl) for kv in (1, 2, HEADS // 2, HEADS) for impl in ("eager", "sdpa")]
         + [(fam, 2, impl) for fam in ("Qwen2", "Mistral", "Gemma") for impl in ("eager", "sdpa")])


@pytest.mark.parametrize("family,kv_heads,impl", CASES)
def test_gqa_decoder_matches_eager_on_device(family, kv_heads, impl, fresh_dynamo, tmp_path):
    torch.manual_seed(0)
    model = _decoder(family, kv_heads, impl)
    ids = torch.randint(0, 160, (2, 19))        # 19 tokens: partial tiles everywhere
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        compiled = torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)})
        with neuron_compiler.profile() as prof:
            out = compiled(input_ids=ids).logits
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 50, d["fallbacks"]
    assert _attention_kernels(tmp_path) == 1
    # logits are O(1): a head read from the wrong key/value group moves them by ~0.5
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
