"""Row-wise kernels whose rows do not fit one SBUF tile: stream each row in column chunks.

softmax / log-softmax (two passes over HBM, "online softmax"):
    pass 1, per chunk:  mc = max(x_c); m' = max(m, mc)                     VectorE
                        s_c = sum(exp(x_c - m'))                           ScalarE (fused reduce)
                        s = s * exp(m - m') + s_c                          ScalarE + VectorE
    pass 2, per chunk:  y_c = exp(x_c - m) / s   |   x_c - m - ln(s)       ScalarE / VectorE
layer norm (three passes): mean; sum of squared deviations; normalise (with weight/bias chunks
broadcast to all partitions by stride-0 DMA).

The working set is a few chunk tiles plus per-row statistics, so any row length runs; the price
is reading x two (softmax) or three (layer norm) times from HBM, which the simulated time shows.

Invariants
- Same numerics as the single-tile kernels up to fp32 reassociation of the row sums.
- Only a single (collapsed) normalised axis is chunked; several strided axes raise Unsupported.
"""
from __future__ import annotations

from dataclasses import replace

from lowering.errors import Unsupported
from lowering.kir import KOp
from lowering.tiling.builder import TileBuilder
from lowering.tiling.layout import hbm_ap
from runtime_sim.isa import AP, ActFunc, AluOp, DType, Memory

F32 = DType.FP32
CHUNK = 2048


def _chunks(C: int):
    for c0 in range(0, C, CHUNK):
        yield c0, min(CHUNK, C - c0)


def _single_axis(k: KOp, plan) -> tuple[int, tuple[int, ...]]:
    if len(plan.red) != 1:
        raise Unsupported(",".join(k.origin), f"a row too long for one tile must be one strided "
                                              f"axis to stream it in chunks (got {len(plan.red)})")
    return plan.red[0]


def _rows(b: TileBuilder, plan):
    P = b.target.sbuf_partitions
    for bases in plan.outer_offsets():
        for r0 in range(0, plan.rows, P):
            yield bases, r0, min(P, plan.rows - r0)


def _load(b, pool, ref, plan, slot, bases, r0, p, c0, f, cst) -> AP:
    t = b.tile(pool, p, f, ref.dtype).ap()
    b.dma(t, hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot]
                    + c0 * cst[slot], p, plan.row_strides[slot], ((f, cst[slot]),)))
    return t


def _store(b, ref, plan, slot, bases, r0, p, c0, f, cst, tile: AP) -> None:
    b.dma(hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot] + c0 * cst[slot],
                 p, plan.row_strides[slot], ((f, cst[slot]),) if f else ()), tile)


def tile_softmax_chunked(b: TileBuilder, k: KOp, plan) -> None:
    x, out = k.ins[0], k.outs[0]
    C, cst = _single_axis(k, plan)
    xp = b.pool("cx", Memory.SBUF, 2, CHUNK * x.dtype.itemsize)
    wk = b.pool("cwork", Memory.SBUF, 2, CHUNK * 4)
    yp = b.pool("cy", Memory.SBUF, 2, CHUNK * out.dtype.itemsize)
    small = b.pool("cstat", Memory.SBUF, 16, 4)

    def sm() -> AP:  # at most 8 per chunk, so the running m and s (<= 8 back) stay live
        return b.tile(small, p, 1, F32).ap()

    for bases, r0, p in _rows(b, plan):
        m = s = None
        for c0, f in _chunks(C):
            xt = _load(b, xp, x, plan, 0, bases, r0, p, c0, f, cst)
            mc = sm()
            b.tensor_reduce(mc, xt, AluOp.MAX)
            nm = mc if m is None else sm()
            if m is not None:
                b.tensor_tensor(nm, m, mc, AluOp.MAX)
            neg = sm()
            b.tensor_scalar(neg, nm, AluOp.MULTIPLY, -1.0)
            sc = sm()
            b.activation(b.tile(wk, p, f, F32).ap(), xt, ActFunc.EXP, bias_ap=neg,
                         reduce=AluOp.ADD, accum=sc)
            if s is None:
                s = sc
            else:  # rescale the running sum to the new maximum
                d = sm()
                b.tensor_tensor(d, m, nm, AluOp.SUBTRACT)
                fac = sm()
                b.activation(fac, d, ActFunc.EXP)
                s2 = sm()
                b.tensor_tensor(s2, s, fac, AluOp.MULTIPLY)
                s3 = sm()
                b.tensor_tensor(s3, s2, sc, AluOp.ADD)
                s = s3
            m = nm
        neg = sm()
        b.tensor_scalar(neg, m, AluOp.MULTIPLY, -1.0)
        fin = sm()
        b.activation(fin, s, ActFunc.LOG if k.attrs.log else ActFunc.RECIPROCAL)
        for c0, f in _chunks(C):
            xt = _load(b, xp, x, plan, 0, bases, r0, p, c0, f, cst)
            y = b.tile(yp, p, f, out.dtype).ap()
            if k.attrs.log:
                b.tensor_scalar(y, xt, AluOp.SUBTRACT, m, op1=AluOp.SUBTRACT, operand1=fin)
            else:
                e = b.tile(wk, p, f, F32).ap()
                b.activation(e, xt, ActFunc.EXP, bias_ap=neg)
                b.tensor_scalar(y, e, AluOp.MULTIPLY, fin)
            _store(b, out, plan, 1, bases, r0, p, c0, f, cst, y)


def tile_layer_norm_chunked(b: TileBuilder, k: KOp, plan, params: list) -> None:
    """``params``: (ref, strides along the normalised axis, is_weight) for weight/bias."""
    a = k.attrs
    x = k.ins[0]
    y, mean, rstd = k.outs
    C, cst = _single_axis(k, plan)
    P = b.target.sbuf_partitions
    xp = b.pool("cx", Memory.SBUF, 2, CHUNK * x.dtype.itemsize)
    wk = b.pool("cwork", Memory.SBUF, 3, CHUNK * 4)
    pp = b.pool("cparam", Memory.SBUF, 2 * max(1, len(params)), CHUNK * 4)
    yp = b.pool("cy", Memory.SBUF, 2, CHUNK * y.dtype.itemsize)
    small = b.pool("cstat", Memory.SBUF, 16, 4)
    keep = b.pool("ckeep", Memory.SBUF, 6, 4)  # mean, -mean, rstd of two row tiles

    def sm() -> AP:
        return b.tile(small, p, 1, F32).ap()

    def kept() -> AP:  # statistics that live across a whole pass (not rotated away by sm())
        return b.tile(keep, p, 1, F32).ap()

    def accumulate(total, part):
        if total is None:
            return part
        nxt = sm()
        b.tensor_tensor(nxt, total, part, AluOp.ADD)
        return nxt

    for bases, r0, p in _rows(b, plan):
        tot = None
        for c0, f in _chunks(C):
            xt = _load(b, xp, x, plan, 0, bases, r0, p, c0, f, cst)
            part = sm()
            b.tensor_reduce(part, xt, AluOp.ADD)
            tot = accumulate(tot, part)
        mu = kept()
        b.tensor_scalar(mu, tot, AluOp.MULTIPLY, 1.0 / C)
        nmu = kept()
        b.tensor_scalar(nmu, tot, AluOp.MULTIPLY, -1.0 / C)
        ss = None
        for c0, f in _chunks(C):
            xt = _load(b, xp, x, plan, 0, bases, r0, p, c0, f, cst)
            part = sm()
            b.activation(b.tile(wk, p, f, F32).ap(), xt, ActFunc.SQUARE, bias_ap=nmu,
                         reduce=AluOp.ADD, accum=part)
            ss = accumulate(ss, part)
        var = sm()
        b.tensor_scalar(var, ss, AluOp.MULTIPLY, 1.0 / C, op1=AluOp.ADD, operand1=a.eps)
        rs = kept()
        b.activation(rs, var, ActFunc.RSQRT)
        for c0, f in _chunks(C):
            xt = _load(b, xp, x, plan, 0, bases, r0, p, c0, f, cst)
            cur = b.tile(wk, p, f, F32).ap()
            b.tensor_scalar(cur, xt, AluOp.SUBTRACT, mu, op1=AluOp.MULTIPLY, operand1=rs)
            for j, (w, wst, is_w) in enumerate(params):
                wt = b.tile(pp, P, f, w.dtype).ap()
                b.dma(wt, hbm_ap(w.buffer, w.dtype, w.offset + c0 * wst, P, 0, ((f, wst),)))
                last = j == len(params) - 1
                nxt = b.tile(yp, p, f, y.dtype).ap() if last else b.tile(wk, p, f, F32).ap()
                b.tensor_tensor(nxt, cur, replace(wt, partitions=p),
                                AluOp.MULTIPLY if is_w else AluOp.ADD)
                cur = nxt
            if not params or cur.dtype != y.dtype:
                yt = b.tile(yp, p, f, y.dtype).ap()
                b.tensor_copy(yt, cur)
                cur = yt
            _store(b, y, plan, 1, bases, r0, p, c0, f, cst, cur)
        for slot, ref, val in ((2, mean, mu), (3, rstd, rs)):
            if val.dtype != ref.dtype:
                c = sm() if ref.dtype is F32 else b.tile(small, p, 1, ref.dtype).ap()
                b.tensor_copy(c, val)
                val = c
            _store(b, ref, plan, slot, bases, r0, p, 0, 0, cst, val)
