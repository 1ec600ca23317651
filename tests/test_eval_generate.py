"""``neuron-eval --generate N [--prompt-len L]``: TTFT, TPOT, tokens/s, the KV cache footprint
and the tokens against eager's, on a tiny transformers GPT-2 (one layer, d=32)."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from neuron_compiler.eval.cli import main
from neuron_compiler.eval.generate import prompt_ids
from neuron_compiler.eval.zoo import LoadedModel

transformers = pytest.importorskip("transformers")

LAYERS, D, HEADS, POSITIONS, VOCAB = 1, 32, 2, 24, 64
MODELS = textwrap.dedent(f"""
    import torch
    import transformers as T

    def _config():
        return T.GPT2Config(n_layer={LAYERS}, n_embd={D}, n_head={HEADS},
                            n_positions={POSITIONS}, vocab_size={VOCAB}, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)

    def make():
        torch.manual_seed(0)
        return T.GPT2LMHeadModel(_config()).eval(), {{"input_ids": torch.randint(1, {VOCAB}, (1, 7))}}

    class Wrong(T.GPT2LMHeadModel):
        # compiled, token 7 always wins: a compiler that gets the values wrong
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if torch.compiler.is_compiling():
                out.logits = out.logits + 1e4 * (torch.arange({VOCAB}) == 7)
            return out

    def make_wrong():
        torch.manual_seed(0)
        return Wrong(_config()).eval(), {{"input_ids": torch.randint(1, {VOCAB}, (1, 7))}}

    def make_encoder():
        torch.manual_seed(0)
        cfg = T.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                           intermediate_size=64, vocab_size={VOCAB}, max_position_embeddings=32)
        return T.BertModel(cfg).eval(), {{"input_ids": torch.randint(1, {VOCAB}, (1, 7))}}
""")


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "genmodels.py"
    path.write_text(MODELS)
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--quiet"])
    out = capsys.readouterr()
    return code, out.out, out.err


def _eager_tokens(models: str, factory: str, prompt_len: int, n: int) -> list[int]:
    """Greedy tokens computed here, without neuron-eval (transformers' default cache)."""
    from neuron_compiler.eval.zoo import load_model
    loaded = load_model(f"{models}:{factory}")
    ids = loaded.kwargs["input_ids"][:, :prompt_len]
    with torch.no_grad():
        seq = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=n, min_new_tokens=n)
    return seq[0, prompt_len:].tolist()


def test_generate_reports_ttft_tpot_kv_and_eager_tokens(models, tmp_path, capsys):
    n, L = 5, 6
    j, h = tmp_path / "g.json", tmp_path / "g.html"
    code, out, err = _run(capsys, f"{models}:make", "--generate", str(n), "--prompt-len", str(L),
                          "--targets", "trn2", "--json", str(j), "--html", str(h))
    assert code == 0, err
    report = json.loads(j.read_text())
    g = report["targets"]["trn2"]["generate"]
    # tokens: the compiled ones equal greedy tokens computed independently here
    assert g["tokens_match_eager"] and g["first_mismatch"] is None
    assert g["token_ids"] == _eager_tokens(models, "make", L, n)
    assert report["model"]["generate"]["token_ids"] == g["token_ids"]
    # KV cache: layers x 2 x batch x heads x max_cache_len x head_dim x 4 bytes (fp32);
    # transformers sizes the static cache at prompt + N - 1 (the last token is never cached)
    kv = LAYERS * 2 * 1 * HEADS * (L + n - 1) * (D // HEADS) * 4
    assert g["kv_cache"]["bytes"] == kv
    mem = report["targets"]["trn2"]["memory"]
    assert mem["kv_cache_bytes"] == kv
    assert mem["hbm_bytes"] == (report["model"]["weight_bytes"] + mem["activations_bytes"]
                                + mem["inputs_bytes"] + kv)
    # times: TTFT is the prefill's; TPOT over the N-1 decode steps; tokens/s from TPOT p50
    assert g["ttft_us"] == pytest.approx(sum(g["ttft"].values()))
    assert g["ttft"]["simulated_us"] > 0 and g["ttft"]["transfer_us"] > 0
    samples = g["tpot_us"]["samples"]
    assert len(samples) == g["decode_steps"] == n - 1 and min(samples) > 0
    assert g["tpot_us"]["p50"] == pytest.approx(float(torch.tensor(samples).median()))
    assert g["tokens_per_s"] == pytest.approx(1e6 / g["tpot_us"]["p50"])
    assert g["generation_us"] == pytest.approx(g["ttft_us"] + sum(samples))
    # one prefill and one decode graph; no recompile per token
    assert g["dynamo_graphs"] == 2
    assert sorted(c["calls"] for c in g["graph_calls"]) == [1, n - 1]
    assert report["compile"]["targets"]["trn2"]["recompiles"] == 0
    rows = {r["name"]: r for r in report["accuracy"]["outputs"]}
    assert rows["out.tokens"]["passed"] and rows["out.tokens"]["dtype"] == "int64"
    # the terminal and the HTML show the same figures
    assert f"{g['ttft_us']:,.2f}" in out and f"{g['tpot_us']['p50']:,.2f}" in out
    assert f"{g['tokens_per_s']:,.0f}" in out and "USD / 1M tokens" in out
    assert "= eager" in out and "result: PASS (exit 0)" in out
    page = h.read_text()
    assert "<h2>Generation</h2>" in page and "Time to first token" in page
    assert f"{g['tpot_us']['p50']:,.2f}" in page and "http" not in page.split("<h2>Versions")[0]


def test_buckets_pad_the_prompt_for_eager_and_every_target(models, tmp_path, capsys):
    """--buckets: the 6-token prompt is left-padded to 8 with a mask; the tokens are the unpadded
    prompt's (computed here without neuron-eval) and the report says which bucket."""
    n, L = 4, 6
    j = tmp_path / "b.json"
    code, out, err = _run(capsys, f"{models}:make", "--generate", str(n), "--prompt-len", str(L),
                          "--buckets", "4,8,16", "--targets", "trn2", "--warmup", "0", "--json", str(j))
    assert code == 0, err
    report = json.loads(j.read_text())
    g = report["targets"]["trn2"]["generate"]
    assert g["prompt_bucket"] == {"length": 8, "padding": 2, "buckets": [4, 8, 16], "pad_token_id": 0}
    assert report["model"]["generate"]["prompt_bucket"] == g["prompt_bucket"]
    assert g["prompt_len"] == L and g["tokens_match_eager"]
    assert g["token_ids"] == _eager_tokens(models, "make", L, n)
    assert "left-padded to its bucket of 8 (2 padding tokens, masked" in out


def test_tokens_that_differ_from_eager_fail_with_exit_1(models, tmp_path, capsys):
    eager = _eager_tokens(models, "make_wrong", 7, 3)
    assert eager != [7, 7, 7]   # else the broken compile would not show
    j = tmp_path / "w.json"
    code, out, err = _run(capsys, f"{models}:make_wrong", "--generate", "3", "--targets",
                          "trn2", "--warmup", "0", "--json", str(j))
    assert code == 1, err
    g = json.loads(j.read_text())["targets"]["trn2"]["generate"]
    assert not g["tokens_match_eager"] and g["token_ids"] == [7, 7, 7]
    assert g["first_mismatch"] == next(i for i, t in enumerate(eager) if t != 7)
    assert "DIFFER from token" in out and "FAIL (accuracy)" in out


@pytest.mark.parametrize("argv, words", [
    (["zoo:mlp", "--generate", "4"], "cannot generate"),
    (["{models}:make_encoder", "--generate", "4"], "cannot generate"),
    (["{models}:make", "--prompt-len", "4"], "--prompt-len applies to --generate"),
    (["{models}:make", "--generate", "1"], "N >= 2"),
    (["{models}:make", "--generate", "4", "--prompt-len", "0"], "--prompt-len must be >= 1"),
    (["{models}:make", "--generate", "20"], f"has {POSITIONS}"),
    (["{models}:make", "--generate", "4", "--train"], "cannot be combined"),
    (["{models}:make", "--buckets", "8"], "--buckets applies to --generate"),
    (["{models}:make", "--generate", "4", "--buckets", "8,x"], "--buckets: expected 'auto'"),
    (["{models}:make", "--generate", "4", "--buckets", "4"], "longer than the largest bucket, 4"),
    (["{models}:make", "--generate", "4", "--buckets", "22"], f"has {POSITIONS}"),
])
def test_generate_usage_errors_exit_2(models, argv, words, capsys):
    code, out, err = _run(capsys, *[a.format(models=models) for a in argv])
    assert code == 2 and words in err and "(exit 2)" in err, err


def test_prompt_from_the_input_or_seeded_tokens():
    class M(torch.nn.Module):
        config = transformers.GPT2Config(vocab_size=50)
    ids = torch.arange(10).reshape(1, 10)
    loaded = LoadedModel("x", M(), (), {"input_ids": ids})
    assert torch.equal(prompt_ids(loaded, None)[0], ids)
    assert torch.equal(prompt_ids(loaded, 4)[0], ids[:, :4])
    longer, source = prompt_ids(loaded, 12)
    assert longer.shape == (1, 12) and int(longer.max()) < 50 and "random" in source
    assert torch.equal(longer, prompt_ids(loaded, 12)[0])   # seeded
    assert prompt_ids(LoadedModel("x", M(), (torch.randn(3, 4),)), None)[0].shape == (1, 8)


def test_baseline_compares_ttft_and_only_the_same_generation():
    from neuron_compiler.eval.baseline import Limits, compare

    def report(ttft, tokens=16):
        return {"model": {"generate": {"tokens": tokens, "prompt_len": 32}},
                "targets": {"trn2": {"options": {"target": "trn2"},
                                     "generate": {"ttft_us": ttft}}},
                "accuracy": {"outputs": []}, "compile": {}}
    limits = Limits(0.10, 0.10, 0.0, None)
    assert compare(report(105.0), report(100.0), limits) == []
    [row] = compare(report(111.0), report(100.0), limits)
    assert row["metric"] == "generate.ttft_us" and "time to first token" in row["message"]
    [row] = compare(report(100.0, tokens=8), report(100.0), limits)
    assert row["metric"] == "options" and "--generate 8" in row["message"]
    inference = report(100.0)
    del inference["model"]["generate"]
    [row] = compare(report(100.0), inference, limits)
    assert row["metric"] == "options" and "inference" in row["message"]
