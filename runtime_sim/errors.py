"""The machine's errors: every error the machine raises is a ``MachineError``; its subclasses
name the rule that was broken. When the error is about an instruction it names the instruction
as ``<queue> #<index>: <instruction text>``, then the rule and the actual values. (Re-exported by
``runtime_sim.checks`` and ``runtime_sim``.)"""
from __future__ import annotations

from .isa import Instr, Queue


class MachineError(Exception):
    """Base of every machine error. ``rule`` names the broken rule; ``queue``/``index``/``instr``
    name the instruction when there is one."""

    rule: str = "machine rule"

    def __init__(self, message: str, *, rule: str | None = None, queue: Queue | str | None = None,
                 index: int | None = None, instr: Instr | str | None = None) -> None:
        self.message = message
        if rule is not None:
            self.rule = rule
        self.queue = queue
        self.index = index
        self.instr = instr
        super().__init__(message)

    def with_context(self, queue: Queue | str, index: int, instr: Instr | str) -> "MachineError":
        if self.queue is None:
            self.queue, self.index, self.instr = queue, index, instr
        return self

    def __str__(self) -> str:
        head = ""
        if self.queue is not None:
            head = f"{self.queue} #{self.index}: {self.instr}\n  "
        return f"{head}{self.rule}: {self.message}"


class ProgramError(MachineError):
    rule = "program structure"


class CapacityError(MachineError):
    rule = "capacity"


class AlignmentError(MachineError):
    rule = "partition alignment"


class BoundsError(MachineError):
    rule = "access out of bounds"


class AccessPatternError(MachineError):
    rule = "access pattern"


class OperandError(MachineError):
    rule = "operands"


class EngineError(MachineError):
    rule = "engine datapath"


class UninitializedReadError(MachineError):
    rule = "read of never-written memory"


class PsumAccumulateError(MachineError):
    rule = "PSUM accumulation"


class RaceError(MachineError):
    rule = "race"


class DeadlockError(MachineError):
    rule = "deadlock"


class InputError(MachineError):
    rule = "program inputs"


ERRORS = (MachineError, ProgramError, CapacityError, AlignmentError, BoundsError,
          AccessPatternError, OperandError, EngineError, UninitializedReadError,
          PsumAccumulateError, RaceError, DeadlockError, InputError)
