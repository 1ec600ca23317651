"""Pointwise functions the engines lack, composed from the ones they have (expression builders).

ScalarE's activation table (NKI ``nki.api.shared``, "Supported Activation Functions for NKI ISA")
has exp, log, sin, arctan (valid input ``[-pi/2, pi/2]``), tanh, sqrt, rsqrt, reciprocal, sign,
abs, erf, sigmoid and a few more; VectorE/GpSimdE's ALU has add, subtract, multiply, divide, max,
min, pow, mod (floor modulo), comparisons and logical ops. The simulator's activation table
(``runtime_sim.isa.ActFunc``) has no arctan yet, so ``atan`` is the VectorE polynomial below
(cephes ``atanf``). Everything else is built here as an
``Expr`` over those, evaluated in fp32 (every intermediate node is fp32; the caller casts the
result to the op's dtype once, as eager's opmath does).

Invariants
- Exact ops (rounding, fmod/remainder, classification) reproduce torch's fp32 results bit for
  bit, signed zeros, NaN and infinities included: each uses only operations that are exact in
  fp32 for the inputs it gives them (the ``2**23`` rounding trick, ``mod`` of magnitudes).
- Transcendental compositions avoid cancellation where the textbook formula has it (Kahan's
  ``log1p``/``expm1`` correction, ``(1-x)(1+x)`` for ``1-x^2``), so they stay within a few fp32
  ulps of torch away from overflow; each builder says where its range ends.
- Builders take and return fp32 ``Expr`` values; equal sub-trees are evaluated once per tile
  (``tiling/exprgen.py``), so reusing ``x`` costs nothing.
"""
from __future__ import annotations

import math

from lowering.kir import EOp, Expr, const
from runtime_sim.isa import DType

F32 = DType.FP32
TWO23 = float(2 ** 23)     # from here on every fp32 is an integer
LN2 = math.log(2.0)
LN10 = math.log(10.0)
HALF_PI = math.pi / 2


def e(op: EOp, *args: Expr | float) -> Expr:
    return Expr(op, tuple(a if isinstance(a, Expr) else const(a) for a in args), F32)


def where(c: Expr, a: Expr | float, b: Expr | float) -> Expr:
    return e(EOp.WHERE, c, a, b)


def negative(x: Expr) -> Expr:
    """1.0 where x's sign bit is set (x < 0, or x is -0.0: 1/x = -inf), else 0.0; NaN -> 0."""
    return e(EOp.OR, e(EOp.LT, x, 0.0), e(EOp.LT, e(EOp.RECIPROCAL, x), 0.0))


def copysign(mag: Expr, sgn: Expr) -> Expr:
    """``mag`` (>= 0 or NaN) with the sign bit of ``sgn``."""
    return where(negative(sgn), e(EOp.NEG, mag), mag)


# ---- rounding (exact) ------------------------------------------------------------------------
def round_even(x: Expr) -> Expr:
    """Round half to even (torch.round): ``(|x| + 2**23) - 2**23`` rounds |x| < 2**23 to an
    integer in fp32's own round-to-nearest-even; the sign comes back by multiplying with
    sign(x), and x itself is kept where it is 0 (either sign), NaN, infinite or >= 2**23."""
    a = e(EOp.ABS, x)
    r = e(EOp.SUB, e(EOp.ADD, a, TWO23), TWO23)
    keep = e(EOp.AND, e(EOp.GT, a, 0.0), e(EOp.LT, a, TWO23))
    return where(keep, e(EOp.MUL, r, e(EOp.SIGN, x)), x)


def floor(x: Expr) -> Expr:
    """``round(x) - (round(x) > x)``: exact, -0.0 stays -0.0, NaN and infinities pass."""
    r = round_even(x)
    return e(EOp.SUB, r, e(EOp.GT, r, x))


def ceil(x: Expr) -> Expr:
    """``-floor(-x)`` (so ceil(-0.5) is -0.0, as in torch)."""
    return e(EOp.NEG, floor(e(EOp.NEG, x)))


def trunc(x: Expr) -> Expr:
    return where(e(EOp.LT, x, 0.0), ceil(x), floor(x))


def round_decimals(x: Expr, decimals: int) -> Expr:
    """torch's ``round(x, decimals)``: ``round(x * 10**d) / 10**d`` (``d < 0``: ``round(x /
    10**-d) * 10**-d``), each step in fp32 as torch's kernel does it."""
    p = float(10 ** abs(decimals))
    if decimals >= 0:
        return e(EOp.DIV, round_even(e(EOp.MUL, x, p)), p)
    return e(EOp.MUL, round_even(e(EOp.DIV, x, p)), p)


# ---- modulo (exact) --------------------------------------------------------------------------
def fmod(a: Expr, b: Expr) -> Expr:
    """C fmod (torch.fmod, sign of the dividend): the ALU's floor modulo of the magnitudes
    needs no sign correction, so it is exact; the dividend's sign bit is put back."""
    m = e(EOp.MOD, e(EOp.ABS, a), e(EOp.ABS, b))
    return copysign(m, a)


def remainder(a: Expr, b: Expr) -> Expr:
    """torch.remainder (sign of the divisor): torch's own formula on top of fmod,
    ``r = fmod(a, b); r + b if r != 0 and (b < 0) != (r < 0) else r``."""
    r = fmod(a, b)
    fix = e(EOp.AND, e(EOp.NE, r, 0.0), e(EOp.NE, e(EOp.LT, b, 0.0), e(EOp.LT, r, 0.0)))
    return where(fix, e(EOp.ADD, r, b), r)


def div_floor(a: Expr, b: Expr, w: DType = F32) -> Expr:
    """torch's floor division of floats (``div_floor_floating_vec``, ATen cpu/BinaryOpsKernel
    .cpp, the Python ``//`` of ``c10::div_floor_floating``): ``mod = fmod(a, b)``,
    ``div = (a - mod) / b`` (``a`` itself where ``a / b`` overflows but ``a`` is finite), one
    less where ``mod != 0`` and the signs of ``b`` and ``mod`` differ, then ``floor(div)``
    rounded up where ``div - floor(div) > 0.5``; ``copysign(0, a / b)`` where ``div == 0``,
    ``a / b`` where ``b == 0``. ``w`` is the dtype each arithmetic step rounds to (bf16/fp16
    when eager computes in that dtype, fp32 otherwise)."""
    def rw(x: Expr) -> Expr:
        return x if w is F32 else Expr(EOp.CAST, (x,), w)
    q = rw(e(EOp.DIV, a, b))
    mod = rw(fmod(a, b))
    fl = where(e(EOp.AND, isinf(q), e(EOp.LOGICAL_NOT, isinf(a))),
               a, rw(e(EOp.SUB, a, mod)))
    div = rw(e(EOp.DIV, fl, b))
    fix = e(EOp.AND, e(EOp.NE, mod, 0.0), e(EOp.XOR, e(EOp.LT, b, 0.0), e(EOp.LT, mod, 0.0)))
    div = where(fix, rw(e(EOp.SUB, div, 1.0)), div)
    fd = floor(div)
    fd = where(e(EOp.GT, rw(e(EOp.SUB, div, fd)), 0.5), rw(e(EOp.ADD, fd, 1.0)), fd)
    fd = where(e(EOp.EQ, div, 0.0), copysign(const(0.0), q), fd)
    return where(e(EOp.EQ, b, 0.0), q, fd)


def div_trunc(a: Expr, b: Expr, w: DType = F32) -> Expr:
    """torch's ``trunc(a / b)``, the quotient rounded to ``w`` first (bf16/fp16 when eager
    divides in that dtype)."""
    q = e(EOp.DIV, a, b)
    return trunc(q if w is F32 else Expr(EOp.CAST, (q,), w))


# ---- exponentials and logarithms -------------------------------------------------------------
def log1p(x: Expr) -> Expr:
    """Kahan: ``u = 1 + x``; ``x`` if u == 1, else ``log(u) * x / (u - 1)`` (the division
    cancels the rounding of ``1 + x``); +inf passes."""
    u = e(EOp.ADD, x, 1.0)
    k = e(EOp.MUL, e(EOp.LOG, u), e(EOp.DIV, x, e(EOp.SUB, u, 1.0)))
    return where(e(EOp.EQ, u, 1.0), x, where(e(EOp.EQ, x, math.inf), x, k))


def expm1(x: Expr) -> Expr:
    """Kahan: ``u = exp(x)``; ``x`` if u == 1, -1 if u - 1 == -1, else ``(u - 1) * x / log(u)``;
    +inf where exp overflows (x > ~88.72)."""
    u = e(EOp.EXP, x)
    um1 = e(EOp.SUB, u, 1.0)
    k = e(EOp.MUL, um1, e(EOp.DIV, x, e(EOp.LOG, u)))
    return where(e(EOp.EQ, u, 1.0), x,
                 where(e(EOp.EQ, um1, -1.0), -1.0, where(e(EOp.EQ, u, math.inf), u, k)))


def log2(x: Expr) -> Expr:
    return e(EOp.DIV, e(EOp.LOG, x), LN2)


def log10(x: Expr) -> Expr:
    return e(EOp.DIV, e(EOp.LOG, x), LN10)


def exp2(x: Expr) -> Expr:
    """``2 ** x`` on the ALU's pow (exact for integer x)."""
    return e(EOp.POW, 2.0, x)


# ---- trigonometric ---------------------------------------------------------------------------
def atan(x: Expr) -> Expr:
    """cephes ``atanf`` on VectorE: on a = |x|, reduce to |t| <= tan(pi/8) (``t = -1/a`` plus
    pi/2 above tan(3pi/8), ``(a-1)/(a+1)`` plus pi/4 above tan(pi/8)), then the odd degree-9
    polynomial (about 2e-7 relative); x's sign bit put back. inf -> pi/2, NaN propagates."""
    a = e(EOp.ABS, x)
    return copysign(_atan_nonneg(a), x)


def _atan_nonneg(a: Expr) -> Expr:
    big, mid = e(EOp.GT, a, 2.414213562373095), e(EOp.GT, a, 0.4142135623730950)
    t = where(big, e(EOp.DIV, -1.0, a),
              where(mid, e(EOp.DIV, e(EOp.SUB, a, 1.0), e(EOp.ADD, a, 1.0)), a))
    y0 = where(big, HALF_PI, where(mid, math.pi / 4, 0.0))
    z = e(EOp.MUL, t, t)
    p: Expr | float = 8.05374449538e-2
    for c in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        p = e(EOp.ADD, e(EOp.MUL, z, p), c)
    return e(EOp.ADD, y0, e(EOp.ADD, e(EOp.MUL, e(EOp.MUL, p, z), t), t))


def tan(x: Expr) -> Expr:
    return e(EOp.DIV, e(EOp.SIN, x), e(EOp.COS, x))


def asin(x: Expr) -> Expr:
    """``atan(x / sqrt((1 - x)(1 + x)))`` (|x| = 1 gives x/0 = +-inf -> +-pi/2)."""
    return atan(e(EOp.DIV, x, e(EOp.SQRT, e(EOp.MUL, e(EOp.SUB, 1.0, x), e(EOp.ADD, x, 1.0)))))


def acos(x: Expr) -> Expr:
    """``2 atan(sqrt((1 - x) / (1 + x)))`` (x = -1 gives atan(inf) = pi/2 -> pi)."""
    return e(EOp.MUL, atan(e(EOp.SQRT, e(EOp.DIV, e(EOp.SUB, 1.0, x), e(EOp.ADD, x, 1.0)))), 2.0)


def atan2(y: Expr, x: Expr) -> Expr:
    """C atan2 over the octant ratio ``min(|x|,|y|) / max(|x|,|y|)`` in [0, 1], then reflected: ``pi/2 - a`` when |y| > |x|, ``pi - a`` when x's sign bit is
    set, negated with y's sign bit. 0/0 counts as ratio 0 and inf/inf as 1, which gives C's
    signed-zero and infinity cases; NaN propagates."""
    ax, ay = e(EOp.ABS, x), e(EOp.ABS, y)
    mn, mx = e(EOp.MIN, ax, ay), e(EOp.MAX, ax, ay)
    q = e(EOp.DIV, mn, mx)
    q = where(e(EOp.EQ, mx, 0.0), 0.0, q)
    q = where(e(EOp.AND, e(EOp.EQ, ax, math.inf), e(EOp.EQ, ay, math.inf)), 1.0, q)
    a = _atan_nonneg(q)
    a = where(e(EOp.GT, ay, ax), e(EOp.SUB, HALF_PI, a), a)
    a = where(negative(x), e(EOp.SUB, math.pi, a), a)
    return copysign(a, y)


# ---- hyperbolic ------------------------------------------------------------------------------
def sinh(x: Expr) -> Expr:
    """On a = |x|: ``(m + m / (m + 1)) / 2`` with m = expm1(a) (no cancellation near 0), and
    ``exp(a) / 2`` for a > 20, where e^-a no longer matters (``exp(a - ln 2)`` past 88, where
    exp(a) overflows but sinh does not yet); x's sign bit put back (odd, so -0.0 stays)."""
    a = e(EOp.ABS, x)
    m = expm1(a)
    small = e(EOp.MUL, e(EOp.ADD, m, e(EOp.DIV, m, e(EOp.ADD, m, 1.0))), 0.5)
    return copysign(where(e(EOp.GT, a, 20.0), _half_exp(a), small), x)


def _half_exp(a: Expr) -> Expr:
    """e^a / 2 for a >= 0: exact halving of exp(a), or exp(a - ln 2) where exp(a) overflows."""
    return where(e(EOp.GT, a, 88.0), e(EOp.EXP, e(EOp.SUB, a, LN2)), e(EOp.MUL, e(EOp.EXP, a), 0.5))


def cosh(x: Expr) -> Expr:
    """``(u + 1/u) / 2`` with u = exp(|x|), and e^|x| / 2 for |x| > 20."""
    a = e(EOp.ABS, x)
    u = e(EOp.EXP, a)
    small = e(EOp.MUL, e(EOp.ADD, u, e(EOp.RECIPROCAL, u)), 0.5)
    return where(e(EOp.GT, a, 20.0), _half_exp(a), small)


def asinh(x: Expr) -> Expr:
    """``log1p(a + a^2 / (1 + sqrt(1 + a^2)))`` on a = |x| (no cancellation near 0), ``log(a) +
    ln 2`` for a > 2**60 (a^2 would overflow); odd (-0.0 stays)."""
    a = e(EOp.ABS, x)
    a2 = e(EOp.MUL, a, a)
    small = log1p(e(EOp.ADD, a, e(EOp.DIV, a2, e(EOp.ADD, e(EOp.SQRT, e(EOp.ADD, a2, 1.0)), 1.0))))
    r = where(e(EOp.GT, a, 2.0 ** 60), e(EOp.ADD, e(EOp.LOG, a), LN2), small)
    return copysign(r, x)


def acosh(x: Expr) -> Expr:
    """``log1p(t + sqrt(t (t + 2)))`` with t = x - 1 (exact for x near 1), ``log(x) + ln 2``
    for x > 2**60; NaN for x < 1."""
    t = e(EOp.SUB, x, 1.0)
    small = log1p(e(EOp.ADD, t, e(EOp.SQRT, e(EOp.MUL, t, e(EOp.ADD, t, 2.0)))))
    r = where(e(EOp.GT, x, 2.0 ** 60), e(EOp.ADD, e(EOp.LOG, x), LN2), small)
    return where(e(EOp.LT, x, 1.0), math.nan, r)


def atanh(x: Expr) -> Expr:
    """``log1p(2a / (1 - a)) / 2`` on a = |x| with x's sign bit put back (the odd symmetry keeps
    x near -1 as accurate as near 1); |x| = 1 -> +-inf, |x| > 1 -> NaN."""
    a = e(EOp.ABS, x)
    return copysign(e(EOp.MUL, log1p(e(EOp.DIV, e(EOp.MUL, a, 2.0), e(EOp.SUB, 1.0, a))), 0.5), x)


# ---- classification --------------------------------------------------------------------------
def isnan(x: Expr) -> Expr:
    return e(EOp.NE, x, x)


def isinf(x: Expr) -> Expr:
    return e(EOp.EQ, e(EOp.ABS, x), math.inf)
