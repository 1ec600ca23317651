"""The decomposition policy: which ATen ops reach the lowering whole, and which are decomposed
first (the table that AOTAutograd and ``make_fx`` trace with, ``decomposition_table(target)``).

- ``EXTRA_DECOMPOSITIONS``: ops core ATen keeps whole but the registry lowers only decomposed;
- ``KEEP_WHOLE``: ops core ATen decomposes but the registry lowers whole;
- ``KERNEL_OPS``: ops core ATen decomposes, kept whole when their registry kernel takes the call
  on the target (a test on the arguments: partitioning sees the target), decomposed otherwise;
- the SDPA case: ``_scaled_dot_product_flash_attention_for_cpu`` kept whole when
  ``sdpa_kernel_fits``, else decomposed with the true logsumexp its backward reads, and its
  backward (no torch decomposition) as matmuls and pointwise ops.

Invariants
- The table is core ATen's plus ``EXTRA_DECOMPOSITIONS`` minus ``KEEP_WHOLE``; a ``KERNEL_OPS``
  entry is conditional only when the registry has the op.
- What the policy reads of the lowering, and nothing else: ``lowering.registry.REGISTRY`` (with
  every op family registered by importing ``lowering.ops``), ``lowering.tiling.norm_backward
  .row_fits_always``, ``lowering.ops.indexing.WRAP_LIMIT`` and ``lowering.ops.attention
  .whole_refusal`` (those two at call time: importing this module does not load the op
  families), and the target from ``runtime_sim.targets``.
- Reached from ``neuron_compiler`` through ``lowering.api`` only.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from lowering.registry import REGISTRY
from lowering.tiling.norm_backward import row_fits_always
from runtime_sim.targets import DEFAULT_TARGET, get_target


# Ops that core ATen keeps whole but that decompose into ops the lowering has (batch norm in
# training and inference, and its backward, become var_mean + elementwise + reductions;
# linalg_vector_norm, F.normalize's and weight norm's, becomes abs/pow, a sum or max and a
# root, in fp32 for 16-bit inputs as eager accumulates).
EXTRA_DECOMPOSITIONS = (
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit",
    "native_batch_norm_backward",
    "linalg_vector_norm",
)


# Ops that core ATen decomposes (into index gathers and where chains) but that the lowering
# registry lowers whole, as one kernel (lowering/ops/padding.py): kept out of the table.
KEEP_WHOLE = tuple(f"{kind}_pad{n}d{bw}" for kind in ("reflection", "replication")
                   for n in (1, 2, 3) for bw in ("", "_backward"))


def _group_norm_backward_fits(target: str):
    def keep(grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask) -> bool:
        if not x.dtype.is_floating_point:
            return False
        row = int(C) // int(group) * int(HxW)
        isz = x.dtype.itemsize
        return row_fits_always(row, 4, isz, isz, get_target(target))   # dy * w is fp32
    return keep


def _layer_norm_backward_fits(target: str):
    def keep(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask) -> bool:
        if not x.dtype.is_floating_point:
            return False
        row = 1
        for n in normalized_shape:
            row *= int(n)
        isz = x.dtype.itemsize
        return row_fits_always(row, grad_out.dtype.itemsize, isz, isz, get_target(target))
    return keep


def _col2im_fits(target: str):
    def keep(cols, output_size, *args) -> bool:
        from lowering.ops.indexing import WRAP_LIMIT
        return cols.dtype.is_floating_point and int(output_size[0]) * int(output_size[1]) < WRAP_LIMIT
    return keep


# Ops that core ATen decomposes but whose kernel the registry has (Inductor's rule: an op with a
# lowering of its own is kept out of the decomposition table, ``decomps_to_exclude``): kept
# whole when the kernel takes the call (the test on the arguments), decomposed otherwise (the
# decomposition returns NotImplemented to keep the op, as Inductor's conditional ones do).
KERNEL_OPS = {
    "native_group_norm_backward": _group_norm_backward_fits,   # LAYER_NORM_BWD over group rows
    "native_layer_norm_backward": _layer_norm_backward_fits,   # LAYER_NORM_BWD over the rows
    "col2im": _col2im_fits,                                     # indirect-DMA accumulation
}


def _keep_when(decomposition: Callable, keep: Callable) -> Callable:
    def decomp(*args, **kwargs):
        if keep(*args, **kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decomp


def decomposition_table(target: str = DEFAULT_TARGET) -> dict:
    """Core-ATen decompositions (what the lowering registry is keyed on) plus
    ``EXTRA_DECOMPOSITIONS``, minus ``KEEP_WHOLE``; ``KERNEL_OPS`` stay whole when their
    registry kernel takes the call on ``target``."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([getattr(torch.ops.aten, n) for n in EXTRA_DECOMPOSITIONS]))
    for n in KEEP_WHOLE:
        table.pop(getattr(torch.ops.aten, n).default, None)
    import lowering.ops  # noqa: F401  (registers every op family: REGISTRY is complete)
    for n, fits in KERNEL_OPS.items():
        op = getattr(torch.ops.aten, n).default
        if op in table and op in REGISTRY:
            table[op] = _keep_when(table[op], fits(target))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    table[op] = flash_attention_for_cpu(table[op])
    table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = \
        flash_attention_for_cpu_backward
    return table


def sdpa_kernel_fits(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                     scale=None) -> bool:
    """``_scaled_dot_product_flash_attention_for_cpu`` stays whole (``lowering/ops/attention.py``
    lowers it to one ATTENTION kernel) when nothing can read its logsumexp, i.e. it is traced
    with grad mode off (no backward records it; inside AOTAutograd's joint trace the inputs'
    ``requires_grad`` is not a reliable sign, grad mode is), and the rule takes the call
    (``whole_refusal``: no dropout, ``attn_mask`` or grouped-query heads)."""
    from lowering.ops.attention import whole_refusal
    return (not torch.is_grad_enabled()
            and whole_refusal(query, key, value, dropout_p, attn_mask) is None)


def flash_attention_for_cpu(inference_decomposition):
    """Kept whole when ``sdpa_kernel_fits``. Otherwise: torch's decomposition of
    ``_scaled_dot_product_flash_attention_for_cpu`` returns the attention probabilities as its
    second output, where the op returns the row logsumexp that its backward
    (``..._for_cpu_backward``) reads: in a training graph the gradients would be silently
    wrong. This one returns the op's output (from torch's decomposition) and the true
    logsumexp [N, H, L] (fp32, laid out as the op lays it out); with dropout it does not
    decompose (the backward regenerates the op's own dropout mask)."""
    def decomp(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        if dropout_p or sdpa_kernel_fits(query, key, value, dropout_p, is_causal,
                                         attn_mask=attn_mask, scale=scale):
            return NotImplemented
        out, _ = inference_decomposition(query, key, value, dropout_p, is_causal,
                                         attn_mask=attn_mask, scale=scale)
        scores = _scores(query.float(), key.float(), is_causal, attn_mask, scale)
        lse = torch.logsumexp(scores, dim=-1)
        return out, lse.transpose(1, 2).contiguous().transpose(1, 2)

    return decomp


def _scores(q, k, is_causal: bool, attn_mask, scale):
    """The attention scores ``scale * q k^T`` (default scale 1/sqrt(E)) with the op's causal
    mask (top-left aligned) and ``attn_mask`` (boolean: keep where True; else added)."""
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if k.dim() == 4 and k.shape[1] != q.shape[1]:      # grouped-query: each key head serves a group
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * s
    L, S = scores.shape[-2:]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    return scores


def flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
                                      is_causal, *, attn_mask=None, scale=None):
    """``_scaled_dot_product_flash_attention_for_cpu_backward`` (which has no decomposition in
    torch) as matmuls and pointwise ops, in fp32 as the CPU kernel accumulates, from the
    forward's logsumexp (``flash_attention_for_cpu`` returns the true one):
    P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = s dS K,
    dK = s dS^T Q, where S = s Q K^T with the causal and ``attn_mask`` masks of the forward.
    With dropout or grouped-query heads it does not decompose (the op regenerates its own
    dropout mask; the key/value gradients of a head group would need summing)."""
    if dropout_p or key.shape[1] != query.shape[1]:    # grouped-query heads: not decomposed
        return NotImplemented
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    q, k, v, o, do = (t.float() for t in (query, key, value, out, grad_out))
    p = torch.exp(_scores(q, k, is_causal, attn_mask, scale) - logsumexp.float().unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), do)
    ds = p * (torch.matmul(do, v.transpose(-2, -1)) - (do * o).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-2, -1), q) * s
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)
