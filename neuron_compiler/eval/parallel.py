"""``neuron-eval --tp N`` / ``--dp N``: one rank simulated for all (issue 24, item 4).

When every rank runs the same program, simulating one is enough: the model is rewritten into
rank 0 of the parallel group and compiled and timed as usual; its collectives are device
operations timed by the topology model (``runtime_sim.collectives``) as among all the group's
ranks.
- ``--tp N``: ``neuron_compiler.tp.shard_decoder`` (Megatron column/row parallel q/k/v/o and
  gate/up/down with an all_reduce after o_proj and down_proj, GPT-2's fused c_attn / c_proj /
  c_fc / mlp.c_proj alike; a vocabulary-parallel lm_head whose logits are all-gathered), in a
  single-process group of N ranks (``tp.fake_group``).
- ``--dp N``: every rank holds the whole model and its own batch. An inference call has no
  collective, so one rank's latency is every rank's and the group serves N times the throughput
  of one (``throughput_per_s`` x N in ``model.parallel``). With ``--train``, the gradient
  all_reduce of a DDP step is not in the compiled graph (it is issued by DDP's hooks): it is
  timed here by the model as DDP buckets it (25 MiB buckets, torch's default ``bucket_cap_mb``;
  one all_reduce per bucket of the gradients in float32 or their dtype), and reported apart in
  ``model.parallel.dp_gradient_all_reduce_us`` (not added to the step's latency: DDP overlaps
  it with the backward; the step is at least max(latency, that time)).

Invariants
- The values are one rank's: with the single-process group an all_reduce returns its input and
  an all_gather leaves the other ranks' parts unset, so the generated tokens are not the
  model's. Accuracy is therefore not judged under ``--tp`` (``accuracy.not_checked`` says why;
  ``tests/distributed/test_tp_models.py`` checks the sharded values on two gloo ranks).
- ``--tp 1`` and ``--dp 1`` change nothing.
"""
from __future__ import annotations

DDP_BUCKET_BYTES = 25 * 1024 * 1024   # torch DistributedDataParallel bucket_cap_mb default 25

NOT_CHECKED = ("--tp: one rank of {n} simulated with a single-process group (its all_reduce "
               "returns the rank's partial sums, its all_gather leaves the other ranks' logits "
               "unset), so the tokens and logits are not the model's and are not compared; the "
               "sharded values are checked by tests/distributed/test_tp_models.py on two gloo "
               "ranks")


def apply_tp(loaded: object, world: int) -> dict:
    """Shard ``loaded.model`` in place into rank 0 of ``world``; returns ``model.parallel``."""
    from neuron_compiler.tp import fake_group, materialize, shard_decoder
    if world <= 1:
        materialize(loaded.model)      # a model built on the meta device (zoo:llama3-8b)
        return {}
    if not hasattr(loaded.model, "config"):
        raise ValueError("--tp needs a transformers Llama-family or GPT-2 model (with .config "
                         f"and its decoder layers), got {type(loaded.model).__name__}")
    group = fake_group(world)
    shard_decoder(loaded.model, world, 0, group)
    return {"tp": world, "rank_simulated": 0,
            "scheme": ("Megatron: c_attn (q|k|v), c_fc column-parallel; c_proj, mlp.c_proj "
                       "row-parallel + all_reduce" if hasattr(loaded.model, "transformer") else
                       "Megatron: q/k/v, gate/up column-parallel; o_proj, down_proj row-parallel "
                       "+ all_reduce") + "; lm_head vocabulary-parallel + all_gather; embeddings, "
                      "norms replicated",
            "collectives": "timed by runtime_sim.collectives among the group's ranks"}


def dp_entry(report: dict, world: int, train: bool, lnc: int = 1) -> dict:
    """``model.parallel`` for ``--dp``: throughput of the group and, with ``--train``, the
    gradient all_reduce of a DDP step per target (module docstring)."""
    from runtime_sim.collectives import collective_cost
    out: dict = {"dp": world, "rank_simulated": 0, "throughput_per_s": {}}
    for name, t in report.get("targets", {}).items():
        if t.get("throughput_per_s"):
            out["throughput_per_s"][name] = t["throughput_per_s"] * world
    if train:
        grad = int(report.get("model", {}).get("weight_bytes", 0))
        buckets = [DDP_BUCKET_BYTES] * (grad // DDP_BUCKET_BYTES)
        if grad % DDP_BUCKET_BYTES:
            buckets.append(grad % DDP_BUCKET_BYTES)
        out["dp_gradient_bytes"] = grad
        out["dp_buckets"] = len(buckets)
        out["dp_gradient_all_reduce_us"] = {
            name: sum(collective_cost("all_reduce", b, world, name, lnc).total_ns for b in buckets)
            / 1e3 for name in report.get("targets", {})}
    return out


def finish(report: dict, tp: int, dp: int, parallel: dict, train: bool, lnc: int = 1) -> None:
    """Record the parallel setting in the report (and the accuracy note of ``--tp``)."""
    if dp > 1:
        parallel = {**parallel, **dp_entry(report, dp, train, lnc)}
    if not parallel:
        return
    report["model"]["parallel"] = parallel
    if tp > 1:
        tp_costs(report, tp, lnc)
        acc = report.setdefault("accuracy", {})
        acc["not_checked"] = NOT_CHECKED.format(n=tp)
        acc["not_checked_outputs"] = acc.get("outputs", [])   # kept, not judged
        acc["outputs"] = []
        acc["passed"] = True


def tp_costs(report: dict, tp: int, lnc: int = 1) -> None:
    """Each target's cost for a replica of ``tp`` ranks: a rank is one logical core of ``lnc``
    physical cores (the compile's option, by which the collectives place the ranks too), so a
    replica occupies ``tp`` x ``lnc`` physical NeuronCores of the instance."""
    from neuron_compiler.eval.prices import per_replica
    for t in report.get("targets", {}).values():
        if "cost" not in t:
            continue
        t["cost"] = per_replica(t["cost"], tp * lnc,
                                f"--tp {tp} ranks x LNC={lnc} physical cores per rank, the "
                                "compile's lnc, by which the collectives place the ranks too")


def text(parallel: dict) -> str:
    """One line for the terminal report."""
    parts = []
    if parallel.get("tp"):
        parts.append(f"--tp {parallel['tp']}: rank 0 of {parallel['tp']} simulated "
                     f"({parallel['scheme']}); collectives {parallel['collectives']}")
    if parallel.get("dp"):
        s = f"--dp {parallel['dp']}: one rank simulated; group throughput " + ", ".join(
            f"{k} {v:,.1f}/s" for k, v in parallel["throughput_per_s"].items())
        if "dp_gradient_all_reduce_us" in parallel:
            s += (f"; gradient all_reduce per step ({parallel['dp_buckets']} DDP bucket(s) of "
                  "at most 25 MiB, modelled, overlapped with backward, not added): " + ", ".join(
                      f"{k} {v:,.1f} us" for k, v in parallel["dp_gradient_all_reduce_us"].items()))
        parts.append(s)
    return "; ".join(parts)
