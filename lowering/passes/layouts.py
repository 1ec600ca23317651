"""Input layouts: a weight that stays in HBM across calls is stored the way its matmuls read it.

A graph input whose ``TensorSpec.resident`` is set (a parameter: uploaded once, read on every
call) may be stored in HBM in a layout the compiler chooses. The runtime applies that layout
when it uploads the data (``CompiledGraph.input_layouts``), as neuronx-cc lays out a model's
weights when it compiles them; in the steady state it costs nothing (the upload is the same
bytes). The one layout chosen here: a 2-d input ``W [R, C]`` that every kernel reads as the B
operand of a MATMUL through its transpose (``x @ W.T``, an ``nn.Linear`` weight: B is K-contiguous,
which a matmul otherwise gets by a DMA transpose or, where there is none (trn1, fp32), by TensorE
transposes evacuated through PSUM) is stored transposed, so that B's rows are contiguous and
load with plain DMAs; only where no DMA transpose serves it (trn1, or 4-byte types), since
a DMA transpose moves W.T at nearly the plain rate while rows of a narrow W.T load in short
contiguous runs (BERT-base trn2 bf16: 640 -> 687 us when its weights were relaid too).

Invariants
- Only a resident 2-d input is changed, and only when every reader is a MATMUL kernel taking it
  as ``ins[1]`` through a view with offset 0, strides in {0, 1, C}, the last two strides
  ``(1, C)``, and the input is not (a view of) a program output.
- The rewrite is exact: element ``[r, c]`` moves from ``r*C + c`` to ``c*R + r``; in every view
  stride ``C`` becomes 1, stride 1 becomes ``R``, stride 0 stays 0.
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import KKind, KOp, KProgram, TensorRef
from runtime_sim.targets import Target

TRANSPOSED = (1, 0)


def choose_input_layouts(kp: KProgram, shapes: list[tuple[int, ...]], resident: list[bool],
                         t: Target) -> tuple[tuple[int, ...] | None, ...]:
    """Rewrite ``kp`` in place for the layouts chosen; per graph input (the placeholders, the
    first ``len(shapes)`` of ``kp.inputs``), the permutation of its axes it is stored in, or
    None when it is stored as given."""
    out: list[tuple[int, ...] | None] = [None] * len(shapes)
    outputs = {r.buffer for r in kp.outputs}
    for i, (name, shape, res) in enumerate(zip(kp.inputs, shapes, resident)):
        if not res or len(shape) != 2 or name in outputs or min(shape) <= 1:
            continue
        if t.dma_transpose_efficiency > 0 and kp.buffers[name].dtype.itemsize == 2:
            continue       # a DMA transpose loads W.T at its full rate: nothing to gain
        R, C = shape
        readers = [(ki, j) for ki, k in enumerate(kp.kernels) for j, r in enumerate(k.ins)
                   if r.buffer == name]
        if not readers or any(not _transposed_b(kp.kernels[ki], j, R, C) for ki, j in readers):
            continue
        for ki in sorted({ki for ki, _ in readers}):
            k = kp.kernels[ki]
            ins = tuple(_relaid(r, R, C) if r.buffer == name else r for r in k.ins)
            kp.kernels[ki] = KOp(k.kind, k.outs, ins, k.attrs, k.origin)
        out[i] = TRANSPOSED
    return tuple(out)


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
