"""Score expressions of the form ``scale * S + bias`` whose ``bias`` is the same for every batch
index (heads, batch items): an attention mask shared by the heads, e.g. GPT-2's
``where(mask[1, 1, Sq, Sk], 0, -inf)`` added to the scaled scores.

Evaluating such a score expression per head repeats the whole mask computation (a load, two
memsets and a select on VectorE/GpSimdE) for every head although its value does not change.
Here the bias is evaluated once per query block, before the head loop, into an fp32 tile
divided by the scale (exact: only for a power-of-two scale), so that each head adds it to its
raw product in one instruction, ``S + bias / scale``, and the softmax takes the scale as
before (exp(scale * x - scale * max)); when the scale already went into Q (``prescale``), the
bias is used as it is.

Invariant: a bias tile is written once, before the loop that reads it, and never again.
"""
from __future__ import annotations

import math

import numpy as np

from lowering.kir import EOp, Expr, KOp
from lowering.tiling.attention.steps import F32, _score_tile
from lowering.tir.affine import aff
from lowering.tir.builder import TirBuilder
from runtime_sim.isa import AluOp, DType, EngineKind, Memory


def _is_acc(e: Expr) -> bool:
    while e.op is EOp.CAST and e.dtype is F32:
        e = e.args[0]
    return e.op is EOp.ACC


def _has_acc(e: Expr) -> bool:
    return e.op is EOp.ACC or any(_has_acc(a) for a in e.args)


def _invariant(e: Expr, k: KOp, nbatch: int) -> bool:
    """No leaf of ``e`` varies along the batch axes (the first ``nbatch`` of the score's)."""
    if e.op is EOp.INDEX:
        return e.index >= nbatch
    if e.op is EOp.LOAD:
        r = k.ins[e.index + 1]
        return len(r.strides) == nbatch + 2 and all(s == 0 for s in r.strides[:nbatch])
    return all(_invariant(a, k, nbatch) for a in e.args)


def pow2_scale(scale: float) -> float | None:
    """The scale as the engines hold it (fp32) when it is a power of two (dividing by it is
    exact), else None."""
    s32 = float(np.float32(scale))
    return s32 if s32 > 0 and math.frexp(s32)[0] == 0.5 else None


def invariant_bias(k: KOp, nbatch: int) -> Expr | None:
    """``bias`` when the score expression is ``acc + bias`` (either order, fp32) with a bias
    that reads no product and is the same for every batch index and the scale is a power of
    two; else None."""
    e = k.attrs.score
    if e is None or e.op is not EOp.ADD or e.dtype is not F32 or pow2_scale(k.attrs.scale) is None:
        return None
    for acc, bias in (e.args, e.args[::-1]):
        if _is_acc(acc) and not _has_acc(bias) and _invariant(bias, k, nbatch):
            return bias
    return None


def bias_tiles(b: TirBuilder, k: KOp, bias: Expr, blocks, kw: int, nbatch: int,
               prescaled: bool) -> list:
    """One fp32 tile [qr, kw] per query block of ``bias`` (keys from 0), divided by the scale
    unless the scale is already in the product (``prescaled``)."""
    zero = tuple(aff(0) for _ in range(nbatch))
    inv = 1.0 / pow2_scale(k.attrs.scale)
    out = []
    for j, (q0, qr) in enumerate(blocks):
        v = _score_tile(b, k, None, zero, q0, qr, aff(0), kw, expr=bias)
        t = b.tile(f"bias{j}", Memory.SBUF, qr, kw, F32, 1)
        if prescaled or inv == 1.0:
            b.tensor_copy(t.ap(), v)
        else:
            b.tensor_scalar(t.ap(), v, AluOp.MULTIPLY, inv)
        out.append(t)
    return out


PE_HIDDEN = -2.0 ** 126     # a hidden key's bias on TensorE: finite and exact in bf16
POOL = (EngineKind.GPSIMD,)


def pe_bias_tiles(b: TirBuilder, k: KOp, bias: Expr, blocks, kw: int, nbatch: int,
                  prescaled: bool, safe: bool) -> tuple[list, list]:
    """A bf16 ``bias`` (its values exact in bf16, and so divided by a power-of-two scale) added
    to the scores on TensorE (``S += I.T @ bias``, as the causal mask of ``_items``): per query
    block the bias tile [qr, kw] in bf16 with -inf (and anything below) raised to
    ``PE_HIDDEN`` (0 x -inf would be NaN in the product), and ``okinv`` [qr, 1] fp32: 1 for a
    row that sees a key, else inf (``safe``: 1 / (l x inf) = 0, torch's _safe_softmax) or NaN
    (softmax of a row of -inf), the scale of the row sum's reciprocal. A row that sees no key
    then has finite, equal scores (no inf - inf), and its output is replaced as eager's.
    (Entries below ``PE_HIDDEN`` that are not -inf are raised too: only a row mixing such
    values, and no larger one, would differ.)"""
    zero = tuple(aff(0) for _ in range(nbatch))
    inv = 1.0 if prescaled else 1.0 / pow2_scale(k.attrs.scale)
    tiles, oks = [], []
    for j, (q0, qr) in enumerate(blocks):
        v = _score_tile(b, k, None, zero, q0, qr, aff(0), kw, expr=bias)
        t = b.tile(f"pbias{j}", Memory.SBUF, qr, kw, DType.BF16, 1)
        b.tensor_scalar(t.ap(), v, AluOp.MULTIPLY, inv, op1=AluOp.MAX, operand1=PE_HIDDEN)
        # the row flags on GpSimdE: VectorE's queue has the heads' work next
        m = b.tile(f"bmax{j}", Memory.SBUF, qr, 1, F32, 1).ap()
        b.tensor_reduce(m, v, AluOp.MAX, engines=POOL)
        ok = b.tile(f"okinv{j}", Memory.SBUF, qr, 1, F32, 1).ap()
        if safe:
            b.tensor_scalar(ok, m, AluOp.IS_GT, float("-inf"), op1=AluOp.DIVIDE, operand1=1.0,
                            reverse1=True, engines=POOL)
        else:
            b.tensor_scalar(ok, m, AluOp.IS_GT, float("-inf"), engines=POOL)
            b.tensor_tensor(ok, ok, ok, AluOp.DIVIDE, engines=POOL)
        tiles.append(t)
        oks.append(ok)
    return tiles, oks
