"""Elementwise ATen ops -> one POINTWISE kernel each (fusion merges chains later).

Engines: ScalarE for transcendental functions (``activation``), VectorE/GpSimdE for arithmetic,
comparisons and select (``tensor_tensor``, ``tensor_scalar``, ``select``), chosen per tile by the
scheduler. Tiling: any shape; see ``tiling/pointwise.py``.

Numerics: the engines compute in fp32 and round each op's result to the dtype eager PyTorch would
produce for that op (``Expr.dtype``), which is how eager's "opmath" behaves for bf16/fp16.
Integers are exact as torch computes them, wraparound included: an integer operation on values
from memory (a graph input such as batch norm's ``num_batches_tracked``, or a stored
intermediate) runs on GpSimdE's 32-bit integer ALU, int64 as two 32-bit words
(``tiling/intgen.py``); integers generated on the device (``arange``/``full``, bounded below
2**24 at compile time) may stay on the fp32 path, exact there. Integer constants must fit
2**53 (the expression's constants are doubles); int64 division has no exact sequence and is
refused with the reason.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import (EOp, Expr, KKind, KOp, PointwiseAttrs, TensorRef, const, contiguous_strides,
                          load)
from lowering.lower_ctx import LowerCtx, machine_dtype
import lowering.ops.mathfns as mathfns
from lowering.ops.common import torch_dtype_of
from lowering.ops.views import apply_view
from lowering.tiling.intgen import DIVISOR_BITS
from lowering.registry_table import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES, MASK_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
EW_DTYPES = FLOAT_DTYPES | MASK_DTYPES | INDEX_DTYPES
F32 = DType.FP32


INT_CONST_MAX = 2 ** 53
DEVICE_INT_SOURCES = {aten.arange.start_step, aten.arange.default, aten.arange.start,
                      aten.full.default, aten.scalar_tensor.default, aten.zeros.default,
                      aten.ones.default}


def exact_integers(node: fx.Node) -> str | None:
    """Integer operands are exact (``tiling/intgen.py``) when every integer constant fits a
    double (|c| <= 2**53)."""
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > INT_CONST_MAX:
            return f"integer constant {a} is beyond 2**53 (expression constants are doubles)"
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
            tdt = torch_dtype_of(x)
            bx = apply_view(x, tdt, lambda t: t.expand(out_shape))
            leaves.append(load(len(ins), x.dtype))
            ins.append(bx)
        elif isinstance(x, bool):
            leaves.append(const(1.0 if x else 0.0))
        elif isinstance(x, int) and abs(x) > INT_CONST_MAX:
            raise Unsupported(ctx.op, f"integer constant {x} is beyond 2**53 (expression constants "
                              "are doubles)")
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
    if _t not in (aten.neg.default, aten.abs.default):
        register(_t, dtypes=FLOAT_DTYPES)(_unary(_op))


@register(aten.neg.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES)
def _neg(ctx, node, x):
    """-x; integers exact with wraparound (GpSimdE int ALU, ``tiling/intgen.py``)."""
    return pointwise(ctx, node, [x], lambda l, dt: e(EOp.NEG, l[0], dtype=dt))


@register(aten.abs.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES)
def _abs(ctx, node, x):
    """|x|: ScalarE abs for floats; integers exact as where(x < 0, -x, x) (|INT_MIN| wraps to
    INT_MIN, as torch's)."""
    def build(l: Leaves, dt: DType) -> Expr:
        if dt.is_float:
            return e(EOp.ABS, l[0], dtype=dt)
        return e(EOp.WHERE, e(EOp.LT, l[0], const(0.0), dtype=DType.BOOL),
                 e(EOp.NEG, l[0], dtype=dt), l[0], dtype=dt)
    return pointwise(ctx, node, [x], build)


def _bool_only(node: fx.Node) -> str | None:
    v = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(v, torch.Tensor) and v.dtype != torch.bool:
        return f"only bool inputs are supported (got {v.dtype}); integer bit patterns are not"
    return None


@register(aten.bitwise_not.default, dtypes=MASK_DTYPES, check=_bool_only)
@register(aten.logical_not.default, dtypes=EW_DTYPES, check=exact_integers)
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
                y = e(EOp.MUL, y, const(alpha), dtype=F32 if dt.is_float else dt)
            if reverse:
                x, y = y, x
            return e(op, x, y, dtype=dt)
        return pointwise(ctx, node, [a, b], build)
    return lower


register(aten.mul.Tensor, aten.mul.Scalar, dtypes=EW_DTYPES,
         check=exact_integers)(_binary(EOp.MUL))


def _bitwise(logical: EOp, bits: EOp):
    """Bitwise ops: on bool the logical op, on int32/int64 the bit patterns (exact, GpSimdE's
    integer ALU word by word)."""
    def lower(ctx: LowerCtx, node: fx.Node, a, b) -> TensorRef:
        return _binary(logical if ctx.out_val.dtype == torch.bool else bits)(ctx, node, a, b)
    return lower


for _ts, _ops in (((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), (EOp.AND, EOp.BITAND)),
                  ((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), (EOp.OR, EOp.BITOR)),
                  ((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), (EOp.XOR, EOp.BITXOR))):
    register(*_ts, dtypes=MASK_DTYPES | INDEX_DTYPES)(_bitwise(*_ops))
_BINARY = {
    (aten.div.Tensor, aten.div.Scalar): EOp.DIV,
    (aten.pow.Tensor_Scalar,): EOp.POW,
}
for _ts, _op in _BINARY.items():
    register(*_ts, dtypes=FLOAT_DTYPES)(_binary(_op))
register(aten.maximum.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES)(_binary(EOp.MAX))
register(aten.minimum.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES)(_binary(EOp.MIN))
register(aten.add.Tensor, aten.add.Scalar, dtypes=EW_DTYPES - MASK_DTYPES,
         check=exact_integers)(_binary(EOp.ADD, alpha_scales=True))
register(aten.sub.Tensor, aten.sub.Scalar, dtypes=EW_DTYPES - MASK_DTYPES,
         check=exact_integers)(_binary(EOp.SUB, alpha_scales=True))
register(aten.rsub.Scalar, aten.rsub.Tensor, dtypes=FLOAT_DTYPES)(
    _binary(EOp.SUB, reverse=True, alpha_scales=True))


def _float_pow(node: fx.Node) -> str | None:
    """pow of a float base: an integer exponent is promoted to the float result type, as
    eager's type promotion does (``torch.pow(alibi_base, int32_powers)`` in BLOOM); an integer
    base (an integer power) falls back."""
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point:
        return f"integer pow (result dtype {v.dtype}): only a float base is lowered"
    return None


@register(aten.pow.Tensor_Tensor, dtypes=FLOAT_DTYPES | INDEX_DTYPES, check=_float_pow)
def _pow_tensor(ctx, node, base, exponent):
    """pow: the base and an integer exponent both taken to the float result type first."""
    def build(l: Leaves, dt: DType) -> Expr:
        x, y = (a if a.dtype == dt else e(EOp.CAST, a, dtype=dt) for a in l)
        return e(EOp.POW, x, y, dtype=dt)
    return pointwise(ctx, node, [base, exponent], build)


@register(aten.pow.Scalar, dtypes=FLOAT_DTYPES)
def _pow_scalar(ctx, node, base, exponent):
    return pointwise(ctx, node, [base, exponent], lambda l, dt: e(EOp.POW, l[0], l[1], dtype=dt))


def _int64_division_ancestry(node: fx.Node) -> str | None:
    """int64 division has no exact engine sequence (the integer ALU is 32-bit): accept it only
    on integers generated on the device (bounded below 2**24: the fp32 path is exact)."""
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
                return (f"int64 division of {a.name}, an integer graph input, by a tensor: the "
                        "integer ALU is 32-bit and this division has no exact sequence (int32 is "
                        f"exact, and int64 by a constant 0 < |c| < 2**{DIVISOR_BITS})")
            if a.op == "call_function" and a.target not in DEVICE_INT_SOURCES:
                stack.append(a)
    return None


def _int64_divisor_ok(node: fx.Node) -> str | None:
    """int64 division / modulo: exact by a constant 0 < |c| < 2**27 (long division on the
    integer ALU, ``tiling/intgen.py``); otherwise only on device-generated integers."""
    b = node.args[1] if len(node.args) > 1 else None
    if isinstance(b, int) and not isinstance(b, bool):
        if 0 < abs(b) < 2 ** DIVISOR_BITS:
            return None
        why = _int64_division_ancestry(node)
        return None if why is None else (
            f"int64 division by the constant {b}: the long division on the 32-bit integer ALU "
            f"takes 0 < |c| < 2**{DIVISOR_BITS}")
    return _int64_division_ancestry(node)


def _div_mode_check(node: fx.Node) -> str | None:
    """rounding_mode None, 'trunc' or 'floor'; floats exact as torch's CPU kernel (floor is
    its fmod-based Python floor division); int32 exact on the integer ALU (division by zero,
    an error in eager, gives -1 there); int64 only on integers generated on the device."""
    mode = node.kwargs.get("rounding_mode")
    if mode not in (None, "trunc", "floor"):
        return f"rounding_mode={mode!r} is not one of None, 'trunc', 'floor'"
    v = node.meta.get("val")
    if mode is not None and isinstance(v, torch.Tensor) and v.dtype == torch.int64:
        return _int64_divisor_ok(node)
    return None


@register(aten.div.Tensor_mode, dtypes=FLOAT_DTYPES | INDEX_DTYPES, check=_div_mode_check)
def _div_mode(ctx, node, a, b, *, rounding_mode=None):
    out_dt = ctx.out_val.dtype
    if rounding_mode is None:
        return pointwise(ctx, node, [a, b], lambda l, dt: e(EOp.DIV, l[0], l[1], dtype=dt))
    if not out_dt.is_floating_point:
        return pointwise(ctx, node, [a, b], lambda l, dt: _int_div(l[0], l[1], dt, rounding_mode))
    # eager divides in bf16/fp16 steps unless the divisor is one element (then in fp32, once)
    single = not isinstance(b, TensorRef) or b.numel == 1
    fn = mathfns.div_floor if rounding_mode == "floor" else mathfns.div_trunc

    def build(l: Leaves, dt: DType) -> Expr:
        return fn(_f32(l[0]), _f32(l[1]), F32 if single else dt)
    return pointwise(ctx, node, [a, b], build)


def _int_div(a: Expr, b: Expr, dt: DType, mode: str) -> Expr:
    """Integer trunc / floor division (``c10::div_floor_integer``): the ALU's truncating
    divide, minus one where the remainder is non-zero and the signs differ (the ALU's floor
    modulo is non-zero exactly where the C remainder is)."""
    q = e(EOp.DIV, a, b, dtype=dt)
    if mode == "trunc":
        return q
    B = DType.BOOL
    fix = e(EOp.AND, e(EOp.NE, e(EOp.MOD, a, b, dtype=dt), const(0.0), dtype=B),
            e(EOp.XOR, e(EOp.LT, a, const(0.0), dtype=B), e(EOp.LT, b, const(0.0), dtype=B), dtype=B),
            dtype=B)
    return e(EOp.SUB, q, fix, dtype=dt)


_COMPARE = {
    (aten.eq.Tensor, aten.eq.Scalar): EOp.EQ, (aten.ne.Tensor, aten.ne.Scalar): EOp.NE,
    (aten.lt.Tensor, aten.lt.Scalar): EOp.LT, (aten.le.Tensor, aten.le.Scalar): EOp.LE,
    (aten.gt.Tensor, aten.gt.Scalar): EOp.GT, (aten.ge.Tensor, aten.ge.Scalar): EOp.GE,
}
for _ts, _op in _COMPARE.items():
    register(*_ts, dtypes=EW_DTYPES, check=exact_integers)(_binary(_op))
register(aten.logical_and.default, dtypes=EW_DTYPES,
         check=exact_integers)(_binary(EOp.AND))
register(aten.logical_or.default, dtypes=EW_DTYPES,
         check=exact_integers)(_binary(EOp.OR))


@register(aten.clamp.default, dtypes=FLOAT_DTYPES | INDEX_DTYPES, check=exact_integers)
def _clamp(ctx, node, x, min=None, max=None):
    """clamp by constants; integer tensors only when generated on the device (bilinear
    upsampling's source indices, clamped to the input's edge)."""
    def build(l: Leaves, dt: DType) -> Expr:
        y, w = l[0], F32 if dt.is_float else dt         # integers stay integers (exact path)
        if min is not None:
            y = e(EOp.MAX, y, const(min), dtype=w)
        if max is not None:
            y = e(EOp.MIN, y, const(max), dtype=w)
        return y
    return pointwise(ctx, node, [x], build)


@register(aten.where.self, dtypes=EW_DTYPES, check=exact_integers)
def _where(ctx, node, cond, a, b):
    return pointwise(ctx, node, [cond, a, b], lambda l, dt: e(EOp.WHERE, *l, dtype=dt))


def _to_copy_check(node: fx.Node) -> str | None:
    layout = node.kwargs.get("layout")
    if layout not in (None, torch.strided):
        return f"layout={layout} is not supported (only strided)"
    return None


@register(aten._to_copy.default, dtypes=EW_DTYPES | FP8_DTYPES, check=_to_copy_check)  # fp8: casts
def _to_copy(ctx, node, x, **kwargs):
    return pointwise(ctx, node, [x], lambda l, dt: e(EOp.CAST, l[0], dtype=dt))


@register(aten.masked_fill.Scalar, dtypes=EW_DTYPES, check=exact_integers)
def _masked_fill(ctx, node, x, mask, value):
    if isinstance(value, float) and not ctx.out_val.dtype.is_floating_point and ctx.out_val.dtype != torch.bool:
        value = int(value)                # torch converts the fill value to x's integer dtype
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


# ---- the rest of the pointwise set: compositions (ops/mathfns.py) --------------------------
def _doc_check(doc: str):
    """A check that accepts every node and documents how the op runs (its ``limits``)."""
    def check(node: fx.Node) -> str | None:
        return None
    check.__doc__ = doc
    return check


_COMPOSED_UNARY = {
    aten.floor.default: (mathfns.floor, "exact: VectorE, round(x) - (round(x) > x) with the 2**23 "
                         "rounding trick (no floor instruction)"),
    aten.ceil.default: (mathfns.ceil, "exact: VectorE, -floor(-x) (no ceil instruction)"),
    aten.round.default: (mathfns.round_even, "exact, half to even: VectorE, (|x| + 2**23) - 2**23 "
                         "with the sign put back (no round instruction)"),
    aten.trunc.default: (mathfns.trunc, "exact: VectorE, ceil for x < 0 else floor"),
    aten.log1p.default: (mathfns.log1p, "ScalarE log + VectorE, Kahan's log(1+x) * x / ((1+x) - 1) "
                         "(no log1p function); log is valid on [2**-64, 2**64]"),
    aten.expm1.default: (mathfns.expm1, "ScalarE exp/log + VectorE, Kahan's (e^x - 1) * x / log(e^x) "
                         "(no expm1 function)"),
    aten.log2.default: (mathfns.log2, "ScalarE log, divided by ln 2 on VectorE"),
    aten.log10.default: (mathfns.log10, "ScalarE log, divided by ln 10 on VectorE"),
    aten.exp2.default: (mathfns.exp2, "VectorE pow(2, x) (exact for integer x)"),
    aten.atan.default: (lambda x: atan_scalar(x), "ScalarE arctan (valid on [-pi/2, pi/2]) of "
                        "min(|x|, 1/|x|), pi/2 - it above 1, sign put back on VectorE"),
    aten.tan.default: (mathfns.tan, "ScalarE sin / cos, divided on VectorE (no tan function)"),
    aten.asin.default: (mathfns.asin, "composed: atan(x / sqrt((1-x)(1+x))), ScalarE sqrt + VectorE"),
    aten.acos.default: (mathfns.acos, "composed: 2 atan(sqrt((1-x)/(1+x))), ScalarE sqrt + VectorE"),
    aten.sinh.default: (mathfns.sinh, "composed from expm1 (exp/log), odd; e^|x|/2 for |x| > 20"),
    aten.cosh.default: (mathfns.cosh, "composed: (e^|x| + e^-|x|)/2; e^|x|/2 for |x| > 20"),
    aten.asinh.default: (mathfns.asinh, "composed: log1p(a + a^2/(1 + sqrt(1 + a^2))) with the sign "
                         "of x; log(a) + ln 2 beyond 2**60"),
    aten.acosh.default: (mathfns.acosh, "composed: log1p(t + sqrt(t(t+2))), t = x - 1; log(x) + ln 2 "
                         "beyond 2**60"),
    aten.atanh.default: (mathfns.atanh, "composed: log1p(2x/(1-x)) / 2"),
}


def atan_scalar(x: Expr) -> Expr:
    """atan on ScalarE's arctan, whose valid input is [-pi/2, pi/2]: on a = |x|, t = a (a <= 1)
    or 1 / clamp(a, 1, 2**42) (ScalarE reciprocal inside its valid [2**-42, 2**42]), so t is in
    [0, 1]; atan(a) = arctan(t), or pi/2 - arctan(t) above 1; x's sign bit put back. inf ->
    pi/2 (t = 2**-42), NaN propagates."""
    from lowering.ops.mathfns import HALF_PI, copysign, e, where
    a = e(EOp.ABS, x)
    big = e(EOp.GT, a, 1.0)
    inv = e(EOp.RECIPROCAL, e(EOp.MIN, e(EOp.MAX, a, 1.0), 2.0 ** 42))
    r = e(EOp.ATAN, where(big, inv, a))
    return copysign(where(big, e(EOp.SUB, HALF_PI, r), r), x)


def _composed_unary(fn):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef) -> TensorRef:
        return pointwise(ctx, node, [x], lambda l, dt: fn(_f32(l[0])))
    return lower


def _f32(x: Expr) -> Expr:
    return x if x.dtype == F32 else e(EOp.CAST, x)


for _t, (_fn, _doc) in _COMPOSED_UNARY.items():
    register(_t, dtypes=FLOAT_DTYPES, check=_doc_check(_doc))(_composed_unary(_fn))


@register(aten.round.decimals, dtypes=FLOAT_DTYPES, check=_doc_check(
    "exact: round(x * 10**d) / 10**d (d < 0: round(x / 10**-d) * 10**-d) in fp32, as torch's kernel"))
def _round_decimals(ctx, node, x, *, decimals=0):
    return pointwise(ctx, node, [x], lambda l, dt: mathfns.round_decimals(_f32(l[0]), int(decimals)))


def _classify(fn):
    def lower(ctx: LowerCtx, node: fx.Node, x: TensorRef) -> TensorRef:
        return pointwise(ctx, node, [x], lambda l, dt: e(EOp.CAST, fn(_f32(l[0])), dtype=dt))
    return lower


register(aten.isnan.default, dtypes=FLOAT_DTYPES | MASK_DTYPES,
         check=_doc_check("exact: VectorE x != x"))(_classify(mathfns.isnan))
register(aten.isinf.default, dtypes=FLOAT_DTYPES | MASK_DTYPES,
         check=_doc_check("exact: VectorE |x| == inf"))(_classify(mathfns.isinf))


@register(aten.nan_to_num.default, dtypes=FLOAT_DTYPES, check=_doc_check(
    "exact: VectorE selects (defaults: the dtype's largest finite values)"))
def _nan_to_num(ctx, node, x, nan=0.0, posinf=None, neginf=None):
    fi = torch.finfo(ctx.out_val.dtype)
    hi = fi.max if posinf is None else posinf
    lo = fi.min if neginf is None else neginf
    nv = 0.0 if nan is None else nan

    def build(l: Leaves, dt: DType) -> Expr:
        v = _f32(l[0])
        return mathfns.where(mathfns.isnan(v), nv, mathfns.where(
            e(EOp.EQ, v, const(math.inf)), hi, mathfns.where(e(EOp.EQ, v, const(-math.inf)), lo, v)))
    return pointwise(ctx, node, [x], build)


def _composed_binary(fn):
    def lower(ctx: LowerCtx, node: fx.Node, a, b) -> TensorRef:
        return pointwise(ctx, node, [a, b], lambda l, dt: fn(_f32(l[0]), _f32(l[1])))
    return lower


register(aten.atan2.default, dtypes=FLOAT_DTYPES, check=_doc_check(
    "C atan2 (signed zeros, infinities): the atan polynomial of min(|x|,|y|)/max(|x|,|y|), "
    "reflected on VectorE"))(_composed_binary(mathfns.atan2))
def _fmod_check(node: fx.Node) -> str | None:
    """exact, sign of the dividend: floats by VectorE mod(|a|, |b|) with a's sign bit;
    integers from the integer ALU's floor modulo m as m - b where m != 0 and the signs of a and
    b differ (int32 any divisor; int64 by a constant 0 < |c| < 2**27 or on device-generated
    integers)."""
    return _remainder_check(node)


@register(aten.fmod.Tensor, aten.fmod.Scalar, dtypes=FLOAT_DTYPES | INDEX_DTYPES, check=_fmod_check)
def _fmod(ctx, node, a, b):
    if ctx.out_val.dtype.is_floating_point:
        return pointwise(ctx, node, [a, b], lambda l, dt: mathfns.fmod(_f32(l[0]), _f32(l[1])))

    def build(l: Leaves, dt: DType) -> Expr:
        B = DType.BOOL
        m = e(EOp.MOD, l[0], l[1], dtype=dt)
        fix = e(EOp.AND, e(EOp.NE, m, const(0.0), dtype=B),
                e(EOp.XOR, e(EOp.LT, l[0], const(0.0), dtype=B), e(EOp.LT, l[1], const(0.0), dtype=B),
                  dtype=B), dtype=B)
        return e(EOp.WHERE, fix, e(EOp.SUB, m, l[1], dtype=dt), m, dtype=dt)
    return pointwise(ctx, node, [a, b], build)
def _remainder_check(node: fx.Node) -> str | None:
    """exact, sign of the divisor: floats by torch's r = fmod(a, b); r + b where r != 0 and
    the signs differ; int32 by the integer ALU's floor modulo; int64 by a constant
    0 < |c| < 2**27 (long division) or on device-generated integers."""
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor) and v.dtype == torch.int64:
        return _int64_divisor_ok(node)
    return None


@register(aten.remainder.Tensor, aten.remainder.Scalar, dtypes=FLOAT_DTYPES | INDEX_DTYPES,
          check=_remainder_check)
def _remainder(ctx, node, a, b):
    if not ctx.out_val.dtype.is_floating_point:
        return pointwise(ctx, node, [a, b], lambda l, dt: e(EOp.MOD, l[0], l[1], dtype=dt))
    return pointwise(ctx, node, [a, b], lambda l, dt: mathfns.remainder(_f32(l[0]), _f32(l[1])))
register(aten.logical_xor.default, dtypes=EW_DTYPES,
         check=exact_integers)(_binary(EOp.XOR))


@register(aten.clamp.Tensor, dtypes=FLOAT_DTYPES)
def _clamp_tensor(ctx, node, x, min=None, max=None):
    """min(max(x, lo), hi) on VectorE, bounds broadcast tensors (NaN propagates)."""
    operands = [x] + [t for t in (min, max) if t is not None]

    def build(l: Leaves, dt: DType) -> Expr:
        y, k = l[0], 1
        if min is not None:
            y, k = e(EOp.MAX, y, l[k]), k + 1
        if max is not None:
            y = e(EOp.MIN, y, l[k])
        return e(EOp.CAST, y, dtype=dt)
    return pointwise(ctx, node, operands, build)


@register(aten.elu.default, dtypes=FLOAT_DTYPES, check=_doc_check(
    "scale * (x if x > 0 else alpha * expm1(x * input_scale)); expm1 composed (ScalarE exp/log)"))
def _elu(ctx, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    def build(l: Leaves, dt: DType) -> Expr:
        v = _f32(l[0])
        neg = e(EOp.MUL, mathfns.expm1(e(EOp.MUL, v, const(input_scale))), const(alpha * scale))
        return mathfns.where(e(EOp.GT, v, const(0.0)), e(EOp.MUL, v, const(scale)), neg)
    return pointwise(ctx, node, [x], build)


# ---- copies and fills ------------------------------------------------------------------------
@register(aten.copy.default, dtypes=EW_DTYPES)
def _copy(ctx, node, x, src, non_blocking=False):
    """``src`` broadcast to ``x``'s shape in ``x``'s dtype (functionalised ``copy_``)."""
    return pointwise(ctx, node, [src], lambda l, dt: e(EOp.CAST, l[0], dtype=dt))


@register(aten.fill.Scalar, aten.fill.Tensor, dtypes=EW_DTYPES)
def _fill_like(ctx, node, x, value):
    """``x``'s shape filled with ``value`` (a number, or a 0-d tensor broadcast): memset."""
    return pointwise(ctx, node, [value], lambda l, dt: e(EOp.CAST, l[0], dtype=dt))


def _empty_strided_check(node: fx.Node) -> str | None:
    """Contiguous strides only (the result is a new contiguous tensor, filled with zeros)."""
    size, stride = node.args[0], node.args[1]
    want = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        want[i] = want[i + 1] * max(1, int(size[i + 1]))
    if any(int(n) > 1 and int(s) != w for n, s, w in zip(size, stride, want)):
        return f"stride {list(stride)} is not the contiguous stride {want} of size {list(size)}"
    return None


@register(aten.empty.memory_format, dtypes=EW_DTYPES)
def _empty(ctx, node, size, **kwargs):
    """A new tensor; its contents are unspecified, so it is filled with zeros (memset)."""
    return pointwise(ctx, node, [], lambda l, dt: const(0.0, dt))


@register(aten.empty_strided.default, dtypes=EW_DTYPES, check=_empty_strided_check)
def _empty_strided(ctx, node, size, stride, **kwargs):
    return pointwise(ctx, node, [], lambda l, dt: const(0.0, dt))


@register(aten.repeat.default, dtypes=EW_DTYPES)
def _repeat(ctx, node, x, repeats):
    """One copy kernel (DMA through SBUF): the output viewed as ``[r0, s0, r1, s1, ...]`` is
    ``x`` broadcast along the ``r`` axes (stride 0)."""
    reps = [int(r) for r in repeats]
    lead = len(reps) - x.rank
    shape = (1,) * lead + x.shape
    strides = (0,) * lead + x.strides
    out = ctx.new_tensor(tuple(r * s for r, s in zip(reps, shape)), x.dtype)
    if out.numel == 0:
        return out
    vshape = tuple(v for pair in zip(reps, shape) for v in pair)
    src = TensorRef(x.buffer, x.dtype, vshape,
                    tuple(v for st in strides for v in (0, st)), x.offset)
    dst = TensorRef(out.buffer, out.dtype, vshape, contiguous_strides(vshape))
    ctx.emit(KOp(KKind.POINTWISE, (dst,), (src,), PointwiseAttrs(load(0, x.dtype))))
    return out


@register(aten.flip.default, dtypes=EW_DTYPES)
def _flip(ctx, node, x, dims):
    """One copy kernel reading ``x`` through a view with negated strides on ``dims``."""
    flipped = {int(d) % max(1, x.rank) for d in dims}
    off = x.offset + sum((x.shape[d] - 1) * x.strides[d] for d in flipped if x.shape[d] > 0)
    src = TensorRef(x.buffer, x.dtype, x.shape,
                    tuple(-s if d in flipped else s for d, s in enumerate(x.strides)), off)
    out = ctx.new_tensor(x.shape, x.dtype)
    if out.numel:
        ctx.emit(KOp(KKind.POINTWISE, (out,), (src,), PointwiseAttrs(load(0, x.dtype))))
    return out
