"""``neuron-dump``: read a dump directory written with ``dump_dir`` / ``$NEURON_DUMP_DIR``.

    neuron-dump DIR                     list the compiles (graph, target, node counts, partitions)
    neuron-dump DIR 0                   summary of compile 0: fallbacks, partitions, programs
                                        (instructions per queue, simulated time), files
    neuron-dump DIR 0 partitions.txt    print a file of compile 0
    neuron-dump DIR 0 program.txt       a stage file of a partition: every match, with headers
                                        (or name the partition: fused_0/program.txt,
                                        fused_0.s1/program.txt)

    neuron-dump DIR 0 decisions.md      fusion (and refused fusions), matmul blocking and why
    neuron-dump DIR --html report.html  the whole dump as one self-contained HTML page
    neuron-dump diff DIR_A DIR_B        what changed: graphs, partitions, fallbacks,
                                        instruction counts, simulated times (exit 1 if any)
    neuron-dump diff --full DIR_A DIR_B  the same with every changed line of the graphs

A compile may be named by its number (``0``, ``000``) or its directory name.

Invariants
- Read-only: it never writes into the dump directory. It reads only the files ``dump.py``
  writes; a missing optional file (stats.json, compiled.json) is shown as ``-``.
- ``main(argv)`` returns a process exit code (0 ok, 2 bad usage / not found; ``diff``: 0 the
  same, 1 different, 2 bad usage).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from neuron_compiler.dump import compiles as _compiles
from neuron_compiler.dump import load_json as _load_json
from neuron_compiler.dump import partition_dirs as _partition_dirs
from neuron_compiler.dump import partition_status
from neuron_compiler.dump import read_text as _read
from neuron_compiler.dump import signature_summary


def _find_compile(root: str, name: str) -> str | None:
    for idx, d in _compiles(root):
        if d == name or (name.isdigit() and int(name) == idx):
            return os.path.join(root, d)
    return None


def list_compiles(root: str) -> str:
    rows = [("#", "directory", "kind", "target", "device", "fallback", "partitions")]
    for idx, d in _compiles(root):
        meta = _load_json(os.path.join(root, d, "compile.json")) or {}
        rows.append((str(idx), d, str(meta.get("kind", "-")), str(meta.get("target", "-")),
                     str(meta.get("device_nodes", "-")), str(meta.get("fallback_nodes", "-")),
                     str(len(meta.get("partitions", {})))))
    if len(rows) == 1:
        return f"no compiles in {root}"
    return "\n".join(_fmt(rows))


def summarize(cdir: str) -> str:
    meta = _load_json(os.path.join(cdir, "compile.json")) or {}
    lines = [f"{os.path.basename(cdir)}: {meta.get('kind', '?')} graph, target "
             f"{meta.get('target', '?')}, {meta.get('device_nodes', '?')} device nodes, "
             f"{meta.get('fallback_nodes', '?')} fallback nodes"]
    fallbacks = meta.get("fallbacks", [])
    lines.append("")
    lines.append(f"fallbacks ({len(fallbacks)}):")
    lines += [f"  {f['op']} x{f['count']}: {f['reason']}" for f in fallbacks] or ["  (none)"]
    lines.append("")
    lines.append("partitions:")
    for name, ops in meta.get("partitions", {}).items():
        lines.append(f"  {name}: {sum(ops.values())} nodes ("
                     + ", ".join(f"{op.removeprefix('aten.')} x{c}" for op, c in ops.items())
                     + ")")
    rows = [("program", "inputs", "instrs", "per queue", "sim us", "roofline us", "status")]
    for d in _partition_dirs(cdir):
        pdir = os.path.join(cdir, d)
        sig = signature_summary(_read(os.path.join(pdir, "signature.txt")))
        comp = _load_json(os.path.join(pdir, "compiled.json"))
        stats = _load_json(os.path.join(pdir, "stats.json"))
        per_q = comp.get("instructions_per_queue", {}) if comp else {}
        rows.append((d, sig, str(sum(per_q.values())) if comp else "-",
                     _queue_summary(per_q),
                     f"{stats['total_ns'] / 1e3:.2f}" if stats else "-",
                     f"{stats['roofline_ns'] / 1e3:.2f}" if stats else "-",
                     partition_status(pdir)))
    if len(rows) > 1:
        lines.append("")
        lines += _fmt(rows)
    lines.append("")
    lines.append("files:")
    for dirpath, _, files in sorted(os.walk(cdir)):
        rel = os.path.relpath(dirpath, cdir)
        for f in sorted(files):
            lines.append("  " + (f if rel == "." else f"{rel}/{f}"))
    return "\n".join(lines)


def _queue_summary(per_q: dict[str, int]) -> str:
    """``pe:24 dve:12 act:6 pool:10 dma:27/11q`` (DMA queues summed, with their count)."""
    engines = ("pe", "dve", "act", "pool")
    parts = [f"{q}:{per_q[q]}" for q in engines if per_q.get(q)]
    parts += [f"{q}:{n}" for q, n in sorted(per_q.items())
              if q not in engines and not q.startswith("dma")]
    dma = [n for q, n in per_q.items() if q.startswith("dma")]
    if dma:
        parts.append(f"dma:{sum(dma)}/{len(dma)}q")
    return " ".join(parts) or "-"


def show_file(cdir: str, name: str) -> str | None:
    direct = os.path.join(cdir, name)
    if os.path.isfile(direct):
        return _read(direct)
    head, _, base = name.rpartition("/")
    found = []
    for d in _partition_dirs(cdir):
        if head and not (d == head or d.startswith(head + ".s")):
            continue
        path = os.path.join(cdir, d, base)
        if os.path.isfile(path):
            found.append((d, path))
    if not found:
        return None
    if len(found) == 1:
        return _read(found[0][1])
    return "\n".join(f"==> {d}/{base} <==\n{_read(p)}" for d, p in found)


def _fmt(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def _diff_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-dump diff", description="What changed between two dump directories "
        "(exit 0 when the same, 1 when different).")
    parser.add_argument("dir_a")
    parser.add_argument("dir_b")
    parser.add_argument("--full", action="store_true",
                        help="show every changed line of the graphs (default: the first "
                             "40, then how many more)")
    args = parser.parse_args(argv)
    for d in (args.dir_a, args.dir_b):
        if not os.path.isdir(d):
            print(f"neuron-dump diff: {d!r} is not a directory", file=sys.stderr)
            return 2
    from neuron_compiler.dump_diff import diff_dumps
    text, changed = diff_dumps(args.dir_a, args.dir_b, full=args.full)
    print(text)
    return 1 if changed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["diff"]:        # a dump directory named "diff" is reachable as ./diff
        try:
            return _diff_main(argv[1:])
        except SystemExit as exc:   # argparse: usage error
            return 2 if exc.code else 0
    parser = argparse.ArgumentParser(
        prog="neuron-dump", description="Inspect a neuron backend dump directory "
        "(`neuron-dump diff DIR_A DIR_B` compares two).")
    parser.add_argument("dir", help="the dump directory (dump_dir option / $NEURON_DUMP_DIR)")
    parser.add_argument("compile", nargs="?", help="a compile: its number or directory name")
    parser.add_argument("file", nargs="?",
                        help="a file of that compile, e.g. partitions.txt, program.txt, "
                             "fused_0/ir_pre_fusion.txt, decisions.md")
    parser.add_argument("--html", metavar="PATH",
                        help="write the whole dump as one self-contained HTML file")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if not os.path.isdir(args.dir):
        print(f"neuron-dump: {args.dir!r} is not a directory", file=sys.stderr)
        return 2
    if args.html is not None:
        if args.compile is not None:
            print("neuron-dump: --html renders the whole directory; drop COMPILE/FILE",
                  file=sys.stderr)
            return 2
        from neuron_compiler.dump_html import render_dump_html
        try:
            with open(args.html, "w") as f:
                f.write(render_dump_html(args.dir))
        except OSError as exc:
            print(f"neuron-dump: cannot write {args.html!r}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.html}")
        return 0
    if args.compile is None:
        print(list_compiles(args.dir))
        return 0
    cdir = _find_compile(args.dir, args.compile)
    if cdir is None:
        names = ", ".join(d for _, d in _compiles(args.dir)) or "none"
        print(f"neuron-dump: no compile {args.compile!r} in {args.dir} (compiles: {names})",
              file=sys.stderr)
        return 2
    if args.file is None:
        print(summarize(cdir))
        return 0
    text = show_file(cdir, args.file)
    if text is None:
        print(f"neuron-dump: no file {args.file!r} in {cdir}; run `neuron-dump {args.dir} "
              f"{args.compile}` to list the files", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
