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
  that limit is given: it is wall-clock time of this machine); with ``--generate``, the
  latency is TPOT and ``generate.ttft_us`` grew by more than ``max_slowdown``;
  a target of the baseline missing from this run, or one measured with other options
  (``sim_mode``, ``fallback``, ``auto_cast``, ``host_link_gbps`` / ``call_overhead_us`` when
  set) or another kind of call (``call_kind``: inference, ``--train``, or ``--generate N``
  after L prompt tokens):
  its numbers are not comparable;
- per output and target: an output that passed the accuracy thresholds in the baseline (or
  is new) and fails them now, or one that the baseline had and this run has not.

Invariants
- ``compare`` is pure: it reads two report dicts and returns JSON-ready rows, each
  ``{target, metric, baseline, current, change, threshold, message}`` (``target`` is None for
  model-wide rows; ``change`` is the relative change where one is defined, else None).
  ``comparison`` runs the same checks and returns the report's ``baseline`` entry: the file,
  how many metrics were compared (a metric counts when both reports have a value for it), on
  which targets, the limits, the regressions and the baseline's versions. What the terminal
  and the HTML say about the baseline is read from that entry.
- Messages print sizes in human units (``12.82 MB``), times in us with two decimals: never a
  float in exponent notation.
- A baseline that is not a neuron-eval report (missing one of ``REQUIRED_KEYS``) raises
  ValueError; reports written before the ``baseline`` key existed are accepted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from neuron_compiler.profile import _bytes

REQUIRED_KEYS = ("versions", "model", "compile", "accuracy", "targets", "regressions")
TOP_LEVEL_KEYS = REQUIRED_KEYS + ("baseline",)


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
    missing = [k for k in REQUIRED_KEYS if not isinstance(data, dict) or k not in data]
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


def fmt_value(metric: str, v: float) -> str:
    """``v`` of ``metric`` for a person: bytes in B/KB/MB/GB, times in us or s, shares in %."""
    unit = next((u for u in ("_bytes", "_us", "_s") if any(part.endswith(u) for part
                                                          in metric.split("."))), None)
    if unit == "_bytes":
        return _bytes(v)
    if unit == "_us":
        return f"{v:,.2f} us"
    if unit == "_s":
        return f"{v:,.2f} s"
    if metric.startswith("device_share"):
        return f"{100 * v:.1f}%"
    if metric == "throughput_per_s":
        return f"{v:,.1f}/s"
    if metric.startswith("cost."):
        return f"${v:,.6f}" if v < 1 else f"${v:,.2f}"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.4f}"


def _row(target, metric, base, cur, threshold, message) -> dict:
    change = (cur / base - 1.0) if isinstance(base, (int, float)) and base and \
        isinstance(cur, (int, float)) else None
    return {"target": target, "metric": metric, "baseline": base, "current": cur,
            "change": change, "threshold": threshold, "message": message}


class _Checks:
    """The regressions found, and every (target, metric) that had a value on both sides."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.compared: list[tuple[str | None, str]] = []

    def growth(self, target: str, cur: dict, base: dict, metric: str, limit: float,
               what: str) -> None:
        b, c = _get(base, metric), _get(cur, metric)
        if b is None or c is None:
            return
        self.compared.append((target, metric))
        if c > b * (1.0 + limit) + 1e-12:
            grew = f"+{100 * (c / b - 1):.1f}%" if b else "from zero"
            self.rows.append(_row(target, metric, b, c, limit,
                                  f"{what} {fmt_value(metric, b)} -> {fmt_value(metric, c)} "
                                  f"({grew}, allowed +{100 * limit:.1f}%)"))

    def target(self, target: str, cur: dict, base: dict, cur_compile: dict,
               base_compile: dict, limits: Limits) -> None:
        self.growth(target, cur, base, "latency_us.p50", limits.max_slowdown, "p50 latency")
        self.growth(target, cur, base, "latency_us.simulated_us", limits.max_slowdown,
                    "simulated device time")
        self.growth(target, cur, base, "cost.usd_per_million_inferences", limits.max_slowdown,
                    "USD per million inferences")
        self.growth(target, cur, base, "memory.hbm_bytes", limits.max_memory_growth, "HBM")
        b, c = _get(base, "throughput_per_s"), _get(cur, "throughput_per_s")
        if b and c is not None:
            self.compared.append((target, "throughput_per_s"))
            if c < b / (1.0 + limits.max_slowdown) - 1e-12:
                self.rows.append(_row(target, "throughput_per_s", b, c, limits.max_slowdown,
                                      f"throughput {fmt_value('throughput_per_s', b)} -> "
                                      f"{fmt_value('throughput_per_s', c)}"))
        b, c = _get(base, "device_share.by_nodes"), _get(cur, "device_share.by_nodes")
        if b is not None and c is not None:
            self.compared.append((target, "device_share.by_nodes"))
            if c < b - limits.max_share_drop - 1e-12:
                self.rows.append(_row(target, "device_share.by_nodes", b, c,
                                      limits.max_share_drop,
                                      f"device share by nodes {100 * b:.1f}% -> "
                                      f"{100 * c:.1f}%"))
        base_fb = {f["op"]: f["count"] for f in base.get("fallbacks", [])}
        cur_fb: dict[str, int] = {}
        for f in cur.get("fallbacks", []):
            cur_fb[f["op"]] = cur_fb.get(f["op"], 0) + f["count"]
        self.compared.append((target, "fallbacks"))
        for op, n in sorted(cur_fb.items()):
            if n > base_fb.get(op, 0):
                self.rows.append(_row(target, f"fallbacks.{op}", base_fb.get(op, 0), n, 0,
                                      f"{op}: {base_fb.get(op, 0)} -> {n} nodes in eager "
                                      f"fallback"))
        self.growth(target, cur, base, "generate.ttft_us", limits.max_slowdown,
                    "time to first token")
        if limits.max_compile_slowdown is not None:
            self.growth(target, cur_compile, base_compile, "first_call_s",
                        limits.max_compile_slowdown, "first call (compile)")

    def outputs(self, current: dict, baseline: dict) -> None:
        cur_rows = {(r["name"], r.get("target")): r
                    for r in current.get("accuracy", {}).get("outputs", [])}
        base_rows = {(r["name"], r.get("target")): r
                     for r in baseline.get("accuracy", {}).get("outputs", [])}
        for key, b in base_rows.items():
            if key not in cur_rows and key[1] in current.get("targets", {}):
                self.rows.append(_row(key[1], f"accuracy.{key[0]}", None, None, None,
                                      f"output {key[0]} is in the baseline but not in this "
                                      f"run"))
        for key, c in cur_rows.items():
            b = base_rows.get(key)
            if b is not None:
                self.compared.append((key[1], f"accuracy.{key[0]}"))
            if not c["passed"] and (b is None or b["passed"]):
                self.rows.append(_row(key[1], f"accuracy.{key[0]}",
                                      b["max_abs"] if b else None, c["max_abs"],
                                      c["thresholds"],
                                      f"output {key[0]} fails its thresholds: {c['problem']}"))


def call_kind(report: dict) -> str:
    """What one measured call of ``report`` is: an inference, a training step, or a decode
    step of ``--generate N`` after a prompt of L tokens (N, L and the prompt's bucket must
    match to compare)."""
    m = report.get("model", {})
    g = m.get("generate")
    if g:
        b = g.get("prompt_bucket")
        return (f"--generate {g.get('tokens')} --prompt-len {g.get('prompt_len')}"
                + (f" in a bucket of {b['length']}" if b else ""))
    return "--train" if m.get("train") else "inference"


def _run(current: dict, baseline: dict, limits: Limits) -> _Checks:
    checks = _Checks()
    for target, base in baseline.get("targets", {}).items():
        cur = current.get("targets", {}).get(target)
        if cur is None:
            checks.rows.append(_row(target, "targets", None, None, None,
                                    f"target {target} is in the baseline but was not run"))
            continue
        b_opts, c_opts = base.get("options", {}), cur.get("options", {})
        b_kind, c_kind = call_kind(baseline), call_kind(current)
        if b_opts != c_opts or b_kind != c_kind:
            checks.rows.append(_row(target, "options", None, None, None,
                                    f"not comparable: baseline {b_opts} ({b_kind}), "
                                    f"this run {c_opts} ({c_kind})"))
            continue
        checks.target(target, cur, base,
                      current.get("compile", {}).get("targets", {}).get(target, {}),
                      baseline.get("compile", {}).get("targets", {}).get(target, {}), limits)
    checks.outputs(current, baseline)
    return checks


def compare(current: dict, baseline: dict, limits: Limits) -> list[dict]:
    """The regressions of ``current`` against ``baseline`` (module docstring)."""
    return _run(current, baseline, limits).rows


def comparison(current: dict, baseline: dict, limits: Limits,
               path: str) -> tuple[list[dict], dict]:
    """(the report's ``regressions``, its ``baseline`` entry: ``{path, metrics_compared,
    targets, limits, regressions, versions}``, where ``regressions`` is their count and
    ``versions`` the baseline's git commit, neuron-sim and torch)."""
    checks = _run(current, baseline, limits)
    v = baseline.get("versions", {})
    return checks.rows, {
        "path": path,
        "metrics_compared": len(checks.compared),
        "targets": sorted({t for t, _ in checks.compared if t is not None}),
        "limits": {"max_slowdown": limits.max_slowdown,
                   "max_memory_growth": limits.max_memory_growth,
                   "max_share_drop": limits.max_share_drop,
                   "max_compile_slowdown": limits.max_compile_slowdown},
        "regressions": len(checks.rows),
        "versions": {k: v.get(k) for k in ("git_commit", "neuron_sim", "torch")},
    }


def describe(entry: dict) -> str:
    """One line for a person: the ``baseline`` entry of a report."""
    lim = entry["limits"]
    v = entry["versions"]
    made = ", ".join(f"{k} {str(v[k])[:10]}" for k in ("neuron_sim", "git_commit", "torch")
                     if v.get(k))
    compile_limit = ("not checked" if lim["max_compile_slowdown"] is None
                     else f"+{100 * lim['max_compile_slowdown']:.0f}%")
    found = ("none" if not entry["regressions"] else
             f"{entry['regressions']} (listed under 'Regressions')")
    return (f"compared with {entry['path']}" + (f" ({made})" if made else "")
            + f": {entry['metrics_compared']} metrics on "
            + (", ".join(entry["targets"]) or "no target")
            + f"; thresholds: slowdown +{100 * lim['max_slowdown']:.0f}%, memory "
            f"+{100 * lim['max_memory_growth']:.0f}%, device share "
            f"drop {100 * lim['max_share_drop']:.0f} points, compile {compile_limit}; "
            f"regressions: {found}")
