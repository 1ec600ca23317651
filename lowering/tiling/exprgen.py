"""Expression -> engine instructions on one ``[p, *free]`` tile of the current loop iteration.

Used by every kernel that evaluates a pointwise expression per tile: POINTWISE kernels and the
epilogues of MATMUL kernels. Transcendental functions go to ScalarE (``activation``), arithmetic
and comparisons to VectorE/GpSimdE (``tensor_tensor`` / ``tensor_scalar``), ``where`` to
``select``, casts to ``tensor_copy``. Constants fold at compile time; an operand that must be a
tile (select) is materialised with ``memset``.

Invariants
- Each distinct sub-expression is computed once per tile (expressions are values: equal
  sub-trees share one result), into a tile of its own taken in the current loop (two slots, so
  the next iteration's value can be computed while this one is still read).
- Each result is rounded to its node's dtype, exactly like the ATen op it came from.
- Integer operations on values from memory are exact (``intgen.py``: GpSimdE's int32 ALU,
  int64 as two words); everything else computes in fp32.
- A sub-expression of per-row leaves and constants only (``row_leaf``) is computed on a
  ``[p, 1]`` tile and read with stride 0 wherever a full tile is needed: the same values, the
  work of one column.
"""
from __future__ import annotations

import math
from dataclasses import replace

from lowering.errors import LoweringError
from lowering.kir import BINARY_OPS, EOp, Expr, UNARY_OPS
from lowering.tiling.intgen import IntGen, takes_int_path
from lowering.tir.builder import TirBuilder
from lowering.tir.ir import TAP
from runtime_sim.isa import ActFunc, AluOp, DType, Memory

ACT_OF: dict[EOp, ActFunc] = {
    EOp.EXP: ActFunc.EXP, EOp.LOG: ActFunc.LOG, EOp.SQRT: ActFunc.SQRT, EOp.RSQRT: ActFunc.RSQRT,
    EOp.RECIPROCAL: ActFunc.RECIPROCAL, EOp.TANH: ActFunc.TANH, EOp.SIGMOID: ActFunc.SIGMOID,
    EOp.RELU: ActFunc.RELU, EOp.GELU: ActFunc.GELU, EOp.GELU_TANH: ActFunc.GELU_TANH,
    EOp.SILU: ActFunc.SILU, EOp.ERF: ActFunc.ERF, EOp.SIN: ActFunc.SIN, EOp.COS: ActFunc.COS,
    EOp.SIGN: ActFunc.SIGN, EOp.ABS: ActFunc.ABS, EOp.ATAN: ActFunc.ARCTAN,
}
ALU_OF: dict[EOp, AluOp] = {
    EOp.ADD: AluOp.ADD, EOp.SUB: AluOp.SUBTRACT, EOp.MUL: AluOp.MULTIPLY, EOp.DIV: AluOp.DIVIDE,
    EOp.MAX: AluOp.MAX, EOp.MIN: AluOp.MIN, EOp.POW: AluOp.POW, EOp.EQ: AluOp.IS_EQUAL,
    EOp.NE: AluOp.NOT_EQUAL, EOp.LT: AluOp.IS_LT, EOp.LE: AluOp.IS_LE, EOp.GT: AluOp.IS_GT,
    EOp.GE: AluOp.IS_GE, EOp.AND: AluOp.LOGICAL_AND, EOp.OR: AluOp.LOGICAL_OR,
    EOp.XOR: AluOp.LOGICAL_XOR, EOp.MOD: AluOp.MOD,
}
def count_intermediates(expr: Expr) -> int:
    """Distinct non-leaf sub-expressions (each needs a tile), plus two for casts/constants."""
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
    """Evaluate expressions on one tile shape ``[p, *free]`` of the current iteration;
    ``leaf(expr)`` supplies LOAD / ACC / INDEX leaves as access patterns.

    ``row_leaf(expr)``, when given, returns a ``[p, 1]`` tile for a leaf whose value is the
    same along the whole free extent of its row (a tensor broadcast along the free axes), or
    None. Sub-expressions of such leaves and constants are then computed once per row on
    ``[p, 1]`` tiles, and an operation combining one with a full tile is a ``tensor_scalar``
    with a per-partition operand (one streamed source instead of two)."""

    def __init__(self, b: TirBuilder, p: int, free: tuple[int, ...], leaf, bufs: int = 2,
                 row_leaf=None):
        self.b, self.p, self.free, self.leaf, self.bufs = b, p, free, leaf, bufs
        self.row_leaf = row_leaf
        self.memo: dict[Expr, TAP | float] = {}
        self.rows: set[Expr] = set()          # expressions whose value is a [p, 1] row tile
        self.int_memo: dict = {}              # intgen's shared results (an int64 long division)

    def new(self, dtype: DType, row: bool = False) -> TAP:
        return self.b.tile("w", Memory.SBUF, self.p, (1,) if row else self.free, dtype, self.bufs).ap()

    def wide(self, x: Expr, v: TAP | float) -> TAP | float:
        """``v`` (the value of ``x``) as a full-tile access: a row tile is read with stride 0."""
        if isinstance(v, TAP) and x in self.rows:
            return replace(v, dims=((0, math.prod(self.free)),))
        return v

    def value(self, x: Expr) -> TAP | float:
        if x in self.memo:
            return self.memo[x]
        v = self._value(x)
        self.memo[x] = v
        return v

    def tile_of(self, x: Expr, dtype: DType | None = None, out: TAP | None = None) -> TAP:
        """``x`` as a tile access of ``dtype`` (default its own dtype); with ``out`` the result
        is computed into that access (the last instruction writes it) and ``out`` returned."""
        dt = dtype or x.dtype
        if out is not None and x not in self.memo and x.dtype == dt and x.args and x.op is not EOp.CONST:
            v = self._value(x, out)
            self.memo[x] = v
            if v is out:
                return out
        else:
            v = self.value(x)
        v = self.wide(x, v)
        if isinstance(v, float):
            t = out if out is not None else self.new(dt)
            self.b.memset(t, v)
            return t
        if v.dtype != dt or (out is not None and v is not out):
            t = out if out is not None else self.new(dt)
            self.b.tensor_copy(t, v)
            return t
        return v

    def _value(self, x: Expr, dst: TAP | None = None) -> TAP | float:
        op = x.op
        if op in (EOp.LOAD, EOp.ACC, EOp.INDEX):
            r = self.row_leaf(x) if self.row_leaf is not None else None
            if r is not None:
                self.rows.add(x)
                return r
            return self.leaf(x)
        if op is EOp.CONST:
            return _round_const(x.value, x.dtype)
        if op is EOp.CAST and x.args[0].dtype == x.dtype and dst is None:
            v = self.value(x.args[0])             # a cast to the same type moves nothing
            if x.args[0] in self.rows:
                self.rows.add(x)
            return v
        if takes_int_path(x):                     # exact integers: GpSimdE's int32 ALU
            return IntGen(self).emit(x)
        args = [self.value(a) for a in x.args]
        if all(isinstance(a, float) for a in args):
            return _round_const(_fold(x, args), x.dtype)
        row = op is not EOp.WHERE and all(isinstance(v, float) or a in self.rows
                                          for a, v in zip(x.args, args))
        b = self.b
        if row:                                   # once per row: a [p, 1] tile
            self.rows.add(x)
            out = self.new(x.dtype, row=True)
        else:
            out = dst if dst is not None else self.new(x.dtype)
        if op is EOp.CAST:
            b.tensor_copy(out, args[0])
        elif op is EOp.NEG:
            b.tensor_scalar(out, args[0], AluOp.MULTIPLY, -1.0)
        elif op is EOp.LOGICAL_NOT:
            b.tensor_scalar(out, args[0], AluOp.IS_EQUAL, 0.0)
        elif op in ACT_OF:
            b.activation(out, args[0], ACT_OF[op])
        elif op in BINARY_OPS:
            a, c = args
            alu = ALU_OF[op]
            if isinstance(a, float):
                b.tensor_scalar(out, c, alu, a, reverse0=True)
            elif isinstance(c, float):
                b.tensor_scalar(out, a, alu, c)
            elif not row and x.args[0] in self.rows:   # per-row operand: one streamed source
                b.tensor_scalar(out, c, alu, a, reverse0=True)
            elif not row and x.args[1] in self.rows:
                b.tensor_scalar(out, a, alu, c)
            else:
                b.tensor_tensor(out, a, c, alu)
        elif op is EOp.WHERE:
            cond = self.tile_of(x.args[0])
            t = self.tile_of(x.args[1], x.dtype)
            f = self.tile_of(x.args[2], x.dtype)
            b.select(out, cond, t, f)
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
    """An operation on constants, computed by the machine's own semantics (fp32, as the engine
    would compute it): every op the tile code can emit can also be folded."""
    import numpy as np
    from runtime_sim.semantics import ACT_FUNCS, ALU
    op = x.op
    if op in ALU_OF:
        a, b = (np.asarray([v], dtype=np.float32) for v in args)
        with np.errstate(all="ignore"):
            return float(ALU[ALU_OF[op]](a, b)[0])
    if op is EOp.WHERE:
        return args[1] if args[0] else args[2]
    if op is EOp.CAST:
        return args[0]
    if op is EOp.NEG:
        return -args[0]
    if op is EOp.LOGICAL_NOT:
        return float(args[0] == 0)
    if op in ACT_OF:
        with np.errstate(all="ignore"):
            return float(ACT_FUNCS[ACT_OF[op]](np.asarray([args[0]], dtype=np.float32))[0])
    raise LoweringError(f"cannot fold {op}: no tile code for it either")
