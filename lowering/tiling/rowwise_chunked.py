"""Row-wise kernels whose rows do not fit one SBUF tile: stream each row in column chunks.

softmax / log-softmax (two passes over HBM, "online softmax"):
    pass 1, per chunk:  mc = max(x_c); m' = max(m, mc)                     VectorE
                        s_c = sum(exp(x_c - m'))                           ScalarE (fused reduce)
                        s = s * exp(m - m') + s_c                          ScalarE + VectorE
    pass 2, per chunk:  y_c = exp(x_c - m) / s   |   x_c - m - ln(s)       ScalarE / VectorE
layer norm (three passes): mean; sum of squared deviations; normalise (with weight/bias chunks
broadcast to all partitions by stride-0 DMA).

Each pass is a loop over the chunks of a row tile; the first chunk of a pass that carries a
running statistic is peeled (it initialises the statistic), the partial last chunk follows the
loop. Running statistics live in tiles taken per row tile and are updated in place.

Invariants
- Same numerics as the single-tile kernels up to fp32 reassociation of the row sums.
- Only a single (collapsed) normalised axis is chunked; several strided axes raise Unsupported.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.errors import Unsupported
from lowering.kir import KOp
from lowering.tiling.pointwise import outer_loops
from lowering.tir.affine import aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import ActFunc, AluOp, DType, Memory

F32 = DType.FP32
CHUNK = 2048


def chunks(b: TirBuilder, C: int, peel_first: bool):
    """Yield (c0, f, first) over ``0 .. C-1`` in chunks of CHUNK: optionally the first chunk
    alone, then a loop over the other full chunks, then the tail."""
    full, tail = divmod(C, CHUNK)
    start = 0
    if peel_first:
        f = CHUNK if full else tail
        yield aff(0), f, True
        start = 1
        if not full:
            return
    if full > start:
        with b.loop(full - start, "c") as v:
            yield (v + start) * CHUNK, CHUNK, False
    if tail and full:
        yield aff(full * CHUNK), tail, False


def _single_axis(k: KOp, plan) -> tuple[int, tuple[int, ...]]:
    if len(plan.red) != 1:
        raise Unsupported(",".join(k.origin), f"a row too long for one tile must be one strided "
                                              f"axis to stream it in chunks (got {len(plan.red)})")
    return plan.red[0]


def _rows(b: TirBuilder, plan, n_ops: int):
    P = b.target.sbuf_partitions
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, n_ops)
        for r0, p in b.tiled(plan.rows, P, "r"):
            yield bases, r0, p


def _load(b, ref, plan, slot, bases, r0, p, c0, f, cst) -> TAP:
    t = b.tile("cx", Memory.SBUF, p, f, ref.dtype, 3).ap()
    b.dma(t, hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot]
                    + c0 * cst[slot], p, plan.row_strides[slot], ((f, cst[slot]),)))
    return t


def _store(b, ref, plan, slot, bases, r0, p, c0, f, cst, tile: TAP) -> None:
    b.dma(hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot] + c0 * cst[slot],
                 p, plan.row_strides[slot], ((f, cst[slot]),) if f else ()), tile)


def _sm(b: TirBuilder, p: int, dtype: DType = F32) -> TAP:
    return b.tile("cs", Memory.SBUF, p, 1, dtype).ap()


def tile_softmax_chunked(b: TirBuilder, k: KOp, plan) -> None:
    x, out = k.ins[0], k.outs[0]
    C, cst = _single_axis(k, plan)
    for bases, r0, p in _rows(b, plan, 2):
        m = b.tile("cm", Memory.SBUF, p, 1, F32).ap()       # running max
        s = b.tile("csum", Memory.SBUF, p, 1, F32).ap()     # running sum at that max
        for c0, f, first in chunks(b, C, peel_first=True):
            xt = _load(b, x, plan, 0, bases, r0, p, c0, f, cst)
            mc = m if first else _sm(b, p)
            b.tensor_reduce(mc, xt, AluOp.MAX)
            if not first:
                nm = _sm(b, p)
                b.tensor_tensor(nm, m, mc, AluOp.MAX)
            else:
                nm = m
            neg = _sm(b, p)
            b.tensor_scalar(neg, nm, AluOp.MULTIPLY, -1.0)
            e = b.tile("ce", Memory.SBUF, p, f, F32).ap()
            sc = s if first else _sm(b, p)
            b.activation(e, xt, ActFunc.EXP, bias_ap=neg, reduce=AluOp.ADD, accum=sc)
            if not first:  # rescale the running sum to the new maximum
                d = _sm(b, p)
                b.tensor_tensor(d, m, nm, AluOp.SUBTRACT)
                fac = _sm(b, p)
                b.activation(fac, d, ActFunc.EXP)
                b.tensor_tensor(s, s, fac, AluOp.MULTIPLY)
                b.tensor_tensor(s, s, sc, AluOp.ADD)
                b.tensor_copy(m, nm)
        neg = b.tile("cneg", Memory.SBUF, p, 1, F32).ap()
        b.tensor_scalar(neg, m, AluOp.MULTIPLY, -1.0)
        fin = b.tile("cfin", Memory.SBUF, p, 1, F32).ap()
        b.activation(fin, s, ActFunc.LOG if k.attrs.log else ActFunc.RECIPROCAL)
        for c0, f, _ in chunks(b, C, peel_first=False):
            xt = _load(b, x, plan, 0, bases, r0, p, c0, f, cst)
            y = b.tile("cy", Memory.SBUF, p, f, out.dtype).ap()
            if k.attrs.log:
                b.tensor_scalar(y, xt, AluOp.SUBTRACT, m, op1=AluOp.SUBTRACT, operand1=fin)
            else:
                e = b.tile("ce2", Memory.SBUF, p, f, F32).ap()
                b.activation(e, xt, ActFunc.EXP, bias_ap=neg)
                b.tensor_scalar(y, e, AluOp.MULTIPLY, fin)
            _store(b, out, plan, 1, bases, r0, p, c0, f, cst, y)


def tile_layer_norm_chunked(b: TirBuilder, k: KOp, plan, params: list) -> None:
    """``params``: (ref, stride along the normalised axis, is_weight) for weight/bias."""
    a = k.attrs
    x = k.ins[0]
    y, mean, rstd = k.outs
    C, cst = _single_axis(k, plan)
    P = b.target.sbuf_partitions
    for bases, r0, p in _rows(b, plan, 4):
        tot = b.tile("ctot", Memory.SBUF, p, 1, F32).ap()
        b.memset(tot, -0.0)
        for c0, f, _ in chunks(b, C, peel_first=False):
            xt = _load(b, x, plan, 0, bases, r0, p, c0, f, cst)
            part = _sm(b, p)
            b.tensor_reduce(part, xt, AluOp.ADD)
            b.tensor_tensor(tot, tot, part, AluOp.ADD)
        mu = b.tile("cmu", Memory.SBUF, p, 1, F32).ap()
        b.tensor_scalar(mu, tot, AluOp.MULTIPLY, 1.0 / C)
        nmu = b.tile("cnmu", Memory.SBUF, p, 1, F32).ap()
        b.tensor_scalar(nmu, tot, AluOp.MULTIPLY, -1.0 / C)
        ss = b.tile("css", Memory.SBUF, p, 1, F32).ap()
        b.memset(ss, -0.0)
        for c0, f, _ in chunks(b, C, peel_first=False):
            xt = _load(b, x, plan, 0, bases, r0, p, c0, f, cst)
            part = _sm(b, p)
            b.activation(b.tile("csq", Memory.SBUF, p, f, F32).ap(), xt, ActFunc.SQUARE, bias_ap=nmu,
                         reduce=AluOp.ADD, accum=part)
            b.tensor_tensor(ss, ss, part, AluOp.ADD)
        var = _sm(b, p)
        b.tensor_scalar(var, ss, AluOp.MULTIPLY, 1.0 / C, op1=AluOp.ADD, operand1=a.eps)
        rs = b.tile("crs", Memory.SBUF, p, 1, F32).ap()
        b.activation(rs, var, ActFunc.RSQRT)
        for c0, f, _ in chunks(b, C, peel_first=False):
            xt = _load(b, x, plan, 0, bases, r0, p, c0, f, cst)
            cur = b.tile("cn", Memory.SBUF, p, f, F32).ap()
            b.tensor_scalar(cur, xt, AluOp.SUBTRACT, mu, op1=AluOp.MULTIPLY, operand1=rs)
            for j, (w, wst, is_w) in enumerate(params):
                wt = b.tile("cw", Memory.SBUF, P, f, w.dtype)
                b.dma(wt.ap(), hbm_ap(w.buffer, w.dtype, c0 * wst + w.offset, P, 0, ((f, wst),)))
                last = j == len(params) - 1
                nxt = b.tile("cyw" if last else "cwk", Memory.SBUF, p, f, y.dtype if last else F32).ap()
                b.tensor_tensor(nxt, cur, wt.ap(p), AluOp.MULTIPLY if is_w else AluOp.ADD)
                cur = nxt
            if not params or cur.dtype != y.dtype:
                yt = b.tile("cyc", Memory.SBUF, p, f, y.dtype).ap()
                b.tensor_copy(yt, cur)
                cur = yt
            _store(b, y, plan, 1, bases, r0, p, c0, f, cst, cur)
        for slot, ref, val in ((2, mean, mu), (3, rstd, rs)):
            if ref.buffer not in b.live:
                continue
            if val.dtype != ref.dtype:
                c = _sm(b, p, ref.dtype)
                b.tensor_copy(c, val)
                val = c
            _store(b, ref, plan, slot, bases, r0, p, aff(0), 0, cst, val)
