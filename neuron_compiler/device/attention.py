"""``F.scaled_dot_product_attention`` on ``neuron`` tensors: the fused op, as on the CPU.

torch chooses SDPA's fused kernel by device type in C++; for a PrivateUse1 device without a
C++ choice it takes the math composition (bmm, causal mask, softmax, bmm), which the lowering
cannot run as one ATTENTION kernel. ``fused_attention`` (called by
``NeuronTensor.__torch_function__``) calls ``aten._scaled_dot_product_flash_attention_for_cpu``
instead, as torch's CPU path does for the same arguments when the CPU's flash conditions hold
(``sdp_utils_cpp``: 4-d dense query/key/value of one floating dtype, the same batch, the same
number of heads or, with ``enable_gqa``, query heads a multiple of key/value heads, equal head
dims, non-empty sequences, unit last-dim strides, no dropout, a 2-d or
broadcastable 4-d mask); a boolean mask becomes an additive one (``-inf`` where False), as
torch converts it before the CPU kernel. Otherwise it returns ``NotImplemented`` and torch's
composition runs. Autograd: the op's backward is the flash backward, which the backend's
decomposition table expresses in matmuls and pointwise ops. In eager mode without a backward
to record, only the op's output is computed (``eager.run_op(..., only=0)``): its logsumexp,
which only the backward reads, is not an output of the program.
"""
from __future__ import annotations

import torch

_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _mask_fits(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    b, h, lq, _ = query.shape
    ls = key.shape[2]
    if mask.dim() == 2:
        return tuple(mask.shape) == (lq, ls)
    return (mask.dim() == 4 and tuple(mask.shape[2:]) == (lq, ls)
            and mask.shape[0] in (1, b) and mask.shape[1] in (1, h))


def _fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> bool:
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        return False
    if query.dtype not in _FLASH_DTYPES or not query.dtype == key.dtype == value.dtype:
        return False
    if dropout_p or any(t.stride(-1) != 1 or t.shape[2] == 0 for t in tensors):
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    grouped = enable_gqa and kv_heads and heads % kv_heads == 0
    if not (query.shape[0] == key.shape[0] == value.shape[0]
            and (heads == kv_heads or grouped) and kv_heads == value.shape[1]
            and query.shape[3] == key.shape[3] == value.shape[3]):
        return False
    return attn_mask is None or _mask_fits(attn_mask, query, key)


def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False) -> object:
    """The flash-attention op for these arguments, or ``NotImplemented`` (module docstring)."""
    if not _fits(query, key, value, attn_mask, dropout_p, enable_gqa):
        return NotImplemented
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    args, kwargs = (query, key, value, dropout_p, is_causal), {"attn_mask": attn_mask,
                                                               "scale": scale}
    if not torch.compiler.is_compiling() and not _needs_grad(query, key, value, attn_mask):
        # eager, no backward: only the output is read (the logsumexp would keep the
        # lowering from running the op as one kernel)
        from neuron_compiler.device.eager import run_op
        return run_op(op, args, kwargs, only=0)
    return op(*args, **kwargs)[0]


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
