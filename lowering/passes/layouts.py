"""Input layouts: a weight that stays in HBM across calls is stored the way its matmuls read it.

A graph input whose ``TensorSpec.resident`` is set (a parameter: uploaded once, read on every
call) may be stored in HBM in a layout the compiler chooses. The runtime applies that layout
when it uploads the data (``CompiledGraph.input_layouts``), as neuronx-cc lays out a model's
weights when it compiles them; in the steady state it costs nothing (the upload is the same
bytes). The one layout chosen here: a 2-d input ``W [R, C]`` that a kernel reads as the B
operand of a MATMUL through its transpose (``x @ W.T``, an ``nn.Linear`` weight, a tied LM
head: B is K-contiguous, which a matmul otherwise gets by DMA transposes at
``dma_transpose_efficiency`` of the plain rate, or where there are none (trn1, 4-byte types) by
TensorE transposes evacuated through PSUM) is stored transposed, so that B's rows are
contiguous and load with plain DMAs at the full rate. Every such weight is stored transposed
on trn2/trn3 too (it used to be trn1 and 4-byte types only): their DMA transposes run below the
plain rate, which a large weight (a 128k-vocabulary LM head) pays on every call.

When the input has other readers too (a tied embedding: the LM head reads ``wte.T``, the
lookup gathers rows of ``wte``), those keep the input as given and the matmuls read a second
resident copy stored transposed (``CompiledGraph.input_copies``: the runtime uploads it once
beside the plain one).

Invariants
- Only a resident 2-d input is changed, and only for readers that are MATMUL kernels taking it
  as ``ins[1]`` through a view with offset 0, strides in {0, 1, C}, the last two strides
  ``(1, C)``; the input is not (a view of) a program output.
- The rewrite is exact: element ``[r, c]`` moves from ``r*C + c`` to ``c*R + r``; in every view
  stride ``C`` becomes 1, stride 1 becomes ``R``, stride 0 stays 0.
- An input is relaid in place only when every reader reads it so; else its transposed readers
  move to a copy named ``<input>_t`` and the others are unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import KKind, KOp, KProgram, TensorRef

TRANSPOSED = (1, 0)


Copy = tuple[str, int, tuple[int, ...]]     # (program input, graph input index, permutation)


def choose_input_layouts(kp: KProgram, shapes: list[tuple[int, ...]], resident: list[bool]
                         ) -> tuple[tuple[tuple[int, ...] | None, ...], tuple[Copy, ...]]:
    """Rewrite ``kp`` in place for the layouts chosen. Returns, per graph input (the
    placeholders, the first ``len(shapes)`` of ``kp.inputs``), the permutation of its axes it
    is stored in (None: as given), and the copies added as program inputs (appended to
    ``kp.inputs``), each a graph input stored permuted."""
    out: list[tuple[int, ...] | None] = [None] * len(shapes)
    copies: list[Copy] = []
    outputs = {r.buffer for r in kp.outputs}
    for i, (name, shape, res) in enumerate(zip(kp.inputs, shapes, resident)):
        if not res or len(shape) != 2 or name in outputs or min(shape) <= 1:
            continue
        R, C = shape
        readers = [(ki, j) for ki, k in enumerate(kp.kernels) for j, r in enumerate(k.ins)
                   if r.buffer == name]
        moved = {(ki, j) for ki, j in readers if _transposed_b(kp.kernels[ki], j, R, C)}
        if not moved:
            continue
        target = name
        if len(moved) < len(readers):
            target = f"{name}_t"
            kp.buffers[target] = replace(kp.buffers[name], name=target)
            kp.inputs.append(target)
            copies.append((target, i, TRANSPOSED))
        else:
            out[i] = TRANSPOSED
        for ki in sorted({ki for ki, _ in moved}):
            k = kp.kernels[ki]
            ins = tuple(replace(_relaid(r, R, C), buffer=target) if (ki, j) in moved else r
                        for j, r in enumerate(k.ins))
            kp.kernels[ki] = KOp(k.kind, k.outs, ins, k.attrs, k.origin)
    return tuple(out), tuple(copies)


def _transposed_b(k: KOp, j: int, R: int, C: int) -> bool:
    """``k`` reads the input as its B operand ``W.T`` (see the module docstring): every element
    it reaches is ``[r, c]`` with ``r`` from the stride-C axes and ``c`` from the stride-1 axes,
    without carry (their spans stay below R and C)."""
    r = k.ins[j]
    if k.kind is not KKind.MATMUL or j != 1 or r.offset != 0 or r.rank < 2:
        return False
    if r.strides[-2:] != (1, C) or not all(s in (0, 1, C) or n == 1 for s, n in zip(r.strides, r.shape)):
        return False
    span = {s: sum(n - 1 for st, n in zip(r.strides, r.shape) if st == s and n > 1) for s in (1, C)}
    return span[1] < C and span[C] < R


def _relaid(r: TensorRef, R: int, C: int) -> TensorRef:
    new = tuple(0 if n == 1 or s == 0 else 1 if s == C else R for s, n in zip(r.strides, r.shape))
    return replace(r, strides=new)
