"""One ``neuron-eval`` run: eager reference, compile, accuracy, steady state per target (the
report's per-target entries are built by ``entries``, shared with ``generate``).

Phases, in order (each target is compiled afresh after ``torch._dynamo.reset()``):
1. eager reference (``torch.no_grad()``): ``--warmup`` + ``--iters`` eager calls, the same
   counts as the device figures, each on fresh input copies (copied outside the timer); the
   reference outputs are the first call's, ``eager_time_ms`` is the p50 of the ``--iters``
   timed calls after the warm-up (the first, cold call is reported beside it); one more
   eager call under ``FlopCounterMode`` and a live-tensor tracker gives the model's FLOPs
   and its peak of live intermediate bytes (the activation estimate). With ``--generate`` the
   forward is called once (no warm-up): the reference and the eager timings are the eager
   generation's (``generate.eager_generate``);
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
import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

import neuron_compiler
from neuron_compiler.cache import target_hash
from neuron_compiler.eval.accuracy import compare_outputs, dtype_name
from neuron_compiler.eval.entries import (CompileFailure, CountingBackend, EvalConfig,  # noqa: F401
                                          call_latency, compile_entry, fallback_rows,
                                          target_entry, target_options)
from neuron_compiler.eval.flops import count_host_flops
from neuron_compiler.eval.zoo import LoadedModel, ModelSpecError


class ModelFailure(RuntimeError):
    """The model raised in eager PyTorch (no reference to compare with)."""


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
    # --generate: the reference is the eager generation, timed there; the model's forward is
    # called once, for the report's model entry (FLOPs, outputs, activation peak)
    warmup, iters = (0, 1) if cfg.generate else (cfg.warmup, cfg.iters)
    cfg.progress(f"eager reference ({warmup} warm-up + {iters} timed calls"
                 + (": --generate times the eager generation instead)" if cfg.generate else ")"))
    try:
        ref, report["model"] = eager_reference(loaded, warmup, iters)
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
