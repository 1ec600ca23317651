"""``neuron_compiler.tp`` in one process (a fake process group of N ranks) and ``neuron-eval --tp``.

The values of a sharded model against the unsharded one are checked on two real gloo ranks in
tests/distributed/test_tp_models.py; here: the shapes of a shard, its errors, the model built on
the meta device, the timed collectives of one rank of N, and the CLI.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

T = pytest.importorskip("transformers")

from neuron_compiler import tp  # noqa: E402


def _tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=512, max_position_embeddings=64,
               bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg.update(kw)
    return T.LlamaForCausalLM(T.LlamaConfig(**cfg)).eval()


@pytest.fixture
def group2():
    g = tp.fake_group(2)
    yield g
    tp.close_fake_group()


def test_shard_keeps_the_ranks_heads_and_rows(group2):
    full = _tiny()
    s = tp.shard_decoder(copy.deepcopy(full), 2, rank=1, group=group2)
    a, fa = s.model.layers[0].self_attn, full.model.layers[0].self_attn
    # rank 1 of 2: query heads 2-3 (rows 32..63), key/value head 1 (rows 16..31)
    assert torch.equal(a.q_proj.weight, fa.q_proj.weight[32:64])
    assert torch.equal(a.k_proj.weight, fa.k_proj.weight[16:32])
    assert torch.equal(a.o_proj.linear.weight, fa.o_proj.weight[:, 32:64])
    m, fm = s.model.layers[1].mlp, full.model.layers[1].mlp
    assert torch.equal(m.up_proj.weight, fm.up_proj.weight[64:128])
    assert torch.equal(m.down_proj.linear.weight, fm.down_proj.weight[:, 64:128])
    assert torch.equal(s.lm_head.linear.weight, full.lm_head.weight[256:512])
    c = s.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.head_dim) == \
        (2, 1, 64, 16)


def test_shard_refuses_sizes_the_world_does_not_divide(group2):
    with pytest.raises(tp.TPError, match=r"key/value heads \(1\) is not divisible by 2"):
        tp.shard_decoder(_tiny(num_key_value_heads=1), 2)
    with pytest.raises(tp.TPError, match=r"intermediate size \(131\)"):
        tp.shard_decoder(_tiny(intermediate_size=131), 2)
    with pytest.raises(tp.TPError, match="rank must be in"):
        tp.shard_decoder(_tiny(), 2, rank=2)


def test_world_one_changes_nothing():
    full = _tiny()
    s = tp.shard_decoder(copy.deepcopy(full), 1)
    ids = torch.arange(5)[None]
    with torch.no_grad():
        assert torch.equal(s(ids).logits, full(ids).logits)


def test_a_meta_model_gets_only_its_shard(group2):
    with torch.device("meta"):
        m = _tiny(hidden_size=128, intermediate_size=256).to(torch.bfloat16)
    s = tp.shard_decoder(m, 2)
    assert all(p.device.type == "cpu" for p in s.parameters())
    assert all(b.device.type == "cpu" for b in s.buffers())
    assert s.model.layers[0].mlp.gate_proj.weight.shape == (128, 128)
    assert s.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16
    assert bool((s.model.layers[0].input_layernorm.weight == 1).all())
    with torch.no_grad():
        assert s(torch.arange(4)[None]).logits.shape == (1, 4, 512)


def test_one_rank_of_n_is_compiled_with_timed_collectives(group2):
    import neuron_compiler
    s = tp.shard_decoder(_tiny(), 2)
    f = torch.compile(s, backend="neuron", options={"sim_mode": "timing", "fallback": "error"})
    with torch.no_grad(), neuron_compiler.profile() as prof:
        f(torch.arange(6)[None])
    d = prof.to_dict()
    kinds = sorted((c["kind"], c["calls"], c["ranks"]) for c in d["collectives"])
    assert kinds == [("all_gather", 1, 2), ("all_reduce", 4, 2)], kinds   # 2 per layer
    assert d["collective_time_us"] > 0 and d["fallback_nodes"] == 0


def test_neuron_eval_tp_prints_ttft_tpot_with_collectives(tmp_path, capsys):
    from neuron_compiler.eval.cli import main
    out = tmp_path / "r.json"
    code = main(["zoo:llama", "--tp", "2", "--generate", "3", "--sim-mode", "timing",
                 "--targets", "trn2", "--iters", "1", "--quiet", "--json", str(out),
                 "--price", "trn2.48xlarge=36"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert not torch.distributed.is_initialized()        # the fake group was closed
    r = json.loads(out.read_text())
    assert r["model"]["parallel"]["tp"] == 2
    assert "not compared" in r["accuracy"]["not_checked"]
    g = r["targets"]["trn2"]["generate"]
    assert g["ttft"]["collective_us"] > 0 and g["tpot_collective_us"] > 0
    lat = r["targets"]["trn2"]["latency_us"]
    # the decode step's latency includes its modelled collectives
    assert lat["p50"] == pytest.approx(lat["simulated_us"] + lat["transfer_us"]
                                       + lat["fallback_us"] + lat["call_overhead_us"]
                                       + lat["collective_us"], rel=1e-6)
    assert "--tp 2: rank 0 of 2 simulated" in text and "collectives us" in text
    # a replica is 2 ranks x LNC=1 physical core (the compile's lnc): 64 of them on the
    # instance's 128 cores
    c = r["targets"]["trn2"]["cost"]
    assert (c["cores_per_replica"], c["replicas"]) == (2, 64)
    assert c["usd_per_million_inferences"] == pytest.approx(
        36 / 3600 / (64 * 1e6 / lat["p50"]) * 1e6, rel=1e-9)
    assert "one replica per 2 NeuronCores" in c["assumption"]


def test_neuron_eval_tp_usage_errors(capsys):
    from neuron_compiler.eval.cli import main
    assert main(["zoo:llama", "--tp", "0"]) == 2
    assert main(["zoo:llama", "--tp", "2", "--dp", "2"]) == 2
    assert main(["zoo:llama", "--tp", "8", "--targets", "trn2"]) == 2   # 2 kv heads
    assert "not divisible by 8" in capsys.readouterr().err
    assert not torch.distributed.is_initialized()


def test_neuron_eval_dp_train_times_the_gradient_all_reduce(tmp_path, capsys):
    from neuron_compiler.eval.cli import main
    from runtime_sim.collectives import collective_cost
    out = tmp_path / "r.json"
    code = main(["zoo:mlp", "--dp", "4", "--train", "--targets", "trn2", "--iters", "1",
                 "--quiet", "--json", str(out)])
    assert code == 0, capsys.readouterr().out
    r = json.loads(out.read_text())
    par, t = r["model"]["parallel"], r["targets"]["trn2"]
    assert par["dp"] == 4 and par["throughput_per_s"]["trn2"] == pytest.approx(
        4 * t["throughput_per_s"])
    grad = r["model"]["weight_bytes"]          # every parameter of zoo:mlp is trained
    assert par["dp_gradient_bytes"] == grad and par["dp_buckets"] == 1
    want = collective_cost("all_reduce", grad, 4, "trn2", 1).total_ns / 1e3
    assert par["dp_gradient_all_reduce_us"]["trn2"] == pytest.approx(want)


def test_per_replica_cost_scales_with_the_cores_a_replica_holds():
    from neuron_compiler.eval.prices import INSTANCES, cost, per_replica
    one = cost("trn1", 100.0, INSTANCES)          # trn1.32xlarge: 32 cores, a published price
    eight = per_replica(one, 8, "test")
    assert eight["replicas"] == 4
    assert eight["usd_per_million_inferences"] == pytest.approx(
        8 * one["usd_per_million_inferences"])
    with pytest.raises(ValueError, match="does not fit"):
        per_replica(one, 64, "test")


def test_gpt2_shard_keeps_the_ranks_heads_of_the_fused_qkv_and_pads_the_vocabulary(group2):
    import transformers as T
    cfg = T.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=32, vocab_size=101)
    model = T.GPT2LMHeadModel(cfg).eval()
    full_qkv = model.transformer.h[0].attn.c_attn.weight.detach().clone()    # [in, 3E]
    tp.shard_decoder(model, 2, 1, group2)
    a = model.transformer.h[0].attn
    # rank 1: features 32..63 of q, of k and of v, still one fused projection
    want = torch.cat([full_qkv[:, 32:64], full_qkv[:, 96:128], full_qkv[:, 160:192]], dim=1).t()
    assert torch.equal(a.c_attn.weight, want)
    assert (a.split_size, a.num_heads, model.config.num_attention_heads) == (32, 2, 2)
    head = model.lm_head
    assert head.size == 101 and head.linear.out_features == 51      # 101 padded to 102
    assert torch.count_nonzero(head.linear.weight[-1]) == 0          # the padding row


def test_collectives_place_ranks_by_the_compiles_lnc(group2):
    """A rank is a logical core of the compile's ``lnc``: its collectives say so, and at lnc=2
    a rank drives twice the CC channels (a large all_reduce takes less time)."""
    import torch.distributed._functional_collectives as funcol

    import neuron_compiler
    x = torch.randn(1024, 1024)          # 4 MiB: bound by the CC channels, not the hop latency
    got = {}
    for lnc in (1, 2):
        torch._dynamo.reset()
        f = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", group2), backend="neuron",
                          options={"sim_mode": "timing", "lnc": lnc})
        with neuron_compiler.profile() as prof:
            f(x)
        (c,) = prof.to_dict()["collectives"]
        got[lnc] = (c["lnc"], c["time_per_call_us"])
    assert got[1][0] == 1 and got[2][0] == 2, got
    assert got[2][1] < got[1][1], got


def test_neuron_eval_lnc_2_refuses_trn1(capsys):
    from neuron_compiler.eval.cli import main
    assert main(["zoo:llama", "--lnc", "2", "--targets", "trn1,trn2"]) == 2
    assert "only lnc=1" in capsys.readouterr().err
