"""Two kinds of failure, kept apart.

- ``Unsupported``: the op (or this use of it) cannot run on the device. It is *expected*: the
  caller falls back to eager PyTorch and records ``str(exc)`` as the reason. The message names the
  op, the constraint and the actual value.
- ``LoweringError``: an internal bug of the compiler (an invariant broke). It is never turned
  into a silent fallback; it carries the node or instruction it was working on.
"""
from __future__ import annotations


class Unsupported(Exception):
    """``nodes``: the FX nodes of the partition that cannot run (set by the frontend for a rule,
    by the pipeline for a tiler: a kernel's origin nodes); the caller may take them out and
    compile the rest of the partition again."""

    def __init__(self, op: str, reason: str, nodes: tuple[str, ...] = ()):
        super().__init__(f"{op}: {reason}")
        self.op = op
        self.reason = reason
        self.nodes = nodes


class LoweringError(RuntimeError):
    pass
