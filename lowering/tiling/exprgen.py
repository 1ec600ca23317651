"""Expression -> engine instructions on one [p, free] tile.

Used by every kernel that evaluates a pointwise expression per tile: POINTWISE kernels and the
epilogues of MATMUL kernels. Transcendental functions go to ScalarE (``activation``), arithmetic
and comparisons to VectorE/GpSimdE (``tensor_tensor`` / ``tensor_scalar``), ``where`` to
``select``, casts to ``tensor_copy``. Constants fold at compile time; an operand that must be a
tile (select) is materialised with ``memset``.

Invariants
- Each distinct sub-expression is computed once per tile (expressions are values: equal
  sub-trees share one result).
- Each result is rounded to its node's dtype, exactly like the ATen op it came from.
- Intermediate tiles come from ``work``, whose slot count is at least twice the number of
  intermediates, so no live value is overwritten within one tile's evaluation.
"""
from __future__ import annotations

import math

from lowering.errors import LoweringError
from lowering.kir import BINARY_OPS, EOp, Expr, UNARY_OPS
from lowering.tiling.builder import Pool, Tile, TileBuilder
from runtime_sim.isa import AP, ActFunc, AluOp, DType

ACT_OF: dict[EOp, ActFunc] = {
    EOp.EXP: ActFunc.EXP, EOp.LOG: ActFunc.LOG, EOp.SQRT: ActFunc.SQRT, EOp.RSQRT: ActFunc.RSQRT,
    EOp.RECIPROCAL: ActFunc.RECIPROCAL, EOp.TANH: ActFunc.TANH, EOp.SIGMOID: ActFunc.SIGMOID,
    EOp.RELU: ActFunc.RELU, EOp.GELU: ActFunc.GELU, EOp.GELU_TANH: ActFunc.GELU_TANH,
    EOp.SILU: ActFunc.SILU, EOp.ERF: ActFunc.ERF, EOp.SIN: ActFunc.SIN, EOp.COS: ActFunc.COS,
    EOp.SIGN: ActFunc.SIGN, EOp.ABS: ActFunc.ABS,
}
ALU_OF: dict[EOp, AluOp] = {
    EOp.ADD: AluOp.ADD, EOp.SUB: AluOp.SUBTRACT, EOp.MUL: AluOp.MULTIPLY, EOp.DIV: AluOp.DIVIDE,
    EOp.MAX: AluOp.MAX, EOp.MIN: AluOp.MIN, EOp.POW: AluOp.POW, EOp.EQ: AluOp.IS_EQUAL,
    EOp.NE: AluOp.NOT_EQUAL, EOp.LT: AluOp.IS_LT, EOp.LE: AluOp.IS_LE, EOp.GT: AluOp.IS_GT,
    EOp.GE: AluOp.IS_GE, EOp.AND: AluOp.LOGICAL_AND, EOp.OR: AluOp.LOGICAL_OR,
}
_PY = {
    EOp.ADD: lambda a, b: a + b, EOp.SUB: lambda a, b: a - b, EOp.MUL: lambda a, b: a * b,
    EOp.DIV: lambda a, b: a / b if b else math.copysign(math.inf, a) if a else math.nan,
    EOp.MAX: max, EOp.MIN: min, EOp.POW: lambda a, b: a ** b,
    EOp.EQ: lambda a, b: float(a == b), EOp.NE: lambda a, b: float(a != b),
    EOp.LT: lambda a, b: float(a < b), EOp.LE: lambda a, b: float(a <= b),
    EOp.GT: lambda a, b: float(a > b), EOp.GE: lambda a, b: float(a >= b),
}


def count_intermediates(expr: Expr) -> int:
    seen: set[Expr] = set()

    def walk(x: Expr) -> None:
        if x in seen:
            return
        seen.add(x)
        for a in x.args:
            walk(a)

    walk(expr)
    return sum(1 for x in seen if x.args) + 2


class ExprGen:
    """Evaluate expressions on one tile shape ``[p, *free]``; ``leaf(expr)`` supplies LOAD /
    ACC / INDEX leaves as APs."""

    def __init__(self, b: TileBuilder, work: Pool, p: int, free: tuple[int, ...], leaf):
        self.b, self.work, self.p, self.free, self.leaf = b, work, p, free, leaf
        self.memo: dict[Expr, AP | float] = {}

    def _tile(self, dtype: DType) -> Tile:
        return self.b.tile(self.work, self.p, self.free, dtype)

    def value(self, x: Expr) -> AP | float:
        if x in self.memo:
            return self.memo[x]
        v = self._value(x)
        self.memo[x] = v
        return v

    def tile_of(self, x: Expr, dtype: DType | None = None) -> AP:
        """``x`` as a tile AP of ``dtype`` (default its own dtype)."""
        v = self.value(x)
        dt = dtype or x.dtype
        if isinstance(v, float):
            t = self._tile(dt).ap()
            self.b.memset(t, v)
            return t
        if v.dtype != dt:
            t = self._tile(dt).ap()
            self.b.tensor_copy(t, v)
            return t
        return v

    def _value(self, x: Expr) -> AP | float:
        op = x.op
        if op in (EOp.LOAD, EOp.ACC, EOp.INDEX):
            return self.leaf(x)
        if op is EOp.CONST:
            return _round_const(x.value, x.dtype)
        args = [self.value(a) for a in x.args]
        if all(isinstance(a, float) for a in args):
            return _round_const(_fold(x, args), x.dtype)
        out = self._tile(x.dtype).ap()
        if op is EOp.CAST:
            self.b.tensor_copy(out, args[0])
        elif op is EOp.NEG:
            self.b.tensor_scalar(out, args[0], AluOp.MULTIPLY, -1.0)
        elif op is EOp.LOGICAL_NOT:
            self.b.tensor_scalar(out, args[0], AluOp.IS_EQUAL, 0.0)
        elif op in ACT_OF:
            self.b.activation(out, args[0], ACT_OF[op])
        elif op in BINARY_OPS:
            a, c = args
            alu = ALU_OF[op]
            if isinstance(a, float):
                self.b.tensor_scalar(out, c, alu, a, reverse0=True)
            elif isinstance(c, float):
                self.b.tensor_scalar(out, a, alu, c)
            else:
                self.b.tensor_tensor(out, a, c, alu)
        elif op is EOp.WHERE:
            cond = self.tile_of(x.args[0])
            t = self.tile_of(x.args[1], x.dtype)
            f = self.tile_of(x.args[2], x.dtype)
            self.b.select(out, cond, t, f)
        else:
            raise LoweringError(f"no tile code for expression op {op}")
        return out


def _round_const(v: float, dt: DType) -> float:
    if dt is DType.BOOL:
        return 1.0 if v else 0.0
    if not dt.is_float:
        return float(int(v))
    import numpy as np
    return float(np.asarray(v, dtype=np.float32).astype(dt.np).astype(np.float32))


def _fold(x: Expr, args: list[float]) -> float:
    op = x.op
    if op in _PY:
        return float(_PY[op](*args))
    if op is EOp.WHERE:
        return args[1] if args[0] else args[2]
    if op is EOp.CAST:
        return args[0]
    if op is EOp.NEG:
        return -args[0]
    if op in UNARY_OPS:
        import numpy as np
        from runtime_sim.semantics import ACT_FUNCS
        f = ACT_FUNCS[ACT_OF[op]] if op in ACT_OF else None
        if f is None:
            if op is EOp.LOGICAL_NOT:
                return float(args[0] == 0)
            raise LoweringError(f"cannot fold {op}")
        return float(f(np.asarray([args[0]], dtype=np.float32))[0])
    raise LoweringError(f"cannot fold {op}")

