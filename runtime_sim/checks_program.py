"""``check_program``: every static rule of ``checks.py`` over a whole program.

A straight-line stream is checked instruction by instruction here (``checks.check_instr`` and,
in TensorE program order, the PSUM bank and accumulation-group rules); a looped stream
(``loops.Stream``) per static instruction by ``checks_loops.check_stream``. The first violation
is raised, naming the instruction (``<queue> #<index>: <instruction text>``).
"""
from __future__ import annotations

from .checks import MachineError, PsumGroups, check_buffers, check_instr, check_psum_bank, psum_banks_of
from .checks_loops import check_stream
from .isa import EngineKind, Op, Program
from .loops import Stream
from .targets import Target, get_target


def check_program(program: Program, target: Target | str | None = None) -> None:
    """Run every static rule over a program; raise the first violation (naming the instruction).
    ``target`` defaults to the program's own target name."""
    if not isinstance(target, Target):
        target = get_target(target or program.target)
    bufs = check_buffers(program, target)
    for q, stream in program.streams.items():
        if isinstance(stream, Stream):
            check_stream(q, stream, bufs, target)     # per static instruction, see there
            continue
        groups = PsumGroups(target)
        for i, ins in enumerate(stream):
            try:
                geoms = check_instr(ins, q, bufs, target)
                if ins.op in (Op.MATMUL, Op.TRANSPOSE) and q.engine is EngineKind.TENSOR:
                    check_psum_bank(geoms[0], target, ins.op.value, psum_banks_of(ins, target))
                    groups.step(ins, geoms[0])
            except MachineError as e:
                raise e.with_context(q, i, ins) from None
