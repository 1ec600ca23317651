"""Errors raised by the torch face of the backend.

Invariants
- Every message names what was wrong (option key / op), the constraint, and the actual value.
- ``NeuronFallbackError`` is raised only under ``fallback="error"``; it lists *every* op that
  cannot run on the device (not only the first), each with its reason.
"""
from __future__ import annotations


class NeuronOptionError(ValueError):
    """A bad ``options=`` key or value."""


class NeuronFallbackError(RuntimeError):
    """``fallback="error"`` and some ops cannot run on the device."""

    def __init__(self, entries: list[tuple[str, int, str]]):
        self.entries = list(entries)
        lines = [f"  {op} (x{count}): {reason}" for op, count, reason in self.entries]
        super().__init__(
            "fallback='error': these ops cannot run on the device:\n" + "\n".join(lines)
            + "\n(use options={'fallback': 'allow'} to run them in eager PyTorch)")
