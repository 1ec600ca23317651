"""``neuron-eval --html PATH``: the report as one self-contained HTML file with inline SVG charts.

Order: the verdict, then what a reader must not miss, at the top: the regressions against
the baseline (or the line saying a baseline was compared and none was found), and a compile
or build error; with ``--generate``, the Generation section (what ran, a TTFT/TPOT chart
per target, the generation table); then charts: latency per target (p50/p90/p99), where the latency goes
(simulated device time, host transfer, runtime call overhead, eager fallback), time per device
partition (simulated vs roofline), engine utilisation, fallback share of the latency, and the
memory plan (HBM, SBUF, PSUM against capacity); then tables: targets, assumptions (host link
and per-call overhead in force, with their sources), compile, fallbacks, accuracy, versions.

Invariants
- The page loads no network resource: no scripts, no stylesheets, no images, no fonts other
  than the system's; every chart is inline SVG, every style inline in one ``<style>`` element.
  URLs in the report (price sources) appear as escaped text only, never as ``href``/``src``.
- ``render_html(report, exit_code)`` reads only the report dict (the ``--json`` content), so the
  page cannot disagree with the JSON; every string from the report is HTML-escaped.
- A target whose p50, p90 and p99 are equal (always so with one measured call; with no eager
  fallback the simulated time is deterministic) gets one bar labelled ``p50 = p90 = p99`` and
  a sentence saying why, never three equal bars. Sizes are in B/KB/MB/GB.
"""
from __future__ import annotations

import html

from neuron_compiler.eval.prices import price_text
from neuron_compiler.eval.report import baseline_text, eager_text, verdict
from neuron_compiler.profile import _bytes

PALETTE = ("#3b6fb6", "#e08a2c", "#4a9a5b", "#b6443b", "#7d5ba6", "#8c6d46", "#d06aa8")
_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.pass { color: #2a7a3a; font-weight: 600; } .fail { color: #b3261e; font-weight: 600; }
.note { color: #555; font-size: 12px; } svg { display: block; margin: 6px 0 14px; }
.alert { border: 2px solid #b3261e; background: #fdecea; padding: 4px 14px 10px; }
.alert h2 { color: #b3261e; border: none; margin-top: 8px; }
.ok { border: 1px solid #2a7a3a; background: #edf7ee; padding: 6px 14px; }
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _table(head: list[str], rows: list[list[object]], left: set[int] = frozenset({0})) -> str:
    th = "".join(f'<th class="{"l" if i in left else ""}">{_e(h)}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i in left else ""}">{_e(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "%":
        return "<0.1%" if 0 < v < 0.1 else f"{v:,.1f}%"
    return f"{v:,.2f}{unit}"


def bar_chart(title: str, groups: list[tuple[str, list[tuple[str, float]]]], unit: str = "",
              stacked: bool = False, max_value: float | None = None) -> str:
    """Horizontal bars: one block per group label, one bar per (series, value) (or one
    stacked bar). Returns an ``<svg>`` element with a legend."""
    series = list(dict.fromkeys(name for _, vals in groups for name, _ in vals))
    color = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    top = max_value or max([sum(v for _, v in vals) if stacked else max((v for _, v in vals),
                                                                       default=0)
                            for _, vals in groups] + [1e-12])
    label_w, bar_w, bar_h, gap = 230, 560, 14, 10
    y, parts = 34, [f'<text x="0" y="16" font-size="14" font-weight="600">{_e(title)}</text>']
    for label, vals in groups:
        n = 1 if stacked else max(1, len(vals))
        parts.append(f'<text x="{label_w - 8}" y="{y + n * bar_h / 2 + 4:.1f}" font-size="12" '
                     f'text-anchor="end">{_e(label)}</text>')
        x = label_w
        for i, (name, v) in enumerate(vals):
            w = max(0.0, bar_w * v / top)
            yy = y if stacked else y + i * bar_h
            parts.append(f'<rect x="{x:.1f}" y="{yy}" width="{w:.1f}" height="{bar_h - 2}" '
                         f'fill="{color[name]}"><title>{_e(name)}: {_e(_fmt(v, unit))}'
                         f'</title></rect>')
            if not stacked:
                parts.append(f'<text x="{x + w + 4:.1f}" y="{yy + bar_h - 3}" font-size="11">'
                             f'{_e(_fmt(v, unit))}</text>')
            else:
                x += w
        if stacked:
            total = sum(v for _, v in vals)
            parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_h - 3}" font-size="11">'
                         f'{_e(_fmt(total, unit))}</text>')
        y += n * bar_h + gap
    lx = label_w
    for s in series:
        parts.append(f'<rect x="{lx}" y="{y + 2}" width="10" height="10" fill="{color[s]}"/>'
                     f'<text x="{lx + 14}" y="{y + 11}" font-size="11">{_e(s)}</text>')
        lx += 24 + 7 * len(s)
    height = y + 20
    return (f'<svg width="{label_w + bar_w + 90}" '
            f'height="{height}" role="img" aria-label="{_e(title)}">' + "".join(parts) + "</svg>")


def _charts(report: dict) -> list[str]:
    targets = report["targets"]
    if not targets:
        return []
    out = [bar_chart("Steady-state latency per target (us)",
                     [(t, _percentile_bars(d["latency_us"])) for t, d in targets.items()],
                     " us")]
    same = [t for t, d in targets.items() if _all_equal(d["latency_us"])]
    if same:
        out.append(f'<p class="note">{_e(_equal_note(targets, same))}</p>')
    out += [bar_chart("Where the p50 latency goes (us)",
                     [(t, [("simulated device", d["latency_us"]["simulated_us"]),
                           ("host transfer", d["latency_us"]["transfer_us"]),
                           ("call overhead", d["latency_us"].get("call_overhead_us", 0.0)),
                           ("eager fallback", d["latency_us"]["fallback_us"])])
                      for t, d in targets.items()], " us", stacked=True),
           bar_chart("Time per device partition (us per call)",
                     [(f"{t} {p['name'].split('/')[-1]}",
                       [("simulated", p["simulated_us"]), ("roofline", p["roofline_us"])])
                      for t, d in targets.items() for p in d["partitions"]], " us")]
    engines = list(dict.fromkeys(e for d in targets.values() for e in d["engines"]))
    out.append(bar_chart("Engine utilisation (busy % of simulated time)",
                         [(e, [(t, 100 * d["engines"].get(e, 0.0)) for t, d in targets.items()])
                          for e in engines], "%", max_value=100))
    fb = [(f"{t} {f['op']}", [("share of latency", 100 * (f["share_of_latency"] or 0.0))])
          for t, d in targets.items() for f in d["fallbacks"]]
    if fb:
        out.append(bar_chart("Fallback share of the latency (%: its host time summed over the "
                             "measured calls / their summed latency)", fb, "%", max_value=100))
    mem = []
    for t, d in targets.items():
        m = d["memory"]
        mem += [(f"{t} HBM (one core)", [("used", 100 * m["hbm_fraction_of_core"])]),
                (f"{t} SBUF peak", [("used", 100 * m["sbuf_peak_bytes"]
                                     / m["sbuf_capacity_bytes"])]),
                (f"{t} PSUM peak", [("used", 100 * m["psum_peak_bytes"]
                                     / m["psum_capacity_bytes"])])]
    out.append(bar_chart("Memory plan (% of capacity)", mem, "%", max_value=100))
    return out


def _all_equal(lat: dict) -> bool:
    p50 = lat["p50"]
    return all(abs(lat[k] - p50) <= 1e-9 * max(abs(p50), 1e-30) for k in ("p90", "p99"))


def _equal_note(targets: dict, same: list[str]) -> str:
    """Says which targets have p50 = p90 = p99, their value, and why."""
    calls = {len(targets[t]["latency_us"]["samples"]) for t in same}
    values = ", ".join(f"{t} {targets[t]['latency_us']['p50']:,.2f} us" for t in same)
    why = ("one measured call: there is no spread to show" if calls == {1} else
           "every measured call took the same time (the simulated device time is "
           "deterministic; only eager fallbacks and host noise vary)")
    n = "/".join(str(c) for c in sorted(calls))
    return f"p50 = p90 = p99 ({values}; {n} measured call(s)): {why}."


def _percentile_bars(lat: dict) -> list[tuple[str, float]]:
    if _all_equal(lat):
        return [("p50 = p90 = p99", lat["p50"])]
    return [(k, lat[k]) for k in ("p50", "p90", "p99")]


def _top(report: dict) -> list[str]:
    """What must be seen first: regressions (or the baseline's all-clear) and a failure."""
    out = []
    regs, base, c = report.get("regressions") or [], report.get("baseline"), report["compile"]
    if regs or c.get("error"):
        inner = []
        if regs:
            inner.append(f"<h2>Regressions against the baseline ({len(regs)})</h2>")
            inner.append(_table(["target", "metric", "message"],
                                [[r["target"] or "-", r["metric"], r["message"]] for r in regs],
                                left={0, 1, 2}))
        if c.get("error"):
            inner.append("<h2>The model failed</h2>")
            where = f"{c['failed_target']}: " if c.get("failed_target") else ""
            inner.append(f"<pre>{_e(where)}{_e(c['error'])}</pre>")
        out.append('<div class="alert">' + "\n".join(inner) + "</div>")
    out.append(f'<p class="{"ok" if base and not regs else "note"}">Baseline: '
               f"{_e(baseline_text(report))}</p>")
    return out


def _targets_table(report: dict) -> str:
    """Targets side by side: latency, throughput, device share, HBM, cost, first call."""
    names = list(report["targets"])
    comp_t = report["compile"].get("targets", {})
    rows = []
    for label, fn in (
            ("latency p50 / p90 / p99 us", lambda d, n: (
                f"{d['latency_us']['p50']:,.2f} (all three equal)"
                if _all_equal(d["latency_us"]) else " / ".join(
                    f"{d['latency_us'][k]:,.2f}" for k in ("p50", "p90", "p99")))),
            ("throughput /s", lambda d, n: f"{d['throughput_per_s']:,.0f}"),
            ("device share nodes / FLOPs / time", lambda d, n: " / ".join(
                "-" if d["device_share"][k] is None else f"{100 * d['device_share'][k]:.1f}%"
                for k in ("by_nodes", "by_flops", "by_time"))),
            ("HBM used / core capacity", lambda d, n: f"{_bytes(d['memory']['hbm_bytes'])} / "
             f"{_bytes(d['memory']['hbm_capacity_core_bytes'])}"),
            ("USD per 1M inferences", lambda d, n: "-" if d["cost"]["usd_per_million_inferences"]
             is None else f"{d['cost']['usd_per_million_inferences']:.4f}"),
            ("instance, price", lambda d, n: price_text(d["cost"])),
            ("host link GB/s", lambda d, n: _assumed(d, "host_link_gbps")),
            ("call overhead us per device-partition call",
             lambda d, n: _assumed(d, "call_overhead_us")),
            ("first call (compile) s",
             lambda d, n: f"{comp_t.get(n, {}).get('first_call_s', 0):.2f}")):
        rows.append([label] + [fn(report["targets"][n], n) for n in names])
    return _table(["metric", *names], rows, left={0})


def _generation(report: dict) -> list[str]:
    """``--generate``: what ran, a TTFT/TPOT chart and the generation table per target."""
    from neuron_compiler.eval.report import generate_text
    gen = {t: d["generate"] for t, d in report["targets"].items() if "generate" in d}
    out = ["<h2>Generation</h2>",
           f'<p class="note">{_e(generate_text(report["model"]["generate"]))}. TTFT and TPOT '
           "= simulated device time + host transfer + call overhead + eager fallback of the "
           "prefill call and of each decode call; the host's generate loop is not included."
           "</p>",
           bar_chart("Time to first token and time per output token (us)",
                     [(t, [("TTFT", g["ttft_us"])] + _tpot_bars(g["tpot_us"]))
                      for t, g in gen.items()], " us")]
    rows = []
    for label, fn in (
            ("TTFT us (simulated + transfer)", lambda g: f"{g['ttft_us']:,.2f} ("
             f"{g['ttft']['simulated_us']:,.2f} + {g['ttft']['transfer_us']:,.2f})"),
            ("TPOT p50 / p99 us", lambda g: f"{g['tpot_us']['p50']:,.2f} / "
                                            f"{g['tpot_us']['p99']:,.2f}"),
            ("tokens per second (1e6 / TPOT p50)",
             lambda g: "-" if g["tokens_per_s"] is None else f"{g['tokens_per_s']:,.0f}"),
            ("KV cache HBM", lambda g: "-" if g["kv_cache"] is None else
             f"{_bytes(g['kv_cache']['bytes'])} ({g['kv_cache']['layers']} layers x 2 x "
             f"{g['kv_cache']['batch']} x {g['kv_cache']['kv_heads']} x "
             f"{g['kv_cache']['max_cache_len']} x {g['kv_cache']['head_dim']}, "
             f"{g['kv_cache']['dtype']})"),
            ("Dynamo graphs compiled", lambda g: str(g["dynamo_graphs"])),
            ("graph calls in the measured run",
             lambda g: " + ".join(str(c["calls"]) for c in g["graph_calls"])),
            ("tokens equal eager's", lambda g: "yes" if g["tokens_match_eager"] else
             f"NO: they differ from token {g['first_mismatch']}"),
            ("tokens from", lambda g: g["tokens_from"])):
        rows.append([label] + [fn(g) for g in gen.values()])
    out.append(_table(["metric", *gen], rows, left={0}))
    return out


def _tpot_bars(tpot: dict) -> list[tuple[str, float]]:
    if abs(tpot["p99"] - tpot["p50"]) <= 1e-9 * max(abs(tpot["p50"]), 1e-30):
        return [("TPOT p50 = p99", tpot["p50"])]
    return [("TPOT p50", tpot["p50"]), ("TPOT p99", tpot["p99"])]


def _assumed(d: dict, key: str) -> str:
    a = d.get("assumptions", {}).get(key)
    return "-" if a is None else f"{a['value']:g}"


def _assumptions_table(report: dict) -> str:
    """Each host-side assumption in force per target, with its source."""
    rows = [[t, label, f"{d['assumptions'][key]['value']:g} {unit}",
             d["assumptions"][key]["source"]]
            for t, d in report["targets"].items() if "assumptions" in d
            for key, label, unit in (("host_link_gbps", "host link (host_link_gbps)", "GB/s"),
                                     ("call_overhead_us", "call overhead (call_overhead_us)",
                                      "us per device-partition call"))]
    if not rows:
        return ""
    return ("<h2>Assumptions</h2>"
            '<p class="note">values in force in the latency above, and where they come from '
            '("option": set with --host-link-gbps / --call-overhead-us)</p>'
            + _table(["target", "assumption", "value", "source"], rows, left={0, 1, 3}))


def render_html(report: dict, exit_code: int | None = None) -> str:
    m, c, acc, v = report["model"], report["compile"], report["accuracy"], report["versions"]
    words = verdict(report, exit_code)
    body = [f"<h1>neuron-eval {_e(m.get('spec', '?'))}</h1>",
            f'<p>result: <span class="{"pass" if exit_code == 0 else "fail"}">{_e(words)}'
            f"</span> (exit {_e(exit_code)})</p>"]
    body += _top(report)
    if "parameters" in m:
        body.append(_table(["model", "parameters", "weights", "inputs", "MFLOP"],
                           [[f"{m['class']} {m['description']}", f"{m['parameters']:,}",
                             _bytes(m["weight_bytes"]),
                             ", ".join(f"{i['name']} {i['dtype']}{i['shape']}"
                                       for i in m["inputs"]),
                             f"{m['flops'] / 1e6:.2f}"]]))
        body.append(f'<p class="note">eager PyTorch: {_e(eager_text(m))}</p>')
    if m.get("generate") and report["targets"]:
        body += _generation(report)
    if report["targets"]:
        body.append("<h2>Charts</h2>")
        body += _charts(report)
        body.append("<h2>Targets</h2>")
        body.append(_targets_table(report))
        body.append(_assumptions_table(report))
    if c.get("failed_stage") not in ("build", "eager"):
        body.append("<h2>Compile</h2>")
        body.append(f"<p>{'ok' if c.get('ok') else 'FAILED'}; Dynamo graphs "
                    f"{_e(c.get('graphs'))}, graph breaks {_e(c.get('graph_breaks'))}</p>")
    if c.get("break_reasons"):
        body.append(_table(["graph break reason", "where"],
                           [[r["reason"], r["where"] or "-"] for r in c["break_reasons"]],
                           left={0, 1}))
    fb = [[t, f["op"], f["count"], f"{f['time_us']:.1f}",
           "-" if f["share_of_latency"] is None else f"{100 * f['share_of_latency']:.1f}%",
           f["reason"]]
          for t, d in report["targets"].items() for f in d["fallbacks"]]
    if fb:
        body.append("<h2>Fallbacks</h2>")
        body.append('<p class="note">us/call: mean measured host wall time over the measured '
                    "calls; share: that time summed over those calls / their summed latency"
                    "</p>")
        body.append(_table(["target", "op", "count", "us/call", "share", "reason"], fb,
                           left={0, 1, 5}))
    if acc.get("outputs"):
        body.append("<h2>Accuracy</h2>")
        body.append(f'<p class="note">values from {_e(acc["values_from"])}</p>')
        body.append(_table(["output", "target", "dtype", "max abs", "max rel", "cosine",
                            "result"],
                           [[r["name"], r["target"], r["dtype"], _g(r["max_abs"]),
                             _g(r["max_rel"]), _g(r["cosine"], 6),
                             "pass" if r["passed"] else f"FAIL: {r['problem']}"]
                            for r in acc["outputs"]], left={0, 1, 2, 6}))
    body.append("<h2>Versions</h2>")
    body.append(_table(["name", "value"],
                       [[k, "-" if val is None else val] for k, val in v.items()
                        if k != "target_descriptions"]
                       + [[f"target {t}", h] for t, h in v["target_descriptions"].items()],
                       left={0, 1}))
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>neuron-eval "
            f"{_e(m.get('spec', ''))}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def _g(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else (f"{v:.{digits}f}" if digits > 3 else f"{v:.3g}")
