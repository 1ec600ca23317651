"""Tensor parallelism of transformers decoders (``neuron_compiler.tp``) on two gloo ranks.

Both ranks build the same tiny model (seeded), keep its unsharded logits as the reference, shard
a copy into their rank of two and run it compiled with the neuron backend (functional
simulation: the values come from the simulated programs and from gloo's collectives). The
sharded model must give the unsharded model's logits on both ranks, and its collectives must be
timed device operations.
- Llama: q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel with an all_reduce,
  a vocabulary-parallel lm_head;
- GPT-2: the fused ``c_attn`` keeps the rank's heads of q, k and v (column parallel, still
  fused), ``c_proj`` and ``mlp.c_proj`` row-parallel, and the tied lm_head vocabulary-parallel
  over a vocabulary the world does not divide (padded, the gathered logits cut back).
"""
from __future__ import annotations

import pytest
import torch

from ranks import run_ranks

WORLD = 2
LAYERS, SEQ = 2, 7
VOCAB = {"llama": 256, "gpt2": 257}          # 257: not divisible by the world


def _model(kind: str):
    import transformers as T
    torch.manual_seed(0)
    if kind == "llama":
        cfg = T.LlamaConfig(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB[kind],
                            max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                            pad_token_id=0)
        return T.LlamaForCausalLM(cfg).eval()
    cfg = T.GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, n_positions=64,
                       vocab_size=VOCAB[kind], bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel(cfg).eval()


def _run(rank: int, kind: str) -> dict:
    import copy

    import torch.distributed as dist

    import neuron_compiler
    from neuron_compiler.tp import shard_decoder
    full = _model(kind)
    ids = torch.randint(0, VOCAB[kind], (1, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = full(ids).logits
        sharded = shard_decoder(copy.deepcopy(full), WORLD, rank, dist.group.WORLD)
        eager = sharded(ids).logits
        f = torch.compile(sharded, backend="neuron")
        with neuron_compiler.profile() as prof:
            got = f(ids).logits
    d = prof.to_dict()
    if kind == "llama":
        q_rows = sharded.model.layers[0].self_attn.q_proj.weight.shape[0]
    else:
        q_rows = sharded.transformer.h[0].attn.c_attn.weight.shape[0] // 3
    return {"eager_err": float((eager - ref).abs().max()),
            "compiled_err": float((got - ref).abs().max()),
            "ref_scale": float(ref.abs().max()), "shape": list(got.shape), "q_rows": int(q_rows),
            "collectives": [{k: c[k] for k in ("kind", "ranks", "calls", "bytes",
                                                "time_per_call_us")} for c in d["collectives"]],
            "fallbacks": d["fallbacks"]}


def _llama(rank: int) -> dict:
    return _run(rank, "llama")


def _gpt2(rank: int) -> dict:
    return _run(rank, "gpt2")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def ranks(request, tmp_path_factory) -> tuple[str, list[dict]]:
    pytest.importorskip("transformers")
    fn = {"llama": _llama, "gpt2": _gpt2}[request.param]
    return request.param, run_ranks(fn, tmp_path_factory.mktemp(f"tp_{request.param}"), WORLD)


def test_sharded_model_matches_the_unsharded_model_on_both_ranks(ranks):
    kind, results = ranks
    for res in results:
        assert "error" not in res, res.get("error")
        assert res["q_rows"] == 64 // WORLD                   # half the query heads each
        assert res["shape"] == [1, SEQ, VOCAB[kind]]
        # fp32: only the summation order differs; a missing all_reduce (one rank's partial
        # sums), a wrong shard (a wrong third of GPT-2's fused q|k|v) or a misplaced vocabulary
        # shard is off by O(ref_scale)
        assert res["eager_err"] <= 1e-5 * res["ref_scale"], res
        assert res["compiled_err"] <= 1e-4 * res["ref_scale"], res


def test_sharded_model_collectives_are_timed_device_operations(ranks):
    kind, results = ranks
    for res in results:
        by_kind: dict[str, int] = {}
        for c in res["collectives"]:
            by_kind[c["kind"]] = by_kind.get(c["kind"], 0) + c["calls"]
            assert c["ranks"] == WORLD and c["time_per_call_us"] > 0
        # an all_reduce after the attention's and the MLP's row-parallel projection in every
        # layer; one all_gather of the logits (vocabulary-parallel lm_head)
        assert by_kind == {"all_reduce": 2 * LAYERS, "all_gather": 1}, by_kind
        gathers = [c for c in res["collectives"] if c["kind"] == "all_gather"]
        padded = -(-VOCAB[kind] // WORLD) * WORLD
        assert gathers[0]["bytes"] == SEQ * padded * 4      # the gathered fp32 logits
