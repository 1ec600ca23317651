"""Real models that used to stop with an internal error (issue 21's table), through
``torch.compile(backend="neuron")`` in functional mode: each must run on the device (or fall back
with a recorded reason) and match eager.

The roots: an indirect DMA (a gather: transformers' masks index a bool tensor by position) read
the HBM bytes of a tensor the residency pass kept in SBUF (nobody wrote them: a race at run
time); rows of a resident tensor were read from a partition that is not a multiple of 32 (a
GRU step, a KV-cache row: an alignment error); an epilogue input of 8 bytes (an int64 mask)
had no entry in the matmul planner's dtype table; ``&`` / ``|`` of constants could not be
folded (causal SDPA with one query row builds such a mask).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neuron_compiler

transformers = pytest.importorskip("transformers")


def _compiled_run(model, kwargs):
    with torch.no_grad():
        ref = model(**kwargs)
        compiled = torch.compile(model, backend="neuron")
        with neuron_compiler.profile() as prof:
            out = compiled(**kwargs)
    return ref, out, prof.to_dict()


def _assert_on_device(d, allowed: frozenset[str] = frozenset()):
    assert d["device_nodes"] > 20, d
    for f in d["fallbacks"]:
        assert f["op"] in allowed and f["reason"], f


def _check_model(model, kwargs, field: str, allowed: frozenset[str] = frozenset()):
    """Compiled against eager: on the device (only ``allowed`` ops may fall back, with a
    reason), output ``field`` within 1e-4."""
    ref, out, d = _compiled_run(model.eval(), kwargs)
    _assert_on_device(d, allowed)
    torch.testing.assert_close(getattr(out, field), getattr(ref, field), rtol=1e-4, atol=1e-4)


def _ids():
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 19))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0                                       # right padding in the second row
    return ids, mask


def test_bf16_gqa_llama_with_attention_mask(fresh_dynamo):
    """An int64 mask reaches a matmul epilogue (8-byte input) and a gather over a bool mask."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=8,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=100,
                                   max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids, mask = _ids()
    ref, out, d = _compiled_run(model, dict(input_ids=ids, attention_mask=mask))
    _assert_on_device(d)
    assert d["fallback_nodes"] == 0
    assert out.logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.logits.float(), ref.logits.float(), rtol=2e-2, atol=2e-2)


def test_electra_with_padding_mask(fresh_dynamo):
    cfg = transformers.ElectraConfig(vocab_size=100, embedding_size=32, hidden_size=64,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=96)
    torch.manual_seed(0)
    ids, mask = _ids()
    _check_model(transformers.ElectraModel(cfg), dict(input_ids=ids, attention_mask=mask),
                 "last_hidden_state")


def test_clip_two_towers_with_padding_mask(fresh_dynamo):
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, max_position_embeddings=32),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, image_size=32, patch_size=8))
    torch.manual_seed(0)
    ids, mask = _ids()
    # the pooled text token is found by argmax over int64 ids (recorded as a fallback)
    _check_model(transformers.CLIPModel(cfg),
                 dict(input_ids=ids, attention_mask=mask, pixel_values=torch.randn(2, 3, 32, 32)),
                 "logits_per_image", allowed=frozenset({"aten.argmax.default"}))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_mistral_sliding_window_with_mask(impl, fresh_dynamo):
    cfg = transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                     num_key_value_heads=2, num_hidden_layers=1, vocab_size=100,
                                     sliding_window=8, attn_implementation=impl)
    torch.manual_seed(0)
    ids, mask = _ids()
    _check_model(transformers.MistralForCausalLM(cfg), dict(input_ids=ids, attention_mask=mask),
                 "logits")


def test_gpt2_without_cache(fresh_dynamo):
    """transformers' packed-sequence check: int64 diff(prepend=...) of an arange, and a cumsum
    of a bool mask."""
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=100, n_positions=64)
    torch.manual_seed(0)
    ids, _ = _ids()
    _check_model(transformers.GPT2LMHeadModel(cfg), dict(input_ids=ids, use_cache=False), "logits")


@pytest.mark.parametrize("shape", [(3, 300), (129, 5), (1, 128)])
def test_cumsum_of_a_bool_mask_counts_exactly(shape, fresh_dynamo):
    """transformers' position ids and packed-sequence checks count a bool mask (int64 out)."""
    torch.manual_seed(0)
    m = torch.rand(shape) > 0.4

    def f(m):
        return m.cumsum(-1), m.cumsum(0)

    with neuron_compiler.profile() as prof:
        out = torch.compile(f, backend="neuron")(m)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] == 2, d["fallbacks"]
    for o, r in zip(out, f(m)):
        assert o.dtype == torch.int64 and torch.equal(o, r)


def test_gpt2_generate_with_static_cache(fresh_dynamo):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, 100, (1, 7))
    kw = dict(max_new_tokens=4, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="neuron")
        with neuron_compiler.profile() as prof:
            out = model.generate(ids, **kw)
    d = prof.to_dict()
    assert d["device_nodes"] > 100 and d["fallback_nodes"] == 0, d["fallbacks"]
    assert out.tolist() == ref.tolist()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gru(bidirectional, fresh_dynamo):
    torch.manual_seed(0)
    gru = torch.nn.GRU(16, 24, batch_first=True, bidirectional=bidirectional).eval()
    x = torch.randn(2, 7, 16)
    # Dynamo's own switch (a monkeypatch's undo deletes a config entry for the next test)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        ref = gru(x)
        with neuron_compiler.profile() as prof:
            out = torch.compile(gru, backend="neuron")(x)
    d = prof.to_dict()
    assert d["device_nodes"] > 50 and d["fallback_nodes"] == 0, d["fallbacks"]
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lk", [1, 8])
def test_causal_sdpa_one_query_row_forward_and_grad(lk, fresh_dynamo):
    torch.manual_seed(0)
    q = torch.randn(1, 2, 1, 16, requires_grad=True)
    k, v = torch.randn(1, 2, lk, 16), torch.randn(1, 2, lk, 16)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    ref = f(q, k, v)
    (gref,) = torch.autograd.grad(ref.pow(2).sum(), q)
    with neuron_compiler.profile() as prof:
        out = torch.compile(f, backend="neuron")(q, k, v)
        (g,) = torch.autograd.grad(out.pow(2).sum(), q)
    d = prof.to_dict()
    assert d["device_nodes"] > 0 and d["fallback_nodes"] == 0, d["fallbacks"]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g, gref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_boolean_ops_of_one_element_constants(op, fresh_dynamo):
    fn = {"and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor}[op]

    def f(x):
        a = torch.ones(1, dtype=torch.bool)
        b = torch.zeros(1, dtype=torch.bool)
        return (x > 0) & fn(a, a) | fn(a, b)

    x = torch.randn(5)
    with neuron_compiler.profile() as prof:
        out = torch.compile(f, backend="neuron")(x)
    assert prof.to_dict()["fallback_nodes"] == 0
    assert out.tolist() == f(x).tolist()
