"""Selections: argmax/argmin, max.dim/min.dim (values and indices), topk, sort -> one SELECT
kernel each (``tiling/select.py``: VectorE ``max8`` / ``nc_find_index8`` /
``nc_match_replace8`` rounds over rows of up to 16384 elements).

Semantics (eager's): argmax/max pick the first position of the maximum, a NaN wins (the first
NaN); argmin/min likewise with the minimum. topk and sort order NaN above +inf (so last in an
ascending sort); ties keep index order (every sort is stable, so ``stable=True`` is honoured and
``stable=False`` gets one valid order); topk's result is always sorted (``sorted=False`` allows
any order, this is one). Values are exact copies of input elements, positions int64.

Invariants
- Float inputs only (integer keys would need exact integer compares beyond fp32).
- The selected dim holds 1 to 16384 elements (the max8 search range); longer rows fall back
  with that reason. ``argmax``/``argmin`` without ``dim`` select over the flattened tensor.
- An fp32 row holding both -inf and -3.4028235e38 (-FLT_MAX) may order those two values as equal
  (by index) in topk/sort with k > 8 and reports -inf for both (``tiling/select.py``).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import KKind, KOp, SelectKAttrs, TensorRef, view_as
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view, materialize
from lowering.registry_table import FLOAT_DTYPES, register
from lowering.tiling.select import select_limit

aten = torch.ops.aten
SELECT_DTYPES = FLOAT_DTYPES | frozenset({torch.int64})


def _dim_len(node: fx.Node, dim) -> int | None:
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(v, torch.Tensor):
        return None
    if dim is None:
        return v.numel()
    return v.shape[dim % v.dim()] if v.dim() else 1


def _check(pos: int | None, default_dim=None):
    """``pos``: the dim's position in the args (None: keyword only); ``default_dim`` None
    selects over the flattened tensor."""
    def check(node: fx.Node) -> str | None:
        """Float input; the selected dim has 1 to 16384 elements (one VectorE max8 search)."""
        x = node.args[0]
        v = x.meta.get("val") if isinstance(x, fx.Node) else None
        if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
            return f"input dtype {v.dtype} (selections on integer tensors fall back; float inputs only)"
        if pos is not None and len(node.args) > pos:
            dim = node.args[pos]
        else:
            dim = node.kwargs.get("dim", default_dim)
        n = _dim_len(node, dim)
        if n is not None and not isinstance(n, int):
            try:
                n = int(n)
            except (TypeError, ValueError):
                return None       # symbolic: checked on concrete sizes by the rule
        if n is not None:
            why = select_limit(n)
            if why and n:
                return why
        return None
    return check


def _keep_view(ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    return apply_view(ref, torch_dtype_of(ref), lambda t: t.view(shape))


def emit_select(ctx: LowerCtx, x: TensorRef, dim, k: int, largest: bool, nan_wins: bool,
                values: bool, indices: bool, keepdim: bool = True) -> tuple[TensorRef, ...]:
    """One SELECT kernel; returns the new (values?, indices?) tensors with the node's shapes."""
    v = ctx.out_val
    vals = list(v) if isinstance(v, (tuple, list)) else [v]
    if dim is None:                              # over the flattened tensor
        flat = view_as(x, (x.numel,))
        x = flat if flat is not None else view_as(materialize(ctx, x), (x.numel,))
        d = 0
    elif x.rank == 0:
        x = apply_view(x, torch_dtype_of(x), lambda t: t.view(1))
        d = 0
    else:
        d = dim % x.rank
    why = select_limit(x.shape[d]) if x.numel else None
    if why:
        raise Unsupported(ctx.op, why)
    kshape = tuple(k if i == d else s for i, s in enumerate(x.shape))
    assert len(vals) == int(values) + int(indices), (ctx.op, len(vals))
    outs, views = [], []
    for val in vals:
        t = ctx.new_tensor(tuple(val.shape), val.dtype)
        outs.append(t)
        views.append(t if tuple(t.shape) == kshape else _keep_view(t, kshape))
    if x.numel and k:
        ctx.emit(KOp(KKind.SELECT, tuple(views), (x,),
                     SelectKAttrs(d, k, largest, nan_wins, values, indices)))
    return tuple(outs)


def _arg(largest: bool):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim=None, keepdim: bool = False):
        return emit_select(ctx, x, dim, 1, largest, True, False, True)[0]
    lower.__doc__ = (f"arg{'max' if largest else 'min'}: VectorE max8 + nc_find_index8 over the "
                     "row (the first position of the extreme; a NaN wins).")
    return lower


def _extreme(largest: bool):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, dim: int, keepdim: bool = False):
        return emit_select(ctx, x, dim, 1, largest, True, True, True)
    lower.__doc__ = (f"{'max' if largest else 'min'}.dim: values and indices by VectorE max8 + "
                     "nc_find_index8 (the first position of the extreme; a NaN wins).")
    return lower


register(aten.argmax.default, dtypes=SELECT_DTYPES, check=_check(1))(_arg(True))
register(aten.argmin.default, dtypes=SELECT_DTYPES, check=_check(1))(_arg(False))
register(aten.max.dim, dtypes=SELECT_DTYPES, check=_check(1))(_extreme(True))
register(aten.min.dim, dtypes=SELECT_DTYPES, check=_check(1))(_extreme(False))


@register(aten.topk.default, dtypes=SELECT_DTYPES, check=_check(2, -1))
def _topk(ctx, node, x, k, dim=-1, largest=True, sorted=True):
    """topk: ceil(k/8) VectorE max8 / nc_find_index8 / nc_match_replace8 rounds (largest);
    largest=False sorts the row in full (ceil(C/8) rounds). Always sorted."""
    return emit_select(ctx, x, dim, int(k), bool(largest), False, True, True)


def _sort(ctx, x, dim, descending):
    n = x.shape[dim % x.rank] if x.rank else 1
    return emit_select(ctx, x, dim, n, bool(descending), False, True, True)


@register(aten.sort.default, dtypes=SELECT_DTYPES, check=_check(1, -1))
def _sort_default(ctx, node, x, dim=-1, descending=False):
    """sort (stable): ceil(C/8) VectorE max8 / nc_find_index8 / nc_match_replace8 rounds per
    row of C <= 16384 elements; ascending reads the row reversed."""
    return _sort(ctx, x, dim, descending)


@register(aten.sort.stable, dtypes=SELECT_DTYPES, check=_check(None, -1))
def _sort_stable(ctx, node, x, *, stable=None, dim=-1, descending=False):
    """sort (stable=...): as sort.default, which is already stable."""
    return _sort(ctx, x, dim, descending)
