"""Verifiers run between passes (always in tests and debug runs; they are cheap).

- ``verify_kir``: every ref names a known buffer, stays within it, and each kernel's operand
  shapes agree with its kind's rule; no kernel reads a buffer before some kernel wrote it
  (inputs excepted).
- ``verify_program``: the machine program passes the simulator's static checks (capacity,
  alignment, bounds, access-pattern limits, engine datapaths, PSUM banks and accumulation
  groups), per static instruction of its looped streams (``runtime_sim/checks_loops.py``): the
  cost follows the program's size, not its trip counts, and a bad instance is still named.
Errors name the kernel or instruction and what was expected.
"""
from __future__ import annotations

from lowering.errors import LoweringError
from lowering.kir import KKind, KProgram, MatmulKAttrs, PointwiseAttrs, Role, TensorRef
from lowering.tir.analysis import without_cyclic_gc
from runtime_sim.isa import Program


def _check_ref(kp: KProgram, r: TensorRef, where: str) -> None:
    if r.buffer not in kp.buffers:
        raise LoweringError(f"{where}: unknown buffer %{r.buffer}")
    if r.numel == 0:
        return
    # the extreme elements: positive strides walk up from the offset, negative ones down
    hi = r.offset + sum((s - 1) * st for s, st in zip(r.shape, r.strides) if st > 0)
    lo = r.offset + sum((s - 1) * st for s, st in zip(r.shape, r.strides) if st < 0)
    n = kp.buffers[r.buffer].numel
    if lo < 0 or hi >= max(n, 1):
        raise LoweringError(f"{where}: view {r} reaches element {lo if lo < 0 else hi} of "
                            f"%{r.buffer} which has {n} elements")


# the operands the shape rules below index (a kind absent here has no shape rule)
_MIN_INPUTS = {KKind.POINTWISE: 0, KKind.MATMUL: 2}


def verify_kir(kp: KProgram) -> None:
    written = {n for n, b in kp.buffers.items() if b.role is Role.INPUT}
    for i, k in enumerate(kp.kernels):
        where = f"kernel {i} ({k})"
        for r in k.ins + k.outs:
            _check_ref(kp, r, where)
        for r in k.ins:
            if r.buffer not in written and r.numel:
                raise LoweringError(f"{where}: reads %{r.buffer} before any kernel writes it")
        n_in = _MIN_INPUTS.get(k.kind)
        if n_in is not None and (len(k.ins) < n_in or not k.outs):
            raise LoweringError(f"{where}: expected at least {n_in} inputs and 1 output, got "
                                f"{len(k.ins)} and {len(k.outs)}")
        if k.kind is KKind.POINTWISE:
            assert isinstance(k.attrs, PointwiseAttrs)
            for r in k.ins:
                if r.shape != k.outs[0].shape:
                    raise LoweringError(f"{where}: pointwise input {r} does not have the output "
                                        f"shape {k.outs[0].shape}")
            if any(j >= len(k.ins) for j in k.attrs.expr.loads()):
                raise LoweringError(f"{where}: expression loads a missing input")
        if k.kind is KKind.MATMUL:
            a, b = k.ins[0], k.ins[1]
            o = k.outs[0]
            pro = set(k.attrs.prologue_inputs) if isinstance(k.attrs, MatmulKAttrs) else set()
            if not (a.rank == b.rank == o.rank >= 3 and a.shape[:-2] == b.shape[:-2]
                    and a.shape[-1] == b.shape[-2]
                    and o.shape == a.shape[:-1] + b.shape[-1:]
                    and all(x.shape == o.shape for i, x in enumerate(k.ins[2:], 2) if i not in pro)):
                raise LoweringError(f"{where}: expected [*B,M,K] @ [*B,K,N] -> [*B,M,N], got "
                                    f"{a.shape} @ {b.shape} -> {o.shape}")
            if any(i < 2 or i >= len(k.ins) or k.ins[i].shape != (a.shape[-1],) for i in pro):
                raise LoweringError(f"{where}: a_scale / a_shift must name [K] inputs beyond A and B")
        for r in k.outs:
            written.add(r.buffer)
    for r in kp.outputs:
        _check_ref(kp, r, "outputs")
        if r.buffer not in written and r.numel:
            raise LoweringError(f"output {r} is never written")


@without_cyclic_gc
def verify_program(program: Program) -> None:
    from runtime_sim.checks_program import check_program
    from runtime_sim.targets import get_target
    check_program(program, get_target(program.target))
