"""View ops: no data moves; a new ``TensorRef`` on the same buffer.

The resulting shape, strides and offset are computed by applying the very same ATen op to a meta
tensor with the input's layout, so the rules cannot drift from PyTorch's view semantics. A
``view``/``reshape`` that PyTorch could not express as a view of this layout (e.g. after a
permute) first materialises a contiguous copy with a POINTWISE kernel.

Engine: none (views), or the copy kernel's engines (DMA in/out through SBUF).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, TensorRef, contiguous_strides
from lowering.lower_ctx import LowerCtx
from lowering.registry_table import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES, MASK_DTYPES, register

aten = torch.ops.aten
ALL_DTYPES = FLOAT_DTYPES | MASK_DTYPES | INDEX_DTYPES | FP8_DTYPES


def _meta(ref: TensorRef, torch_dtype: torch.dtype) -> torch.Tensor:
    span = ref.offset + 1 + sum((s - 1) * st for s, st in zip(ref.shape, ref.strides) if s > 0)
    base = torch.empty(max(span, 1), dtype=torch_dtype, device="meta")
    return base.as_strided(ref.shape, ref.strides, ref.offset)


def _from_meta(ref: TensorRef, t: torch.Tensor) -> TensorRef:
    return TensorRef(ref.buffer, ref.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def apply_view(ref: TensorRef, torch_dtype: torch.dtype, fn: Callable[[torch.Tensor], Any]) -> Any:
    out = fn(_meta(ref, torch_dtype))
    if isinstance(out, torch.Tensor):
        return _from_meta(ref, out)
    return tuple(_from_meta(ref, t) for t in out)


def materialize(ctx: LowerCtx, ref: TensorRef) -> TensorRef:
    """A contiguous copy of ``ref`` (a POINTWISE identity kernel)."""
    out = ctx.new_tensor(ref.shape, ref.dtype, hint="c")
    expr = Expr(EOp.LOAD, (), ref.dtype, 0)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (ref,), PointwiseAttrs(expr)))
    return out


def _torch_dtype(ctx: LowerCtx, node: fx.Node) -> torch.dtype:
    v = ctx.val(node.args[0])
    return v.dtype


def _view_rule(fn_of_args: Callable[..., Callable[[torch.Tensor], Any]], reshape: bool = False):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, *args, **kwargs):
        dt = _torch_dtype(ctx, node)
        fn = fn_of_args(*args, **kwargs)
        try:
            return apply_view(x, dt, fn)
        except RuntimeError:
            if not reshape:
                raise
            return apply_view(materialize(ctx, x), dt, fn)
    return lower


def _reg(targets, make, reshape=False):
    register(*targets, dtypes=ALL_DTYPES)(_view_rule(make, reshape))


_reg([aten.view.default, aten._unsafe_view.default, aten.reshape.default],
     lambda size: (lambda t: t.view(size)), reshape=True)
_reg([aten.permute.default], lambda dims: (lambda t: t.permute(dims)))
_reg([aten.t.default], lambda: (lambda t: t.t()))
_reg([aten.transpose.int], lambda d0, d1: (lambda t: t.transpose(d0, d1)))
_reg([aten.expand.default], lambda size, implicit=False: (lambda t: t.expand(size)))
_reg([aten.unsqueeze.default], lambda d: (lambda t: t.unsqueeze(d)))
_reg([aten.squeeze.dim, aten.squeeze.dims], lambda d: (lambda t: t.squeeze(d)))
_reg([aten.squeeze.default], lambda: (lambda t: t.squeeze()))
_reg([aten.slice.Tensor], lambda dim=0, start=None, end=None, step=1:
     (lambda t: aten.slice.Tensor(t, dim, start, end, step)))
_reg([aten.select.int], lambda dim, index: (lambda t: t.select(dim, index)))
_reg([aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default],
     lambda memory_format=None: (lambda t: t))
_reg([aten.split_with_sizes.default], lambda sizes, dim=0: (lambda t: t.split_with_sizes(sizes, dim)))
_reg([aten.split.Tensor], lambda size, dim=0: (lambda t: t.split(size, dim)))
_reg([aten.unbind.int], lambda dim=0: (lambda t: t.unbind(dim)))
_reg([aten.as_strided.default], lambda size, stride, storage_offset=None:
     (lambda t: t.as_strided(size, stride, storage_offset)))
_reg([aten.diagonal.default], lambda offset=0, dim1=0, dim2=1: (lambda t: t.diagonal(offset, dim1, dim2)))


def is_view_of_contiguous(ref: TensorRef) -> bool:
    return ref.strides == contiguous_strides(ref.shape)
