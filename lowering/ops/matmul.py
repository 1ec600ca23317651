"""Matrix products: mm, addmm, bmm (``linear`` arrives as addmm/mm through decomposition).

Engine: TensorE ``matmul`` (stationary = A^T tile [K<=128, M<=128], moving = B tile
[K<=128, N<=512], fp32 accumulation in one PSUM bank over the K tiles); the epilogue (bias, alpha,
beta, cast, and fused elementwise consumers) runs on VectorE/ScalarE while evacuating PSUM.
Tiling: any M, N, K, B; see ``tiling/matmul/kernel.py``.
"""
from __future__ import annotations

import torch

from lowering.kir import EOp, Expr, KKind, KOp, MatmulKAttrs, TensorRef, const, load
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.registry_table import register
from runtime_sim.isa import DType

aten = torch.ops.aten
ACC = Expr(EOp.ACC, (), DType.FP32)


def _as3d(ref: TensorRef) -> TensorRef:
    return apply_view(ref, torch_dtype_of(ref), lambda t: t.unsqueeze(0)) if ref.rank == 2 else ref


def emit_matmul(ctx: LowerCtx, a: TensorRef, b: TensorRef, epilogue_of=None,
                extra: tuple[TensorRef, ...] = ()) -> TensorRef:
    """out = a @ b (2-D or batched 3-D); ``epilogue_of(acc, loads) -> Expr`` post-processes."""
    v = ctx.out_val
    out = ctx.new_tensor(tuple(v.shape), v.dtype)
    out3 = _as3d(out)
    odt = out.dtype
    ins = (_as3d(a), _as3d(b)) + tuple(
        apply_view(x, torch_dtype_of(x), lambda t: t.expand(out.shape)) for x in extra)
    ins = ins[:2] + tuple(_as3d(x) for x in ins[2:])
    if epilogue_of is None:
        epi = Expr(EOp.CAST, (ACC,), odt)
    else:
        epi = epilogue_of(ACC, [load(2 + i, x.dtype) for i, x in enumerate(extra)])
        if epi.dtype != odt:
            epi = Expr(EOp.CAST, (epi,), odt)
    ctx.emit(KOp(KKind.MATMUL, (out3,), ins, MatmulKAttrs(epi)))
    return out


@register(aten.mm.default)
def _mm(ctx, node, a, b):
    return emit_matmul(ctx, a, b)


@register(aten.bmm.default)
def _bmm(ctx, node, a, b):
    return emit_matmul(ctx, a, b)


@register(aten.addmm.default)
def _addmm(ctx, node, bias, a, b, *, beta=1, alpha=1):
    odt = DType.FP32
    if beta == 0:  # eager ignores the bias entirely (NaN/inf in it do not propagate)
        if alpha == 1:
            return emit_matmul(ctx, a, b)
        return emit_matmul(ctx, a, b, lambda acc, loads: Expr(EOp.MUL, (acc, const(alpha)), odt))

    def epi(acc, loads):
        x = acc if alpha == 1 else Expr(EOp.MUL, (acc, const(alpha)), odt)
        y = loads[0] if beta == 1 else Expr(EOp.MUL, (loads[0], const(beta)), odt)
        return Expr(EOp.ADD, (x, y), odt)

    return emit_matmul(ctx, a, b, epi, (bias,))
