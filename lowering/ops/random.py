"""Random ops on the device: rand, randn (and their ``_like`` forms), native_dropout.

Engines: GpSimdE ``rand_philox`` (Philox4x32-10, a counter-based generator: the machine's
semantics define every bit), ScalarE for Box-Muller (randn), VectorE/GpSimdE for dropout's
mask and scaling. Tiling: any size below 2**31 elements (``tiling/rand.py``).

Seeding: every RAND kernel reads two int32 seed words from an input buffer ``rng_seed*`` that
``CompiledGraph.run`` draws from torch's default CPU generator on every call, so a program run
after ``torch.manual_seed(s)`` produces the same numbers each time, consecutive calls produce
fresh numbers (a new dropout mask per step), and eager's own random stream advances. The values
differ from eager's (a different generator), as with Inductor.

Invariants
- Uniform values lie in [0, 1) with as many random bits as the output's significand.
- native_dropout keeps an element when its uniform u >= p (probability 1 - p) and scales the
  survivors by 1 / (1 - p); ``train=False`` is the identity with an all-true mask.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, RandKAttrs, Role, TensorRef, const, load
from lowering.lower_ctx import LowerCtx, machine_dtype
from lowering.registry_table import FLOAT_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
SEED_PREFIX = "rng_seed"    # CompiledGraph.run fills input buffers named so (lowering/compiled.py)


def emit_rand(ctx: LowerCtx, shape: tuple[int, ...], dtype: DType, normal: bool) -> TensorRef:
    seed = ctx.new_tensor((2,), DType.INT32, Role.INPUT, hint=SEED_PREFIX)
    ctx.kp.inputs.append(seed.buffer)
    out = ctx.new_tensor(shape, dtype)
    if out.numel:
        ctx.emit(KOp(KKind.RAND, (out,), (seed,), RandKAttrs(normal)))
    return out


def _float_out(node: fx.Node) -> str | None:
    """Values differ from eager's: Philox4x32-10 on GpSimdE, seeded on every call from torch's
    default generator (deterministic after torch.manual_seed). Float results only."""
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"dtype {v.dtype} (random integers fall back)"
    return None


def _rule(normal: bool):
    def lower(ctx: LowerCtx, node: fx.Node, *args, **kwargs) -> TensorRef:
        v = ctx.out_val
        return emit_rand(ctx, tuple(v.shape), machine_dtype(v.dtype, ctx.op), normal)
    lower.__doc__ = ("GpSimdE Philox4x32-10 " + ("+ ScalarE Box-Muller" if normal else "uniform [0, 1)")
                     + "; seeded per call from torch's default generator (values differ from eager's)")
    return lower


for _ov in (aten.rand.default, aten.rand_like.default):
    register(_ov, dtypes=FLOAT_DTYPES, check=_float_out)(_rule(False))
for _ov in (aten.randn.default, aten.randn_like.default):
    register(_ov, dtypes=FLOAT_DTYPES, check=_float_out)(_rule(True))


def _dropout_check(node: fx.Node) -> str | None:
    """Masks differ from eager's: Philox4x32-10 uniforms on GpSimdE, seeded on every call from
    torch's default generator (deterministic after torch.manual_seed); keep u >= p, survivors
    scaled by 1/(1-p)."""
    return None


@register(aten.native_dropout.default, dtypes=FLOAT_DTYPES | MASK_DTYPES, check=_dropout_check)
def _native_dropout(ctx, node, x, p, train):
    """GpSimdE Philox4x32-10 uniforms, then one VectorE/GpSimdE kernel: keep where u >= p, scaled
    by 1 / (1 - p); returns (out, mask). Seeded per call (values differ from eager's)."""
    v = ctx.out_val
    shape = tuple(x.shape)
    out = ctx.new_tensor(shape, x.dtype)
    mask = ctx.new_tensor(shape, DType.BOOL)
    p = float(p)
    if train is False or p == 0.0:           # identity, all kept
        ctx.emit(KOp(KKind.POINTWISE, (out,), (x,), PointwiseAttrs(load(0, x.dtype))))
        ctx.emit(KOp(KKind.POINTWISE, (mask,), (), PointwiseAttrs(Expr(EOp.CAST, (const(1.0),), DType.BOOL))))
        return (out, mask)
    u = emit_rand(ctx, shape, DType.FP32, False)
    keep = Expr(EOp.GE, (load(1, DType.FP32), const(p)), DType.FP32)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    val = Expr(EOp.MUL, (load(0, x.dtype), const(scale)), DType.FP32)
    ctx.emit(KOp(KKind.POINTWISE, (out,), (x, u),
                 PointwiseAttrs(Expr(EOp.WHERE, (keep, val, const(0.0)), x.dtype))))
    ctx.emit(KOp(KKind.POINTWISE, (mask,), (u,),
                 PointwiseAttrs(Expr(EOp.GE, (load(0, DType.FP32), const(p)), DType.BOOL))))
    return (out, mask)
