"""In-place updates of inputs: an output that is a whole copy of an input, then updated by
scatters (a static KV cache's ``index_copy_``), is written into the input's own buffer
(kernel IR -> kernel IR, after fusion).

AOTAutograd's functional graph of ``cache.index_copy_(2, pos, row)`` is
``out = index_put(cache, [.., pos], row)``, returned as an output that its runtime copies back
into ``cache``; ``index_put`` lowers to a POINTWISE copy ``out = cache`` then a SCATTER of the
rows into ``out``. The copy moves the whole cache (read + write) for a one-row update: for a
decode step of gpt2-small over a 1024-token cache that is 75 MB of HBM traffic on top of the
285 MB the step must read. When the caller overwrites the input with the output anyway (an
input mutation: ``TensorSpec.mutated``, set by the backend from AOTAutograd's metadata) and
nothing else reads or writes the input, the output can live in the input's buffer: the copy is dropped, the scatters update the input in place, and the
program returns that buffer (``CompiledGraph.outputs`` may name an input buffer; a functional
run reads it back after the simulator wrote it, ``lowering.compiled``).

Invariants
- Applies only when the copy is a POINTWISE kernel ``cast(load 0)`` to the same dtype, whose
  input and output are whole buffers (offset 0, contiguous, the buffer's size), the input a
  MUTATED graph input (an out-of-place ``index_put`` of an input the user keeps must not write
  over it on the hardware) that no other kernel reads or writes and that is not a graph output, the output
  a graph output buffer that no kernel touches before the copy.
- Every reference to the output buffer becomes the input buffer (same dtype, shape and
  strides), so every later reader and writer sees the same bytes in the same order as before;
  the stale input is never read after the copy's place, because nothing else read it.
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import EOp, KKind, KOp, KProgram, PointwiseAttrs, Role, TensorRef


def _whole(r: TensorRef, kp: KProgram) -> bool:
    return r.offset == 0 and r.is_contiguous and r.numel == kp.buffers[r.buffer].numel


def _is_copy(k: KOp, kp: KProgram) -> bool:
    if k.kind is not KKind.POINTWISE or len(k.ins) != 1 or len(k.outs) != 1:
        return False
    assert isinstance(k.attrs, PointwiseAttrs)
    e, (x,), (t,) = k.attrs.expr, k.ins, k.outs
    return (e.op is EOp.CAST and e.dtype == x.dtype == t.dtype and e.args[0].op is EOp.LOAD
            and e.args[0].index == 0 and x.shape == t.shape and _whole(x, kp) and _whole(t, kp))


def _touches(k: KOp, name: str) -> bool:
    return any(r.buffer == name for r in k.ins + k.outs)


def update_inputs_in_place(kp: KProgram, mutated: set[str]) -> list[str]:
    """Apply the rewrite wherever it holds (module docstring) for the input buffers ``mutated``;
    returns ``"output <- input"`` for each buffer pair merged."""
    done: list[str] = []
    outs = {r.buffer for r in kp.outputs}
    i = 0
    while i < len(kp.kernels):
        k = kp.kernels[i]
        if not _is_copy(k, kp):
            i += 1
            continue
        x, t = k.ins[0].buffer, k.outs[0].buffer
        ok = (x in mutated and kp.buffers[x].role is Role.INPUT and x in kp.inputs and x not in outs
              and kp.buffers[t].role is Role.OUTPUT and t in outs
              and kp.buffers[x].dtype == kp.buffers[t].dtype
              and not any(_touches(o, x) for j, o in enumerate(kp.kernels) if j != i)
              and not any(_touches(o, t) for o in kp.kernels[:i]))
        if not ok:
            i += 1
            continue
        del kp.kernels[i]

        def ren(r: TensorRef) -> TensorRef:
            return replace(r, buffer=x) if r.buffer == t else r

        kp.kernels[i:] = [KOp(o.kind, tuple(map(ren, o.outs)), tuple(map(ren, o.ins)), o.attrs,
                              o.origin) for o in kp.kernels[i:]]
        kp.outputs = [ren(r) for r in kp.outputs]
        del kp.buffers[t]
        done.append(f"%{t} <- %{x}")
    return done
