"""``neuron-dump diff DIR_A DIR_B``: what changed between two dump directories.

Compared, side by side: the compiles (paired by kind and order: the first forward of A with the
first forward of B, ...), each compile's ATen graph (``fx_graph_readable.py``, as a line diff),
device / fallback node counts, the fallback table (op: count), the device partitions and their
ops, and per partition program: its status, instruction count (and per queue, when it differs),
simulated time and roofline.

Invariants
- Read-only, and a pure function of the two directories' files (the ones ``dump.py`` writes).
- ``diff_dumps`` returns ``(text, changed)``; ``changed`` is True when any compared item
  differs, so the exit code (0 same, 1 different) agrees with the rows marked ``*``.
- A program taken from a cache is the same program: ``device (cache hit)`` compares equal
  to ``device``.
- Simulated times compare exactly (the simulator is deterministic: the same program has the
  same time), shown with their relative change.
- Nothing is cut silently. A cell longer than ``CELL`` characters ends in ``...`` and, when
  its row changed, both whole values are printed beneath the row; changed input signatures
  are printed as a line diff, one input per line. The graph diff shows every changed line
  with ``full=True`` (``--full``), else the first ``GRAPH_LINES`` and ``... N more changed
  lines`` with the command that shows them all.
"""
from __future__ import annotations

import difflib
import os
from collections import Counter
from dataclasses import dataclass, field

from neuron_compiler.dump import (compiles, load_json, partition_dirs, partition_status,
                                  read_text, signature_lines, signature_summary)

CELL = 60            # widest table cell; a longer value ends in "..." (never cut silently)
GRAPH_LINES = 40     # changed graph lines shown without --full


@dataclass
class _Compile:
    dirname: str
    meta: dict
    graph: str
    programs: dict[str, dict] = field(default_factory=dict)


def _collect(root: str) -> list[_Compile]:
    out = []
    for _, d in compiles(root):
        cdir = os.path.join(root, d)
        c = _Compile(d, load_json(os.path.join(cdir, "compile.json")) or {},
                     read_text(os.path.join(cdir, "fx_graph_readable.py")))
        for p in partition_dirs(cdir):
            pdir = os.path.join(cdir, p)
            comp = load_json(os.path.join(pdir, "compiled.json")) or {}
            stats = load_json(os.path.join(pdir, "stats.json")) or {}
            c.programs[p] = {
                # where the program came from (lowered or a cache) is not a change of it
                "status": partition_status(pdir).replace(" (cache hit)", ""),
                "signature": tuple(signature_lines(read_text(os.path.join(pdir,
                                                                          "signature.txt")))),
                "queues": comp.get("instructions_per_queue", {}),
                "sim_us": stats["total_ns"] / 1e3 if "total_ns" in stats else None,
                "roofline_us": stats["roofline_ns"] / 1e3 if "roofline_ns" in stats else None,
            }
        out.append(c)
    return out


def _pair(a: list[_Compile], b: list[_Compile]) -> list[tuple[str, _Compile | None,
                                                             _Compile | None]]:
    def keyed(cs: list[_Compile]) -> dict[tuple[str, int], _Compile]:
        seen: Counter = Counter()
        out = {}
        for c in cs:
            kind = str(c.meta.get("kind", "?"))
            out[(kind, seen[kind])] = c
            seen[kind] += 1
        return out
    ka, kb = keyed(a), keyed(b)
    order = list(ka) + [k for k in kb if k not in ka]
    return [(f"{k[0]} #{k[1]}", ka.get(k), kb.get(k)) for k in order]


def _change(va: object, vb: object) -> str:
    if va == vb:
        return ""
    if va is None or vb is None:
        return "added" if va is None else "removed"
    if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
        d = vb - va
        rel = f" ({100.0 * d / va:+.1f}%)" if va else ""
        return (f"{d:+.2f}" if isinstance(d, float) else f"{d:+d}") + rel
    return "changed"


def _show(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, tuple):           # a signature: its inputs
        return signature_summary("\n".join(v), CELL) if v else "(no inputs)"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _details(name: str, va: object, vb: object) -> list[str]:
    """What a changed row's cells cannot show: a signature's inputs as a line diff, or both
    whole values when a cell had to be cut."""
    if isinstance(va, tuple) or isinstance(vb, tuple):
        return _line_diff(list(va or ()), list(vb or ()))
    if max(len(_show(va)), len(_show(vb))) > CELL:
        return [f"A: {_show(va)}", f"B: {_show(vb)}"]
    return []


def _line_diff(a: list[str], b: list[str]) -> list[str]:
    """The changed lines of ``a`` -> ``b`` (``-`` in A only, ``+`` in B only)."""
    return [x for x in difflib.unified_diff(a, b, "A", "B", lineterm="", n=0)
            if x[:1] in "+-" and x[:3] not in ("+++", "---")]


def _rows_for(ca: _Compile | None, cb: _Compile | None) -> list[tuple[str, object, object]]:
    ma = ca.meta if ca else {}
    mb = cb.meta if cb else {}
    rows: list[tuple[str, object, object]] = [
        ("directory", ca.dirname if ca else None, cb.dirname if cb else None),
        ("target", ma.get("target"), mb.get("target")),
        ("device nodes", ma.get("device_nodes"), mb.get("device_nodes")),
        ("fallback nodes", ma.get("fallback_nodes"), mb.get("fallback_nodes")),
        ("partitions", len(ma.get("partitions", {})) if ca else None,
         len(mb.get("partitions", {})) if cb else None),
    ]
    fa = {f["op"]: f["count"] for f in ma.get("fallbacks", [])}
    fb = {f["op"]: f["count"] for f in mb.get("fallbacks", [])}
    rows += [(f"fallback {op}", fa.get(op), fb.get(op)) for op in sorted(set(fa) | set(fb))]
    pa, pb = ma.get("partitions", {}), mb.get("partitions", {})
    for name in sorted(set(pa) | set(pb)):
        oa = ", ".join(f"{o.removeprefix('aten.')} x{n}" for o, n in pa.get(name, {}).items())
        ob = ", ".join(f"{o.removeprefix('aten.')} x{n}" for o, n in pb.get(name, {}).items())
        rows.append((f"{name} ops", oa or None, ob or None))
    ga = ca.programs if ca else {}
    gb = cb.programs if cb else {}
    for p in sorted(set(ga) | set(gb)):
        a, b = ga.get(p, {}), gb.get(p, {})
        rows += [(f"{p} inputs", a.get("signature"), b.get("signature")),
                 (f"{p} status", a.get("status"), b.get("status"))]
        qa, qb = a.get("queues", {}), b.get("queues", {})
        rows.append((f"{p} instructions", sum(qa.values()) if a else None,
                     sum(qb.values()) if b else None))
        if qa != qb and a and b:
            rows += [(f"{p}   {q}", qa.get(q), qb.get(q)) for q in sorted(set(qa) | set(qb))
                     if qa.get(q) != qb.get(q)]
        rows += [(f"{p} simulated us", a.get("sim_us"), b.get("sim_us")),
                 (f"{p} roofline us", a.get("roofline_us"), b.get("roofline_us"))]
    return rows


def _graph_diff(ca: _Compile | None, cb: _Compile | None,
                full: bool) -> tuple[str, list[str]]:
    if ca is None or cb is None:
        return "", []
    if ca.graph == cb.graph:
        return "same", []
    lines = _line_diff(ca.graph.splitlines(), cb.graph.splitlines())
    plus = sum(1 for x in lines if x.startswith("+"))
    summary = f"changed (+{plus} -{len(lines) - plus} lines)"
    if full or len(lines) <= GRAPH_LINES:
        return summary, lines
    return summary, lines[:GRAPH_LINES] + [
        f"... {len(lines) - GRAPH_LINES} more changed lines (all of them: neuron-dump diff --full "
        "DIR_A DIR_B)"]


def _cell(text: str) -> str:
    return text if len(text) <= CELL else text[:CELL - 4] + " ..."


def diff_dumps(dir_a: str, dir_b: str, full: bool = False) -> tuple[str, bool]:
    """The side-by-side comparison of two dump directories and whether anything differs;
    ``full``: every changed line of the graphs (else the first ``GRAPH_LINES``)."""
    a, b = _collect(dir_a), _collect(dir_b)
    out = [f"A: {dir_a} ({len(a)} compiles)", f"B: {dir_b} ({len(b)} compiles)"]
    changed = cut = False
    for label, ca, cb in _pair(a, b):
        out += ["", f"== {label}" + ("" if ca and cb else
                                    f"  (only in {'A' if cb is None else 'B'})")]
        changed |= ca is None or cb is None
        gsum, gshown = _graph_diff(ca, cb, full)
        rows: list[tuple[tuple[str, str, str, str], list[str]]] = [(("", "A", "B", "change"), [])]
        if gsum:
            rows.append((("graph", "", "", "" if gsum == "same" else gsum), gshown))
            changed |= gsum != "same"
        for name, va, vb in _rows_for(ca, cb):
            ch = "" if name == "directory" else _change(va, vb)
            changed |= bool(ch)
            cells = (name, _show(va), _show(vb), ch)
            cut |= any(len(c) > CELL for c in cells)
            rows.append((cells, _details(name, va, vb) if ch else []))
        widths = [max(len(_cell(r[i])) for r, _ in rows) for i in range(4)]
        for k, (r, details) in enumerate(rows):
            mark = "*" if r[3] and k else " "          # row 0 is the header
            line = "  ".join(_cell(c).ljust(w) for c, w in zip(r, widths))
            out.append(f"{mark} {line}".rstrip())
            out += [f"      {x}" for x in details]
    if cut:
        out += ["", f"(a cell ending in '...' was cut at {CELL} characters; a changed row's whole "
                    "values are printed beneath it; `neuron-dump DIR COMPILE` shows one dump's)"]
    out += ["", "different (rows marked *)" if changed else "same"]
    return "\n".join(out), changed
