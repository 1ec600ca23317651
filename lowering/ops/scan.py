"""Scans: cumsum and cumprod along one dim -> one SCAN kernel (``tiling/scan.py``).

Engines: VectorE/GpSimdE ``tensor_tensor_scan`` (the running value stays in fp32 inside the
engine; each output is rounded once to its dtype, as eager's fp32 accumulator for bf16/fp16).
Tiling: rows on partitions, the scanned dim along the free axis in chunks that carry the last
running value; any shape and strides.

Invariants
- Float inputs, or (cumsum) a bool mask counted exactly in fp32 (length below 2**24), also
  when it was cast to an integer type first (``mask.int().cumsum(1)``: RoBERTa's position ids);
  other integer scans fall back (an integer scan is int64 in eager, beyond fp32's exact range).
- ``dtype=`` narrower than the input rounds the input first (one POINTWISE cast), as eager does.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, ScanKAttrs, ScanOp, TensorRef, load
from lowering.lower_ctx import LowerCtx, machine_dtype
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten


EXACT_FP32 = 1 << 24     # fp32 holds every integer up to this exactly


def _float_scan(node: fx.Node) -> str | None:
    """Float inputs and outputs only (integer scans fall back)."""
    x = node.args[0]
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"input dtype {v.dtype} (integer scans fall back; float inputs only)"
    return None


# ops that keep every value of their (first) input: a bool cast to an integer type stays 0 or 1
_VALUE_PRESERVING = frozenset({
    aten._to_copy.default, aten.clone.default, aten.alias.default, aten.view.default,
    aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.expand.default, aten.permute.default,
    aten.t.default, aten.transpose.int, aten.slice.Tensor, aten.select.int,
    torch.ops.prims.convert_element_type.default})


def _bool_valued(x) -> bool:
    """``x`` holds only 0 and 1: a bool tensor, or one through value-preserving ops and casts."""
    for _ in range(16):
        v = x.meta.get("val") if isinstance(x, fx.Node) else None
        if not isinstance(v, torch.Tensor):
            return False
        if v.dtype is torch.bool:
            return True
        if x.op != "call_function" or x.target not in _VALUE_PRESERVING or not x.args:
            return False
        x = x.args[0]
    return False


def _count_scan(node: fx.Node) -> str | None:
    """cumsum: float inputs, or a bool input counted into integers (transformers' position ids
    and packed-sequence checks), also cast to an integer type first: exact in the engine's fp32
    while the scanned length stays below 2**24; other integer inputs fall back (their sums may
    leave fp32's exact range)."""
    x, dim = node.args[0], node.args[1]
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(v, torch.Tensor) or v.dtype.is_floating_point:
        return _float_scan(node)
    if not _bool_valued(x):
        return (f"input dtype {v.dtype} with values not known to be 0 or 1 (integer scans fall "
                f"back: sums may leave fp32's exact range)")
    n = v.shape[dim % v.dim()] if v.dim() else 1
    if not isinstance(n, int) or n >= EXACT_FP32:
        return f"a count over {n} elements (exact in fp32 below {EXACT_FP32})"
    return None


def emit_scan(ctx: LowerCtx, x: TensorRef, dim: int, op: ScanOp) -> TensorRef:
    v = ctx.out_val
    odt = machine_dtype(v.dtype, ctx.op)
    if x.rank == 0:
        x = apply_view(x, torch_dtype_of(x), lambda t: t.view(1))
    if not x.dtype.is_float:            # a count of a bool mask: scanned in fp32, exact
        f = _cast(ctx, x, DType.FP32)
        counts = emit_scan_of(ctx, f, dim, op, DType.FP32, tuple(v.shape))
        return _cast(ctx, counts, odt)
    if odt != x.dtype and odt.itemsize < x.dtype.itemsize:
        c = ctx.new_tensor(x.shape, odt)
        ctx.emit(KOp(KKind.POINTWISE, (c,), (x,), PointwiseAttrs(Expr(EOp.CAST, (load(0, x.dtype),), odt))))
        x = c
    return emit_scan_of(ctx, x, dim, op, odt, tuple(v.shape))


def emit_scan_of(ctx: LowerCtx, x: TensorRef, dim: int, op: ScanOp, odt, shape) -> TensorRef:
    out = ctx.new_tensor(shape, odt)
    o = out if out.rank else apply_view(out, torch_dtype_of(out), lambda t: t.view(1))
    if x.numel:
        ctx.emit(KOp(KKind.SCAN, (o,), (x,), ScanKAttrs(dim % x.rank, op)))
    return out


def _cast(ctx: LowerCtx, x: TensorRef, dt) -> TensorRef:
    c = ctx.new_tensor(x.shape, dt)
    ctx.emit(KOp(KKind.POINTWISE, (c,), (x,), PointwiseAttrs(Expr(EOp.CAST, (load(0, x.dtype),), dt))))
    return c


@register(aten.cumsum.default,
          dtypes=FLOAT_DTYPES | MASK_DTYPES | frozenset({torch.int64, torch.int32}),
          check=_count_scan)
def _cumsum(ctx, node, x, dim, *, dtype=None):
    """cumsum: VectorE/GpSimdE ``tensor_tensor_scan`` (add); any shape."""
    return emit_scan(ctx, x, dim, ScanOp.SUM)


@register(aten.cumprod.default, dtypes=FLOAT_DTYPES, check=_float_scan)
def _cumprod(ctx, node, x, dim, *, dtype=None):
    """cumprod: VectorE/GpSimdE ``tensor_tensor_scan`` (multiply); any shape."""
    return emit_scan(ctx, x, dim, ScanOp.PROD)
