"""Compare a ``neuron-eval`` report with a baseline report: the ``regressions`` list.

A regression is one metric that got worse than its threshold allows (``Limits``):
- per target present in the baseline: ``latency_us.p50`` and ``latency_us.simulated_us``
  grew by more than ``max_slowdown`` (a fraction: 0.1 = 10% slower);
  ``throughput_per_s`` fell below baseline / (1 + max_slowdown);
  ``cost.usd_per_million_inferences`` grew by more than ``max_slowdown``;
  ``memory.hbm_bytes`` grew by more than ``max_memory_growth``;
  ``device_share.by_nodes`` fell by more than ``max_share_drop`` (absolute);
  a fallback op that the baseline did not have, or more nodes of one it had;
  ``compile.targets.T.first_call_s`` grew by more than ``max_compile_slowdown`` (only when
  that limit is given: it is wall-clock time of this machine);
  a target of the baseline missing from this run, or one measured with other options
  (``sim_mode``, ``fallback``, ``auto_cast``) or another kind of call (``--train`` or not):
  its numbers are not comparable;
- per output and target: an output that passed the accuracy thresholds in the baseline (or
  is new) and fails them now, or one that the baseline had and this run has not.

Invariants
- ``compare`` is pure: it reads two report dicts and returns JSON-ready rows, each
  ``{target, metric, baseline, current, change, threshold, message}`` (``target`` is None for
  model-wide rows; ``change`` is the relative change where one is defined, else None).
- A baseline that is not a neuron-eval report (missing top-level keys) raises ValueError.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

TOP_LEVEL_KEYS = ("versions", "model", "compile", "accuracy", "targets", "regressions")


@dataclass(frozen=True)
class Limits:
    max_slowdown: float = 0.10
    max_memory_growth: float = 0.10
    max_share_drop: float = 0.0
    max_compile_slowdown: float | None = None


def load_baseline(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read baseline {path!r}: {exc}") from exc
    missing = [k for k in TOP_LEVEL_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"baseline {path!r} is not a neuron-eval report (missing "
                         f"{', '.join(missing)})")
    return data


def _get(d: dict, dotted: str) -> float | None:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _row(target, metric, base, cur, threshold, message) -> dict:
    change = (cur / base - 1.0) if isinstance(base, (int, float)) and base and \
        isinstance(cur, (int, float)) else None
    return {"target": target, "metric": metric, "baseline": base, "current": cur,
            "change": change, "threshold": threshold, "message": message}


def _growth(out: list, target: str, cur: dict, base: dict, metric: str, limit: float,
            what: str) -> None:
    b, c = _get(base, metric), _get(cur, metric)
    if b is None or c is None:
        return
    if c > b * (1.0 + limit) + 1e-12:
        out.append(_row(target, metric, b, c, limit,
                        f"{what} {b:.4g} -> {c:.4g} (+{100 * (c / b - 1) if b else float('inf'):.1f}%"
                        f", allowed +{100 * limit:.1f}%)"))


def compare(current: dict, baseline: dict, limits: Limits) -> list[dict]:
    out: list[dict] = []
    for target, base in baseline.get("targets", {}).items():
        cur = current.get("targets", {}).get(target)
        if cur is None:
            out.append(_row(target, "targets", None, None, None,
                            f"target {target} is in the baseline but was not run"))
            continue
        b_opts, c_opts = base.get("options", {}), cur.get("options", {})
        b_train = bool(baseline.get("model", {}).get("train"))
        c_train = bool(current.get("model", {}).get("train"))
        if b_opts != c_opts or b_train != c_train:
            out.append(_row(target, "options", None, None, None,
                            f"not comparable: baseline {b_opts} train={b_train}, this run "
                            f"{c_opts} train={c_train}"))
            continue
        _growth(out, target, cur, base, "latency_us.p50", limits.max_slowdown, "p50 latency us")
        _growth(out, target, cur, base, "latency_us.simulated_us", limits.max_slowdown,
                "simulated device us")
        _growth(out, target, cur, base, "cost.usd_per_million_inferences", limits.max_slowdown,
                "USD per million inferences")
        _growth(out, target, cur, base, "memory.hbm_bytes", limits.max_memory_growth,
                "HBM bytes")
        b, c = _get(base, "throughput_per_s"), _get(cur, "throughput_per_s")
        if b and c is not None and c < b / (1.0 + limits.max_slowdown) - 1e-12:
            out.append(_row(target, "throughput_per_s", b, c, limits.max_slowdown,
                            f"throughput {b:.4g}/s -> {c:.4g}/s"))
        b, c = _get(base, "device_share.by_nodes"), _get(cur, "device_share.by_nodes")
        if b is not None and c is not None and c < b - limits.max_share_drop - 1e-12:
            out.append(_row(target, "device_share.by_nodes", b, c, limits.max_share_drop,
                            f"device share by nodes {100 * b:.1f}% -> {100 * c:.1f}%"))
        base_fb = {f["op"]: f["count"] for f in base.get("fallbacks", [])}
        cur_fb: dict[str, int] = {}
        for f in cur.get("fallbacks", []):
            cur_fb[f["op"]] = cur_fb.get(f["op"], 0) + f["count"]
        for op, n in sorted(cur_fb.items()):
            if n > base_fb.get(op, 0):
                out.append(_row(target, f"fallbacks.{op}", base_fb.get(op, 0), n, 0,
                                f"{op}: {base_fb.get(op, 0)} -> {n} nodes in eager fallback"))
        if limits.max_compile_slowdown is not None:
            _growth(out, target, current.get("compile", {}).get("targets", {}).get(target, {}),
                    baseline.get("compile", {}).get("targets", {}).get(target, {}),
                    "first_call_s", limits.max_compile_slowdown, "first call (compile) s")
    cur_rows = {(r["name"], r.get("target")): r
                for r in current.get("accuracy", {}).get("outputs", [])}
    base_rows = {(r["name"], r.get("target")): r
                 for r in baseline.get("accuracy", {}).get("outputs", [])}
    for key, b in base_rows.items():
        if key not in cur_rows and key[1] in current.get("targets", {}):
            out.append(_row(key[1], f"accuracy.{key[0]}", None, None, None,
                            f"output {key[0]} is in the baseline but not in this run"))
    for key, c in cur_rows.items():
        b = base_rows.get(key)
        if not c["passed"] and (b is None or b["passed"]):
            out.append(_row(key[1], f"accuracy.{key[0]}", b["max_abs"] if b else None,
                            c["max_abs"], c["thresholds"],
                            f"output {key[0]} fails its thresholds: {c['problem']}"))
    return out
