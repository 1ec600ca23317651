"""Activation recognition on the kernel-level IR: a function written out elementwise that
ScalarE evaluates as one activation becomes that activation.

The written-out tanh GELU of GPT-2 and BERT-era code (``transformers``' ``gelu_new`` /
``NewGELUActivation``, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``) is eight
pointwise ATen ops, each rounded to the tensor's dtype; ScalarE has it as one function
(``Gelu_apprx_tanh``). The rewrite matches the expression algebraically (products and sums in
any order and grouping, ``pow(x, 3)`` or ``x * x * x``, constants within 1e-6 relative) and
replaces the whole sub-tree by ``GELU_TANH(x)`` in the sub-tree's dtype.

Invariants
- The rewrite changes rounding, on purpose and only there: eager rounds each of the eight
  intermediates to the dtype (bf16 loses ~3 significant bits over the chain), the activation
  rounds once, like ``F.gelu(x, approximate="tanh")`` and like Inductor, which also computes
  a bf16 chain in fp32. Results match eager to the dtype's tolerance, not bit for bit.
- Only POINTWISE expressions and MATMUL/ATTENTION epilogues are rewritten; nothing else moves.
"""
from __future__ import annotations

import math
from dataclasses import replace

from lowering.kir import (AttentionKAttrs, EOp, Expr, KKind, KOp, KProgram, MatmulKAttrs,
                          PointwiseAttrs)
from lowering.passes.fusion_rules import drop_unused_inputs

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
_ARITH = (EOp.ADD, EOp.SUB, EOp.MUL, EOp.NEG, EOp.POW, EOp.CONST)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def _poly(e: Expr, x: Expr) -> dict[int, float] | None:
    """``e`` as a polynomial in ``x`` ({power: coefficient}), or None."""
    if e == x:
        return {1: 1.0}
    if e.op is EOp.CONST:
        return {0: e.value}
    if e.op is EOp.NEG:
        p = _poly(e.args[0], x)
        return None if p is None else {k: -v for k, v in p.items()}
    if e.op in (EOp.ADD, EOp.SUB):
        p, q = _poly(e.args[0], x), _poly(e.args[1], x)
        if p is None or q is None:
            return None
        s = -1.0 if e.op is EOp.SUB else 1.0
        out = dict(p)
        for k, v in q.items():
            out[k] = out.get(k, 0.0) + s * v
        return out
    if e.op is EOp.MUL:
        p, q = _poly(e.args[0], x), _poly(e.args[1], x)
        if p is None or q is None:
            return None
        out: dict[int, float] = {}
        for i, a in p.items():
            for j, c in q.items():
                out[i + j] = out.get(i + j, 0.0) + a * c
        return out
    if e.op is EOp.POW and e.args[1].op is EOp.CONST:
        n = e.args[1].value
        p = _poly(e.args[0], x)
        if p is None or n != int(n) or not 1 <= n <= 4 or p != {1: 1.0}:
            return None
        return {int(n): 1.0}
    return None


def _variable(e: Expr) -> Expr | None:
    """The first non-arithmetic sub-tree of ``e`` (the candidate ``x`` of a polynomial)."""
    if e.op not in _ARITH:
        return e
    for a in e.args:
        v = _variable(a)
        if v is not None:
            return v
    return None


def _same(p: dict[int, float] | None, want: dict[int, float]) -> bool:
    if p is None:
        return False
    keys = {k for k, v in p.items() if v != 0.0} | set(want)
    return all(_close(p.get(k, 0.0), want.get(k, 0.0)) for k in keys)


def _factors(e: Expr) -> list[Expr]:
    if e.op is EOp.MUL:
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _gelu_tanh(e: Expr) -> Expr | None:
    """``GELU_TANH(x)`` if ``e`` computes the tanh GELU of some ``x``, else None."""
    if e.op is not EOp.MUL:
        return None
    fs = _factors(e)
    for i, f in enumerate(fs):
        if f.op is not EOp.ADD:
            continue
        one, th = f.args if f.args[1].op is EOp.TANH else f.args[::-1]
        if th.op is not EOp.TANH or one.op is not EOp.CONST or not _close(one.value, 1.0):
            continue
        inner = th.args[0]
        x = _variable(inner)
        if x is None or not _same(_poly(inner, x), {1: SQRT_2_OVER_PI, 3: SQRT_2_OVER_PI * GELU_CUBIC}):
            continue
        rest = fs[:i] + fs[i + 1:]
        prod = rest[0] if rest else Expr(EOp.CONST, value=1.0)
        for r in rest[1:]:
            prod = Expr(EOp.MUL, (prod, r), e.dtype)
        if _same(_poly(prod, x), {1: 0.5}):
            return Expr(EOp.GELU_TANH, (x,), e.dtype)
    return None


def _rewrite(e: Expr) -> Expr:
    if not e.args:
        return e
    g = _gelu_tanh(e)
    if g is not None:
        return replace(g, args=(_rewrite(g.args[0]),))
    args = tuple(_rewrite(a) for a in e.args)
    return e if args == e.args else replace(e, args=args)


def recognise_activations(kp: KProgram) -> bool:
    """Rewrite every expression of the program in place; True if anything changed."""
    changed = False
    for i, k in enumerate(kp.kernels):
        a = k.attrs
        if k.kind is KKind.POINTWISE and isinstance(a, PointwiseAttrs):
            new = PointwiseAttrs(_rewrite(a.expr))
            same = new.expr == a.expr
        elif k.kind is KKind.MATMUL and isinstance(a, MatmulKAttrs) and a.epilogue is not None:
            new = MatmulKAttrs(_rewrite(a.epilogue))
            same = new.epilogue == a.epilogue
        elif k.kind is KKind.ATTENTION and isinstance(a, AttentionKAttrs):
            new = replace(a, epilogue=_rewrite(a.epilogue))
            same = new.epilogue == a.epilogue
        else:
            continue
        if not same:
            kp.kernels[i] = drop_unused_inputs(KOp(k.kind, k.outs, k.ins, new, k.origin))
            changed = True
    return changed
