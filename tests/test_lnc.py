"""LNC=2: a partition split over the two physical cores of a logical NeuronCore (issue 24 item 1).

Done-when: ``options={"lnc": 2}`` on trn2 runs ``torch.mm`` 4096^3 bf16 in at most 0.6x its
lnc=1 time (timing mode), and a functional mm over tile edges matches eager, on both cores.
"""
from __future__ import annotations

import json

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compiler
from lowering.api import TensorSpec, compile_graph
from lowering.lnc import LncCompiledGraph
from neuron_compiler.errors import NeuronOptionError
from neuron_compiler.options import validate_options
from neuron_compiler.testing import assert_matches_eager
from runtime_sim.multicore import CORES_PER_STACK, simulate_cores
from runtime_sim.targets import get_target

LNC2 = {"lnc": 2}


def _lnc_partitions(d: dict) -> list[dict]:
    return [p for p in d["partitions"] if p.get("lnc") == 2]


def _assert_both_cores(d: dict) -> dict:
    """The single device partition ran split: two physical cores, each with matmul work."""
    assert d["fallback_nodes"] == 0 and d["device_nodes"] >= 1
    (p,) = _lnc_partitions(d)
    assert p["lnc_note"] == "", p["lnc_note"]
    assert [c["core"] for c in p["cores"]] == [0, 1]
    for c in p["cores"]:
        assert c["instructions"] > 0 and c["simulated_time_per_call_us"] > 0
    return p


# ---- options -----------------------------------------------------------------------------------
def test_lnc_default_is_one_and_two_is_accepted_on_trn2_trn3():
    assert validate_options(None).lnc == 1
    assert validate_options({"lnc": 2}).lnc == 2
    assert validate_options({"lnc": 2, "target": "trn3"}).lnc == 2


@pytest.mark.parametrize("opts, words", [
    ({"lnc": 2, "target": "trn1"}, ["'lnc'", "must be 1", "'trn1'", "only lnc=1", "got 2"]),
    ({"lnc": 3}, ["'lnc'", "must be 1 or 2", "'trn2'", "got 3"]),
    ({"lnc": "2"}, ["'lnc'", "got '2'"]),
    ({"lnc": True}, ["'lnc'", "got True"]),
])
def test_bad_lnc_names_option_constraint_and_value(opts, words):
    with pytest.raises(NeuronOptionError) as info:
        validate_options(opts)
    for w in words:
        assert w in str(info.value)


# ---- functional: values match eager, work on both cores ----------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mm_over_tile_edges_matches_eager_on_both_cores(dtype):
    torch.manual_seed(0)
    a, b = torch.randn(300, 700, dtype=dtype), torch.randn(700, 260, dtype=dtype)
    d = assert_matches_eager(torch.mm, a, b, options=LNC2)
    p = _assert_both_cores(d)
    # each core computes half of the output: M = 300 -> 150 + 150 rows, the full K and N
    assert [c["flops"] for c in p["cores"]] == [2 * 150 * 700 * 260] * 2
    assert p["flops"] == 2 * 300 * 700 * 260


def test_a_wrong_half_fails_the_comparison(monkeypatch):
    """The tolerance can fail: core 1 dropping its last K tile (128 of 700) in bf16 is caught."""
    run = LncCompiledGraph.run

    def core1_drops_a_k_tile(self, inputs, mode="functional", *, trace=False):
        outs, result = run(self, inputs, mode, trace=trace)
        if outs is not None and self.plan is not None:
            (lo, hi), a, b = self.plan.bounds[1], inputs[0], inputs[1]
            k = a.shape[1] - 128
            assert self.plan.outputs[0] == 0
            half = a[lo:hi, :k].astype("float32") @ b[:k].astype("float32")
            outs[0] = outs[0].copy()
            outs[0][lo:hi] = half.astype(outs[0].dtype)
        return outs, result

    monkeypatch.setattr(LncCompiledGraph, "run", core1_drops_a_k_tile)
    torch.manual_seed(0)
    a, b = torch.randn(300, 700, dtype=torch.bfloat16), torch.randn(700, 260, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_matches_eager(torch.mm, a, b, options=LNC2)


def test_mlp_attention_and_layer_norm_split_and_match():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(200, 300), torch.nn.GELU(),
                              torch.nn.LayerNorm(300), torch.nn.Linear(300, 130)).eval()
    with torch.no_grad():
        _assert_both_cores(assert_matches_eager(mlp, torch.randn(4, 33, 200), options=LNC2))

    def attn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
    qkv = [torch.randn(2, 4, 70, 64) for _ in range(3)]
    _assert_both_cores(assert_matches_eager(attn, *qkv, options=LNC2))


def test_training_step_matches_eager_with_lnc2():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    ref = __import__("copy").deepcopy(m)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    torch._dynamo.reset()
    c = torch.compile(m, backend="neuron", options=LNC2)
    with neuron_compiler.profile() as prof:
        torch.nn.functional.cross_entropy(c(x), y).backward()
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    assert {p["graph"].split("_")[0] for p in _lnc_partitions(prof.to_dict())} == \
        {"forward", "backward"}


def test_unsplittable_partition_runs_on_one_core_and_says_why():
    torch.manual_seed(0)
    d = assert_matches_eager(lambda x: (x * 2).sum(), torch.randn(100, 100), options=LNC2)
    (p,) = _lnc_partitions(d)
    assert len(p["cores"]) == 1
    assert "one physical core" in p["lnc_note"] and "no output has a dim" in p["lnc_note"]


# ---- timing: the done-when figure --------------------------------------------------------------
def _mm_time_us(lnc: int, n: int = 4096) -> float:
    a, b = (torch.empty(n, n, dtype=torch.bfloat16) for _ in range(2))
    torch._dynamo.reset()
    f = torch.compile(torch.mm, backend="neuron",
                      options={"lnc": lnc, "sim_mode": "timing", "target": "trn2"})
    with neuron_compiler.profile() as prof:
        f(a, b)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0
    if lnc == 2:
        _assert_both_cores(d)
    return d["simulated_time_us"]


def test_mm_4096_bf16_lnc2_at_most_0_6x_lnc1():
    one, two = _mm_time_us(1), _mm_time_us(2)
    assert two <= 0.6 * one, (one, two)


# ---- the machine: two programs on one HBM stack ------------------------------------------------
def _add_program(rows: int = 1024, cols: int = 4096):
    a = torch.empty(rows, cols)
    gm = make_fx(lambda x, y: torch.ops.aten.add.Tensor(x, y), tracing_mode="fake")(a, a)
    spec = TensorSpec((rows, cols), torch.float32)
    return compile_graph(gm, [spec, spec], "trn2").program


def test_two_cores_share_one_hbm_stack():
    """An HBM-bound program on both cores: together they move at most one stack's bandwidth
    (two cores' even shares); without the sharing they would exceed it."""
    t = get_target("trn2")
    stack = CORES_PER_STACK * t.hbm_bytes_per_ns_per_core
    p = _add_program()
    alone = simulate_cores([p], None, mode="timing", checks="static")
    both = simulate_cores([p, p], None, mode="timing", checks="static")
    assert both.stats.hbm_bytes == 2 * alone.stats.hbm_bytes
    assert both.stats.hbm_bytes / both.stats.total_ns <= stack * 1.001
    assert 2 * alone.stats.hbm_bytes / alone.stats.total_ns > stack   # unshared would exceed it
    assert both.stats.total_ns > alone.stats.total_ns


def test_lnc_trace_has_a_track_per_physical_core(tmp_path):
    torch.manual_seed(0)
    torch._dynamo.reset()
    f = torch.compile(torch.mm, backend="neuron", options=LNC2)
    with neuron_compiler.profile() as prof:
        f(torch.randn(256, 128), torch.randn(128, 256))
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"core0/pe (TensorE)", "core1/pe (TensorE)"} <= tracks
    assert {e["tid"] for e in events if e.get("ph") == "X" and e["cat"] == "core1/pe"}
    assert "Physical cores of the logical cores" in prof.summary()


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_splits_and_matches(causal):
    """The whole-SDPA op (no grad): rows of a non-causal attention, heads of a causal one."""
    torch.manual_seed(0)
    qkv = [torch.randn(2, 3, 130, 64) for _ in range(3)]

    def attn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with torch.no_grad():
        d = assert_matches_eager(attn, *qkv, options=LNC2)
    _assert_both_cores(d)


@pytest.mark.parametrize("use_cache", [True, False])
def test_gpt2_batch_two_splits_by_batch_and_matches(use_cache):
    """A whole small GPT-2 (one partition): reshapes between [B*L, D] and [B, L, D] cut the
    batch in steps of L; the qkv split, the KV cat (use_cache), the mask's arange/index/any
    (no cache) and the tied embedding are all cut or whole."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=500, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 500, (2, 40))
    with torch.no_grad():
        d = assert_matches_eager(lambda i: m(i, use_cache=use_cache).logits, ids, options=LNC2)
    _assert_both_cores(d)
