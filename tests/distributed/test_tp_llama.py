"""Tensor parallelism of a transformers Llama (``neuron_compiler.tp``) on two gloo ranks.

Both ranks build the same tiny Llama (seeded), keep its unsharded logits as the reference, shard
a copy into their rank of two (column/row parallel attention and MLP, vocabulary-parallel lm_head)
and run it compiled with the neuron backend (functional simulation: the values come from the
simulated programs and from gloo's collectives). The sharded model must give the unsharded
model's logits on both ranks, and its collectives must be timed device operations.
"""
from __future__ import annotations

import pytest
import torch

from ranks import run_ranks

WORLD = 2
LAYERS, SEQ, VOCAB = 2, 7, 256


def _model():
    import transformers as T
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB,
                        max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    return T.LlamaForCausalLM(cfg).eval()


def _rank(rank: int) -> dict:
    import copy

    import torch.distributed as dist

    import neuron_compiler
    from neuron_compiler.tp import shard_decoder
    full = _model()
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = full(ids).logits
        sharded = shard_decoder(copy.deepcopy(full), WORLD, rank, dist.group.WORLD)
        eager = sharded(ids).logits
        f = torch.compile(sharded, backend="neuron")
        with neuron_compiler.profile() as prof:
            got = f(ids).logits
    d = prof.to_dict()
    q = sharded.model.layers[0].self_attn.q_proj.weight
    return {"eager_err": float((eager - ref).abs().max()),
            "compiled_err": float((got - ref).abs().max()),
            "ref_scale": float(ref.abs().max()),
            "q_rows": int(q.shape[0]),
            "collectives": [{k: c[k] for k in ("kind", "ranks", "calls", "bytes",
                                                "time_per_call_us")} for c in d["collectives"]],
            "fallbacks": d["fallbacks"]}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    pytest.importorskip("transformers")
    return run_ranks(_rank, tmp_path_factory.mktemp("tp_llama"), WORLD)


def test_sharded_llama_matches_the_unsharded_model_on_both_ranks(ranks):
    for res in ranks:
        assert res["q_rows"] == 64 // WORLD                   # half the query heads each
        # fp32: only the summation order differs; a missing all_reduce (one rank's partial
        # sums) or a wrong shard is off by O(ref_scale)
        assert res["eager_err"] <= 1e-5 * res["ref_scale"], res
        assert res["compiled_err"] <= 1e-4 * res["ref_scale"], res


def test_sharded_llama_collectives_are_timed_device_operations(ranks):
    for res in ranks:
        by_kind = {}
        for c in res["collectives"]:
            by_kind[c["kind"]] = by_kind.get(c["kind"], 0) + c["calls"]
            assert c["ranks"] == WORLD and c["time_per_call_us"] > 0
        # an all_reduce after o_proj and after down_proj in every layer; one all_gather of the
        # logits (vocabulary-parallel lm_head)
        assert by_kind == {"all_reduce": 2 * LAYERS, "all_gather": 1}, by_kind
        gathers = [c for c in res["collectives"] if c["kind"] == "all_gather"]
        assert gathers[0]["bytes"] == SEQ * VOCAB * 4      # the gathered fp32 logits
