"""Exact integer arithmetic in pointwise expressions: GpSimdE's 32-bit integer ALU.

``ExprGen`` hands an expression node here when ``takes_int_path(node)``: an integer-valued
operation (add, sub, mul, max/min, comparisons, logical ops, negation, where, integer casts,
and int32 division/modulo) whose operands are integers or integral constants and whose value
depends on memory (a LOAD or ACC leaf below it: a graph input or a stored intermediate, whose
values are unknown at compile time).

Invariants
- The result is what torch computes: two's complement arithmetic that wraps at the width of the
  node's dtype (int32 or int64), signed comparisons, int64 results for int64 operands.
- Every instruction runs on GpSimdE with int32/int8/uint8/bool operands and integer
  constants, so the simulator takes its integer path (``runtime_sim/semantics.py``, "Integer
  ALU"); a value is never read through fp32.
- int32 values: one instruction per operation. int64 values live in SBUF as int64 tiles; the
  machine has no 64-bit ALU, so each operation is a short sequence of int32 instructions on the
  tile's two words (little endian: the low word at byte 0, the high word at byte 4), read and
  written through int32 views with twice the element stride. Carries and borrows come from
  unsigned compares (adding 2**31 turns unsigned order into signed order); products from
  16-bit halves (``_mulhi``); division and modulo by a constant below 2**27 by long division in
  chunks (``_udivmod``). int64 division by a tensor has no such sequence: the registry accepts
  it only on device-generated integers, and it keeps the fp32 path here.
- Sub-expressions over device-generated integers only (INDEX leaves, constants below 2**24)
  keep the fp32 path of ``exprgen``: they are bounded below 2**24 at compile time, where fp32
  is exact; a constant of 2**24 or more takes this path.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Protocol

from lowering.errors import LoweringError
from lowering.kir import BITWISE_OPS, EOp, Expr
from lowering.tir.builder import TirBuilder
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, EngineKind, Op, SelectAttrs

I32, I64, BOOL = DType.INT32, DType.INT64, DType.BOOL
WIDE = frozenset({I32, I64})
INT_DTYPES = frozenset({I32, I64, DType.INT8, DType.UINT8, BOOL})
GP = (EngineKind.GPSIMD,)
MIN32 = -2 ** 31
FP32_EXACT = 2 ** 24       # integers from here on are not all exact in fp32
Word = TAP | int                # an int32 word: a tile view or a constant

_ALU = {EOp.ADD: AluOp.ADD, EOp.SUB: AluOp.SUBTRACT, EOp.MUL: AluOp.MULTIPLY, EOp.MAX: AluOp.MAX,
        EOp.MIN: AluOp.MIN, EOp.EQ: AluOp.IS_EQUAL, EOp.NE: AluOp.NOT_EQUAL, EOp.LT: AluOp.IS_LT,
        EOp.LE: AluOp.IS_LE, EOp.GT: AluOp.IS_GT, EOp.GE: AluOp.IS_GE, EOp.AND: AluOp.LOGICAL_AND,
        EOp.OR: AluOp.LOGICAL_OR, EOp.XOR: AluOp.LOGICAL_XOR, EOp.DIV: AluOp.DIVIDE,
        EOp.MOD: AluOp.MOD, EOp.BITAND: AluOp.BITWISE_AND, EOp.BITOR: AluOp.BITWISE_OR,
        EOp.BITXOR: AluOp.BITWISE_XOR}
EXACT_OPS = frozenset(_ALU) | {EOp.NEG, EOp.LOGICAL_NOT, EOp.WHERE, EOp.CAST}
DIVISIONS = frozenset({EOp.DIV, EOp.MOD})


def wrap32(v: int) -> int:
    return ((int(v) + 2 ** 31) & 0xFFFFFFFF) - 2 ** 31


def from_memory(x: Expr) -> bool:
    return x.op in (EOp.LOAD, EOp.ACC) or any(from_memory(a) for a in x.args)


def _integral(v: float) -> bool:
    return math.isfinite(v) and float(v).is_integer() and abs(v) < 2 ** 63


def _const(x: Expr) -> float | None:
    """The value of a constant, or of a cast of one (an integer cast truncates), else None."""
    if x.op is EOp.CONST:
        return x.value
    if x.op is EOp.CAST:
        v = _const(x.args[0])
        if v is not None and not x.dtype.is_float and math.isfinite(v):
            return float(math.trunc(v))
        return v if x.dtype is DType.FP32 else None
    return None


def takes_int_path(x: Expr) -> bool:
    if x.op not in EXACT_OPS or x.dtype.is_float:
        return False
    if x.op in BITWISE_OPS:      # bit patterns: no fp32 code computes them
        return True
    if x.op is EOp.CAST:
        s = x.args[0]
        return s.dtype in WIDE and s.dtype is not x.dtype and x.dtype in (I32, I64, BOOL) and from_memory(s)
    vals = x.args[1:] if x.op is EOp.WHERE else x.args
    if x.op in DIVISIONS and I64 in (x.dtype, *(a.dtype for a in vals)):
        # int64 by a small constant: chunked long division; else device-generated values
        # only (the registry's rule), on the fp32 path
        return int64_divisor(vals[1]) is not None and from_memory(vals[0])
    consts = [_const(a) for a in vals]
    for a, c in zip(vals, consts):
        if c is not None:
            if not _integral(c):
                return False
        elif a.dtype not in INT_DTYPES:
            return False
    if all(c is not None for c in consts) and x.op is not EOp.WHERE:
        return False                                        # folds at compile time
    if not (x.dtype in WIDE or any(a.dtype in WIDE for a, c in zip(vals, consts) if c is None)):
        return False
    return (any(from_memory(a) for a in vals)
            or any(c is not None and abs(c) >= FP32_EXACT for c in consts))


DIVISOR_BITS = 27          # |c| < 2**27: long division in chunks of >= 4 bits (<= 8 steps)


def int64_divisor(b: Expr) -> int | None:
    """The constant divisor of an int64 division that ``_divmod64`` takes, else None."""
    v = _const(b)
    if v is None or not _integral(v):
        return None
    c = int(v)
    return c if 0 < abs(c) < 2 ** DIVISOR_BITS else None


class TileHost(Protocol):
    """What ``IntGen`` needs from the expression generator that hands it nodes
    (``exprgen.ExprGen``): its builder, fresh tiles, operand values, and a memo shared
    across the nodes of one tile."""

    b: TirBuilder
    int_memo: dict

    def new(self, dtype: DType, row: bool = False) -> TAP: ...

    def wide(self, x: Expr, v: TAP | float) -> TAP | float: ...

    def value(self, x: Expr) -> TAP | float: ...

    def tile_of(self, x: Expr, dtype: DType | None = None, out: TAP | None = None) -> TAP: ...


class IntGen:
    """Integer code for one tile shape, on the tiles of a ``TileHost`` (an ``ExprGen``)."""

    def __init__(self, eg: TileHost):
        self.eg, self.b = eg, eg.b

    # ---- words and single instructions ------------------------------------------------------
    def tmp(self, dtype: DType = I32) -> TAP:
        return self.eg.new(dtype)

    @staticmethod
    def words(t: TAP) -> tuple[TAP, TAP]:
        lo = replace(t, dtype=I32, dims=tuple((2 * s, n) for s, n in t.dims))
        return lo, replace(lo, offset=t.offset + 4)

    def op2(self, a: Word, b: Word, alu: AluOp, dst: TAP | None = None, dtype: DType = I32) -> Word:
        """``a alu b`` on int32 words (folded when both are constants, or by an identity when
        no ``dst`` is asked for)."""
        if isinstance(a, int) and isinstance(b, int):
            v = _fold(alu, a, b)
            if dst is None:
                return v
            self.b.memset(dst, float(v), engines=GP)
            return dst
        if dst is None:
            if alu in (AluOp.ADD, AluOp.SUBTRACT, AluOp.BITWISE_OR, AluOp.LOGICAL_SHIFT_RIGHT,
                       AluOp.LOGICAL_SHIFT_LEFT) and b == 0:
                return a
            if alu is AluOp.ADD and a == 0:
                return b
            if alu is AluOp.MULTIPLY and (a == 0 or b == 0):
                return 0
            if alu is AluOp.MULTIPLY and b == 1:
                return a
            if alu is AluOp.MULTIPLY and a == 1:
                return b
            dst = self.tmp(dtype)
        if isinstance(a, TAP) and isinstance(b, TAP):
            self.b.tensor_tensor(dst, a, b, alu, engines=GP)
        elif isinstance(b, int):
            self.b.tensor_scalar(dst, a, alu, float(b), engines=GP)
        else:
            self.b.tensor_scalar(dst, b, alu, float(a), reverse0=True, engines=GP)
        return dst

    def put(self, dst: TAP, w: Word) -> None:
        """Write word ``w`` into ``dst`` (unless it already is ``dst``)."""
        if isinstance(w, int):
            self.b.memset(dst, float(w), engines=GP)
        elif w is not dst:
            self.b.tensor_copy(dst, w, engines=GP)

    def tile(self, w: Word) -> TAP:
        if isinstance(w, TAP):
            return w
        t = self.tmp()
        self.b.memset(t, float(w), engines=GP)
        return t

    def ult(self, a: Word, b: Word) -> Word:
        """Unsigned ``a < b`` of two words, 0 / 1."""
        if isinstance(b, int):
            t = self.tmp()
            self.b.tensor_scalar(t, a, AluOp.ADD, float(MIN32), op1=AluOp.IS_LT,
                                 operand1=float(wrap32(b + MIN32)), engines=GP)
            return t
        if isinstance(a, int):
            t = self.tmp()
            self.b.tensor_scalar(t, b, AluOp.ADD, float(MIN32), op1=AluOp.IS_GT,
                                 operand1=float(wrap32(a + MIN32)), engines=GP)
            return t
        return self.op2(self.op2(a, MIN32, AluOp.ADD, dst=self.tmp()),
                        self.op2(b, MIN32, AluOp.ADD, dst=self.tmp()), AluOp.IS_LT)

    # ---- operands ---------------------------------------------------------------------------
    def operand(self, x: Expr) -> TAP | int:
        c = _const(x)
        if c is not None:
            return int(c)
        v = self.eg.wide(x, self.eg.value(x))
        if isinstance(v, float):
            return int(v)
        return v

    def pair(self, v: TAP | int) -> tuple[Word, Word]:
        """(low, high) int32 words of an operand as int64."""
        if isinstance(v, int):
            u = v & (2 ** 64 - 1)
            return wrap32(u & 0xFFFFFFFF), wrap32(u >> 32)
        if v.dtype is I64:
            return self.words(v)
        if v.dtype in (BOOL, DType.UINT8):
            return v, 0
        return v, self.op2(v, 31, AluOp.ARITH_SHIFT_RIGHT, dst=self.tmp())

    # ---- expressions ------------------------------------------------------------------------
    def emit(self, x: Expr) -> TAP:
        op = x.op
        if op is EOp.CAST:
            return self._cast(x)
        vals = x.args[1:] if op is EOp.WHERE else x.args
        wide64 = x.dtype is I64 or any(a.dtype is I64 for a in vals if a.op is not EOp.CONST)
        ops = [self.operand(a) for a in vals]
        if not wide64:
            return self._emit32(x, [wrap32(v) if isinstance(v, int) else v for v in ops])
        return self._emit64(x, [self.pair(v) for v in ops])

    def _emit32(self, x: Expr, ops: list) -> TAP:
        op, out = x.op, self.tmp(x.dtype)
        if op is EOp.NEG:
            return self.op2(0, ops[0], AluOp.SUBTRACT, dst=out)
        if op is EOp.LOGICAL_NOT:
            return self.op2(ops[0], 0, AluOp.IS_EQUAL, dst=out)
        if op is EOp.WHERE:
            self._select(out, self.eg.tile_of(x.args[0]), ops[0], ops[1])
            return out
        return self.op2(ops[0], ops[1], _ALU[op], dst=out)

    def _select(self, dst: TAP, cond: TAP, t: Word, f: Word) -> None:
        self.b.emit(Op.SELECT, dst, (cond, self.tile(t), self.tile(f)), SelectAttrs(), engines=GP)

    def _cast(self, x: Expr) -> TAP:
        src, dt = x.args[0], x.dtype
        v = self.eg.wide(src, self.eg.value(src))
        out = self.tmp(dt)
        if src.dtype is I64:
            lo, hi = self.words(v)
            if dt is BOOL:
                self.op2(self.op2(lo, hi, AluOp.BITWISE_OR), 0, AluOp.NOT_EQUAL, dst=out)
            else:                               # the low word: torch's wrapping narrowing cast
                self.b.tensor_copy(out, lo, engines=GP)
            return out
        if dt is I64:                          # int32 -> int64: sign extension
            lo, hi = self.words(out)
            self.put(lo, v)
            self.op2(v, 31, AluOp.ARITH_SHIFT_RIGHT, dst=hi)
            return out
        if dt is BOOL:
            return self.op2(v, 0, AluOp.NOT_EQUAL, dst=out)
        self.b.tensor_copy(out, v, engines=GP)
        return out

    def _emit64(self, x: Expr, ops: list[tuple[Word, Word]]) -> TAP:
        op = x.op
        out = self.tmp(x.dtype)
        if x.dtype is not I64:                 # comparisons and logical ops: 0 / 1
            return self._predicate64(op, ops, out)
        lo, hi = self.words(out)
        if op is EOp.WHERE:
            cond = self.eg.tile_of(x.args[0])
            self._select(lo, cond, ops[0][0], ops[1][0])
            self._select(hi, cond, ops[0][1], ops[1][1])
        elif op in (EOp.MAX, EOp.MIN):
            a, b = ops
            lt = self.tile(self._lt64(a, b))
            big, small = (b, a) if op is EOp.MAX else (a, b)     # max: b where a < b
            self._select(lo, lt, big[0], small[0])
            self._select(hi, lt, big[1], small[1])
        elif op is EOp.NEG:
            self._sub64((0, 0), ops[0], lo, hi)
        elif op is EOp.ADD:
            self._add64(ops[0], ops[1], lo, hi)
        elif op is EOp.SUB:
            self._sub64(ops[0], ops[1], lo, hi)
        elif op is EOp.MUL:
            self._mul64(ops[0], ops[1], lo, hi)
        elif op in BITWISE_OPS:               # word by word
            self.op2(ops[0][0], ops[1][0], _ALU[op], dst=lo)
            self.op2(ops[0][1], ops[1][1], _ALU[op], dst=hi)
        elif op in DIVISIONS:
            c = int64_divisor(x.args[1])
            assert c is not None
            self._divmod64(op, ops[0], c, lo, hi)
        else:
            raise LoweringError(f"no exact int64 code for {op.value}")
        return out

    def _add64(self, a, b, lo: TAP, hi: TAP) -> None:
        (al, ah), (bl, bh) = a, b
        s = self.op2(al, bl, AluOp.ADD, dst=lo)
        carry = self.ult(s, al if isinstance(al, TAP) or isinstance(bl, int) else bl)
        self.op2(self.op2(ah, bh, AluOp.ADD), carry, AluOp.ADD, dst=hi)

    def _sub64(self, a, b, lo: TAP, hi: TAP) -> None:
        (al, ah), (bl, bh) = a, b
        borrow = self.ult(al, bl)               # before lo is written (lo may alias nothing here)
        self.op2(al, bl, AluOp.SUBTRACT, dst=lo)
        self.op2(self.op2(ah, bh, AluOp.SUBTRACT), borrow, AluOp.SUBTRACT, dst=hi)

    def _mul64(self, a, b, lo: TAP, hi: TAP) -> None:
        (al, ah), (bl, bh) = a, b
        self.op2(al, bl, AluOp.MULTIPLY, dst=lo)
        h = self.op2(self._mulhi(al, bl), self.op2(ah, bl, AluOp.MULTIPLY), AluOp.ADD)
        self.put(hi, self.op2(h, self.op2(al, bh, AluOp.MULTIPLY), AluOp.ADD))

    def _mulhi(self, x: Word, y: Word) -> Word:
        """The high word of the unsigned 64-bit product of two words, from 16-bit halves:
        every partial product and partial sum is below 2**32 (exact as a 32-bit pattern)."""
        def halves(w: Word) -> tuple[Word, Word]:
            if isinstance(w, int):
                u = w & 0xFFFFFFFF
                return u & 0xFFFF, u >> 16
            return (self.op2(w, 0xFFFF, AluOp.BITWISE_AND, dst=self.tmp()),
                    self.op2(w, 16, AluOp.LOGICAL_SHIFT_RIGHT, dst=self.tmp()))
        (x0, x1), (y0, y1) = halves(x), halves(y)
        mul, add = AluOp.MULTIPLY, AluOp.ADD

        def lsr16(w: Word) -> Word:
            return ((w & 0xFFFFFFFF) >> 16) if isinstance(w, int) else self.op2(
                w, 16, AluOp.LOGICAL_SHIFT_RIGHT, dst=self.tmp())

        def low16(w: Word) -> Word:
            return (w & 0xFFFF) if isinstance(w, int) else self.op2(
                w, 0xFFFF, AluOp.BITWISE_AND, dst=self.tmp())
        t, m1, m2 = self.op2(x0, y0, mul), self.op2(x1, y0, mul), self.op2(x0, y1, mul)
        mid = self.op2(self.op2(lsr16(t), low16(m1), add), low16(m2), add)
        h = self.op2(self.op2(x1, y1, mul), lsr16(m1), add)
        return self.op2(self.op2(h, lsr16(m2), add), lsr16(mid), add)

    def _udivmod(self, a, d: int) -> tuple[tuple[Word, Word], Word]:
        """``(floor(a / d), a mod d)`` of an int64 pair by ``0 < d < 2**27``: the high word by
        the ALU (floor modulo and floor division), then the remainder times ``2**k`` plus
        the next ``k`` bits of the low word, divided by ``d``, chunk by chunk (every partial
        value below ``d * 2**k <= 2**31``). The quotient's low word collects the chunks."""
        key = (a, d)
        if key in self.eg.int_memo:            # a // c and a % c share one long division
            return self.eg.int_memo[key]
        al, ah = a
        k = min(16, 31 - d.bit_length())
        r = self.op2(ah, d, AluOp.MOD)
        # floor(ah / d): the truncating divide, one less where ah < 0 leaves a remainder
        # ((ah - r) / d would wrap for ah = -2**31)
        below = self.op2(self.op2(ah, 0, AluOp.IS_LT), self.op2(r, 0, AluOp.NOT_EQUAL), AluOp.LOGICAL_AND)
        qh = self.op2(self.op2(ah, d, AluOp.DIVIDE), below, AluOp.SUBTRACT)
        ql: Word = 0
        bits = 32
        while bits > 0:
            step = min(k, bits)
            bits -= step
            chunk = self.op2(self.op2(al, bits, AluOp.LOGICAL_SHIFT_RIGHT), (1 << step) - 1,
                             AluOp.BITWISE_AND)
            t = self.op2(self.op2(r, 1 << step, AluOp.MULTIPLY), chunk, AluOp.ADD)
            qc = self.op2(t, d, AluOp.DIVIDE)
            r = self.op2(t, self.op2(qc, d, AluOp.MULTIPLY), AluOp.SUBTRACT)
            ql = self.op2(self.op2(ql, step, AluOp.LOGICAL_SHIFT_LEFT), qc, AluOp.ADD)
        self.eg.int_memo[key] = ((ql, qh), r)
        return (ql, qh), r

    def _divmod64(self, op: EOp, a, c: int, lo: TAP, hi: TAP) -> None:
        """int64 ``a // c`` (DIV: truncating, as the node's rounding asks) or floor ``a % c``
        (MOD) by a constant, exact: floor division of the magnitudes by ``|c|``, then torch's
        sign rules (``c < 0``: ``a // c = -(q + [r > 0])``, ``a % c = r - |c| [r > 0]``)."""
        d = abs(c)
        q, r = self._udivmod(a, d)
        if op is EOp.MOD:
            if c < 0:
                r = self.op2(r, self.op2(self.op2(r, 0, AluOp.IS_GT), d, AluOp.MULTIPLY), AluOp.SUBTRACT)
            self.put(lo, r)
            self.op2(self.tile(r), 31, AluOp.ARITH_SHIFT_RIGHT, dst=hi)
            return
        # DIV truncates: trunc(a / d) = floor(a / d) + [a < 0 and r != 0]
        up = self.op2(self.op2(a[1], 0, AluOp.IS_LT), self.op2(r, 0, AluOp.NOT_EQUAL), AluOp.LOGICAL_AND)
        if c > 0:
            self._add64(q, (up, 0), lo, hi)
            return
        t = self.tmp(I64)
        tl, th = self.words(t)
        self._add64(q, (up, 0), tl, th)
        self._sub64((0, 0), (tl, th), lo, hi)

    def _lt64(self, a, b) -> Word:
        """Signed ``a < b`` of two int64 pairs: high words signed, then low words unsigned."""
        (al, ah), (bl, bh) = a, b
        hlt = self.op2(ah, bh, AluOp.IS_LT)
        heq = self.op2(ah, bh, AluOp.IS_EQUAL)
        return self.op2(hlt, self.op2(heq, self.ult(al, bl), AluOp.LOGICAL_AND), AluOp.LOGICAL_OR)

    def _nonzero64(self, a) -> Word:
        return self.op2(self.op2(a[0], a[1], AluOp.BITWISE_OR), 0, AluOp.NOT_EQUAL)

    def _predicate64(self, op: EOp, ops, out: TAP) -> TAP:
        if op is EOp.LOGICAL_NOT:
            return self.op2(self.op2(ops[0][0], ops[0][1], AluOp.BITWISE_OR), 0, AluOp.IS_EQUAL, dst=out)
        a, b = ops
        if op in (EOp.EQ, EOp.NE):
            alu, comb = ((AluOp.IS_EQUAL, AluOp.LOGICAL_AND) if op is EOp.EQ
                         else (AluOp.NOT_EQUAL, AluOp.LOGICAL_OR))
            r = self.op2(self.op2(a[0], b[0], alu), self.op2(a[1], b[1], alu), comb, dst=out)
        elif op in (EOp.LT, EOp.GT):
            r = self.op2(self._lt64(a, b) if op is EOp.LT else self._lt64(b, a), 0, AluOp.ADD, dst=out)
        elif op in (EOp.LE, EOp.GE):                   # not (b < a) / not (a < b)
            r = self.op2(self._lt64(b, a) if op is EOp.LE else self._lt64(a, b), 0, AluOp.IS_EQUAL, dst=out)
        elif op in (EOp.AND, EOp.OR, EOp.XOR):
            r = self.op2(self._nonzero64(a), self._nonzero64(b), _ALU[op], dst=out)
        else:
            raise LoweringError(f"no exact int64 code for {op.value} with a {out.dtype.value} result")
        assert isinstance(r, TAP)
        return r


def _fold(alu: AluOp, a: int, b: int) -> int:
    """Constant words, as the integer ALU computes them (semantics.INT_ALU)."""
    import numpy as np
    from runtime_sim.semantics import INT_ALU
    return int(wrap32(int(INT_ALU[alu](np.array([a], dtype=np.int64), np.array([b], dtype=np.int64))[0])))
