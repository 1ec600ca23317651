"""The terminal report of ``neuron-eval``: a text rendering of the JSON report.

Invariants
- ``render(report)`` reads only the report dict (the same one ``--json`` writes), so what the
  terminal shows and what the JSON holds cannot disagree; it never raises on a partial report
  (a compile failure leaves ``targets`` empty).
- Targets are columns, side by side, in the order they were run; metrics are rows.
  With ``--generate``, a Generation table (TTFT, TPOT, tokens/s, KV cache, graphs, tokens
  against eager's) comes before the main table, whose latency is then one decode step's.
- The host link and the per-call overhead in force are rows of that table, and their sources
  are printed under "Assumptions" (a report from before they existed shows "-" in the rows and
  no Assumptions block).
- When a baseline was compared (the report's ``baseline`` entry), the terminal says so in one
  line (file, metrics compared, thresholds, regressions or "none") just above the result;
  without one it says nothing was compared, and after a failure that the comparison did not
  run. Sizes are printed in B/KB/MB/GB.
"""
from __future__ import annotations

from neuron_compiler.eval.baseline import describe
from neuron_compiler.eval.prices import price_text
from neuron_compiler.profile import _bytes, _table


MAX_ACCURACY_ROWS = 12


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _pct(v: float | None) -> str:
    if v is None:
        return "-"
    return "<0.1%" if 0 < v < 0.001 else f"{100.0 * v:.1f}%"


def _side_by_side(report: dict) -> list[str]:
    targets = report["targets"]
    names = list(targets)
    comp = report["compile"].get("targets", {})
    engines = sorted({e for t in targets.values() for e in t["engines"]},
                     key=lambda e: ("TensorE", "VectorE", "ScalarE", "GpSimdE", "DMA").index(e)
                     if e in ("TensorE", "VectorE", "ScalarE", "GpSimdE", "DMA") else 9)

    def row(label: str, fn) -> tuple[str, ...]:
        return (label,) + tuple(fn(targets[n], comp.get(n, {})) for n in names)

    rows = [("", *names),
            row("first call (compile) s", lambda t, c: f"{c.get('first_call_s', 0):.2f}"),
            row("  of which lowering s", lambda t, c: f"{c.get('lowering_s', 0):.2f}"),
            row("partitions / recompiles",
                lambda t, c: f"{c.get('partitions', '-')} / {c.get('recompiles', '-')}"),
            row("latency p50 us", lambda t, c: _us(t["latency_us"]["p50"])),
            row("latency p90 us", lambda t, c: _us(t["latency_us"]["p90"])),
            row("latency p99 us", lambda t, c: _us(t["latency_us"]["p99"])),
            row("  simulated device us", lambda t, c: _us(t["latency_us"]["simulated_us"])),
            row("  host transfer us", lambda t, c: _us(t["latency_us"]["transfer_us"])),
            row("  eager fallback us", lambda t, c: _us(t["latency_us"]["fallback_us"])),
            row("  call overhead us", lambda t, c: _us(t["latency_us"].get("call_overhead_us"))),
            *([row("  collectives us (modelled)",
                   lambda t, c: _us(t["latency_us"].get("collective_us")))]
              if any(t["latency_us"].get("collective_us") for t in targets.values())
              else []),
            row("  roofline us", lambda t, c: _us(t["latency_us"]["roofline_us"])),
            row("host link GB/s", lambda t, c: _assumed(t, "host_link_gbps")),
            row("call overhead us/call", lambda t, c: _assumed(t, "call_overhead_us")),
            row("throughput /s", lambda t, c: "-" if t["throughput_per_s"] is None
                else f"{t['throughput_per_s']:,.0f}"),
            row("device share: nodes", lambda t, c: _pct(t["device_share"]["by_nodes"])),
            row("device share: FLOPs", lambda t, c: _pct(t["device_share"]["by_flops"])),
            row("device share: time", lambda t, c: _pct(t["device_share"]["by_time"])),
            row("fallback ops", lambda t, c: str(sum(f["count"] for f in t["fallbacks"]))),
            row("HBM (w+act+in+kv) / core" if report["model"].get("generate")
                else "HBM (w+act+in) / core", lambda t, c:
                f"{_bytes(t['memory']['hbm_bytes'])} "
                f"({_pct(t['memory']['hbm_fraction_of_core'])})"),
            row("SBUF peak", lambda t, c: f"{_bytes(t['memory']['sbuf_peak_bytes'])} "
                f"({_pct(t['memory']['sbuf_peak_bytes'] / t['memory']['sbuf_capacity_bytes'])})"),
            row("PSUM peak", lambda t, c: f"{_bytes(t['memory']['psum_peak_bytes'])} "
                f"({_pct(t['memory']['psum_peak_bytes'] / t['memory']['psum_capacity_bytes'])})"),
            ]
    rows += [row(f"{e} busy", lambda t, c, e=e: _pct(t["engines"].get(e))) for e in engines]
    rows.append(row("TensorE FLOP util", lambda t, c: _pct(t["tensor_flop_utilisation"])))
    rows.append(row("instance", lambda t, c: t["cost"]["instance"]))
    rows.append(row("  USD / hour", lambda t, c: "not published"
                    if t["cost"]["usd_per_hour"] is None
                    else f"{t['cost']['usd_per_hour']:g} ({t['cost']['price_status']})"))
    per = ("steps" if report["model"].get("train") else
           "tokens" if report["model"].get("generate") else "inferences")
    rows.append(row(f"USD / 1M {per}", lambda t, c:
                    "-" if t["cost"]["usd_per_million_inferences"] is None
                    else f"{t['cost']['usd_per_million_inferences']:.4f}"))
    return _table(rows, left={0})


def generate_text(g: dict) -> str:
    """What ``--generate`` ran, in one sentence (``model.generate`` of the report)."""
    b = g.get("prompt_bucket")
    padded = ("" if not b else f", left-padded to its bucket of {b['length']} ({b['padding']} "
              f"padding tokens, masked; buckets {', '.join(map(str, b['buckets']))})")
    return (f"greedy generation of {g['tokens']} tokens with a static KV cache after a prompt "
            f"of {g['prompt_len']} tokens ({g['prompt']}){padded}, batch {g['batch']}; each "
            f"measured call below is one decode step (latency = TPOT), the prefill is TTFT")


def generation_table(report: dict) -> list[str]:
    """``--generate``: TTFT, TPOT, tokens/s, KV cache, graphs and tokens, targets side by side
    (TTFT and TPOT = simulated device + host transfer + call overhead + eager fallback)."""
    names = [n for n, t in report["targets"].items() if "generate" in t]
    gen = {n: report["targets"][n]["generate"] for n in names}

    def row(label: str, fn) -> tuple[str, ...]:
        return (label,) + tuple(fn(gen[n]) for n in names)

    def tokens(g: dict) -> str:
        return ("= eager" if g["tokens_match_eager"]
                else f"DIFFER from token {g['first_mismatch']}")

    kv = (lambda g: "-" if g["kv_cache"] is None else _bytes(g["kv_cache"]["bytes"]))
    rows = [("Generation", *names),
            row("TTFT us (prefill)", lambda g: _us(g["ttft_us"])),
            row("  simulated / transfer us", lambda g: f"{_us(g['ttft']['simulated_us'])} / "
                                                       f"{_us(g['ttft']['transfer_us'])}"),
            row("TPOT p50 us (decode step)", lambda g: _us(g["tpot_us"]["p50"])),
            row("TPOT p99 us", lambda g: _us(g["tpot_us"]["p99"])),
            row("  simulated / transfer us", lambda g: f"{_us(g['tpot_us']['simulated_us'])} / "
                                                       f"{_us(g['tpot_us']['transfer_us'])}"),
            *([row("  collectives us (TTFT / TPOT p50)",
                   lambda g: f"{_us(g['ttft'].get('collective_us', 0.0))} / "
                             f"{_us(g.get('tpot_collective_us', 0.0))}")]
              if any(g.get("tpot_collective_us") for g in gen.values()) else []),
            row("tokens / s (1e6 / TPOT p50)", lambda g: "-" if g["tokens_per_s"] is None
                else f"{g['tokens_per_s']:,.0f}"),
            row("KV cache HBM", kv),
            row("Dynamo graphs", lambda g: str(g["dynamo_graphs"])),
            row("graph calls (measured run)",
                lambda g: " + ".join(str(c["calls"]) for c in g["graph_calls"])),
            row("tokens", tokens)]
    out = _table(rows, left={0})
    shapes = {(g["kv_cache"]["layers"], g["kv_cache"]["batch"], g["kv_cache"]["kv_heads"],
               g["kv_cache"]["max_cache_len"], g["kv_cache"]["head_dim"], g["kv_cache"]["dtype"])
              for g in gen.values() if g["kv_cache"]}
    for layers, b, h, L, d, dt in sorted(shapes):
        out.append(f"  KV cache: {layers} layers x 2 (K, V) x batch {b} x {h} kv heads x "
                   f"{L} positions x head dim {d}, {dt}")
    froms = {g["tokens_from"] for g in gen.values()}
    out.append(f"  tokens from: {', '.join(sorted(froms))}")
    return out


def _assumed(t: dict, key: str) -> str:
    a = t.get("assumptions", {}).get(key)
    return "-" if a is None else f"{a['value']:g}" + (" (option)" if a["source"] == "option"
                                                      else " (assumed)")


def assumption_lines(report: dict) -> list[str]:
    """Per target, each host-side assumption in force: value, unit and source."""
    from neuron_compiler.assumptions import describe
    return [f"{name}: {line}" for name, t in report["targets"].items()
            if "assumptions" in t for line in describe(t["assumptions"])]


def render(report: dict, exit_code: int | None = None) -> str:
    m, c, acc = report["model"], report["compile"], report["accuracy"]
    lines = [f"neuron-eval {m.get('spec', '?')}" + (f": {m['class']}" if "class" in m else "")
             + (f" ({m['description']})" if m.get("description") else "")]
    if "parameters" in m:
        ins = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in m["inputs"])
        lines.append(f"  {m['parameters']:,} parameters ({_bytes(m['weight_bytes'])}), "
                     f"inputs: {ins or '-'}; {m['flops'] / 1e6:.2f} MFLOP")
        lines.append(f"  eager PyTorch: {eager_text(m)}")
    if m.get("train"):
        lines.append(f"  --train: each call is one training step: {m['train']['step']}; "
                     f"{m['train']['flops'] / 1e6:.2f} MFLOP per step")
    if m.get("generate"):
        lines.append(f"  --generate: {generate_text(m['generate'])}")
    if m.get("parallel"):
        from neuron_compiler.eval.parallel import text as parallel_text
        lines.append(f"  {parallel_text(m['parallel'])}")
    if acc.get("not_checked"):
        lines.append(f"  accuracy not checked: {acc['not_checked']}")
    v = report["versions"]
    lines.append(f"  torch {v['torch']}, neuron-sim {v['neuron_sim']}"
                 + (f" @ {v['git_commit'][:10]}{'+dirty' if v['git_dirty'] else ''}"
                    if v.get("git_commit") else "")
                 + f", python {v['python']}, numpy {v['numpy']}, ml_dtypes {v['ml_dtypes']}")
    breaks = c.get("graph_breaks")
    if c.get("failed_stage") not in ("build", "eager"):
        lines.append(f"compile: {'ok' if c.get('ok') else 'FAILED'}; Dynamo graphs "
                     f"{c.get('graphs', '-')}, graph breaks {'-' if breaks is None else breaks}"
                     + (" (torch._dynamo.explain of one forward call with the model's inputs; "
                        "the generation's graphs are under Generation)"
                        if m.get("generate") else ""))
    for r in c.get("break_reasons", []):
        lines.append(f"  break: {r['reason']}" + (f" at {r['where']}" if r["where"] else ""))
    if c.get("error"):
        lines.append(f"  {c['failed_target'] + ': ' if c.get('failed_target') else ''}"
                     f"{c['error']}")
    if report["targets"]:
        lines.append("")
        if m.get("generate"):
            lines += generation_table(report) + [""]
        lines += _side_by_side(report)
        assumed = assumption_lines(report)
        if assumed:
            lines += ["", "Assumptions (values in force in the latency above, and where they "
                          "come from):"] + [f"  {a}" for a in assumed]
    fb_rows = [("target", "op", "count", "us/call", "share", "reason")]
    iters = {len(t["latency_us"]["samples"]) for t in report["targets"].values()}
    for name, t in report["targets"].items():
        fb_rows += [(name, f["op"], str(f["count"]), f"{f['time_us']:.1f}",
                     _pct(f["share_of_latency"]), f["reason"]) for f in t["fallbacks"]]
    if len(fb_rows) > 1:
        n = "/".join(str(i) for i in sorted(iters))
        lines += ["", f"Fallbacks (eager PyTorch; us/call = mean measured host wall time over "
                      f"the {n} measured calls; share = that time summed over those calls / "
                      f"their summed latency; their host<->device copies are in "
                      f"'host transfer'):"]
        lines += _table(fb_rows, left={0, 1, 5})
    if acc.get("outputs"):
        cast = acc.get("auto_cast", "none")
        lines += ["", f"Accuracy (values from {acc['values_from']}"
                  + (f"; auto_cast={cast}: fp32 outputs judged by the bfloat16 thresholds"
                     if cast != "none" else "") + "):"]
        rows = [("output", "target", "dtype", "max abs", "max rel", "cosine", "result")]
        shown = acc["outputs"]
        if len(shown) > MAX_ACCURACY_ROWS:   # every failure, and the worst output per target
            worst = {}
            for r in shown:
                if r["max_rel"] is not None and (r["target"] not in worst or
                                                 r["max_rel"] > worst[r["target"]]["max_rel"]):
                    worst[r["target"]] = r
            keep = {id(r) for r in shown if not r["passed"]} | {id(r) for r in worst.values()}
            lines.append(f"  ({len(shown)} outputs, {sum(r['passed'] for r in shown)} pass; "
                         f"shown: failures and the largest max rel per target; all in --json)")
            shown = [r for r in shown if id(r) in keep]
        for r in shown:
            rows.append((r["name"], r["target"], r["dtype"],
                         "-" if r["max_abs"] is None else f"{r['max_abs']:.3g}",
                         "-" if r["max_rel"] is None else f"{r['max_rel']:.3g}",
                         "-" if r["cosine"] is None else f"{r['cosine']:.6f}",
                         "pass" if r["passed"] else f"FAIL: {r['problem']}"))
        lines += _table(rows, left={0, 1, 2, 6})
    if report["targets"]:
        costs = {t["cost"]["instance"]: t["cost"] for t in report["targets"].values()}
        lines += ["", "Cost: " + next(iter(costs.values()))["assumption"] + ". Prices:"]
        lines += [f"  {price_text(c)}" for c in costs.values()]
    if report.get("regressions"):
        lines += ["", f"Regressions against the baseline ({len(report['regressions'])}):"]
        lines += [f"  {r['target'] or '-'}: {r['metric']}: {r['message']}"
                  for r in report["regressions"]]
    lines += ["", "Baseline: " + baseline_text(report)]
    if exit_code is not None:
        lines += ["", f"result: {verdict(report, exit_code)} (exit {exit_code})"]
    return "\n".join(lines)


def baseline_text(report: dict) -> str:
    """Whether and how a baseline was compared (never silent about it)."""
    if report.get("baseline"):
        return describe(report["baseline"])
    if report["compile"].get("error"):
        return "not compared: the model failed before the comparison"
    return "none compared (--baseline PATH)"


def eager_text(m: dict) -> str:
    """How the eager baseline was measured: p50 over the timed calls, after warm-up."""
    samples = m.get("eager_samples_ms") or []
    text = f"p50 {_ms(m['eager_time_ms'])} over {len(samples)} call(s)"
    if m.get("eager_warmup"):
        text += (f" after {m['eager_warmup']} warm-up (first, cold call "
                 f"{_ms(m['eager_first_call_ms'])})")
    else:
        text += " (no warm-up: the first, cold call is among them)"
    return text + "; wall clock of this machine's CPU"


def _ms(v: float) -> str:
    return f"{v * 1e3:,.1f} us" if v < 1 else f"{v:,.2f} ms"


def verdict(report: dict, exit_code: int | None) -> str:
    """The result in words, for the terminal and the HTML (exit codes: cli.py)."""
    if exit_code == 0:
        return "PASS"
    if exit_code == 1:
        acc = not report["accuracy"].get("passed", True)
        regs = bool(report.get("regressions"))
        return "FAIL (" + " and ".join(w for w, on in (("accuracy", acc),
                                                      ("regression against the baseline",
                                                       regs)) if on) + ")"
    if exit_code == 3:
        c = report["compile"]
        stage = c.get("failed_stage")
        if stage == "build":
            return "FAIL (the model could not be built: its factory or module raised)"
        if stage == "eager":
            return "FAIL (the model does not run in eager PyTorch)"
        return f"FAIL (the model does not compile or run on {c.get('failed_target')})"
    return f"exit {exit_code}"
