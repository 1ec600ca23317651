"""Per-compile dump directories (``options={"dump_dir": ...}`` or ``$NEURON_DUMP_DIR``).

Layout (every file is plain text or JSON, readable and diffable)::

    DUMP_DIR/
      000_forward_1a2b3c4d/            one directory per compiled ATen graph, numbered in order
        compile.json                   kind, target, options, node counts, fallbacks, partitions
        fx_graph_readable.py           the ATen graph after AOTAutograd + decompositions
        fx_graph_partitioned.py        the outer graph calling fused_N submodules
        partitions.txt                 device partitions (ops) vs fallback ops (reasons)
        fused_0.s0/                    device partition fused_0, input signature number 0
          signature.txt                input shapes and dtypes
          fx_graph_readable.py         the partition specialised on those shapes
          <stage files>                whatever the lowering passes to the dump callback
                                       (ir_pre_fusion.txt, program.txt, ...)
          compiled.json                program summary: instructions per queue, buffers, ops
          stats.json                   simulation statistics of the first call
          unsupported.txt              only when the lowering raised Unsupported

Invariants
- A compile never overwrites another's files: its directory number is claimed with an atomic
  ``mkdir`` (safe with several processes sharing one dump directory).
- File names written through the lowering's dump callback are plain names (no path separators).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

from torch.fx import GraphModule

from runtime_sim.stats import SimStats

COMPILE_DIR_RE = re.compile(r"^(\d{3,})_(.+)$")


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
        from neuron_compiler.runtime import describe_signature
        sub = self.partition_subdir(partition, sig)
        self.write("signature.txt", describe_signature(sig) + "\n", sub)
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


def instructions_per_queue(compiled: object | None) -> dict[str, int]:
    """Instruction count per engine / DMA queue of a lowered program (empty when none)."""
    streams = getattr(getattr(compiled, "program", None), "streams", None) or {}
    return {str(getattr(q, "name", q)): len(s) for q, s in sorted(streams.items())}


def readable(gm: GraphModule) -> str:
    """``print_readable`` text of ``gm`` (with shapes/dtypes as comments)."""
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)
