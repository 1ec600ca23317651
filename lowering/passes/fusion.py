"""Fusion on the kernel-level IR: keep elementwise intermediates out of HBM.

1. Pointwise into pointwise: a POINTWISE kernel whose output is read only by POINTWISE kernels
   (as an aligned, possibly broadcast view) is inlined into each reader's expression; its inputs
   become the reader's inputs (broadcast through the reader's view). Unless recomputing it costs
   far more than computing it once (``RECOMPUTE_MIN_OPS`` operations or more, and readers that
   together compute ``RECOMPUTE_FACTOR`` times more elements than it writes: a mask built once
   from loaded tensors and broadcast over every head of every layer); then it stays a kernel and
   its readers load it. A producer of index expressions only (a causal mask) is always inlined.
2. Pointwise into a matmul epilogue: a POINTWISE kernel that reads a MATMUL output (the whole
   output, same shape) that nobody else reads becomes the matmul's epilogue, evaluated while
   PSUM is evacuated.
3. Attention (``passes/attention.py``): matmul -> softmax -> matmul becomes one ATTENTION
   kernel; kernels whose outputs nothing reads are dropped.
4. Copies into batched matmuls: a contiguous copy that only exists to merge batch axes for a
   matmul operand is dropped; the matmul reads the strided source with several batch axes.
5. Activations (``passes/patterns.py``): a written-out function ScalarE has as one activation
   (the tanh GELU) becomes that activation (the one rewrite here that changes rounding).
6. Pointwise into an attention epilogue: a POINTWISE kernel that only reads the ATTENTION
   output, through a permutation of its axes, becomes the attention's epilogue, and the
   attention writes the consumer's tensor in the consumer's layout.
7. Reading through copies: an ATTENTION operand that is a pure copy of a view of another
   tensor (GPT-2's K and V, copied out as the present key/value cache) reads that view itself,
   so the attention does not wait for the copy; the copy stays for its other readers.

Invariants
- A fused producer disappears only when every reader inlined it and it is not a graph output.
- Inlining never changes rounding: every expression node keeps the dtype of its ATen op
  (activation recognition, 5, is the documented exception).
- Expressions stay below ``MAX_EXPR`` nodes (recomputation is bounded).
"""
from __future__ import annotations

from lowering.kir import KProgram
from lowering.passes.attention import drop_dead_kernels, fuse_attention
from lowering.passes.fusion_rules import (absorb_copies_into_matmul, fuse_attention_epilogues,
                                          fuse_matmul_epilogues, fuse_pointwise_chains,
                                          read_through_copies)
from lowering.passes.fusion_why import explain
from lowering.passes.patterns import recognise_activations


def fuse(kp: KProgram) -> KProgram:
    """Run the fusions to a fixed point (in place); return the program. Every producer ->
    consumer pair of kernels left through a temporary gets a ``WhyNoFuse`` line in
    ``kp.notes`` (``fusion_why.explain``; refused attention fusions too)."""
    passes = (drop_dead_kernels, fuse_pointwise_chains, recognise_activations, fuse_matmul_epilogues,
              absorb_copies_into_matmul, lambda kp: fuse_attention(kp, kp.notes),
              fuse_attention_epilogues, read_through_copies)
    # in priority order; a pass that changed something runs again at once until it has
    # nothing left (a chain of pointwise fusions does not re-run the passes before it after
    # every single fusion), then everything starts again from the first pass
    i = 0
    while i < len(passes):
        if passes[i](kp):
            while passes[i](kp):
                pass
            i = 0
        else:
            i += 1
    kp.notes.extend(n for n in explain(kp) if n not in kp.notes)
    return kp
