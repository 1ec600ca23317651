"""Tensor parallelism of a transformers GPT-2 (``neuron_compiler.tp``) on two gloo ranks.

GPT-2's attention projects q, k and v with one fused ``Conv1D`` (``c_attn``); each rank keeps its
heads of all three (column parallel, still fused), ``c_proj`` and the MLP's second layer are
row-parallel with an all_reduce, and the tied lm_head is vocabulary-parallel over a vocabulary
the world does not divide (padded, the gathered logits cut back). Both ranks compile their shard
with the neuron backend (functional simulation) and must give the unsharded logits.
"""
from __future__ import annotations

import pytest
import torch

from ranks import run_ranks

WORLD = 2
LAYERS, SEQ, VOCAB = 2, 9, 257          # 257: not divisible by the world


def _model():
    import transformers as T
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                       bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel(cfg).eval()


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
    a = sharded.transformer.h[0].attn
    return {"eager_err": float((eager - ref).abs().max()),
            "compiled_err": float((got - ref).abs().max()),
            "ref_scale": float(ref.abs().max()), "shape": list(got.shape),
            "qkv_rows": int(a.c_attn.weight.shape[0]), "fc_rows": int(sharded.transformer.h[0].mlp.c_fc.weight.shape[0]),
            "collectives": [{k: c[k] for k in ("kind", "ranks", "calls", "time_per_call_us")}
                            for c in d["collectives"]],
            "device_nodes": d["device_nodes"], "fallback_nodes": d["fallback_nodes"]}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    pytest.importorskip("transformers")
    return run_ranks(_rank, tmp_path_factory.mktemp("tp_gpt2"), WORLD)


def test_sharded_gpt2_matches_the_unsharded_model_on_both_ranks(ranks):
    for res in ranks:
        assert "error" not in res, res.get("error")
        assert res["qkv_rows"] == 3 * 64 // WORLD and res["fc_rows"] == 4 * 64 // WORLD
        assert res["shape"] == [1, SEQ, VOCAB]
        # fp32: only the summation order differs; a missing all_reduce, a wrong third of the
        # fused q|k|v or a misplaced vocabulary shard is off by O(ref_scale)
        assert res["eager_err"] <= 1e-5 * res["ref_scale"], res
        assert res["compiled_err"] <= 1e-4 * res["ref_scale"], res


def test_sharded_gpt2_collectives_are_timed_device_operations(ranks):
    for res in ranks:
        by_kind: dict[str, int] = {}
        for c in res["collectives"]:
            by_kind[c["kind"]] = by_kind.get(c["kind"], 0) + c["calls"]
            assert c["ranks"] == WORLD and c["time_per_call_us"] > 0
        assert by_kind == {"all_reduce": 2 * LAYERS, "all_gather": 1}, by_kind
        assert res["device_nodes"] > 0
