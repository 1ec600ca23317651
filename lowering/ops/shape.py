"""Ops that assemble tensors from pieces: cat.

Engine: DMA (each piece is copied through SBUF into its slice of the output by an identity
POINTWISE kernel writing a strided view).
"""
from __future__ import annotations

import torch

from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs
from lowering.ops.common import torch_dtype_of
from lowering.ops.elementwise import EW_DTYPES
from lowering.ops.views import apply_view
from lowering.registry_table import register

aten = torch.ops.aten


@register(aten.cat.default, dtypes=EW_DTYPES)
def _cat(ctx, node, tensors, dim=0):
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    d = dim % len(v.shape)
    start = 0
    for t in tensors:
        if t.rank == 1 and t.shape[0] == 0 and len(v.shape) > 1:
            continue  # legacy empty tensor in cat
        n = t.shape[d]
        if n:
            piece = apply_view(out, torch_dtype_of(out),
                               lambda x, s=start, n=n: x.narrow(d, s, n))
            expr = Expr(EOp.CAST, (Expr(EOp.LOAD, (), t.dtype, 0),), out.dtype)
            ctx.emit(KOp(KKind.POINTWISE, (piece,), (t,), PointwiseAttrs(expr)))
        start += n
    return out
