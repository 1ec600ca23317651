"""The pieces of a ``neuron-eval`` report shared by every kind of run: the configuration
(``EvalConfig``), a target's compile options (``target_options``) and counting backend
(``CountingBackend``), the failure of a compiled model (``CompileFailure``), and the report's
per-target entries built from profile dicts (``target_entry``, ``compile_entry``,
``fallback_rows``, ``call_latency``).

``measure`` (inference and ``--train``) and ``generate`` (``--generate``) both build their
reports from these. ``measure`` imports ``generate`` (it hands ``--generate`` runs to it), so
``generate`` takes these from here, never from ``measure``.

Invariants: those of ``measure``'s module docstring on latency (simulated + transfer + fallback
+ call overhead + collectives), fallback shares, ``assumptions``/``options`` and JSON-ready
values; ``CompileFailure`` names the target and words a ``fallback="error"`` refusal for the
command line.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import neuron_compiler.eval.prices as prices
from neuron_compiler.errors import NeuronFallbackError
from neuron_compiler.eval.accuracy import Thresholds
from neuron_compiler.eval.flops import flop_share

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
    lnc: int | None = None                                    # --lnc (None: the option's default)
    call_overhead_us: float | None = None

    def effective_thresholds(self) -> dict[str, Thresholds]:
        """With ``auto_cast``, fp32 outputs are judged by the bfloat16 thresholds."""
        if self.auto_cast == "none":
            return self.thresholds
        return {**self.thresholds, "float32": self.thresholds["bfloat16"]}
    progress: Callable[[str], None] = lambda msg: None


# ---- per target -------------------------------------------------------------------------------
def _percentiles(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()),
            "min": float(a.min()), "max": float(a.max())}


def call_latency(d: dict) -> tuple[float, float, float, float, float]:
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
    for key in ("host_link_gbps", "call_overhead_us", "lnc"):   # only when set (docstring)
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


def target_entry(target: str, cfg: EvalConfig, options: dict, model_info: dict,
                 warm: list[dict], dicts: list[dict], host_flops, model_flops: int) -> dict:
    """``targets[target]`` from the profile dicts of the warm-up calls and of the measured
    calls (one per call: an inference, a training step or a decode step)."""
    lat = [sum(call_latency(d)) for d in dicts]
    pct = _percentiles(lat)
    last = dicts[-1]
    parts = last["partitions"]
    program_flops = sum(p["flops"] for p in parts)   # simulated programs, with transposes
    time_parts = [call_latency(d) for d in dicts]
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
        "warmup_us": sum(sum(call_latency(d)) for d in warm),
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
