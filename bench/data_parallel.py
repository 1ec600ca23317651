"""DDP and FSDP2 training steps on 2 gloo ranks, neuron-compiled against eager, collectives timed.

    python bench/data_parallel.py                      # spawns 2 ranks itself
    python -m torch.distributed.run --nproc-per-node 2 bench/data_parallel.py
    python bench/data_parallel.py --wrap ddp --model transformer --steps 2 --target trn3

Each rank builds the same seeded model twice: one copy wrapped and trained eagerly, the other
wrapped the same way around ``torch.compile(..., backend="neuron")`` (functional simulation: the
values come from the simulated programs), on the rank's own seeded batches, one SGD step per
batch. Every loss and every gradient (FSDP2: the rank's shard) of the compiled run must match
the eager run (``neuron_compiler.dp.compare_runs``); ``--perturb`` shows the check failing on one
gradient element moved by 1e-3 of its tensor's largest magnitude.

- DDP: ``DistributedDataParallel(torch.compile(model, backend="neuron"))``. (On torch 2.13,
  ``torch.compile(DistributedDataParallel(model))`` compiles no graph at all: Dynamo breaks in
  DDP's ``_pre_forward`` and runs the module eagerly; a CompileCounter backend counts 0 frames.)
  The gradient all_reduce is DDP's, per bucket, outside the compiled graphs, timed through a
  DDP comm hook (``neuron_compiler.dp.time_ddp``).
- FSDP2: ``fully_shard`` on each transformer block (or each MLP layer) and on the root, then
  ``torch.compile(model, backend="neuron")``; the all_gather / reduce_scatter are FSDP2's hooks',
  outside the compiled graphs, timed through FSDP2's custom comm API
  (``neuron_compiler.dp.time_fsdp``).
- ``--wrap ddp-ca``: DDP built with ``optimize_ddp="python_reducer"`` and trained by a compiled
  step with ``compiled_autograd`` on: DDP's Python reducer all_reduces each gradient inside the
  compiled backward graph (device operations, timed there); its reference is plain eager DDP.

Exit status 0 when every compared run matches (and, with ``--perturb``, every perturbed
comparison fails), 1 otherwise.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

WORLD = 2
BATCH, SEQ = 8, 16           # per rank


class MLP(nn.Module):
    """Two Linear layers: 256 -> 512 -> 256 (1.05 MB of fp32 parameters: two DDP buckets, the
    first capped at DDP's 1 MiB)."""

    def __init__(self, d: int = 256, hidden: int = 512):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def shard_units(self) -> list[nn.Module]:
        # none: FSDP2 shards the MLP as one unit. A Linear that is an FSDP unit of its own runs
        # eagerly under torch.compile (Dynamo starts no frame in torch.nn's Linear.forward after
        # the FSDP hooks' graph break): only the ReLU between them would be compiled
        return []


class TinyTransformer(nn.Module):
    """Two pre-norm causal transformer blocks (``neuron_compiler.demo.GPTBlock``: d_model 64,
    4 heads, GELU MLP) and a linear head to 32 outputs."""

    def __init__(self, d: int = 64, layers: int = 2, out: int = 32):
        super().__init__()
        from neuron_compiler.demo import GPTBlock
        self.blocks = nn.ModuleList([GPTBlock(d, 4) for _ in range(layers)])
        self.head = nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)


MODELS = {"mlp": (MLP, (BATCH, 256), (BATCH, 256)),
          "transformer": (TinyTransformer, (BATCH // 4, SEQ, 64), (BATCH // 4, SEQ, 32))}


HOOK_PATH = {"ddp": "DDP comm hook", "fsdp2": "FSDP2 comm API",
             "ddp-ca": "hooks; the rest are in the compiled backward graph"}
PYTHON_REDUCER = {"optimize_ddp": "python_reducer", "compiled_autograd": True}


def _wrap(model: nn.Module, wrap: str, compiled: bool, options: dict) -> nn.Module:
    """The model as trained: DDP or FSDP2, around the compiled module or not; hooks timed.
    ``ddp-ca`` compiled: DDP with its Python reducer (built under ``PYTHON_REDUCER``), compiled
    with the step (``run_case``); eager: plain DDP."""
    from neuron_compiler.dp import time_ddp, time_fsdp
    target = options.get("target", "trn2")
    if wrap == "ddp-ca" and compiled:
        from torch.nn.parallel import DistributedDataParallel as DDP
        with torch._dynamo.config.patch(**PYTHON_REDUCER):
            return DDP(model)
    if wrap in ("ddp", "ddp-ca"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        inner = torch.compile(model, backend="neuron", options=options) if compiled else model
        return time_ddp(DDP(inner), target)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (WORLD,))
    for unit in model.shard_units():
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    time_fsdp(model, target)
    return torch.compile(model, backend="neuron", options=options) if compiled else model


def run_case(rank: int, wrap: str, model_name: str, steps: int, options: dict,
             perturb: bool = False, trace_dir: str | None = None) -> dict:
    """One wrap x model on this rank: eager and compiled runs, their comparison, the profile."""
    import neuron_compiler
    from neuron_compiler.dp import (GRAD_CANCELLATION, GRAD_RTOL, batches, compare_runs,
                                    hook_collective_time_us, perturbed, train, worst_error)
    cls, xs, ys = MODELS[model_name]
    torch.manual_seed(0)
    base = cls()
    data = batches(steps, xs, ys, seed=1000 + rank)          # each rank its own data
    eager_model = copy.deepcopy(base)
    eager = train(_wrap(eager_model, wrap, False, options), eager_model, data, F.mse_loss)
    comp_model = copy.deepcopy(base)
    wrapped = _wrap(comp_model, wrap, True, options)
    if wrap == "ddp-ca":       # the whole step compiled: compiled autograd traces the backward
        with torch._dynamo.config.patch(**PYTHON_REDUCER), neuron_compiler.profile() as prof:
            compiled = train(wrapped, comp_model, data, F.mse_loss, compile_step=lambda f:
                             torch.compile(f, backend="neuron", options=options))
    else:
        with neuron_compiler.profile() as prof:
            compiled = train(wrapped, comp_model, data, F.mse_loss)
    d = prof.to_dict()
    failures = compare_runs(eager, compiled)
    out = {"wrap": wrap, "model": model_name, "steps": steps, "rank": rank,
           "params": sum(p.numel() for p in base.parameters()),
           "losses_eager": eager.losses, "losses_compiled": compiled.losses,
           "tensors_compared": sum(len(g) for g in compiled.grads),
           "grad_elements": sum(g.numel() for g in compiled.grads[0].values()),
           "worst_loss_rel": worst_error(eager, compiled)[0],
           "worst_grad_rel": worst_error(eager, compiled)[1],
           "tolerance": f"|a - e| <= {GRAD_CANCELLATION:g} x mean|e| + {GRAD_RTOL:g} x |e|",
           "failures": failures,
           "grad_norms": [{n: float(g.double().norm()) for n, g in step.items()}
                          for step in compiled.grads],
           "device_nodes": d["device_nodes"], "fallback_nodes": d["fallback_nodes"],
           "fallbacks": d["fallbacks"], "target": d["target"],
           "steady_state": d["steady_state"], "warmup": d["warmup"],
           "collectives": d["collectives"],
           "hook_collective_time_us": hook_collective_time_us(d),
           "graphs": [(g["name"], g["kind"], g["calls"]) for g in d["graphs"]],
           "device_ops": sorted({op for p in d["partitions"] for op in p["ops"]})}
    if perturb:
        name = sorted(compiled.grads[-1])[0]
        out["perturbed"] = {"grad": name, "step": steps - 1,
                            "failures": compare_runs(eager, perturbed(compiled, steps - 1, name))}
    if trace_dir:
        path = os.path.join(trace_dir, f"{wrap}_{model_name}_rank{rank}.json")
        prof.export_chrome_trace(path)
        out["trace"] = path
        if rank == 0:
            out["summary"] = prof.summary()
    return out


def run_rank(rank: int, cfg: dict) -> list[dict]:
    """Every case of ``cfg`` on this rank (the process group is open)."""
    import warnings
    # FSDP2 warns that the root returns a view (an in-place op on it would skip a hook); the
    # loss here reads it out of place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    return [run_case(rank, w, m, cfg["steps"], cfg["options"], cfg.get("perturb", False),
                     cfg.get("trace_dir")) for w, m in cfg["cases"]]


def report(results: list[list[dict]]) -> tuple[str, bool]:
    """Text for all ranks' results (a list per rank); True when every comparison held."""
    lines, ok = [], True
    for i, case in enumerate(results[0]):
        per_rank = [r[i] for r in results]
        lines += ["", f"== {case['wrap'].upper()} x {case['model']} ({case['params']:,} parameters), "
                  f"{case['steps']} SGD step(s), {len(results)} gloo ranks, target {case['target']}"]
        for c in per_rank:
            verdict = "PASS" if not c["failures"] else f"FAIL ({len(c['failures'])})"
            ok &= not c["failures"]
            lines.append(
                f"  rank {c['rank']}: loss eager " + " ".join(f"{v:.6f}" for v in c["losses_eager"])
                + " | compiled " + " ".join(f"{v:.6f}" for v in c["losses_compiled"]))
            lines.append(
                f"          {c['tensors_compared']} gradients ({c['grad_elements']:,} elements per "
                f"step) + {c['steps']} loss(es); worst loss error {c['worst_loss_rel']:.1e} "
                f"(relative), worst gradient error {c['worst_grad_rel']:.1e} of the tensor's max; "
                f"{c['tolerance']}: {verdict}")
            for f in c["failures"][:3]:
                lines.append(f"            {f}")
            if "perturbed" in c:
                p = c["perturbed"]
                lines.append(f"          --perturb: {p['grad']} at step {p['step']} moved by 1e-3 "
                             f"of its max: {'FAIL as expected' if p['failures'] else 'NOT DETECTED'}"
                             + (f": {p['failures'][0]}" if p["failures"] else ""))
                ok &= bool(p["failures"])
        for c in per_rank:
            lines.append(f"  rank {c['rank']}'s profile: {sum(x['calls'] for x in c['collectives'])} "
                         f"collective calls, {sum(x['time_us'] for x in c['collectives']):.2f} us "
                         f"modelled ({c['hook_collective_time_us']:.2f} us through the "
                         f"{HOOK_PATH[c['wrap']]})")
        c = per_rank[0]
        ss, phase = c["steady_state"], "steady state"
        if not ss["graph_calls"]:                    # one step: only warm-up calls
            ss, phase = c["warmup"], "first step (warm-up)"
        lines.append(f"  device: {c['device_nodes']} ATen nodes on device, {c['fallback_nodes']} "
                     f"fallback; graphs: " + ", ".join(f"{n} ({k}, {calls} calls)"
                                                       for n, k, calls in c["graphs"]))
        lines.append(f"  ops on the device: {', '.join(c['device_ops'])}")
        for fb in c["fallbacks"]:
            lines.append(f"  fallback: {fb['op']} x{fb['count']}: {fb['reason'][:100]}")
        lines.append(f"  per step (rank 0, {phase}, modelled, nothing overlapped): "
                     f"simulated compute {ss['simulated_time_us']:.2f} us, transfers "
                     f"{ss['transfer_time_us']:.2f} us, collectives "
                     f"{ss['collective_time_us']:.2f} us (in-graph and the hooks')")
        lines.append(f"  collectives (rank 0; each rank's profile has its own):")
        lines.append(f"    {'op':<44} {'kind':<14} {'ranks':>5} {'bytes':>9} {'algorithm':>9} "
                     f"{'bound':>7} {'calls':>5} {'us/call':>8}")
        for col in c["collectives"]:
            lines.append(f"    {col['op']:<44} {col['kind']:<14} {col['ranks']:>5} "
                         f"{col['bytes']:>9,} {col['algorithm']:>9} {col['bound']:>7} "
                         f"{col['calls']:>5} {col['time_per_call_us']:>8.2f}")
        if c.get("summary"):
            lines += ["", c["summary"]]
    return "\n".join(lines), ok


def _spawned(rank: int, cfg: dict, store: str) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        res = run_rank(rank, cfg)
    finally:
        dist.destroy_process_group()
    with open(f"{store}.rank{rank}.json", "w") as f:
        json.dump(res, f)


def parse(argv: list[str] | None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wrap", choices=("ddp", "fsdp2", "ddp-ca", "both", "all"), default="both",
                    help="both (default): ddp and fsdp2; ddp-ca: DDP under compiled autograd; all")
    ap.add_argument("--model", choices=("mlp", "transformer", "pair"), default="pair",
                    help="pair (default): DDP x mlp and FSDP2 x transformer")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--perturb", action="store_true",
                    help="also move one gradient element and show that the comparison fails")
    ap.add_argument("--trace-dir", help="write each rank's Chrome trace there (and print rank "
                                        "0's profile summary)")
    a = ap.parse_args(argv)
    wraps = {"both": ("ddp", "fsdp2"), "all": ("ddp", "fsdp2", "ddp-ca")}.get(a.wrap, (a.wrap,))
    if a.model == "pair":
        pair = {"ddp": "mlp", "fsdp2": "transformer", "ddp-ca": "mlp"}
        cases = [(w, pair[w]) for w in wraps]
    else:
        cases = [(w, a.model) for w in wraps]
    return {"cases": cases, "steps": a.steps, "options": {"target": a.target, "fallback": "allow"},
            "perturb": a.perturb, "trace_dir": a.trace_dir}


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg["trace_dir"]:
        os.makedirs(cfg["trace_dir"], exist_ok=True)
    if "RANK" in os.environ:                        # launched by torchrun
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        res = run_rank(rank, cfg)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, res)
        dist.destroy_process_group()
        if rank:
            return 0
    else:
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            mp.spawn(_spawned, args=(cfg, store), nprocs=WORLD, join=True)
            everyone = []
            for r in range(WORLD):
                with open(f"{store}.rank{r}.json") as f:
                    everyone.append(json.load(f))
    text, ok = report(everyone)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
