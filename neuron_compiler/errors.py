"""Errors raised by the torch face of the backend.

Invariants
- Every message names what was wrong (option key / op), the constraint, and the actual value.
- ``NeuronFallbackError`` is raised only under ``fallback="error"``; it lists *every* op that
  cannot run on the device (not only the first), each with its reason.
- ``NeuronInternalError`` is a bug of the compiler met while compiling one device partition
  (anything but ``lowering.errors.Unsupported``). It is never turned into a fallback; its
  message names the graph, the partition, its input signature and the ATen op(s) involved, and
  the original exception is its ``__cause__``.
- ``NeuronRunError`` (a ``NeuronInternalError``) is the same for a machine error the simulator
  raised while running a partition's program (race, out-of-bounds access, partition alignment,
  deadlock, read of never-written memory): the compiler built a program that breaks a machine
  rule. It names the graph, the partition, the signature, the machine rule, the instruction
  and the ATen op(s) the instruction was generated for (from its tag), never only the bare
  simulator exception.
- ``NeuronInputError`` is a call the device cannot run as given (a meta-device input in
  functional mode, tensors that do not fit the target's HBM); it names the tensor, the
  constraint and the actual value, and is raised before any simulation starts.
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


class NeuronInternalError(RuntimeError):
    """An internal error while compiling device partition ``graph/partition``.

    ``ops`` are the ATen ops the error names (the nodes its message mentions), or every op of
    the partition when it names none; ``partition_ops`` are all the partition's ops."""

    stage = "compiling"

    def __init__(self, graph: str, partition: str, signature: str, ops: list[str],
                 partition_ops: list[str], cause: BaseException):
        self.graph, self.partition, self.signature = graph, partition, signature
        self.ops, self.partition_ops = list(ops), list(partition_ops)
        where = f"{graph}/{partition} {signature}"
        involved = ", ".join(self.ops) or "no ATen op"
        extra = ("" if set(self.ops) >= set(self.partition_ops)
                 else f"; the partition computes {', '.join(self.partition_ops)}")
        super().__init__(
            f"internal error {self.stage} device partition {where} (op: {involved}{extra}): "
            f"{type(cause).__name__}: {cause}\n(this is a bug of the neuron compiler, not an "
            f"unsupported op: it is not turned into an eager fallback)")


class NeuronRunError(NeuronInternalError):
    """A machine error (``runtime_sim.errors.MachineError``) raised while the simulator ran
    device partition ``graph/partition``: ``rule`` is the machine rule it broke, ``instruction``
    the instruction (``<queue> #<index>: <text>``) when the error names one."""

    stage = "running"

    def __init__(self, graph: str, partition: str, signature: str, ops: list[str],
                 partition_ops: list[str], cause: BaseException):
        self.rule = str(getattr(cause, "rule", type(cause).__name__))
        queue, index = getattr(cause, "queue", None), getattr(cause, "index", None)
        self.instruction = (None if queue is None
                            else f"{queue} #{index}: {getattr(cause, 'instr', '?')}")
        super().__init__(graph, partition, signature, ops, partition_ops, cause)


class NeuronInputError(ValueError):
    """A call that the device cannot run as given (see the module docstring)."""
