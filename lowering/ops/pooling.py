"""Pooling: max, average and adaptive-average pools (2-d and 3-d) and the 2-d backward ops.

- ``max_pool2d_with_indices`` / ``max_pool3d_with_indices`` (kernel, stride, padding, dilation,
  ceil_mode), ``avg_pool2d`` / ``avg_pool3d`` (kernel, stride, padding, ceil_mode,
  count_include_pad, divisor_override), ``_adaptive_avg_pool2d`` / ``_adaptive_avg_pool3d``:
  one RESAMPLE kernel each (``tiling/resample.py``): planes (N x C) on partitions, the pool as
  one separable pass per spatial axis of strided VectorE/GpSimdE instructions, one per kernel
  tap (``tensor_tensor`` max / add over the shifted window), innermost axis first; the argmax
  index travels with the value (``iota`` candidates + ``is_gt`` + ``select``), only when the
  graph reads the indices. Averages divide once per region of equal divisor, as eager does
  (``sum / (kh*kw)``, adaptive: ``sum / kh / kw``). Padding is never materialised: window
  taps that fall outside the input are simply not entries of the map.
- ``avg_pool2d_backward`` / ``_adaptive_avg_pool2d_backward``: the transposed maps (the
  gradient divided by each output's divisor, then summed into every input of its window).
- ``max_pool2d_with_indices_backward``: one MAXPOOL_BWD kernel (``tiling/pool.py``): per kernel
  tap, an equality mask of the saved indices against the tap's input positions, times the
  gradient, accumulated into the tap's window of an SBUF tile (VectorE).
- 1-d pools reach the graph as these 2-d ops over an unsqueezed axis.

Limits (fall back with the reason): inputs of another rank; a plane too large for one output
row in SBUF; max-pool indices of planes of 2**24 elements or more. NaN: values propagate as
eager's, but the index of a window holding NaN may differ from eager's (eager picks the last
NaN, the device the first strict maximum before it). The backward trusts that each saved index
lies in its own window (as ``max_pool2d_with_indices`` produces it).

Invariants
- The kernels read ``x`` viewed as ``[planes, *spatial]`` (copied contiguous first when the
  leading axes do not merge) and write fresh contiguous outputs.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lowering.kir import (AxisMap, Divisors, KKind, KOp, MaxPoolBwdKAttrs, ReduceOp,
                          ResampleKAttrs, TensorRef, view_as)
from lowering.lower_ctx import LowerCtx
from lowering.ops.views import materialize
from lowering.registry_table import FLOAT_DTYPES, register

aten = torch.ops.aten
WITH_INDEX = FLOAT_DTYPES | {torch.int64}


def _val(a: object):
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def _rank_check(nsp: int, name: str):
    def check(node: fx.Node) -> str | None:
        x = _val(node.args[0])
        if not isinstance(x, torch.Tensor) or x.dim() not in (nsp + 1, nsp + 2):
            got = x.dim() if isinstance(x, torch.Tensor) else type(x).__name__
            return f"{name} takes a {nsp + 1}-d or {nsp + 2}-d input, got rank {got}"
        if not x.dtype.is_floating_point:
            return f"{name} input dtype {x.dtype} is not a float dtype"
        return None
    check.__doc__ = f"{nsp + 1}-d or {nsp + 2}-d float input; any kernel, stride, padding" + \
        (", dilation, ceil_mode" if "max" in name else "")
    return check


def tup(v, n: int, default=None) -> tuple[int, ...]:
    """An int or list argument as ``n`` ints (an empty list: ``default``)."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    v = [int(e) for e in (v if isinstance(v, (list, tuple)) else [v])]
    return tuple(v * n if len(v) == 1 else v)


def planes(ctx: LowerCtx, x: TensorRef, nsp: int) -> TensorRef:
    """``x`` viewed as ``[planes, *spatial]`` (a contiguous copy when no view has that shape)."""
    sp = x.shape[x.rank - nsp:]
    rows = 1
    for n in x.shape[:x.rank - nsp]:
        rows *= n
    v = view_as(x, (rows,) + tuple(sp))
    return v if v is not None else view_as(materialize(ctx, x), (rows,) + tuple(sp))


def window_map(n_in: int, n_out: int, k: int, s: int, p: int, d: int = 1) -> AxisMap:
    """Output ``o`` reads taps ``o*s - p + t*d`` (t < k) inside ``[0, n_in)``; class = tap."""
    ent = []
    for o in range(n_out):
        for t in range(k):
            i = o * s - p + t * d
            if 0 <= i < n_in:
                ent.append((o, i, 1.0, t))
    return AxisMap(n_in, n_out, tuple(ent))


def adaptive_window(n_in: int, n_out: int, o: int) -> tuple[int, int]:
    return (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)


def adaptive_map(n_in: int, n_out: int) -> tuple[AxisMap, tuple[float, ...]]:
    ent, div = [], []
    for o in range(n_out):
        a, e = adaptive_window(n_in, n_out, o)
        ent += [(o, i, 1.0, i - a) for i in range(a, e)]
        div.append(float(e - a))
    return AxisMap(n_in, n_out, tuple(ent)), tuple(div)


def avg_divisors(n_in: int, n_out: int, k: int, s: int, p: int, include_pad: bool) -> tuple[float, ...]:
    """Eager's per-axis window size (``pool_size`` before or after clipping to the input)."""
    out = []
    for o in range(n_out):
        hs = o * s - p
        he = min(hs + k, n_in + p)
        size = he - hs
        hs2, he2 = max(hs, 0), min(he, n_in)
        out.append(1.0 if hs2 >= he2 else float(size if include_pad else he2 - hs2))
    return tuple(out)


def transpose_map(m: AxisMap) -> AxisMap:
    return AxisMap(m.n_out, m.n_in, tuple((i, o, w, c) for o, i, w, c in m.entries))


def emit_resample(ctx: LowerCtx, x: TensorRef, nsp: int, out_shape, out_dtype, attrs: ResampleKAttrs,
                  index_shape=None) -> tuple[TensorRef, TensorRef | None]:
    """One RESAMPLE kernel of ``x``'s trailing ``nsp`` axes into a fresh ``out_shape`` tensor
    (and an int64 index tensor of ``index_shape``)."""
    xp = planes(ctx, x, nsp)
    out = ctx.new_tensor(tuple(out_shape), out_dtype, hint="rs")
    outs = [view_as(out, (xp.shape[0],) + tuple(out_shape[len(out_shape) - nsp:]))]
    idx = None
    if index_shape is not None:
        idx = ctx.new_tensor(tuple(index_shape), torch.int64, hint="rsi")
        outs.append(view_as(idx, outs[0].shape))
    ctx.emit(KOp(KKind.RESAMPLE, tuple(outs), (xp,), attrs))
    return out, idx


def _indices_read(node: fx.Node) -> bool:
    return any((u.target is not operator.getitem) or (u.args[1] == 1 and len(u.users) > 0)
               for u in node.users)


def _max_pool(nsp: int):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, kernel_size, stride=(), padding=0,
              dilation=1, ceil_mode=False):
        k = tup(kernel_size, nsp)
        s, p, d = tup(stride, nsp, k), tup(padding, nsp), tup(dilation, nsp)
        vals, _ = ctx.out_val
        sout = tuple(vals.shape[-nsp:])
        sin = x.shape[-nsp:]
        maps = tuple(window_map(sin[j], sout[j], k[j], s[j], p[j], d[j]) for j in range(nsp))
        need = _indices_read(node)
        out, idx = emit_resample(ctx, x, nsp, vals.shape, vals.dtype,
                                 ResampleKAttrs(maps, ReduceOp.MAX, indices=need),
                                 vals.shape if need else None)
        return out, idx
    return lower


def _avg_attrs(sin, sout, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override, backward: bool) -> ResampleKAttrs:
    k = tup(kernel_size, nsp)
    s, p = tup(stride, nsp, k), tup(padding, nsp)
    maps = tuple(window_map(sin[j], sout[j], k[j], s[j], p[j]) for j in range(nsp))
    if divisor_override:
        div = Divisors((tuple([float(divisor_override)] * sout[0]),) + (None,) * (nsp - 1))
    else:
        div = Divisors(tuple(avg_divisors(sin[j], sout[j], k[j], s[j], p[j], bool(count_include_pad))
                             for j in range(nsp)))
    if backward:
        return ResampleKAttrs(tuple(transpose_map(m) for m in maps), ReduceOp.SUM, pre=div)
    return ResampleKAttrs(maps, ReduceOp.SUM, post=div)


def _avg_pool(nsp: int):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, kernel_size, stride=(), padding=0,
              ceil_mode=False, count_include_pad=True, divisor_override=None):
        v = ctx.out_val
        a = _avg_attrs(x.shape[-nsp:], tuple(v.shape[-nsp:]), nsp, kernel_size, stride, padding,
                       ceil_mode, count_include_pad, divisor_override, backward=False)
        return emit_resample(ctx, x, nsp, v.shape, v.dtype, a)[0]
    return lower


def _adaptive(nsp: int):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef, output_size):
        v = ctx.out_val
        sin, sout = x.shape[-nsp:], tuple(v.shape[-nsp:])
        md = [adaptive_map(sin[j], sout[j]) for j in range(nsp)]
        a = ResampleKAttrs(tuple(m for m, _ in md), ReduceOp.SUM,
                           post=Divisors(tuple(d for _, d in md), each=True))
        return emit_resample(ctx, x, nsp, v.shape, v.dtype, a)[0]
    return lower


register(aten.max_pool2d_with_indices.default, dtypes=WITH_INDEX,
         check=_rank_check(2, "max_pool2d_with_indices"))(_max_pool(2))
register(aten.max_pool3d_with_indices.default, dtypes=WITH_INDEX,
         check=_rank_check(3, "max_pool3d_with_indices"))(_max_pool(3))
register(aten.avg_pool2d.default, check=_rank_check(2, "avg_pool2d"))(_avg_pool(2))
register(aten.avg_pool3d.default, check=_rank_check(3, "avg_pool3d"))(_avg_pool(3))
register(aten._adaptive_avg_pool2d.default, check=_rank_check(2, "_adaptive_avg_pool2d"))(_adaptive(2))
register(aten._adaptive_avg_pool3d.default, check=_rank_check(3, "_adaptive_avg_pool3d"))(_adaptive(3))


def _grad_check(name: str):
    inner = _rank_check(2, name)

    def check(node: fx.Node) -> str | None:
        return inner(node)
    check.__doc__ = "3-d or 4-d float gradient; the forward pool's kernel, stride and padding"
    return check


@register(aten.avg_pool2d_backward.default, check=_grad_check("avg_pool2d_backward"))
def avg_pool2d_backward(ctx: LowerCtx, node: fx.Node, g: TensorRef, x: TensorRef, kernel_size,
                        stride, padding, ceil_mode, count_include_pad, divisor_override):
    v = ctx.out_val
    a = _avg_attrs(x.shape[-2:], g.shape[-2:], 2, kernel_size, stride, padding, ceil_mode,
                   count_include_pad, divisor_override, backward=True)
    return emit_resample(ctx, g, 2, v.shape, v.dtype, a)[0]


@register(aten._adaptive_avg_pool2d_backward.default,
          check=_grad_check("_adaptive_avg_pool2d_backward"))
def adaptive_avg_pool2d_backward(ctx: LowerCtx, node: fx.Node, g: TensorRef, x: TensorRef):
    v = ctx.out_val
    md = [adaptive_map(x.shape[-2 + j], g.shape[-2 + j]) for j in range(2)]
    a = ResampleKAttrs(tuple(transpose_map(m) for m, _ in md), ReduceOp.SUM,
                       pre=Divisors(tuple(d for _, d in md), each=True))
    return emit_resample(ctx, g, 2, v.shape, v.dtype, a)[0]


@register(aten.max_pool2d_with_indices_backward.default, dtypes=WITH_INDEX,
          check=_grad_check("max_pool2d_with_indices_backward"))
def max_pool2d_backward(ctx: LowerCtx, node: fx.Node, g: TensorRef, x: TensorRef, kernel_size,
                        stride, padding, dilation, ceil_mode, indices: TensorRef):
    k = tup(kernel_size, 2)
    s, p, d = tup(stride, 2, k), tup(padding, 2), tup(dilation, 2)
    v = ctx.out_val
    gp, ip = planes(ctx, g, 2), planes(ctx, indices, 2)
    out = ctx.new_tensor(tuple(v.shape), v.dtype, hint="mpb")
    o3 = view_as(out, (gp.shape[0], x.shape[-2] * x.shape[-1]))
    g3 = view_as(gp, (gp.shape[0], g.shape[-2] * g.shape[-1]))
    i3 = view_as(ip, g3.shape)
    if g3 is None or i3 is None:
        gp, ip = materialize(ctx, gp), materialize(ctx, ip)
        g3, i3 = view_as(gp, (gp.shape[0], -1)), view_as(ip, (ip.shape[0], -1))
    attrs = MaxPoolBwdKAttrs(tuple(x.shape[-2:]), tuple(g.shape[-2:]), k, s, p, d)
    ctx.emit(KOp(KKind.MAXPOOL_BWD, (o3,), (g3, i3), attrs))
    return out
