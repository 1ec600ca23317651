"""Operand-shape assertions shared by the operand rules of ``checks.py`` and ``checks_nc4.py``.

Each raises ``OperandError`` naming the operand, the expected shape and the actual one; none
reads the target or the buffers (they are part of the offset-independent rules,
``checks.check_instr_shape``).
"""
from __future__ import annotations

from .errors import OperandError
from .isa import AP, Instr


def check_nsrcs(ins: Instr, n: int) -> None:
    """``ins`` has exactly ``n`` source APs."""
    if len(ins.srcs) != n:
        raise OperandError(f"{ins.op.value} takes {n} source APs here, got {len(ins.srcs)}")


def check_same_pf(a: AP, b: AP, what: str) -> None:
    """``a`` has ``b``'s partitions and free size."""
    if a.partitions != b.partitions or a.free_size != b.free_size:
        raise OperandError(f"{what}: expected [{b.partitions} partitions x {b.free_size}] elements, "
                           f"got [{a.partitions} x {a.free_size}] ({a})")


def check_col(a: AP, p: int, what: str) -> None:
    """``a`` is a ``[p, 1]`` per-partition operand."""
    if a.partitions != p or a.free_size != 1:
        raise OperandError(f"{what}: expected a [{p}, 1] per-partition operand, got [{a.partitions} x {a.free_size}] ({a})")
