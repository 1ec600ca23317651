"""DDP and FSDP2 training steps on two gloo ranks: neuron-compiled against eager, collectives timed.

One spawn (module fixture) runs ``bench/data_parallel.py``'s two cases on both ranks (DDP
around a neuron-compiled 2-layer MLP, FSDP2 around a compiled two-block transformer; 2 SGD
steps each, each rank its own data) and writes what each rank saw; the tests read it. The
comparison's own failure is shown with a gradient moved by 1e-3 of its tensor's largest value.
The tests of ``compare_runs`` at the bottom run in this process (no ranks).
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from ranks import run_ranks

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, os.path.abspath(EXAMPLES))     # spawned ranks inherit sys.path

WORLD, STEPS = 2, 2


def _rank(rank: int) -> dict:
    import data_parallel as ex
    cfg = {"cases": [("ddp", "mlp"), ("fsdp2", "transformer")], "steps": STEPS,
           "options": {"target": "trn2"}, "perturb": True,
           "trace_dir": os.environ["NEURON_TEST_OUT"]}
    ddp, fsdp = ex.run_rank(rank, cfg)
    for case in (ddp, fsdp):
        case.pop("summary", None)
        with open(case["trace"]) as f:
            case["trace_events"] = [e for e in json.load(f)["traceEvents"]
                                    if e.get("cat") == "collective"]
    return {"ddp": ddp, "fsdp2": fsdp}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_rank, tmp_path_factory.mktemp("data_parallel"), WORLD)


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_losses_and_every_gradient_match_eager(ranks, wrap):
    for res in ranks:
        case = res[wrap]
        assert case["failures"] == [], case["failures"]
        assert len(case["losses_compiled"]) == STEPS
        assert case["tensors_compared"] == STEPS * len(case["grad_norms"][0]) > 0
        # the compiled graphs ran on the simulated device (a fallback would compare eager to eager)
        assert case["fallback_nodes"] == 0 and case["device_nodes"] > 0
        # the layers themselves, not only the glue between them (an FSDP unit Dynamo does not
        # compile would leave the matmuls eager and the comparison eager against eager)
        assert {"aten.addmm.default", "aten.mm.default"} <= set(case["device_ops"])
        assert any(k == "backward" and calls == STEPS for _, k, calls in case["graphs"])


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_a_gradient_moved_by_1e_3_of_its_max_fails(ranks, wrap):
    for res in ranks:
        p = res[wrap]["perturbed"]
        assert len(p["failures"]) == 1 and p["grad"] in p["failures"][0], p


def test_ddp_gradients_are_averaged_over_the_ranks(ranks):
    r0, r1 = ranks[0]["ddp"], ranks[1]["ddp"]
    assert r0["losses_compiled"] != r1["losses_compiled"]          # each rank its own data
    assert r0["grad_norms"] == r1["grad_norms"]                   # one all_reduced gradient


def test_ddp_bucket_all_reduce_is_timed_through_the_comm_hook(ranks):
    grad_bytes = 262_912 * 4                                      # the MLP's fp32 gradients
    for res in ranks:
        case = res["ddp"]
        colls = case["collectives"]
        assert {c["kind"] for c in colls} == {"all_reduce"}
        assert {c["graph"] for c in colls} == {"ddp_comm_hook"}
        assert all(c["op"].startswith("c10d.allreduce (DDP bucket ") for c in colls)
        # every gradient byte is all_reduced once per step (DDP rebuilds its buckets after
        # the first step: one bucket, then two)
        assert sum(c["bytes"] * c["calls"] for c in colls) == STEPS * grad_bytes
        assert all(c["ranks"] == WORLD and c["time_per_call_us"] > 0 for c in colls)
        assert case["hook_collective_time_us"] == pytest.approx(sum(c["time_us"] for c in colls))
        assert len(case["trace_events"]) == len(colls)
        # filed under the step they belong to (the last graph call's phase): the first step's
        # buckets are warm-up, the second's the steady state (one call of each graph)
        assert STEPS == 2
        first = sum(c["time_per_call_us"] for c in colls if c["bytes"] == grad_bytes)
        assert case["warmup"]["collective_time_us"] == pytest.approx(first)
        assert case["steady_state"]["collective_time_us"] == pytest.approx(
            case["hook_collective_time_us"] - first)


def test_ddp_hook_time_is_the_collective_model(ranks):
    from runtime_sim.collectives import collective_cost
    for c in ranks[0]["ddp"]["collectives"]:
        want = collective_cost("all_reduce", c["bytes"], WORLD, "trn2", 1).total_ns / 1e3
        assert c["time_per_call_us"] == pytest.approx(want)


def test_fsdp2_all_gather_and_reduce_scatter_are_timed_per_module(ranks):
    for res in ranks:
        case = res["fsdp2"]
        calls: dict[tuple[str, str], int] = {}
        nbytes: dict[tuple[str, str], int] = {}
        for c in case["collectives"]:
            assert c["graph"] == "fsdp2_comm" and c["ranks"] == WORLD and c["time_per_call_us"] > 0
            unit = c["op"].split("(FSDP2 ")[1].rstrip(")")
            calls[(c["kind"], unit)] = calls.get((c["kind"], unit), 0) + c["calls"]
            nbytes[(c["kind"], unit)] = c["bytes"]
        units = ("blocks.0", "blocks.1", "root")
        # each block is gathered before its forward and again before its backward (resharded
        # after forward); the root keeps its parameters (FSDP2 does not reshard the root);
        # every unit's gradients are reduce-scattered once per step
        assert calls == {**{("all_gather", u): 2 * STEPS for u in units[:2]},
                         ("all_gather", "root"): STEPS,
                         **{("reduce_scatter", u): STEPS for u in units}}, calls
        block = (64 * 2 * 2 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) * 4
        assert nbytes[("all_gather", "blocks.0")] == block          # unsharded fp32, even split
        assert nbytes[("reduce_scatter", "blocks.1")] == block
        assert nbytes[("all_gather", "root")] == (64 * 32 + 32) * 4
        assert len(case["trace_events"]) == len(case["collectives"])


# ---- compare_runs in this process --------------------------------------------------------------
def _run():
    from neuron_compiler.dp import Run
    gen = torch.Generator().manual_seed(0)
    return Run([1.5, 1.25], [{"w": torch.randn(16, 8, generator=gen) * 1e-3,
                              "b": torch.randn(8, generator=gen)} for _ in range(2)])


def test_compare_runs_passes_itself_and_rounding():
    from neuron_compiler.dp import Run, compare_runs
    run = _run()
    assert compare_runs(run, run) == []
    noisy = Run([v * (1 + 1e-7) for v in run.losses],
                [{k: v * (1 + 1e-6) for k, v in g.items()} for g in run.grads])
    assert compare_runs(run, noisy) == []


def test_compare_runs_fails_on_one_element_a_halved_gradient_and_a_loss():
    from neuron_compiler.dp import Run, compare_runs, perturbed
    run = _run()
    bad = compare_runs(run, perturbed(run, 1, "w", 1e-3))
    assert len(bad) == 1 and "step 1 grad w" in bad[0]
    halved = Run(run.losses, [{**g, "b": g["b"] / 2} for g in run.grads])
    assert len(compare_runs(run, halved)) == 2
    assert "step 0 loss" in compare_runs(run, Run([1.5 * (1 + 1e-3), 1.25], run.grads))[0]
    assert compare_runs(run, Run(run.losses[:1], run.grads[:1]))[0].startswith("steps:")


def test_time_fsdp_refuses_a_model_without_fully_shard():
    from neuron_compiler.dp import time_fsdp
    with pytest.raises(ValueError, match="fully_shard"):
        time_fsdp(torch.nn.Linear(2, 2))


# ---- DDP under compiled autograd: the all_reduce inside the compiled backward (slow: own spawn) --
def _rank_ca(rank: int) -> dict:
    import data_parallel as ex
    (case,) = ex.run_rank(rank, {"cases": [("ddp-ca", "mlp")], "steps": STEPS,
                                 "options": {"target": "trn2"}})
    return case


@pytest.mark.slow
def test_ddp_under_compiled_autograd_all_reduces_inside_the_backward_graph(tmp_path):
    for case in run_ranks(_rank_ca, tmp_path, WORLD):
        assert case["failures"] == [], case["failures"]
        assert {"aten.addmm.default", "aten.mm.default"} <= set(case["device_ops"])
        colls = case["collectives"]
        # the Python reducer all_reduces each of the 4 parameters' gradients, per step, as
        # _c10d_functional ops of the compiled backward graph (no hook)
        assert {c["op"] for c in colls} == {"_c10d_functional.all_reduce.default"}
        assert sum(c["calls"] for c in colls) == 4 * STEPS
        assert sum(c["bytes"] * c["calls"] for c in colls) == STEPS * 262_912 * 4
        assert case["hook_collective_time_us"] == 0.0
        assert case["steady_state"]["collective_time_us"] > 0
