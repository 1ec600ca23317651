"""Verifier of the tile IR (run between tiling and the later passes).

Checks, each error naming the instruction and what was expected:
- statement ids unique and increasing in program order; loop variables unique, counts >= 2;
- every access names a known buffer; SBUF/PSUM accesses lie inside their buffer's scope loop
  and use only enclosing loop variables;
- every access stays within its slot (SBUF/PSUM: partitions and bytes) or tensor (HBM) for
  every iteration (affine bounds over the loop ranges);
- ``start_when`` and ``dyn_attrs`` use only enclosing loop variables.
"""
from __future__ import annotations

from typing import Iterator

from lowering.errors import LoweringError
from lowering.tir.analysis import Structure
from lowering.tir.ir import TAP, Loop, Stmt, TProgram
from runtime_sim.isa import Memory


def verify_tir(tp: TProgram, st: Structure | None = None) -> None:
    """``st`` is accepted for the pipeline's call but not needed: the checks walk the statement
    tree, since ``Structure.loop_of_var`` keeps one loop per variable and cannot show a variable
    that two loops use."""
    seen_vars: set[str] = set()
    for lp in _loops(tp.body):
        if lp.var in seen_vars:
            raise LoweringError(f"tile IR: loop variable {lp.var} is used by two loops")
        seen_vars.add(lp.var)
        if lp.count < 2:
            raise LoweringError(f"tile IR: loop {lp.var} runs {lp.count} times (expected >= 2)")
    last = -1
    for ins, loops in tp.instrs():
        where = f"tile IR instruction {ins.sid} ({ins.op.value}, {ins.tag})"
        if ins.sid <= last:
            raise LoweringError(f"{where}: statement id not increasing (after {last})")
        last = ins.sid
        counts = {lp.var: lp.count for lp in loops}
        for a, _ in ins.accesses():
            _check_access(tp, a, counts, where)
        for e in ins.start_when + tuple(e for _, e in ins.dyn_attrs):
            for v in e.vars:
                if v not in counts:
                    raise LoweringError(f"{where}: uses loop variable {v} outside its loop")


def _loops(body: tuple[Stmt, ...]) -> Iterator[Loop]:
    for s in body:
        if isinstance(s, Loop):
            yield s
            yield from _loops(s.body)


def _check_access(tp: TProgram, a: TAP, counts: dict[str, int], where: str) -> None:
    try:
        buf = tp.buffer(a.buf)
    except KeyError:
        raise LoweringError(f"{where}: unknown buffer {a.buf}") from None
    for v in a.offset.vars:
        if v not in counts:
            raise LoweringError(f"{where}: {a} uses loop variable {v} outside its loop")
    if buf.memory is not Memory.HBM and buf.scope is not None and buf.scope not in counts:
        raise LoweringError(f"{where}: {a} touches {buf.name} outside its scope loop {buf.scope}")
    lo, hi = a.offset.bounds(counts)
    slo, shi = a.byte_span()
    if buf.memory is Memory.HBM:
        size = buf.free[0]
    else:
        size = buf.slot_bytes
        if a.partition_start < 0 or a.partition_start + a.partitions > buf.partitions:
            raise LoweringError(f"{where}: {a} touches partitions [{a.partition_start}, "
                                f"{a.partition_start + a.partitions}) of {buf.name}, which has "
                                f"{buf.partitions}")
    if a.free_size and (lo + slo < 0 or hi + shi > size):
        raise LoweringError(f"{where}: {a} reaches bytes [{lo + slo}, {hi + shi}) of {buf.name}, "
                            f"which has {size} B{' per partition per slot' if buf.memory is not Memory.HBM else ''}")
