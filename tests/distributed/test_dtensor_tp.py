"""DTensor tensor parallelism compiled with the neuron backend, on two gloo ranks (docs/dtensor.md).

One spawn (module fixture) runs every scenario on both ranks; the tests read what each rank saw:
- ``mlp``: ``parallelize_module(mlp, init_device_mesh("cpu", (2,)), {"up": ColwiseParallel(),
  "down": RowwiseParallel()})`` compiled with ``fallback="error"`` (a collective that fell back
  would refuse to compile): inference under ``no_grad`` and a training step, against the
  unsharded module run eagerly on each rank (outputs, every parameter's local gradient shard and
  the input's gradient);
- ``sp_block``: an attention + MLP block with sequence parallelism (``SequenceParallel`` norms,
  ``PrepareModuleInput``, ``RowwiseParallel(output_layouts=Shard(1))``): all_gather and
  reduce_scatter in the forward and the backward graphs;
- ``autograd_ops``: torch's ``_c10d_functional_autograd`` ops called directly (forward and
  backward);
- ``tp_plan_auto``: transformers' ``from_pretrained(path, tp_plan="auto")`` of a tiny Llama
  saved locally, compiled; logits against the unsharded model. Loaded before ``neuron_compiler``
  is imported in the rank (docs/dtensor.md: otherwise the ``neuron`` device is torch's
  accelerator and transformers places the shards on it); skipped without ``accelerate``, which
  transformers requires for ``tp_plan``.

Comparisons use ``neuron_compiler.testing.assert_close`` (fp32 tolerances); each scenario also
compares against a reference with one weight 1% off, which must fail.
"""
from __future__ import annotations

import copy
import os
import time

import pytest
import torch

from ranks import run_ranks

WORLD = 2
D, HIDDEN, ROWS = 130, 260, 9        # the sharded hidden (130 per rank) crosses a tile edge
DB, SEQ, HEADS = 64, 8, 4            # sp_block: 4 tokens and 2 heads per rank
LLAMA_LAYERS, LLAMA_SEQ, VOCAB = 2, 7, 256
PERTURB = 1e-2                       # a perturbed weight is this much (relative) off


class MLP(torch.nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Attention(torch.nn.Module):
    """Causal self-attention whose head count comes from the (possibly sharded) projections."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.head_dim = d // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn, self.mlp = Attention(d, heads), MLP(d, 2 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


# ---- helpers run on each rank -------------------------------------------------------------------
def _mismatch(actual: torch.Tensor, expected: torch.Tensor, what: str) -> str | None:
    """None when ``actual`` matches ``expected`` (fp32 tolerances), else the failure."""
    from neuron_compiler.testing import assert_close
    try:
        assert_close(actual.detach(), expected.detach(), what=what)
    except AssertionError as e:
        return str(e)
    return None


def _local_shard(full: torch.Tensor, placements: tuple, rank: int) -> torch.Tensor:
    """This rank's part of ``full`` under a 1-D mesh's ``placements`` (Shard(d): the rank's even
    chunk on d; Replicate: all of it)."""
    from torch.distributed.tensor import Replicate, Shard
    (p,) = placements
    if isinstance(p, Shard):
        return full.chunk(WORLD, p.dim)[rank]
    if isinstance(p, Replicate):
        return full
    raise AssertionError(f"unexpected gradient placement {p}")


def _grad_mismatches(model: torch.nn.Module, ref: torch.nn.Module, rank: int) -> dict:
    """Per parameter: None, or how its local gradient shard differs from ``ref``'s gradient. A
    Partial gradient (a sequence-parallel norm's weight: each rank's sum over its own tokens,
    as in eager DTensor) is reduced first, an eager all_reduce on both ranks in the same order."""
    from torch.distributed.tensor import Partial, Replicate
    out = {}
    refs = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g = p.grad
        if hasattr(g, "to_local"):
            if any(isinstance(pl, Partial) for pl in g.placements):
                g = g.redistribute(placements=[Replicate()])
            want = _local_shard(refs[name].grad, tuple(g.placements), rank)
            g = g.to_local()
        else:
            want = refs[name].grad
        out[name] = _mismatch(g, want, f"grad {name}")
    return out


def _perturbed(ref: torch.nn.Module, name: str) -> torch.nn.Module:
    """A copy of ``ref`` whose parameter ``name`` is scaled by ``1 + PERTURB``."""
    bad = copy.deepcopy(ref)
    with torch.no_grad():
        dict(bad.named_parameters())[name].mul_(1 + PERTURB)
    return bad


def _profile_view(prof) -> dict:
    """What the tests read of a profile: collectives with their graph's kind, fallbacks, node
    counts and the compute ops of the device partitions."""
    d = prof.to_dict()
    kinds = {g["name"]: g["kind"] for g in d["graphs"]}
    return {"collectives": [{**{k: c[k] for k in ("op", "kind", "ranks", "bytes", "calls",
                                                   "time_per_call_us", "time_us")},
                             "graph_kind": kinds[c["graph"]]} for c in d["collectives"]],
            "collective_time_us": d["collective_time_us"],
            "simulated_time_us": d["simulated_time_us"],
            "fallbacks": d["fallbacks"], "fallback_nodes": d["fallback_nodes"],
            "device_nodes": d["device_nodes"],
            "partition_ops": sorted({op for p in d["partitions"] for op in p["ops"]})}


def _dynamo_graphs() -> dict:
    from torch._dynamo.utils import counters
    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": sum(counters["graph_break"].values())}


def _reset_dynamo() -> None:
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()


# ---- scenarios ----------------------------------------------------------------------------------
def _mlp(rank: int, mesh) -> dict:
    """The issue's MLP: inference and one training step, compiled, against the unsharded MLP."""
    import neuron_compiler
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    ref = MLP(D, HIDDEN)
    x = torch.randn(ROWS, D)
    model = parallelize_module(copy.deepcopy(ref), mesh,
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    _reset_dynamo()
    compiled = torch.compile(model, backend="neuron", options={"fallback": "error"})
    with neuron_compiler.profile() as infer_prof, torch.no_grad():
        y = compiled(x)
        y = compiled(x)                                   # a steady-state call too
    graphs = _dynamo_graphs()
    with torch.no_grad():
        want = ref(x)
    xc, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    with neuron_compiler.profile() as train_prof:
        yt = compiled(xc)
        yt.square().sum().backward()
    ref(xr).square().sum().backward()
    bad = _perturbed(ref, "up.weight")
    with torch.no_grad():
        want_bad = bad(x)
    xb = x.clone().requires_grad_()
    bad(xb).square().sum().backward()
    return {"output": _mismatch(y, want, "inference output"),
            "train_output": _mismatch(yt, want, "training output"),
            "grads": _grad_mismatches(model, ref, rank),
            "input_grad": _mismatch(xc.grad, xr.grad, "input grad"),
            "perturbed_output": _mismatch(y, want_bad, "inference output vs perturbed"),
            "perturbed_grads": _grad_mismatches(model, bad, rank),
            "perturbed_input_grad": _mismatch(xc.grad, xb.grad, "input grad vs perturbed"),
            "placements": {n: str(p.placements) for n, p in model.named_parameters()},
            "dynamo": graphs,
            "inference": _profile_view(infer_prof), "train": _profile_view(train_prof)}


def _sp_block(rank: int, mesh) -> dict:
    """Attention + MLP block, tensor and sequence parallel, one training step."""
    import neuron_compiler
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    torch.manual_seed(1)
    ref = Block(DB, HEADS)
    x = torch.randn(1, SEQ, DB)
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {"norm1": SequenceParallel(), "norm2": SequenceParallel(),
            "attn": gather, "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "mlp": gather, "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1))}
    model = parallelize_module(copy.deepcopy(ref), mesh, plan)
    _reset_dynamo()
    compiled = torch.compile(model, backend="neuron", options={"fallback": "error"})
    mine = x.chunk(WORLD, 1)[rank].clone().requires_grad_()      # this rank's tokens
    xr = x.clone().requires_grad_()
    with neuron_compiler.profile() as prof:
        y = compiled(mine)
        y.square().sum().backward()
    graphs = _dynamo_graphs()
    want = ref(xr)
    want.square().sum().backward()
    bad = _perturbed(ref, "mlp.down.weight")
    xb = x.clone().requires_grad_()
    want_bad = bad(xb)
    want_bad.square().sum().backward()
    return {"output": _mismatch(y, want.chunk(WORLD, 1)[rank], "output"),
            "grads": _grad_mismatches(model, ref, rank),
            "input_grad": _mismatch(mine.grad, xr.grad.chunk(WORLD, 1)[rank], "input grad"),
            "perturbed_output": _mismatch(y, want_bad.chunk(WORLD, 1)[rank], "output vs perturbed"),
            "perturbed_grads": _grad_mismatches(model, bad, rank),
            "grad_placements": {n: str(p.grad.placements) for n, p in model.named_parameters()},
            "dynamo": graphs, "train": _profile_view(prof)}


def _autograd_ops(rank: int) -> dict:
    """``_c10d_functional_autograd`` ops (torch's differentiable funcol variants) in a compiled
    function, forward and backward, against the same function run eagerly."""
    import torch.distributed as dist

    import neuron_compiler
    group = dist.group.WORLD.group_name
    ops, wait = torch.ops._c10d_functional_autograd, torch.ops._c10d_functional.wait_tensor

    def f(x):
        g = wait(ops.all_gather_into_tensor(x, WORLD, group))
        s = wait(ops.reduce_scatter_tensor(g * 2, "sum", WORLD, group))
        return wait(ops.all_to_all_single(s, [2, 2], [2, 2], group))

    _reset_dynamo()
    x = torch.arange(16.0).reshape(4, 4) * (rank + 1)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    with neuron_compiler.profile() as prof:
        y = torch.compile(f, backend="neuron", options={"fallback": "error"})(xc)
        (y * torch.arange(1.0, 5.0)).sum().backward()
    ye = f(xe)
    (ye * torch.arange(1.0, 5.0)).sum().backward()
    return {"output": _mismatch(y, ye, "output"), "input_grad": _mismatch(xc.grad, xe.grad, "grad"),
            "profile": _profile_view(prof)}


def _tp_plan_auto(rank: int, path: str) -> dict:
    """transformers' ``tp_plan="auto"`` (module docstring). Runs before ``neuron_compiler`` is
    imported in this process."""
    import importlib.util
    import sys
    if importlib.util.find_spec("accelerate") is None:
        return {"skipped": "transformers requires accelerate for tp_plan (pip install accelerate)"}
    assert "neuron_compiler" not in sys.modules, "tp_plan_auto must run before the import"
    import transformers as T
    # what torchrun sets: transformers derives tp_size from WORLD_SIZE (1 when unset: no sharding)
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank))
    full = T.AutoModelForCausalLM.from_pretrained(path).eval()
    model = T.AutoModelForCausalLM.from_pretrained(path, tp_plan="auto").eval()
    ids = torch.randint(0, VOCAB, (1, LLAMA_SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = full(ids).logits
        bad = _perturbed(full, "model.layers.1.mlp.down_proj.weight")(ids).logits
    sharded = {n: str(p.placements) for n, p in model.named_parameters() if hasattr(p, "placements")}
    import neuron_compiler
    _reset_dynamo()
    compiled = torch.compile(model, backend="neuron")
    with neuron_compiler.profile() as prof, torch.no_grad():
        got = compiled(ids).logits
        got = compiled(ids).logits
    return {"output": _mismatch(got, want, "logits"),
            "perturbed_output": _mismatch(got, bad, "logits vs perturbed"),
            "param_device": str(next(model.parameters()).device),
            "sharded": sharded, "dynamo": _dynamo_graphs(), "profile": _profile_view(prof)}


def _scenarios(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    out_dir = os.environ["NEURON_TEST_OUT"]
    t0 = time.perf_counter()
    res = {"tp_plan_auto": _tp_plan_auto(rank, os.path.join(out_dir, "llama"))}
    mesh = init_device_mesh("cpu", (WORLD,))
    res["mlp"] = _mlp(rank, mesh)
    res["sp_block"] = _sp_block(rank, mesh)
    res["autograd_ops"] = _autograd_ops(rank)
    res["seconds"] = time.perf_counter() - t0
    return res


def _save_tiny_llama(path: str) -> None:
    import transformers as T
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=LLAMA_LAYERS, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB,
                        max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    T.LlamaForCausalLM(cfg).save_pretrained(path)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("dtensor")
    _save_tiny_llama(str(out / "llama"))
    return run_ranks(_scenarios, out, WORLD)


def _by_kind(collectives: list[dict]) -> dict:
    """{(graph kind, collective kind): (calls, bytes)}; fails on a collective listed twice or a
    time that is not positive."""
    out = {}
    for c in collectives:
        key = (c["graph_kind"], c["kind"])
        assert key not in out, f"two entries for {key}: {collectives}"
        assert c["time_per_call_us"] > 0 and c["ranks"] == WORLD, c
        out[key] = (c["calls"], c["bytes"])
    return out


def _no_fallback(prof: dict) -> None:
    assert prof["fallbacks"] == [] and prof["fallback_nodes"] == 0, prof["fallbacks"]


def test_tp_mlp_matches_the_unsharded_mlp_in_inference_and_training(ranks):
    for rank, res in enumerate(ranks):
        mlp = res["mlp"]
        assert mlp["placements"] == {"up.weight": "(Shard(dim=0),)", "up.bias": "(Shard(dim=0),)",
                                     "down.weight": "(Shard(dim=1),)", "down.bias": "(Replicate(),)"}
        assert mlp["output"] is None and mlp["train_output"] is None, (rank, mlp)
        assert mlp["grads"] == dict.fromkeys(mlp["placements"]), (rank, mlp["grads"])
        assert mlp["input_grad"] is None, (rank, mlp["input_grad"])
        # the same comparisons fail against a reference whose up.weight is 1% off
        assert mlp["perturbed_output"] is not None and mlp["perturbed_input_grad"] is not None
        assert mlp["perturbed_grads"]["up.weight"] is not None
        assert mlp["perturbed_grads"]["down.weight"] is not None


def test_tp_mlp_all_reduces_are_timed_device_operations(ranks):
    for res in ranks:
        mlp = res["mlp"]
        assert mlp["dynamo"] == {"unique_graphs": 1, "graph_breaks": 0}
        nbytes = ROWS * D * 4
        infer, train = mlp["inference"], mlp["train"]
        _no_fallback(infer)
        _no_fallback(train)
        assert _by_kind(infer["collectives"]) == {("inference", "all_reduce"): (2, nbytes)}
        # backward: the input's gradient, summed over the ranks' column shards
        assert _by_kind(train["collectives"]) == {("forward", "all_reduce"): (1, nbytes),
                                                  ("backward", "all_reduce"): (1, nbytes)}
        for prof in (infer, train):
            assert prof["collective_time_us"] == pytest.approx(
                sum(c["time_us"] for c in prof["collectives"]))
            assert prof["simulated_time_us"] > 0 and "aten.addmm.default" in prof["partition_ops"]
        assert "aten.mm.default" in train["partition_ops"]          # the backward's matmuls


def test_sequence_parallel_block_matches_and_times_gathers_and_scatters(ranks):
    for rank, res in enumerate(ranks):
        blk = res["sp_block"]
        assert blk["dynamo"] == {"unique_graphs": 1, "graph_breaks": 0}
        assert blk["output"] is None and blk["input_grad"] is None, (rank, blk)
        assert all(v is None for v in blk["grads"].values()), (rank, blk["grads"])
        assert blk["perturbed_output"] is not None
        assert blk["perturbed_grads"]["mlp.down.weight"] is not None
        # the norms' gradients stay Partial, as in eager DTensor (reduced when redistributed)
        assert blk["grad_placements"]["norm1.weight"] == "(Partial(sum),)"
        train = blk["train"]
        _no_fallback(train)
        nbytes = SEQ * DB * 4                       # the whole sequence: gather output, scatter input
        assert _by_kind(train["collectives"]) == {
            ("forward", "all_gather"): (2, nbytes), ("forward", "reduce_scatter"): (2, nbytes),
            ("backward", "all_gather"): (2, nbytes), ("backward", "reduce_scatter"): (2, nbytes)}
        assert {"aten.bmm.default", "aten.native_layer_norm_backward.default"} <= set(
            train["partition_ops"])


def test_autograd_collective_ops_are_device_operations(ranks):
    for res in ranks:
        ag = res["autograd_ops"]
        assert ag["output"] is None and ag["input_grad"] is None, ag
        prof = ag["profile"]
        _no_fallback(prof)
        fwd = sorted(c["op"] for c in prof["collectives"] if c["graph_kind"] == "forward")
        assert fwd == [f"_c10d_functional_autograd.{op}.default" for op in
                       ("all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor")]
        assert sorted(k for g, k in _by_kind(prof["collectives"]) if g == "backward") == [
            "all_gather", "all_to_all", "reduce_scatter"]


def test_transformers_tp_plan_auto_compiles_with_timed_collectives(ranks):
    if "skipped" in ranks[0]["tp_plan_auto"]:
        pytest.skip(ranks[0]["tp_plan_auto"]["skipped"])
    for rank, res in enumerate(ranks):
        tp = res["tp_plan_auto"]
        assert tp["param_device"] == "cpu"
        assert tp["sharded"]["model.layers.0.self_attn.q_proj.weight"] == "(Shard(dim=0),)"
        assert tp["sharded"]["model.layers.0.mlp.down_proj.weight"] == "(Shard(dim=1),)"
        assert tp["sharded"]["lm_head.weight"] == "(Shard(dim=0),)"
        assert tp["dynamo"] == {"unique_graphs": 1, "graph_breaks": 0}
        assert tp["output"] is None, (rank, tp["output"])
        assert tp["perturbed_output"] is not None
        prof = tp["profile"]
        # embedding_rowwise masks the ids outside the rank's vocabulary half: an int64 index_put
        assert [f["op"] for f in prof["fallbacks"]] == ["aten.index_put.default"]
        hidden = LLAMA_SEQ * 64 * 4
        # two calls; per call: the embedding's, each layer's o_proj and down_proj all_reduce, and
        # the lm_head's all_gather of the logits
        assert _by_kind(prof["collectives"]) == {
            ("inference", "all_reduce"): (2 * (1 + 2 * LLAMA_LAYERS), hidden),
            ("inference", "all_gather"): (2, LLAMA_SEQ * VOCAB * 4)}
