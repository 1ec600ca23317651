"""Reflection and replication pads (1-d, 2-d, 3-d) and their backward ops.

``reflection_padNd(x, pad)`` / ``replication_padNd(x, pad)``: one RESAMPLE kernel
(``tiling/resample.py``) whose per-axis maps are pure gathers: the interior is one strided copy,
each border one more, reflected borders walking the input backwards (a negative stride in the
access pattern), replicated ones repeating the edge (stride 0). Per padded axis that is at most
three VectorE/GpSimdE/ScalarE copies over 128 planes at once, between one contiguous DMA in and
one out per plane block; copies keep the input dtype (exact). ``pad`` lists (before, after)
pairs from the last axis backwards, as ATen does; negative pads crop.

``reflection_padNd_backward`` / ``replication_padNd_backward(grad_out, x, pad)``: the transposed
maps: every input position sums the gradient of the outputs that copied it (fp32, one rounding).

Limits: the ranks ATen accepts for the op (N-d pad over an (N+1)-d or (N+2)-d input); float
dtypes. A reflection pad must be smaller than its axis (ATen raises otherwise).

The core-ATen decompositions turn these ops into ``index`` gathers and ``where`` chains;
the decomposition policy keeps them whole (``lowering.policy.KEEP_WHOLE``) so that they reach these rules.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.kir import AxisMap, ReduceOp, ResampleKAttrs, TensorRef
from lowering.lower_ctx import LowerCtx
from lowering.ops.pooling import emit_resample, transpose_map
from lowering.registry_table import register

aten = torch.ops.aten


def _reflect(j: int, n: int) -> int:
    if n == 1:
        return 0
    period = 2 * (n - 1)
    j = abs(j) % period
    return period - j if j >= n else j


def pad_map(n: int, lo: int, hi: int, reflect: bool) -> AxisMap | None:
    """Output ``o`` copies input ``reflect(o - lo)`` (or the clamped position); class 0 = before,
    1 = interior, 2 = after. None when the axis is not padded."""
    if lo == 0 and hi == 0:
        return None
    ent = []
    for o in range(n + lo + hi):
        j = o - lo
        i = (_reflect(j, n) if reflect else min(max(j, 0), n - 1))
        cls = 0 if j < 0 else 2 if j >= n else 1
        ent.append((o, i, 1.0, cls))
    return AxisMap(n, n + lo + hi, tuple(ent))


def _pairs(pad, nsp: int) -> list[tuple[int, int]]:
    """(before, after) per spatial axis, outermost first."""
    pad = [int(v) for v in pad]
    pairs = [(pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]
    return list(reversed(pairs))[-nsp:]


def _check(nsp: int, name: str):
    def check(node: fx.Node) -> str | None:
        x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if not isinstance(x, torch.Tensor) or x.dim() not in (nsp + 1, nsp + 2):
            got = x.dim() if isinstance(x, torch.Tensor) else type(x).__name__
            return f"{name} takes a {nsp + 1}-d or {nsp + 2}-d input, got rank {got}"
        return None
    check.__doc__ = f"{nsp + 1}-d or {nsp + 2}-d input; any pad ATen accepts"
    return check


def _maps(x_shape, pad, nsp: int, reflect: bool) -> tuple[AxisMap | None, ...]:
    sp = x_shape[len(x_shape) - nsp:]
    return tuple(pad_map(sp[j], lo, hi, reflect) for j, (lo, hi) in enumerate(_pairs(pad, nsp)))


def _forward(nsp: int, reflect: bool):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, padding):
        v = ctx.out_val
        a = ResampleKAttrs(_maps(x.shape, padding, nsp, reflect), ReduceOp.SUM)
        return emit_resample(ctx, x, nsp, v.shape, v.dtype, a)[0]
    return lower


def _backward(nsp: int, reflect: bool):
    def lower(ctx: LowerCtx, node: fx.Node, g: TensorRef, x: TensorRef, padding):
        v = ctx.out_val
        maps = tuple(None if m is None else transpose_map(m)
                     for m in _maps(x.shape, padding, nsp, reflect))
        a = ResampleKAttrs(maps, ReduceOp.SUM)
        return emit_resample(ctx, g, nsp, v.shape, v.dtype, a)[0]
    return lower


for _n in (1, 2, 3):
    for _kind, _refl in (("reflection", True), ("replication", False)):
        _fw = getattr(aten, f"{_kind}_pad{_n}d").default
        _bw = getattr(aten, f"{_kind}_pad{_n}d_backward").default
        register(_fw, check=_check(_n, f"{_kind}_pad{_n}d"))(_forward(_n, _refl))
        register(_bw, check=_check(_n, f"{_kind}_pad{_n}d_backward"))(_backward(_n, _refl))
