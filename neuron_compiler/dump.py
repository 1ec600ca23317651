"""Per-compile dump directories (``options={"dump_dir": ...}`` or ``$NEURON_DUMP_DIR``).

Layout (every file is plain text or JSON, readable and diffable)::

    DUMP_DIR/
      index.md                         one line per compile, linking its files (regenerated)
      000_forward_1a2b3c4d/            one directory per compiled ATen graph, numbered in order
        compile.json                   kind, target, options, node counts, fallbacks, partitions
        fx_graph_readable.py           the ATen graph after AOTAutograd + decompositions
        fx_graph_partitioned.py        the outer graph calling fused_N submodules
        partitions.txt                 device partitions (ops) vs fallback ops (reasons)
        fused_0.s0/                    device partition fused_0, input signature number 0
          signature.txt                the inputs, one per line: ``arg0: float32[8, 16]``
                                       (``(parameter)`` after a parameter; a scalar's value)
          fx_graph_readable.py         the partition specialised on those shapes
          <stage files>                whatever the lowering passes to the dump callback
                                       (ir_pre_fusion.txt, program.txt, ...)
          compiled.json                program summary: instructions per queue, buffers, ops
          stats.json                   simulation statistics of the first call
          decisions.md                 fusion (and refused fusions), matmul blocking and why,
                                       other tiling choices (``dump_views``)
          memory_plan.svg              the SBUF/PSUM plan as a picture
          cache_hit.txt                the program came from a cache (stage files replayed)
          unsupported.txt              only when the lowering raised Unsupported
          error.txt                    only when the lowering failed (a compiler bug): the
                                       error and its traceback

Invariants
- A compile never overwrites another's files: its directory number is claimed with an atomic
  ``mkdir`` (safe with several processes sharing one dump directory).
- File names written through the lowering's dump callback are plain names (no path separators).
- ``index.md`` is derived from the compile directories alone and rewritten whole (temporary
  file + ``os.replace``) after each compile and partition, so a reader never sees half of it
  and several processes sharing the directory each leave a complete index.
- Derived views (``decisions.md``, ``memory_plan.svg``) are written from the stage files after
  each partition's compile, whether lowered now or replayed from a cache.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable

from torch.fx import GraphModule

from runtime_sim.stats import SimStats

COMPILE_DIR_RE = re.compile(r"^(\d{3,})_(.+)$")
INDEX = "index.md"
STAGE_FILES = ("ir_pre_fusion.txt", "ir_post_fusion.txt", "tir.txt", "memory_plan.txt",
               "sync.txt", "program.txt")


class CompileDump:
    """The dump directory of one compiled graph."""

    def __init__(self, path: str):
        self.path = path
        self._sig_index: dict[tuple[str, tuple], int] = {}

    @classmethod
    def create(cls, root: str, name: str) -> "CompileDump":
        os.makedirs(root, exist_ok=True)
        taken = [int(m.group(1)) for d in os.listdir(root) if (m := COMPILE_DIR_RE.match(d))]
        index = max(taken, default=-1) + 1
        while True:
            path = os.path.join(root, f"{index:03d}_{name}")
            try:
                os.mkdir(path)
                return cls(path)
            except FileExistsError:
                index += 1

    def write(self, filename: str, text: str, subdir: str | None = None) -> str:
        if os.sep in filename or (os.altsep and os.altsep in filename) or filename in ("", ".", ".."):
            raise ValueError(f"dump file name must be a plain file name, got {filename!r}")
        d = self.path if subdir is None else os.path.join(self.path, subdir)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, filename)
        with open(path, "w") as f:
            f.write(text)
        return path

    def write_json(self, filename: str, obj: object, subdir: str | None = None) -> str:
        return self.write(filename, json.dumps(obj, indent=2, sort_keys=True) + "\n", subdir)

    def partition_subdir(self, partition: str, sig: tuple) -> str:
        key = (partition, sig)
        if key not in self._sig_index:
            self._sig_index[key] = sum(1 for p, _ in self._sig_index if p == partition)
        return f"{partition}.s{self._sig_index[key]}"

    def partition_writer(self, partition: str, sig: tuple,
                         gm: GraphModule) -> Callable[[str, str], None]:
        """The ``dump(filename, text)`` callback handed to ``lowering.api.compile_graph``."""
        sub = self.partition_subdir(partition, sig)
        self.write("signature.txt", format_signature(sig), sub)
        self.write("fx_graph_readable.py", readable(gm), sub)

        def dump(filename: str, text: str) -> None:
            self.write(filename, text if text.endswith("\n") else text + "\n", sub)

        return dump

    def write_compiled(self, partition: str, sig: tuple, compiled: object) -> None:
        program = getattr(compiled, "program", None)
        info = {
            "name": getattr(compiled, "name", partition),
            "ops": list(getattr(compiled, "ops", ())),
            "spill_bytes": int(getattr(compiled, "spill_bytes", 0)),
            "instructions_per_queue": instructions_per_queue(compiled),
            "buffers": [str(b) for b in getattr(program, "buffers", ())],
        }
        self.write_json("compiled.json", info, self.partition_subdir(partition, sig))
        if program is not None and not os.path.exists(
                os.path.join(self.path, self.partition_subdir(partition, sig), "program.txt")):
            self.write("program.txt", str(program) + "\n", self.partition_subdir(partition, sig))

    def write_partition_stats(self, partition: str, sig: tuple, stats: SimStats) -> None:
        self.write_json("stats.json", stats.to_dict(), self.partition_subdir(partition, sig))
        self.update_index()

    def finish_partition(self, partition: str, sig: tuple, error: str | None = None) -> None:
        """After a partition's compile (lowered, replayed from a cache, refused or failed):
        its error (``error.txt``), its derived views, and the index."""
        from neuron_compiler.dump_views import decisions, decisions_markdown, memory_plan_svg
        sub = self.partition_subdir(partition, sig)
        if error is not None:
            self.write("error.txt", error if error.endswith("\n") else error + "\n", sub)
        pdir = os.path.join(self.path, sub)
        texts = {f: read_text(os.path.join(pdir, f)) for f in STAGE_FILES}
        if texts["ir_post_fusion.txt"]:
            title = f"{os.path.basename(self.path)}/{sub}"
            self.write("decisions.md", decisions_markdown(decisions(texts), title), sub)
        if texts["memory_plan.txt"]:
            self.write("memory_plan.svg", memory_plan_svg(texts["memory_plan.txt"]) + "\n", sub)
        self.update_index()

    def update_index(self) -> None:
        write_index(os.path.dirname(self.path))


def format_signature(sig: tuple) -> str:
    """``signature.txt``: one input per line, ``arg<i>: <dtype>[<shape>]`` (`` (parameter)``
    after a parameter), ``arg<i>: <value>`` for a scalar, ``arg<i>: <type name>`` otherwise.
    ``sig`` is ``runtime.signature(args)``: ``("T", shape, dtype, is_parameter)``,
    ``("S", value)`` or ``("O", type name)`` per argument."""
    lines = []
    for i, (kind, *rest) in enumerate(sig):
        if kind == "T":
            shape, dtype, *param = rest
            text = f"{dtype}{list(shape)}" + (" (parameter)" if param and param[0] else "")
        else:
            text = repr(rest[0]) if kind == "S" else str(rest[0])
        lines.append(f"arg{i}: {text}")
    return "".join(f"{ln}\n" for ln in lines) or "(no inputs)\n"


# ---- reading a dump (shared by index.md and neuron-dump) ----------------------------------------
def signature_lines(text: str) -> list[str]:
    """The inputs of a ``signature.txt``, one string each (``float32[8, 16]``); an older dump's
    one-line ``(float32[8, 16], 3)`` form is split at its top-level commas."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines == ["(no inputs)"] or lines == ["()"]:
        return []
    if len(lines) == 1 and lines[0].startswith("(") and lines[0].endswith(")"):
        parts, depth, cur = [], 0, ""
        for ch in lines[0][1:-1]:
            depth += (ch in "[(") - (ch in "])")
            if ch == "," and depth == 0:
                parts.append(cur.strip())
                cur = ""
            else:
                cur += ch
        return parts + [cur.strip()]
    return [ln.split(": ", 1)[1] if re.match(r"arg\d+: ", ln) else ln for ln in lines]


def signature_summary(text: str, width: int = 60) -> str:
    """A table cell for a ``signature.txt``: the inputs joined by ``, `` when that fits in
    ``width`` characters, else ``N inputs (signature.txt)``: never a silently cut line."""
    inputs = signature_lines(text)
    joined = ", ".join(inputs)
    if not inputs:
        return "-"
    many = f"{len(inputs)} input{'s' if len(inputs) > 1 else ''} (signature.txt)"
    return joined if len(joined) <= width else many



def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def compiles(root: str) -> list[tuple[int, str]]:
    """(number, directory name) of every compile under ``root``, in order."""
    out = []
    for d in os.listdir(root):
        m = COMPILE_DIR_RE.match(d)
        if m and os.path.isdir(os.path.join(root, d)):
            out.append((int(m.group(1)), d))
    return sorted(out)


def partition_dirs(cdir: str) -> list[str]:
    return sorted(d for d in os.listdir(cdir) if os.path.isdir(os.path.join(cdir, d)))


def partition_status(pdir: str) -> str:
    """``device``, ``device (cache hit)``, ``fallback: <reason>``, ``error: <first line>`` or
    ``compiling`` (nothing but the inputs written yet) for one partition directory."""
    error = read_text(os.path.join(pdir, "error.txt")).strip()
    if error:
        return "error: " + error.splitlines()[0]
    unsupported = read_text(os.path.join(pdir, "unsupported.txt")).strip()
    if unsupported:
        return "fallback: " + unsupported.splitlines()[0]
    if os.path.exists(os.path.join(pdir, "compiled.json")):
        hit = os.path.exists(os.path.join(pdir, "cache_hit.txt"))
        return "device (cache hit)" if hit else "device"
    return "compiling"


def write_index(root: str) -> str:
    """Rewrite ``root/index.md`` from the compile directories; returns its path."""
    lines = ["# neuron dump", "",
             "One line per compiled ATen graph. Browse with `neuron-dump DIR`, "
             "`neuron-dump DIR N`, `neuron-dump DIR --html report.html`.", "",
             "| # | compile | kind | target | device nodes | fallback nodes | files | partitions |",
             "|---|---|---|---|---|---|---|---|"]
    for idx, d in compiles(root):
        cdir = os.path.join(root, d)
        meta = load_json(os.path.join(cdir, "compile.json")) or {}
        files = " ".join(f"[{f.split('.')[0].removeprefix('fx_graph_')}]({d}/{f})"
                         for f in ("fx_graph_readable.py", "fx_graph_partitioned.py",
                                   "partitions.txt", "compile.json")
                         if os.path.exists(os.path.join(cdir, f)))
        parts = []
        for p in partition_dirs(cdir):
            pdir = os.path.join(cdir, p)
            links = " ".join(f"[{f.split('.')[0].replace('_', ' ')}]({d}/{p}/{f})"
                             for f in ("decisions.md", "memory_plan.svg", "tir.txt",
                                       "program.txt", "stats.json", "error.txt",
                                       "unsupported.txt")
                             if os.path.exists(os.path.join(pdir, f)))
            parts.append(f"**{p}** {partition_status(pdir).replace('|', '/')} {links}")
        lines.append(f"| {idx} | [{d}]({d}/) | {meta.get('kind', '-')} | "
                     f"{meta.get('target', '-')} | {meta.get('device_nodes', '-')} | "
                     f"{meta.get('fallback_nodes', '-')} | {files} | "
                     f"{'<br>'.join(parts) or '-'} |")
    path = os.path.join(root, INDEX)
    fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".md", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise
    return path


def instructions_per_queue(compiled: object | None) -> dict[str, int]:
    """Instruction count per engine / DMA queue of a lowered program (empty when none)."""
    streams = getattr(getattr(compiled, "program", None), "streams", None) or {}
    return {str(getattr(q, "name", q)): len(s) for q, s in sorted(streams.items())}


def readable(gm: GraphModule) -> str:
    """``print_readable`` text of ``gm`` (with shapes/dtypes as comments)."""
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)
