"""``_scaled_dot_product_flash_attention_for_cpu`` taken whole: one ATTENTION kernel.

``F.scaled_dot_product_attention`` on CPU dispatches to this op. The backend keeps it whole (out
of the decomposition table, as Inductor keeps it) when nothing can read its second output, the
logsumexp: traced with grad mode off (no backward), and ``whole_refusal`` has nothing against
the call (no dropout, no ``attn_mask``, as many key/value heads as query heads, one float
dtype; ``lowering.policy.sdpa_kernel_fits``). Otherwise it is decomposed
(torch's math path plus the true logsumexp) and ``passes/attention.py`` fuses the pattern
back; this rule makes the same kernel directly, without tracing the ~50 ops of the math path
and matching them again.

    out[n, h] = softmax(scale * q[n, h] @ k[n, h]^T [causal: keys k <= query q]) @ v[n, h]

Engine: TensorE (both products), ScalarE exp, VectorE row max/sum (``tiling/attention/kernel.py``).

Invariants
- The kernel is the one the pattern fusion makes of the decomposed op: ``safe`` softmax (torch's
  math path is ``_safe_softmax``), scores in fp32, probabilities rounded to the value dtype for the
  second product (fp32 values stay fp32), the output cast once to the query dtype.
- The output has the op's layout ([L, N, H, E] in memory, viewed as [N, H, L, E]), as its
  ``meta['val']`` strides say.
- The logsumexp is not computed: a graph that reads it is refused by ``_check`` (the partition
  falls back, with that reason), never given an unset tensor.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import AttentionKAttrs, EOp, Expr, KKind, KOp, TensorRef, one_batch_form, view_as
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
SDPA_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
ACC = Expr(EOp.ACC, (), DType.FP32)


def _lse_readers(node: fx.Node) -> list[fx.Node]:
    return [u for u in node.users if u.target is operator.getitem and u.args[1] == 1 and u.users]


def whole_refusal(q, k, v, dropout_p: float = 0.0, attn_mask=None) -> str | None:
    """Why a call on tensors (or fake values) ``q, k, v`` cannot be one ATTENTION kernel as it
    stands, or None: the backend keeps such calls whole (``lowering.policy.sdpa_kernel_fits``) and the
    rule's ``_check`` refuses the others."""
    if dropout_p:
        return "dropout_p > 0 (the op draws its own dropout mask)"
    if attn_mask is not None:
        return "an attn_mask (the op is decomposed when a mask is given)"
    if q.dim() != 4 or not q.shape[1] == k.shape[1] == v.shape[1]:
        return f"query heads {tuple(q.shape)} vs key heads {tuple(k.shape)} (grouped-query)"
    dtypes = {t.dtype for t in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= FLOAT_DTYPES:
        return f"operand dtypes {sorted(map(str, dtypes))} (one float dtype expected)"
    return None


def _check(node: fx.Node) -> str | None:
    """Without dropout or ``attn_mask``, equal head counts, one float dtype, and the
    logsumexp output unread."""
    args, kw = node.args, node.kwargs
    q, k, v = (a.meta.get("val") for a in args[:3])
    if q is None or k is None or v is None:
        return "operands without meta['val']"
    why = whole_refusal(q, k, v, args[3] if len(args) > 3 else kw.get("dropout_p", 0.0),
                        kw.get("attn_mask"))
    if why is None and _lse_readers(node):
        why = ("its logsumexp output is read (only the op's backward reads it; the op is "
               "decomposed when traced with grad mode on)")
    return why


@register(SDPA_CPU, dtypes=FLOAT_DTYPES, check=_check)
def _sdpa_cpu(ctx: LowerCtx, node: fx.Node, q: TensorRef, k: TensorRef, v: TensorRef,
              dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None,
              scale: float | None = None):
    reason = _check(node)
    if reason is not None:
        raise Unsupported(ctx.op, reason)
    E = q.shape[-1]
    out_val = ctx.out_val[0]
    s = scale if scale is not None else 1.0 / math.sqrt(E)
    # the output in the op's own layout ([L, N, H, E] in memory), as meta['val'] has it
    shape, strides = tuple(out_val.shape), tuple(out_val.stride())
    if 1 + sum((n - 1) * st for n, st in zip(shape, strides)) != math.prod(shape):
        raise Unsupported(ctx.op, f"output strides {strides} of shape {shape} are not dense")
    buf = ctx.new_tensor((math.prod(shape),), out_val.dtype, hint="attn")
    out = TensorRef(buf.buffer, buf.dtype, shape, strides, 0)
    kt = apply_view(k, torch_dtype_of(k), lambda t: t.transpose(-2, -1))
    # [N*H, ...] as the decomposed bmm saw it when every operand merges, else [N, H, ...]
    flat = view_as(out, (math.prod(shape[:2]),) + shape[2:])
    o, refs = ((flat is not None and one_batch_form(flat, (q, kt, v)))
               or one_batch_form(out, (q, kt, v)))
    attrs = AttentionKAttrs(s, None, bool(is_causal), 0, True, Expr(EOp.CAST, (ACC,), out.dtype),
                            v.dtype)
    ctx.emit(KOp(KKind.ATTENTION, (o,), tuple(refs), attrs))
    return out, None
