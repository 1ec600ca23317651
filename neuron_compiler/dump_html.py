"""``neuron-dump DIR --html PATH``: a dump directory as one self-contained HTML page.

The page: the index (one row per compile), then per compile its graph counts, fallback table
and partition table (with a chart of simulated time against the roofline per program), and per
partition program its compiler decisions (``decisions.md``), its memory plan (the SVG), its
engine utilisation and every stage file (pre-/post-fusion kernel IR, tile IR, memory plan,
sync, program) in a collapsed ``<details>``; a partition whose compile failed shows its error
open, in red.

Invariants
- No network resource: no scripts, stylesheets, images or fonts are loaded; every picture is
  inline SVG, every style in one ``<style>`` element, and nothing has ``href``/``src``
  attributes (links inside the page are not needed: the sections are in order).
- Every string read from the dump is HTML-escaped; SVGs are the ones ``dump_views`` builds from
  the dump's text (regenerated here, never read from the ``.svg`` file, so a tampered file
  cannot inject markup).
- A stage file longer than ``MAX_FILE_CHARS`` is cut there, saying so and naming the file.
"""
from __future__ import annotations

import os

from neuron_compiler.dump import (STAGE_FILES, compiles, load_json, partition_dirs,
                                  partition_status, read_text, signature_summary)
from neuron_compiler.dump_views import decisions, decisions_markdown, memory_plan_svg
from neuron_compiler.eval.html_report import _CSS, _e, _table, bar_chart

MAX_FILE_CHARS = 200_000
_EXTRA_CSS = """
pre { background: #f7f7f7; border: 1px solid #ddd; padding: 8px; font-size: 12px;
      overflow-x: auto; max-height: 480px; }
pre.error { background: #fdecea; border-color: #b3261e; color: #7a1410; }
details { margin: 4px 0; } summary { cursor: pointer; font-size: 13px; }
h3 { font-size: 15px; margin-top: 20px; } .md li { font-size: 13px; margin: 2px 0; }
.md p { font-size: 13px; margin: 4px 0; } .md h3 { font-size: 14px; }
.md h4 { font-size: 13px; margin: 10px 0 4px; } h4 { font-size: 14px; }
"""


def _markdown(text: str) -> str:
    """The small markdown subset ``decisions_markdown`` writes: headings, bullets (one nested
    level), paragraphs."""
    out, depth = [], 0
    for line in text.splitlines():
        stripped = line.lstrip()
        level = (len(line) - len(stripped)) // 2 + 1 if stripped.startswith("- ") else 0
        while depth > level:
            out.append("</ul>")
            depth -= 1
        while depth < level:
            out.append("<ul>")
            depth += 1
        if level:
            out.append(f"<li>{_e(stripped[2:])}</li>")
        elif stripped.startswith("#"):
            n = min(len(stripped) - len(stripped.lstrip("#")) + 2, 6)
            out.append(f"<h{n}>{_e(stripped.lstrip('#').strip())}</h{n}>")
        elif stripped:
            out.append(f"<p>{_e(stripped)}</p>")
    out += ["</ul>"] * depth
    return '<div class="md">' + "\n".join(out) + "</div>"


def _file_block(path: str, label: str, open_: bool = False, cls: str = "") -> str:
    text = read_text(path)
    if not text:
        return ""
    note = ""
    if len(text) > MAX_FILE_CHARS:
        note = (f'<p class="note">cut at {MAX_FILE_CHARS:,} of {len(text):,} characters; '
                f"the whole file: {_e(path)}</p>")
        text = text[:MAX_FILE_CHARS]
    return (f"<details{' open' if open_ else ''}><summary>{_e(label)}</summary>{note}"
            f'<pre class="{cls}">{_e(text)}</pre></details>')


def _partition_section(cdir: str, p: str) -> str:
    pdir = os.path.join(cdir, p)
    status = partition_status(pdir)
    parts = [f"<h3>{_e(os.path.basename(cdir))} / {_e(p)}: {_e(status)}</h3>",
             f'<p class="note">inputs</p><pre>{_e(read_text(os.path.join(pdir, "signature.txt")))}'
             '</pre>']
    error = read_text(os.path.join(pdir, "error.txt"))
    if error:
        parts.append(f'<pre class="error">{_e(error)}</pre>')
    texts = {f: read_text(os.path.join(pdir, f)) for f in STAGE_FILES}
    if texts["ir_post_fusion.txt"]:
        parts.append(_markdown(decisions_markdown(decisions(texts))))
    if texts["memory_plan.txt"]:
        parts.append("<h4>Memory plan</h4>" + memory_plan_svg(texts["memory_plan.txt"]))
    stats = load_json(os.path.join(pdir, "stats.json"))
    if stats and any(v > 0 for v in stats.get("engine_busy", {}).values()):
        busy = sorted(stats["engine_busy"].items())
        parts.append(bar_chart("Engine utilisation (% of the simulated time)",
                               [(e, [("busy", 100.0 * v)]) for e, v in busy], "%",
                               max_value=100))
    for f in ("fx_graph_readable.py",) + STAGE_FILES + ("unsupported.txt", "cache_hit.txt"):
        parts.append(_file_block(os.path.join(pdir, f), f))
    return "\n".join(parts)


def _compile_section(root: str, d: str) -> str:
    cdir = os.path.join(root, d)
    meta = load_json(os.path.join(cdir, "compile.json")) or {}
    out = [f"<h2>{_e(d)}</h2>",
           _table(["kind", "target", "device nodes", "fallback nodes", "partitions"],
                  [[meta.get("kind", "-"), meta.get("target", "-"),
                    meta.get("device_nodes", "-"), meta.get("fallback_nodes", "-"),
                    len(meta.get("partitions", {}))]])]
    fallbacks = meta.get("fallbacks", [])
    if fallbacks:
        out.append("<h3>Fallbacks (run in eager PyTorch)</h3>")
        out.append(_table(["op", "count", "reason"],
                          [[f["op"], f["count"], f["reason"]] for f in fallbacks], {0, 2}))
    rows, chart = [], []
    for p in partition_dirs(cdir):
        pdir = os.path.join(cdir, p)
        comp = load_json(os.path.join(pdir, "compiled.json")) or {}
        stats = load_json(os.path.join(pdir, "stats.json")) or {}
        per_q = comp.get("instructions_per_queue", {})
        sim, roof = stats.get("total_ns"), stats.get("roofline_ns")
        rows.append([p, signature_summary(read_text(os.path.join(pdir, "signature.txt"))),
                     sum(per_q.values()) if comp else "-",
                     f"{sim / 1e3:,.2f}" if sim is not None else "-",
                     f"{roof / 1e3:,.2f}" if roof is not None else "-",
                     partition_status(pdir)])
        if sim is not None:
            chart.append((p, [("simulated", sim / 1e3), ("roofline", (roof or 0) / 1e3)]))
    if rows:
        out.append("<h3>Device partitions</h3>")
        out.append(_table(["program", "inputs", "instructions", "simulated us", "roofline us",
                           "status"], rows, {0, 1, 5}))
    if chart:
        out.append(bar_chart("Simulated time vs roofline per program (us)", chart, " us"))
    out += [_file_block(os.path.join(cdir, f), f) for f in
            ("fx_graph_readable.py", "fx_graph_auto_cast.py", "fx_graph_partitioned.py",
             "partitions.txt")]
    out += [_partition_section(cdir, p) for p in partition_dirs(cdir)]
    return "\n".join(out)


def render_dump_html(root: str) -> str:
    """The page for dump directory ``root`` (module docstring)."""
    cs = compiles(root)
    body = [f"<h1>neuron dump {_e(os.path.abspath(root))}</h1>",
            f'<p class="note">{len(cs)} compiled ATen graph{"s" if len(cs) != 1 else ""}</p>']
    rows = []
    for idx, d in cs:
        cdir = os.path.join(root, d)
        meta = load_json(os.path.join(cdir, "compile.json")) or {}
        statuses = [partition_status(os.path.join(cdir, p)) for p in partition_dirs(cdir)]
        rows.append([idx, d, meta.get("kind", "-"), meta.get("target", "-"),
                     meta.get("device_nodes", "-"), meta.get("fallback_nodes", "-"),
                     ", ".join(f"{n} {s}" for s, n in _counts(statuses)) or "-"])
    body.append(_table(["#", "compile", "kind", "target", "device nodes", "fallback nodes",
                        "programs"], rows, {1, 6}))
    body += [_compile_section(root, d) for _, d in cs]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>neuron dump</title>"
            f"<style>{_CSS}{_EXTRA_CSS}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _counts(statuses: list[str]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for s in statuses:
        key = s.split(":")[0]
        out[key] = out.get(key, 0) + 1
    return list(out.items())
