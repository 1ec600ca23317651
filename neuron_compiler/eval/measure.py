"""One ``neuron-eval`` run: eager reference, compile, accuracy, steady state per target.

Phases, in order (each target is compiled afresh after ``torch._dynamo.reset()``):
1. eager reference (``torch.no_grad()``): ``--warmup`` + ``--iters`` eager calls, the same
   counts as the device figures, each on fresh input copies (copied outside the timer); the
   reference outputs are the first call's, ``eager_time_ms`` is the p50 of the ``--iters``
   timed calls after the warm-up (the first, cold call is reported beside it); one more
   eager call under ``FlopCounterMode`` and a live-tensor tracker gives the model's FLOPs
   and its peak of live intermediate bytes (the activation estimate);
2. ``torch._dynamo.explain``: Dynamo graphs and graph breaks with their reasons;
3. per target: ``--warmup`` calls (the first compiles), then ``--iters`` calls, each inside
   its own ``neuron_compiler.profile()``; every call gets fresh copies of the inputs, so it pays
   the host->device copy of its inputs as a real inference would (the weights stay resident);
4. accuracy of the last call's outputs against the eager reference.

Invariants
- Latency of one call = simulated device time + host<->device transfer time (over the host
  link in force) + the runtime's per-call overhead of each device-partition call + measured
  eager wall time of the fallback ops, from that call's profile;
  p50/p90/p99 are numpy's linear-interpolation percentiles over the ``--iters`` calls.
  Compile time is never part of it.
- A fallback op's ``time_us`` is the mean over the ``--iters`` measured calls of its measured
  host wall time in each call; its ``share_of_latency`` is the sum over those same calls of
  that time divided by the sum of their latencies (= ``time_us`` / mean latency). Each call's
  fallback time is part of that call's latency, so a share is in [0, 1], and the shares of
  all fallback ops sum to at most 1.
- Nothing in the model's outputs is modified; accuracy compares the compiled call's outputs
  with the eager reference of the same inputs.
- A failure of the compiled model (Dynamo, the backend, the lowering, ``fallback="error"``)
  raises ``CompileFailure`` naming the target (a ``fallback="error"`` refusal is worded for the
  command line: the ``--fallback`` flag, not the Python ``options=``); a failure of the eager
  model raises ``ModelFailure``. Usage problems were raised before (``zoo.ModelSpecError``),
  except one found only by running: ``--train`` on a model with no floating-point output
  raises ``ModelSpecError`` from the eager training step (exit 2, never wrapped).
- ``targets.T.assumptions`` is the host link and per-call overhead in force with their
  sources, as the last measured call's profile recorded them (``neuron_compiler.assumptions``);
  ``targets.T.options`` holds ``host_link_gbps`` / ``call_overhead_us`` only when set, so a
  report with the defaults compares with a baseline written before these options existed.
- Every number in the result is JSON-ready (str/int/float/bool/None/list/dict).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

import neuron_compiler
from neuron_compiler.cache import target_hash
from neuron_compiler.errors import NeuronFallbackError
from neuron_compiler.eval import prices
from neuron_compiler.eval.accuracy import Thresholds, compare_outputs, dtype_name
from neuron_compiler.eval.flops import count_host_flops, flop_share
from neuron_compiler.eval.zoo import LoadedModel, ModelSpecError

# runtime_sim engine keys -> the names AWS's profiler uses
ENGINE_NAMES = {"pe": "TensorE", "dve": "VectorE", "act": "ScalarE", "pool": "GpSimdE",
                "dma": "DMA"}


def _fallback_refusal(exc: BaseException) -> NeuronFallbackError | None:
    """The ``NeuronFallbackError`` behind ``exc`` (Dynamo wraps backend errors), if any."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, NeuronFallbackError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


class CompileFailure(RuntimeError):
    """The model did not compile (or its compiled form raised) for ``target``."""

    def __init__(self, target: str, exc: BaseException):
        self.target = target
        self.exc = exc
        refusal = _fallback_refusal(exc)
        if refusal is not None:
            self.detail = ("--fallback error: these ops cannot run on the device:\n"
                           + "\n".join(f"  {op} (x{n}): {reason}"
                                       for op, n, reason in refusal.entries)
                           + "\n(run with --fallback allow, the default, to run them in eager "
                             "PyTorch and measure what they cost)")
        else:
            self.detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        super().__init__(f"{target}: {self.detail}")


class ModelFailure(RuntimeError):
    """The model raised in eager PyTorch (no reference to compare with)."""


@dataclass
class EvalConfig:
    targets: list[str]
    warmup: int = 1
    iters: int = 10
    sim_mode: str = "functional"
    fallback: str = "allow"
    thresholds: dict[str, Thresholds] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)   # --price overrides
    train: bool = False                                       # one training step per call
    generate: int = 0                     # --generate N: tokens per generation (0: inference)
    prompt_len: int | None = None         # --prompt-len L (None: the input's length, or 8)
    buckets: str | None = None            # --buckets: "auto" or "L1,L2,..." (None: no padding)
    auto_cast: str = "none"                                   # the backend option
    host_link_gbps: float | None = None                       # backend options; None: default
    call_overhead_us: float | None = None

    def effective_thresholds(self) -> dict[str, Thresholds]:
        """With ``auto_cast``, fp32 outputs are judged by the bfloat16 thresholds."""
        if self.auto_cast == "none":
            return self.thresholds
        return {**self.thresholds, "float32": self.thresholds["bfloat16"]}
    progress: Callable[[str], None] = lambda msg: None


# ---- versions ---------------------------------------------------------------------------------
def _git(*args: str) -> str | None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(neuron_compiler.__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions(targets: list[str]) -> dict:
    def version_of(mod: str) -> str | None:
        m = sys.modules.get(mod)
        if m is None:
            try:
                m = __import__(mod)
            except ImportError:
                return None
        return str(getattr(m, "__version__", None))
    try:
        from importlib.metadata import version
        installed = version("neuron-sim")
    except Exception:   # not installed: running from a checkout on PYTHONPATH
        installed = None
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        # 2: device_share.by_flops counts ATen FLOPs, cost.price_status; 3: eager_time_ms is a
        # warm p50, fallbacks' time_us/share_of_latency over the measured calls, "baseline"
        "report_schema": 3,
        "neuron_sim": neuron_compiler.__version__,
        "neuron_sim_installed": installed,
        "git_commit": commit,
        "git_dirty": (bool(dirty) if dirty is not None else None) if commit else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "ml_dtypes": version_of("ml_dtypes"),
        "transformers": (version_of("transformers") if "transformers" in sys.modules
                         else None),
        "platform": platform.platform(),
        "target_descriptions": {t: target_hash(t) for t in targets},
    }


# ---- eager reference --------------------------------------------------------------------------
class _LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensors produced by ops (each storage counted once, at its first
    producer; freed when that tensor is collected): an estimate of activation memory."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                key = st.data_ptr()
                if key == 0 or key in self._seen:
                    continue
                n = st.nbytes()
                self._seen.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, key, n)
        return out


def _fresh(obj: object) -> object:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, obj)


def _call(loaded: LoadedModel, fn: Callable) -> object:
    return fn(*_fresh(loaded.args), **_fresh(loaded.kwargs))


def _tensor_specs(obj: object, prefix: str) -> list[dict]:
    from neuron_compiler.eval.accuracy import flatten_outputs
    return [{"name": n, "shape": list(t.shape), "dtype": dtype_name(t.dtype)}
            for n, t in flatten_outputs(obj, prefix)]


def eager_reference(loaded: LoadedModel, warmup: int = 1,
                    iters: int = 1) -> tuple[object, dict]:
    """(reference outputs, the report's ``model`` entry); ``warmup`` + ``iters`` eager calls,
    the reference is the first call's outputs, the timing the ``iters`` calls after warm-up."""
    from neuron_compiler.eval.flops import model_flop_counter
    model = loaded.model
    times_s: list[float] = []
    try:
        with torch.no_grad():
            for i in range(warmup + max(1, iters)):
                args, kwargs = _fresh(loaded.args), _fresh(loaded.kwargs)
                t0 = time.perf_counter()
                out = model(*args, **kwargs)
                times_s.append(time.perf_counter() - t0)
                if i == 0:
                    ref = out
                del out
            live = _LiveBytes()
            with model_flop_counter() as fc, live:
                _call(loaded, model)
    except Exception as exc:
        raise ModelFailure(f"the model raised in eager PyTorch: "
                           f"{type(exc).__name__}: {exc}") from exc
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    buffers = list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    seen: dict[int, int] = {}
    for t in params + buffers:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    inputs = {"args": loaded.args, "kwargs": loaded.kwargs}
    input_bytes = sum(t.numel() * t.element_size() for t in tree_leaves(inputs)
                      if isinstance(t, torch.Tensor))
    return ref, {
        "spec": loaded.spec,
        "class": type(model).__name__,
        "description": loaded.description,
        "parameters": int(sum(p.numel() for p in params)),
        "weight_bytes": int(sum(seen.values())),
        "input_bytes": int(input_bytes),
        "activation_peak_bytes": int(live.peak),
        "inputs": (_tensor_specs(list(loaded.args), "arg")
                   + [s for k, v in loaded.kwargs.items() for s in _tensor_specs(v, k)]),
        "outputs": _tensor_specs(ref, "out"),
        "flops": int(fc.get_total_flops()),
        "eager_time_ms": float(np.median(times_s[warmup:])) * 1e3,
        "eager_samples_ms": [t * 1e3 for t in times_s[warmup:]],
        "eager_warmup": warmup,
        "eager_first_call_ms": times_s[0] * 1e3,
    }


def explain(loaded: LoadedModel) -> dict:
    """Dynamo graphs and graph breaks (``torch._dynamo.explain``); never raises."""
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            ex = torch._dynamo.explain(loaded.model)(*_fresh(loaded.args),
                                                     **_fresh(loaded.kwargs))
    except Exception as exc:
        return {"graphs": None, "graph_breaks": None, "break_reasons": [],
                "explain_error": f"{type(exc).__name__}: {exc}"}
    reasons = []
    for r in ex.break_reasons:
        frame = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        reasons.append({"reason": str(r.reason).strip(),
                        "where": f"{frame.filename}:{frame.lineno}" if frame else None})
    return {"graphs": ex.graph_count, "graph_breaks": ex.graph_break_count,
            "break_reasons": reasons, "explain_error": None}


# ---- per target -------------------------------------------------------------------------------
def _percentiles(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()),
            "min": float(a.min()), "max": float(a.max())}


def _call_latency(d: dict) -> tuple[float, float, float, float, float]:
    """(simulated, transfer, fallback, call overhead, collectives) of one call's profile; the
    sum is its latency (collectives: modelled, runtime_sim.collectives; not overlapped)."""
    return (d["simulated_time_us"], d["transfer_time_us"], d["fallback_time_us"],
            d.get("call_overhead_time_us", 0.0), d.get("collective_time_us", 0.0))


def _assumptions(d: dict, target: str, options: dict) -> dict:
    """The host link and per-call overhead in force on ``target`` with their sources: the
    profile's record, or (no graph ran) what the options resolve to."""
    from neuron_compiler.assumptions import host_assumptions
    from neuron_compiler.options import NeuronOptions
    found = [a for a in d.get("assumptions", []) if a["target"] == target]
    a = found[0] if found else host_assumptions(NeuronOptions.from_user(options)).to_dict()
    return {k: v for k, v in a.items() if k != "target"}


def _engines(parts: list[dict]) -> dict:
    """Busy fraction per engine, weighted by each partition's simulated time per call."""
    total = sum(p["simulated_time_per_call_us"] * p["calls"] for p in parts)
    busy: dict[str, float] = {}
    for p in parts:
        w = p["simulated_time_per_call_us"] * p["calls"]
        for k, v in p["engine_busy"].items():
            name = ENGINE_NAMES.get(k, k)
            busy[name] = busy.get(name, 0.0) + v * w
    return {k: (v / total if total else 0.0) for k, v in sorted(busy.items())}


def _memory(target: str, model_info: dict, parts: list[dict]) -> dict:
    """HBM estimate against capacity, SBUF/PSUM peaks (``--train``: the step's live peak and
    the gradients, from ``model.train``)."""
    from runtime_sim.targets import get_target
    tgt = get_target(target)
    chip = prices.HBM_BYTES_PER_CHIP[target]
    core = chip // tgt.cores_per_chip
    train = model_info.get("train") or {}
    act = train.get("activation_peak_bytes", model_info["activation_peak_bytes"])
    grads = train.get("gradient_bytes", 0) + train.get("optimizer_state_bytes", 0)
    hbm = model_info["weight_bytes"] + act + model_info["input_bytes"] + grads
    sbuf = max((p["sbuf_peak_bytes"] for p in parts), default=0)
    psum = max((p["psum_peak_bytes"] for p in parts), default=0)
    return {
        "weights_bytes": model_info["weight_bytes"],
        "activations_bytes": act,
        "gradients_bytes": grads,
        "inputs_bytes": model_info["input_bytes"],
        "hbm_bytes": hbm,
        "hbm_capacity_core_bytes": core,
        "hbm_capacity_chip_bytes": chip,
        "hbm_fraction_of_core": hbm / core,
        "fits_one_core": hbm <= core,
        "sbuf_peak_bytes": sbuf,
        "sbuf_capacity_bytes": tgt.sbuf_bytes,
        "psum_peak_bytes": psum,
        "psum_capacity_bytes": tgt.sbuf_partitions * tgt.psum_bytes_per_partition,
        "spill_bytes": int(sum(p["spill_bytes"] for p in parts)),
        "estimate": "weights + inputs + eager peak of live intermediate tensors (+ gradients "
                    "with --train); the simulator does not model HBM capacity",
    }


def fallback_rows(calls: list[dict], latencies_us: list[float]) -> list[dict]:
    """One row per fallback (op, reason) of the measured ``calls`` (profile dicts, one per
    call; ``latencies_us[i]`` is call i's latency): ``time_us`` the mean of its host wall time
    per call, ``share_of_latency`` its summed time over the summed latencies of the same calls
    (module docstring: in [0, 1]). Counts are the last call's (the graph does not change)."""
    total = sum(latencies_us)
    rows: dict[tuple[str, str], dict] = {}
    for d in calls:
        for f in d["fallbacks"]:
            row = rows.setdefault((f["op"], f["reason"]), {
                "op": f["op"], "count": f["count"], "reason": f["reason"], "time_us": 0.0})
            row["count"] = f["count"]
            row["time_us"] += f["time_us"]
    for row in rows.values():
        summed = row["time_us"]
        row["time_us"] = summed / len(calls)
        row["share_of_latency"] = summed / total if total > 0 else None
    return list(rows.values())


def target_options(cfg: EvalConfig, target: str) -> dict:
    """The backend options of ``target``'s compile (the host options only when set)."""
    options = {"target": target, "sim_mode": cfg.sim_mode, "fallback": cfg.fallback,
               "auto_cast": cfg.auto_cast}
    for key in ("host_link_gbps", "call_overhead_us"):   # only when set (module docstring)
        if getattr(cfg, key) is not None:
            options[key] = getattr(cfg, key)
    return options


class CountingBackend:
    """``neuron_backend`` with ``options``, counting the Dynamo graphs handed to it."""

    def __init__(self, options: dict):
        self.options = options
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from neuron_compiler.backend import neuron_backend
        self.graphs += 1
        return neuron_backend(gm, example_inputs, options=self.options)


def run_target(loaded: LoadedModel, ref: object, model_info: dict, target: str,
               cfg: EvalConfig) -> tuple[dict, dict, list[dict]]:
    """(targets[target], compile.targets[target], accuracy rows) for one target."""
    if cfg.generate:
        from neuron_compiler.eval.generate import run_generate
        return run_generate(loaded, ref, model_info, target, cfg)
    torch._dynamo.reset()
    options = target_options(cfg, target)
    backend = CountingBackend(options)
    if cfg.train:
        from neuron_compiler.eval.train import TrainRunner
        step: Callable[[], object] = TrainRunner(
            loaded, lambda fn: torch.compile(fn, backend=backend))
    else:
        compiled = torch.compile(loaded.model, backend=backend)

        def step() -> object:
            with torch.no_grad():
                return _call(loaded, compiled)
    warm, dicts, out = [], [], None
    first_call_s = 0.0
    try:
        for i in range(cfg.warmup + cfg.iters):
            phase, n, of = (("warm-up", i + 1, cfg.warmup) if i < cfg.warmup else
                            ("iter", i + 1 - cfg.warmup, cfg.iters))
            cfg.progress(f"[{target}] {phase} {n}/{of}")
            t0 = time.perf_counter()
            with neuron_compiler.profile() as prof:
                out = step()
            if i == 0:
                first_call_s = time.perf_counter() - t0
                graphs_after_first = backend.graphs
            (warm if i < cfg.warmup else dicts).append(prof.to_dict())
        cfg.progress(f"[{target}] counting host FLOPs")
        host_flops = count_host_flops(step)   # one more call, outside the measured ones
    except Exception as exc:
        raise CompileFailure(target, exc) from exc
    model_flops = model_info["train"]["flops"] if cfg.train else model_info["flops"]
    per_target = target_entry(target, cfg, options, model_info, warm, dicts, host_flops,
                              model_flops)
    compile_info = compile_entry(first_call_s, backend.graphs,
                                 backend.graphs - graphs_after_first, warm + dicts, dicts[-1])
    rows = compare_outputs(out, ref, cfg.effective_thresholds())
    for r in rows:
        r["target"] = target
    return per_target, compile_info, rows


def target_entry(target: str, cfg: EvalConfig, options: dict, model_info: dict,
                 warm: list[dict], dicts: list[dict], host_flops, model_flops: int) -> dict:
    """``targets[target]`` from the profile dicts of the warm-up calls and of the measured
    calls (one per call: an inference, a training step or a decode step)."""
    lat = [sum(_call_latency(d)) for d in dicts]
    pct = _percentiles(lat)
    last = dicts[-1]
    parts = last["partitions"]
    program_flops = sum(p["flops"] for p in parts)   # simulated programs, with transposes
    time_parts = [_call_latency(d) for d in dicts]
    sim_p50 = float(np.median([t[0] for t in time_parts]))
    return {
        "options": options,
        "latency_us": {**pct, "samples": lat,
                       "simulated_us": sim_p50,
                       "transfer_us": float(np.median([t[1] for t in time_parts])),
                       "fallback_us": float(np.median([t[2] for t in time_parts])),
                       "call_overhead_us": float(np.median([t[3] for t in time_parts])),
                       "collective_us": float(np.median([t[4] for t in time_parts])),
                       "roofline_us": last["roofline_time_us"]},
        "assumptions": _assumptions(last, target, options),
        "throughput_per_s": 1e6 / pct["p50"] if pct["p50"] > 0 else None,
        "device_share": {
            "by_nodes": last["device_fraction"],
            "by_time": sim_p50 / pct["p50"] if pct["p50"] > 0 else None,
            "device_nodes": last["device_nodes"], "fallback_nodes": last["fallback_nodes"],
            **flop_share(model_flops, host_flops, program_flops),
        },
        "fallbacks": fallback_rows(dicts, lat),
        "memory": _memory(target, model_info, parts),
        "cost": prices.cost(target, pct["p50"], prices.instances_with(cfg.prices)),
        "engines": _engines(parts),
        "tensor_flop_utilisation": _tensor_util(target, program_flops, sim_p50),
        "partitions": [{"name": p["name"], "ops": len(p["ops"]),
                        "simulated_us": p["simulated_time_per_call_us"],
                        "roofline_us": p["roofline_time_per_call_us"],
                        "bound": p["roofline_bound"], "instructions": p["instructions"],
                        "flops": p["flops"], "sbuf_peak_bytes": p["sbuf_peak_bytes"],
                        "psum_peak_bytes": p["psum_peak_bytes"]} for p in parts],
        "warmup_us": sum(sum(_call_latency(d)) for d in warm),
    }


def compile_entry(first_call_s: float, dynamo_graphs: int, recompiles: int,
                  all_calls: list[dict], last: dict) -> dict:
    """``compile.targets[target]``: ``all_calls`` are the profile dicts of every call made
    (warm-up and measured), ``last`` the one whose graphs and partitions are described."""
    nodes = last["device_nodes"] + last["fallback_nodes"]
    return {
        "ok": True,
        "first_call_s": first_call_s,
        "lowering_s": sum(d["compile_time_s"] for d in all_calls),
        "dynamo_graphs": dynamo_graphs,
        "recompiles": recompiles,
        "aten_graphs": [{"name": g["name"], "kind": g["kind"], "device_nodes": g["device_nodes"],
                         "fallback_nodes": g["fallback_nodes"],
                         "partitions": len(g["partitions"])} for g in last["graphs"]],
        "partitions": len(last["partitions"]),
        "device_nodes": last["device_nodes"], "fallback_nodes": last["fallback_nodes"],
        "nodes": nodes,
        "program_cache": {k: sum(d["program_cache"][k] for d in all_calls)
                          for k in ("hits", "misses")},
        "compile_cache": {k: sum(d["cache"][k] for d in all_calls)
                          for k in ("hits", "misses")},
    }


def _tensor_util(target: str, flops: int, sim_us: float) -> float | None:
    from runtime_sim.targets import get_target
    peak = get_target(target).tensor_peak_flops_per_ns
    return flops / (peak * sim_us * 1e3) if sim_us > 0 else None


def empty_report(targets: list[str], spec: str | None = None) -> dict:
    """A report with every top-level key and nothing measured yet (a model that could not be
    built still gets one: ``--json`` is written on exit 3)."""
    return {"versions": versions(targets), "model": {"spec": spec} if spec else {},
            "compile": {}, "accuracy": {}, "targets": {}, "regressions": [], "baseline": None}


def evaluate(loaded: LoadedModel, cfg: EvalConfig) -> dict:
    """The whole report except ``regressions`` (``baseline.py`` adds them). Raises
    ``ModelFailure`` / ``CompileFailure`` (after which the partial report is in
    ``exc.report``)."""
    report = empty_report(cfg.targets, loaded.spec)
    cfg.progress(f"eager reference ({cfg.warmup} warm-up + {cfg.iters} timed calls)")
    try:
        ref, report["model"] = eager_reference(loaded, cfg.warmup, cfg.iters)
        if cfg.train:
            from neuron_compiler.eval.train import eager_steps
            cfg.progress("eager training steps")
            try:
                ref, report["model"]["train"] = eager_steps(loaded, cfg.warmup + cfg.iters,
                                                            _LiveBytes)
            except ModelSpecError:
                raise
            except Exception as exc:
                raise ModelFailure(f"an eager training step raised {type(exc).__name__}: "
                                   f"{exc}") from exc
        if cfg.generate:
            from neuron_compiler.eval.generate import eager_generate
            cfg.progress(f"eager generation of {cfg.generate} tokens")
            try:
                ref, report["model"]["generate"] = eager_generate(loaded, cfg)
            except ModelSpecError:
                raise
            except Exception as exc:
                raise ModelFailure(f"eager generation (transformers generate() with a static "
                                   f"cache) raised {type(exc).__name__}: {exc}") from exc
    except ModelFailure as exc:
        report["compile"] = {"ok": False, "error": str(exc), "failed_target": None,
                             "failed_stage": "eager"}
        exc.report = report   # type: ignore[attr-defined]
        raise
    cfg.progress("torch._dynamo.explain")
    report["compile"] = {"ok": False, "error": None, "failed_target": None,
                         "failed_stage": None, **explain(loaded),
                         "targets": {}}
    rows: list[dict] = []
    report["accuracy"] = {
        "values_from": ("simulator (sim_mode=functional)" if cfg.sim_mode == "functional" else
                        "eager partitions (sim_mode=timing: checks partitioning and fallbacks, "
                        "not the simulated arithmetic)"),
        "auto_cast": cfg.auto_cast,
        "thresholds": {k: v.to_dict() for k, v in cfg.effective_thresholds().items()},
        "passed": False, "outputs": rows}
    for target in cfg.targets:
        try:
            per_target, comp, acc = run_target(loaded, ref, report["model"], target, cfg)
        except CompileFailure as exc:
            report["compile"].update(error=exc.detail, failed_target=target,
                                     failed_stage="compile")
            exc.report = report   # type: ignore[attr-defined]
            raise
        report["targets"][target] = per_target
        report["compile"]["targets"][target] = comp
        rows += acc
    report["compile"]["ok"] = True
    report["accuracy"]["passed"] = all(r["passed"] for r in rows)
    torch._dynamo.reset()
    return report
