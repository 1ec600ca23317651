"""Pairwise distances: ``_cdist_forward`` and ``_pdist_forward``.

- ``aten._cdist_forward(x1 [*B, P, M], x2 [*B, R, M], p, compute_mode)`` -> ``[*B, P, R]``,
  ``out[b, i, j] = ||x1[b, i] - x2[b, j]||_p``. Eager's choice of algorithm is kept, because
  the two round differently: for p = 2 with ``compute_mode`` 1 (``use_mm_for_euclid_dist``) or
  the default with more than 25 rows on either side, the matmul form on TensorE:
  ``sqrt(max(|x1_i|^2 + |x2_j|^2 - 2 x1_i . x2_j, 1e-30))`` (the squared norms by REDUCE
  kernels, the product's epilogue evaluated on PSUM evacuation); otherwise the direct form.
- ``aten._pdist_forward(x [N, M], p)`` -> ``[N (N - 1) / 2]``, the rows i < j of the direct
  form in row-major order: the full [N, N] distances, then one indirect-DMA scatter that writes
  each pair (i, j > i) to its condensed position (computed on the engines from the coordinates,
  exact in fp32 below 2**24) and every other pair to one spare element past the end.

Direct form (VectorE): a POINTWISE kernel over ``[*B, P, R, M]`` (``|d|^p``; ``d != 0`` for
p = 0; ``d * d`` for p = 2; ``|d|`` for p = inf), a REDUCE over M (sum; max for p = inf) in fp32,
then the root (sqrt for 2, ``pow(s, 1/p)`` for other p). The [*B, P, R, M] tensor is written
to HBM: at most ``DENSE_LIMIT`` elements, else the op falls back.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (EOp, Expr, KKind, KOp, PointwiseAttrs, ReduceKAttrs, ReduceOp,
                          ScatterKAttrs, TensorRef, const, contiguous_strides, load)
from lowering.lower_ctx import LowerCtx, machine_dtype
from lowering.ops.common import torch_dtype_of
from lowering.ops.matmul import emit_matmul
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
F32 = DType.FP32
DENSE_LIMIT = 1 << 22
MM_ROWS = 25          # eager's threshold for the matmul form (aten/native/Distance.cpp)


def _e(op: EOp, *args: Expr, dtype: DType = F32) -> Expr:
    return Expr(op, tuple(args), dtype)


def _view(ref: TensorRef, fn) -> TensorRef:
    return apply_view(ref, torch_dtype_of(ref), fn)


def _direct(ctx: LowerCtx, x1: TensorRef, x2: TensorRef, p: float, batch: tuple[int, ...]) -> TensorRef:
    """fp32 ``[*batch, P, R]`` distances by the direct form."""
    P, M = x1.shape[-2:]
    R = x2.shape[-2]
    shape = batch + (P, R, M)
    if math.prod(shape) > DENSE_LIMIT:
        raise Unsupported(ctx.op, f"the direct form builds a {list(shape)} tensor of "
                          f"{math.prod(shape)} elements (limit {DENSE_LIMIT})")
    if M == 0:
        raise Unsupported(ctx.op, "vectors of 0 elements")
    a = _view(x1, lambda t: t.unsqueeze(-2).expand(shape))
    b = _view(x2, lambda t: t.unsqueeze(-3).expand(shape))
    d = _e(EOp.SUB, load(0, x1.dtype), load(1, x2.dtype))
    if p == 0:
        term, rop = _e(EOp.NE, d, const(0.0)), ReduceOp.SUM
    elif p == 1:
        term, rop = _e(EOp.ABS, d), ReduceOp.SUM
    elif p == 2:
        term, rop = _e(EOp.MUL, d, d), ReduceOp.SUM
    elif math.isinf(p):
        term, rop = _e(EOp.ABS, d), ReduceOp.MAX
    else:
        term, rop = _e(EOp.POW, _e(EOp.ABS, d), const(p)), ReduceOp.SUM
    t = ctx.new_tensor(shape, F32, hint="dd")
    ctx.emit(KOp(KKind.POINTWISE, (t,), (a, b), PointwiseAttrs(term)))
    s = ctx.new_tensor(batch + (P, R), F32, hint="ds")
    keep = TensorRef(s.buffer, F32, batch + (P, R, 1), contiguous_strides(batch + (P, R, 1)), 0)
    ctx.emit(KOp(KKind.REDUCE, (keep,), (t,), ReduceKAttrs(rop, (len(shape) - 1,), 1.0)))
    if p in (0, 1) or math.isinf(p):
        return s
    root = _e(EOp.SQRT, load(0, F32)) if p == 2 else _e(EOp.POW, load(0, F32), const(1.0 / p))
    out = ctx.new_tensor(s.shape, F32, hint="ds")
    ctx.emit(KOp(KKind.POINTWISE, (out,), (s,), PointwiseAttrs(root)))
    return out


def _cast_out(ctx: LowerCtx, ref: TensorRef, shape: tuple[int, ...]) -> TensorRef:
    odt = machine_dtype(ctx.out_val.dtype, ctx.op)
    out = ctx.new_tensor(shape, odt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (ref,), PointwiseAttrs(_e(EOp.CAST, load(0, F32), dtype=odt))))
    return out


def _sq_norms(ctx: LowerCtx, x: TensorRef) -> TensorRef:
    """fp32 ``sum(x * x, -1, keepdim=True)`` (POINTWISE square, REDUCE)."""
    sq = ctx.new_tensor(x.shape, F32, hint="dn")
    ctx.emit(KOp(KKind.POINTWISE, (sq,), (x,), PointwiseAttrs(_e(EOp.MUL, load(0, x.dtype), load(0, x.dtype)))))
    kshape = x.shape[:-1] + (1,)
    n = ctx.new_tensor(kshape, F32, hint="dn")
    ctx.emit(KOp(KKind.REDUCE, (n,), (sq,), ReduceKAttrs(ReduceOp.SUM, (x.rank - 1,), 1.0)))
    return n


def _check_p(node: fx.Node) -> str | None:
    """p >= 0 (0, 1, 2, inf or any other power); float tensors; the direct form at most 2**22
    [.., P, R, M] elements (checked on concrete shapes)."""
    p = node.args[2] if node.target is aten._cdist_forward.default else (
        node.args[1] if len(node.args) > 1 else 2.0)
    if not isinstance(p, (int, float)) or p < 0 or math.isnan(p):
        return f"p={p!r} (p must be a number >= 0)"
    return None


@register(aten._cdist_forward.default, dtypes=FLOAT_DTYPES, check=_check_p)
def _cdist_forward(ctx: LowerCtx, node: fx.Node, x1: TensorRef, x2: TensorRef, p: float,
                   compute_mode=None) -> TensorRef:
    shape = tuple(ctx.out_val.shape)
    batch = shape[:-2]
    P, R = shape[-2:]
    x1 = _view(x1, lambda t: t.expand(batch + tuple(t.shape[-2:])))
    x2 = _view(x2, lambda t: t.expand(batch + tuple(t.shape[-2:])))
    mode = 0 if compute_mode is None else int(compute_mode)
    if p == 2 and (mode == 1 or (mode == 0 and (P > MM_ROWS or R > MM_ROWS))) and x1.shape[-1]:
        n1 = _view(_sq_norms(ctx, x1), lambda t: t.expand(shape))
        n2 = _view(_sq_norms(ctx, x2), lambda t: t.transpose(-1, -2).expand(shape))
        x2t = _view(x2, lambda t: t.transpose(-1, -2))

        def epilogue(acc, loads):
            d2 = _e(EOp.ADD, _e(EOp.ADD, loads[0], loads[1]), _e(EOp.MUL, acc, const(-2.0)))
            return _e(EOp.SQRT, _e(EOp.MAX, d2, const(1e-30)))

        if len(batch) > 1:
            raise Unsupported(ctx.op, f"{len(batch)} batch dims for the matmul form (at most one)")
        return emit_matmul(ctx, x1, x2t, epilogue, (n1, n2))
    return _cast_out(ctx, _direct(ctx, x1, x2, float(p), batch), shape)


@register(aten._pdist_forward.default, dtypes=FLOAT_DTYPES, check=_check_p)
def _pdist_forward(ctx: LowerCtx, node: fx.Node, x: TensorRef, p: float = 2.0) -> TensorRef:
    N = x.shape[0]
    K = N * (N - 1) // 2
    odt = machine_dtype(ctx.out_val.dtype, ctx.op)
    if K == 0:
        return ctx.new_tensor((0,), odt)
    if N * N >= 1 << 24:
        raise Unsupported(ctx.op, f"{N} rows: the condensed positions are computed in fp32 (N^2 < 2**24)")
    full = _cast_out(ctx, _direct(ctx, x, x, float(p), ()), (N, N))
    # condensed position of (i, j): i*N - i*(i+1)/2 + j - i - 1 when j > i, else the spare K
    i, j = Expr(EOp.INDEX, (), F32, 0), Expr(EOp.INDEX, (), F32, 1)
    pos = _e(EOp.SUB, _e(EOp.ADD, _e(EOp.SUB, _e(EOp.MUL, i, const(float(N))),
                                     _e(EOp.MUL, _e(EOp.MUL, i, _e(EOp.ADD, i, const(1.0))), const(0.5))),
                         j), _e(EOp.ADD, i, const(1.0)))
    idx = ctx.new_tensor((N, N), DType.INT32, hint="dp")
    ctx.emit(KOp(KKind.POINTWISE, (idx,), (), PointwiseAttrs(_e(
        EOp.CAST, _e(EOp.WHERE, _e(EOp.GT, j, i), pos, const(float(K))), dtype=DType.INT32))))
    out = ctx.new_tensor((K + 1,), odt, hint="dp")
    ctx.emit(KOp(KKind.POINTWISE, (out,), (), PointwiseAttrs(_e(EOp.CAST, const(0.0), dtype=odt))))
    table = TensorRef(out.buffer, odt, (N, N, K + 1), (0, 0, 1), 0)
    ctx.emit(KOp(KKind.SCATTER, (table,), (full, idx), ScatterKAttrs(2, K + 1, False)))
    return TensorRef(out.buffer, odt, (K,), (1,), 0)
