"""Elementwise ATen ops -> one POINTWISE kernel each (fusion merges chains later).

Engines: ScalarE for transcendental functions (``activation``), VectorE/GpSimdE for arithmetic,
comparisons and select (``tensor_tensor``, ``tensor_scalar``, ``select``), chosen per tile by the
scheduler. Tiling: any shape; see ``tiling/pointwise.py``.

Numerics: the engines compute in fp32 and round each op's result to the dtype eager PyTorch would
produce for that op (``Expr.dtype``), which is how eager's "opmath" behaves for bf16/fp16.
Integer tensors are computed through fp32 too, so they are accepted only when generated on the
device (``arange``/``full``, bounded below 2**24 at compile time), never from a graph input.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.frontend import LowerCtx, machine_dtype
from lowering.kir import EOp, Expr, KKind, KOp, PointwiseAttrs, TensorRef, const, load
from lowering.ops.views import apply_view
from lowering.registry import FLOAT_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
EW_DTYPES = FLOAT_DTYPES | MASK_DTYPES | INDEX_DTYPES
DEVICE_INT_SOURCES = {aten.arange.start_step, aten.arange.default, aten.arange.start,
                      aten.full.default, aten.scalar_tensor.default, aten.zeros.default,
                      aten.ones.default}
F32 = DType.FP32


def int_inputs_generated_on_device(node: fx.Node) -> str | None:
    """Integer tensors reach the engines through fp32: accept them only when every integer
    ancestor is produced on the device by a bounded generator."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for a in n.all_input_nodes:
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or v.dtype not in INDEX_DTYPES:
                continue
            if a.op == "placeholder":
                return (f"integer tensor {a.name} ({v.dtype}) comes from a graph input; the "
                        "engines compute integers through fp32, exact only below 2**24")
            if a.op == "call_function" and a.target not in DEVICE_INT_SOURCES:
                stack.append(a)
    return None


Leaves = Sequence[Expr]


def pointwise(ctx: LowerCtx, node: fx.Node, operands: Sequence[object],
              build: Callable[[Leaves, DType], Expr]) -> TensorRef:
    """Emit ``out = build(leaves)``; tensor operands broadcast to the output shape."""
    out_val = ctx.out_val
    out_shape = tuple(out_val.shape)
    odt = machine_dtype(out_val.dtype, ctx.op)
    ins: list[TensorRef] = []
    leaves: list[Expr] = []
    for x in operands:
        if isinstance(x, TensorRef):
            tdt = _torch_dtype_of(x)
            bx = apply_view(x, tdt, lambda t: t.expand(out_shape))
            leaves.append(load(len(ins), x.dtype))
            ins.append(bx)
        elif isinstance(x, bool):
            leaves.append(const(1.0 if x else 0.0))
        elif isinstance(x, (int, float)):
            leaves.append(const(float(x)))
        else:
            raise Unsupported(ctx.op, f"operand of type {type(x).__name__} is not supported")
    expr = build(leaves, odt)
    if expr.dtype != odt:
        expr = Expr(EOp.CAST, (expr,), odt)
    out = ctx.new_tensor(out_shape, odt)
    ctx.emit(KOp(KKind.POINTWISE, (out,), tuple(ins), PointwiseAttrs(expr)))
    return out


_DT_TO_TORCH = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
                DType.INT32: torch.int32, DType.INT64: torch.int64, DType.BOOL: torch.bool,
                DType.UINT8: torch.uint8, DType.INT8: torch.int8}


def _torch_dtype_of(ref: TensorRef) -> torch.dtype:
    return _DT_TO_TORCH.get(ref.dtype, torch.float32)


def e(op: EOp, *args: Expr, dtype: DType = F32) -> Expr:
    return Expr(op, tuple(args), dtype)


# ---- unary ------------------------------------------------------------------------------
_UNARY = {
    aten.neg.default: EOp.NEG, aten.abs.default: EOp.ABS, aten.exp.default: EOp.EXP,
    aten.log.default: EOp.LOG, aten.sqrt.default: EOp.SQRT, aten.rsqrt.default: EOp.RSQRT,
    aten.reciprocal.default: EOp.RECIPROCAL, aten.tanh.default: EOp.TANH,
    aten.sigmoid.default: EOp.SIGMOID, aten.relu.default: EOp.RELU, aten.silu.default: EOp.SILU,
    aten.erf.default: EOp.ERF, aten.sin.default: EOp.SIN, aten.cos.default: EOp.COS,
    aten.sign.default: EOp.SIGN,
}


def _unary(op: EOp):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef) -> TensorRef:
        return pointwise(ctx, node, [x], lambda l, dt: e(op, l[0], dtype=dt))
    return lower


for _t, _op in _UNARY.items():
    register(_t, dtypes=FLOAT_DTYPES)(_unary(_op))


def _bool_only(node: fx.Node) -> str | None:
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(v, torch.Tensor) and v.dtype != torch.bool:
        return f"only bool inputs are supported (got {v.dtype}); integer bit patterns are not"
    return None


@register(aten.bitwise_not.default, dtypes=MASK_DTYPES, check=_bool_only)
@register(aten.logical_not.default, dtypes=EW_DTYPES, check=int_inputs_generated_on_device)
def _logical_not(ctx, node, x):
    return pointwise(ctx, node, [x], lambda l, dt: e(EOp.EQ, l[0], const(0.0), dtype=dt))


def _gelu_check(node: fx.Node) -> str | None:
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approx not in ("none", "tanh"):
        return f"approximate={approx!r} is not one of 'none', 'tanh'"
    return None


@register(aten.gelu.default, check=_gelu_check)
def _gelu(ctx, node, x, approximate="none"):
    op = EOp.GELU_TANH if approximate == "tanh" else EOp.GELU
    return pointwise(ctx, node, [x], lambda l, dt: e(op, l[0], dtype=dt))


# ---- binary -----------------------------------------------------------------------------
def _binary(op: EOp, *, reverse: bool = False, alpha_scales: bool = False):
    def lower(ctx: LowerCtx, node: fx.Node, a, b, *, alpha=1) -> TensorRef:
        def build(l: Leaves, dt: DType) -> Expr:
            x, y = l
            if alpha_scales and alpha != 1:
                y = e(EOp.MUL, y, const(alpha))
            if reverse:
                x, y = y, x
            return e(op, x, y, dtype=dt)
        return pointwise(ctx, node, [a, b], build)
    return lower


register(aten.mul.Tensor, aten.mul.Scalar, dtypes=EW_DTYPES,
         check=int_inputs_generated_on_device)(_binary(EOp.MUL))
register(aten.bitwise_and.Tensor, dtypes=MASK_DTYPES)(_binary(EOp.AND))
register(aten.bitwise_or.Tensor, dtypes=MASK_DTYPES)(_binary(EOp.OR))
_BINARY = {
    (aten.div.Tensor, aten.div.Scalar): EOp.DIV,
    (aten.maximum.default,): EOp.MAX,
    (aten.minimum.default,): EOp.MIN,
    (aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor): EOp.POW,
}
for _ts, _op in _BINARY.items():
    register(*_ts, dtypes=FLOAT_DTYPES)(_binary(_op))
register(aten.add.Tensor, aten.add.Scalar, dtypes=EW_DTYPES - MASK_DTYPES,
         check=int_inputs_generated_on_device)(_binary(EOp.ADD, alpha_scales=True))
register(aten.sub.Tensor, aten.sub.Scalar, dtypes=EW_DTYPES - MASK_DTYPES,
         check=int_inputs_generated_on_device)(_binary(EOp.SUB, alpha_scales=True))
register(aten.rsub.Scalar, aten.rsub.Tensor, dtypes=FLOAT_DTYPES)(
    _binary(EOp.SUB, reverse=True, alpha_scales=True))


@register(aten.pow.Scalar, dtypes=FLOAT_DTYPES)
def _pow_scalar(ctx, node, base, exponent):
    return pointwise(ctx, node, [base, exponent], lambda l, dt: e(EOp.POW, l[0], l[1], dtype=dt))


def _div_mode_check(node: fx.Node) -> str | None:
    mode = node.kwargs.get("rounding_mode")
    return None if mode is None else f"rounding_mode={mode!r} is not supported (only None)"


@register(aten.div.Tensor_mode, dtypes=FLOAT_DTYPES, check=_div_mode_check)
def _div_mode(ctx, node, a, b, *, rounding_mode=None):
    return pointwise(ctx, node, [a, b], lambda l, dt: e(EOp.DIV, l[0], l[1], dtype=dt))


_COMPARE = {
    (aten.eq.Tensor, aten.eq.Scalar): EOp.EQ, (aten.ne.Tensor, aten.ne.Scalar): EOp.NE,
    (aten.lt.Tensor, aten.lt.Scalar): EOp.LT, (aten.le.Tensor, aten.le.Scalar): EOp.LE,
    (aten.gt.Tensor, aten.gt.Scalar): EOp.GT, (aten.ge.Tensor, aten.ge.Scalar): EOp.GE,
}
for _ts, _op in _COMPARE.items():
    register(*_ts, dtypes=EW_DTYPES, check=int_inputs_generated_on_device)(_binary(_op))
register(aten.logical_and.default, dtypes=EW_DTYPES,
         check=int_inputs_generated_on_device)(_binary(EOp.AND))
register(aten.logical_or.default, dtypes=EW_DTYPES,
         check=int_inputs_generated_on_device)(_binary(EOp.OR))


@register(aten.clamp.default, dtypes=FLOAT_DTYPES)
def _clamp(ctx, node, x, min=None, max=None):
    def build(l: Leaves, dt: DType) -> Expr:
        y = l[0]
        if min is not None:
            y = e(EOp.MAX, y, const(min))
        if max is not None:
            y = e(EOp.MIN, y, const(max))
        return y
    return pointwise(ctx, node, [x], build)


@register(aten.where.self, dtypes=EW_DTYPES, check=int_inputs_generated_on_device)
def _where(ctx, node, cond, a, b):
    return pointwise(ctx, node, [cond, a, b], lambda l, dt: e(EOp.WHERE, *l, dtype=dt))


def _to_copy_check(node: fx.Node) -> str | None:
    layout = node.kwargs.get("layout")
    if layout not in (None, torch.strided):
        return f"layout={layout} is not supported (only strided)"
    return None


@register(aten._to_copy.default, dtypes=EW_DTYPES, check=_to_copy_check)
def _to_copy(ctx, node, x, **kwargs):
    return pointwise(ctx, node, [x], lambda l, dt: e(EOp.CAST, l[0], dtype=dt))


@register(aten.masked_fill.Scalar, dtypes=EW_DTYPES, check=int_inputs_generated_on_device)
def _masked_fill(ctx, node, x, mask, value):
    return pointwise(ctx, node, [mask, value, x], lambda l, dt: e(EOp.WHERE, *l, dtype=dt))


@register(aten.hardtanh.default)
def _hardtanh(ctx, node, x, min_val=-1.0, max_val=1.0):
    return pointwise(ctx, node, [x], lambda l, dt: e(EOp.MIN, e(EOp.MAX, l[0], const(min_val)),
                                                     const(max_val), dtype=dt))


@register(aten.leaky_relu.default)
def _leaky_relu(ctx, node, x, negative_slope=0.01):
    return pointwise(ctx, node, [x], lambda l, dt: e(
        EOp.WHERE, e(EOp.GT, l[0], const(0.0)), l[0], e(EOp.MUL, l[0], const(negative_slope)),
        dtype=dt))
