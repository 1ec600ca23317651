"""Tiling of row-wise kernels: SOFTMAX (and log-softmax) and LAYER_NORM.

Rows (every axis but the normalised ones) go on partitions, 128 per tile; a whole row sits in
the free dim of one tile, so each row is read from HBM once and written once.

softmax:     mx = reduce_max(x)                      VectorE tensor_reduce
             e, s = exp(x - mx), sum(e)               ScalarE activation, bias=-mx, reduce=add
             y = e * (1/s)   | log: y = x - mx - ln(s) VectorE tensor_scalar (per-partition operands)
layer_norm:  mean = sum(x)/C                          VectorE tensor_reduce + tensor_scalar
             ss = sum((x - mean)^2)                   ScalarE activation(square), bias=-mean, reduce
             rstd = rsqrt(ss/C + eps)                 VectorE tensor_scalar + ScalarE rsqrt
             y = (x - mean) * rstd [* w] [+ b]        VectorE tensor_scalar, tensor_tensor
Weight and bias are loaded once, broadcast to all partitions by a stride-0 DMA.

Rows whose tiles do not fit one SBUF partition are streamed in column chunks instead
(``rowwise_chunked.py``: two or three passes over HBM).
"""
from __future__ import annotations

from dataclasses import replace

from lowering.errors import Unsupported
from lowering.kir import KOp, LayerNormKAttrs, SoftmaxKAttrs
from lowering.tiling.builder import TileBuilder
from lowering.tiling.layout import hbm_ap, plan_rows
from lowering.tiling.rowwise_chunked import tile_layer_norm_chunked, tile_softmax_chunked
from runtime_sim.isa import ActFunc, AluOp, DType, Memory

F32 = DType.FP32


def _row_plan(k: KOp, red_dims: tuple[int, ...], operands, n_full: int):
    """Operands from index ``n_full`` on hold one value per row (reduced axes of size 1)."""
    x = k.ins[0]
    strides = [tuple(0 if d in red_dims and j >= n_full else s for d, s in enumerate(o.strides))
               for j, o in enumerate(operands)]
    plan = plan_rows(x.shape, red_dims, strides, [o.offset for o in operands])
    if len(plan.red) > 3:
        raise Unsupported(",".join(k.origin), f"normalised axes do not collapse to 3 strided axes "
                                              f"(got {len(plan.red)})")
    return plan, plan.red_size


def _fits(b: TileBuilder, C: int, bytes_per_elem: int) -> bool:
    """Every pool of a single-tile row-wise kernel holds whole rows: do they fit the SBUF
    partition (1/8 kept for the small per-row statistics and alignment)?"""
    return C * bytes_per_elem <= b.target.sbuf_bytes_per_partition * 7 // 8


def _free(plan, slot: int) -> tuple[tuple[int, int], ...]:
    return tuple((s, st[slot]) for s, st in plan.red)


def _row_tiles(b: TileBuilder, plan, x, pool, C: int):
    """Yield (bases, r0, p, x tile AP) for every tile of up to 128 rows, the rows loaded."""
    P = b.target.sbuf_partitions
    for bases in plan.outer_offsets():
        for r0 in range(0, plan.rows, P):
            p = min(P, plan.rows - r0)
            xt = b.tile(pool, p, C, x.dtype).ap()
            b.dma(xt, hbm_ap(x.buffer, x.dtype, bases[0] + r0 * plan.row_strides[0], p,
                             plan.row_strides[0], _free(plan, 0)))
            yield bases, r0, p, xt


def _store_rows(b: TileBuilder, plan, slot: int, ref, bases, r0: int, p: int, tile, free=True):
    """Store a [p, C] (``free``) or [p, 1] tile to operand ``slot``'s rows."""
    b.dma(hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot], p,
                 plan.row_strides[slot], _free(plan, slot) if free else ()), tile)


def tile_softmax(b: TileBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, SoftmaxKAttrs)
    x, out = k.ins[0], k.outs[0]
    if x.numel == 0:
        return
    d = k.attrs.dim
    plan, C = _row_plan(k, (d,), [x, out], 2)
    if not _fits(b, C, 2 * x.dtype.itemsize + 2 * 4 + 2 * out.dtype.itemsize):
        return tile_softmax_chunked(b, k, plan)
    xp = b.pool("sx", Memory.SBUF, 2, C * x.dtype.itemsize)
    ep = b.pool("se", Memory.SBUF, 2, C * 4)
    op = b.pool("sy", Memory.SBUF, 2, C * out.dtype.itemsize)
    small = b.pool("sstat", Memory.SBUF, 8, 4)
    for bases, r0, p, xa in _row_tiles(b, plan, x, xp, C):
        mx = b.tile(small, p, 1, F32).ap()
        b.tensor_reduce(mx, xa, AluOp.MAX)
        nmx = b.tile(small, p, 1, F32).ap()
        b.tensor_scalar(nmx, mx, AluOp.MULTIPLY, -1.0)
        e = b.tile(ep, p, C, F32).ap()
        s = b.tile(small, p, 1, F32).ap()
        b.activation(e, xa, ActFunc.EXP, bias_ap=nmx, reduce=AluOp.ADD, accum=s)
        y = b.tile(op, p, C, out.dtype).ap()
        if k.attrs.log:
            ls = b.tile(small, p, 1, F32).ap()
            b.activation(ls, s, ActFunc.LOG)
            b.tensor_scalar(y, xa, AluOp.SUBTRACT, mx, op1=AluOp.SUBTRACT, operand1=ls)
        else:
            rs = b.tile(small, p, 1, F32).ap()
            b.activation(rs, s, ActFunc.RECIPROCAL)
            b.tensor_scalar(y, e, AluOp.MULTIPLY, rs)
        _store_rows(b, plan, 1, out, bases, r0, p, y)


def tile_layer_norm(b: TileBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, LayerNormKAttrs)
    x = k.ins[0]
    y, mean, rstd = k.outs
    if x.numel == 0:
        return
    red = tuple(range(x.rank - a.normalized_ndim, x.rank))
    plan, C = _row_plan(k, red, [x, y, mean, rstd], 2)
    P = b.target.sbuf_partitions
    # weight / bias: (ref, its plan over x's axes with partition stride 0, is_weight)
    prm = []
    for j, flag, is_w in ((1, a.has_weight, True), (2 if a.has_weight else 1, a.has_bias, False)):
        if flag:
            w = k.ins[j]
            wst = [tuple(0 for _ in range(x.rank - a.normalized_ndim)) + w.strides]
            prm.append((w, plan_rows(x.shape, red, wst, [w.offset]), is_w))
    if not _fits(b, C, len(prm) * 4 + 2 * x.dtype.itemsize + 3 * 4 + 2 * y.dtype.itemsize):
        return tile_layer_norm_chunked(b, k, plan, [(w, wp.red[0][1][0], is_w) for w, wp, is_w in prm])
    pp = b.pool("lnw", Memory.SBUF, max(1, len(prm)), C * 4)
    params = []
    for w, wplan, _ in prm:
        wt = b.tile(pp, P, C, w.dtype)
        # every partition reads the same row: partition stride 0
        b.dma(wt.ap(), hbm_ap(w.buffer, w.dtype, w.offset, P, 0, _free(wplan, 0)))
        params.append(wt.ap())
    xp = b.pool("lx", Memory.SBUF, 2, C * x.dtype.itemsize)
    wk = b.pool("lwork", Memory.SBUF, 3, C * 4)
    yp = b.pool("ly", Memory.SBUF, 2, C * y.dtype.itemsize)
    small = b.pool("lstat", Memory.SBUF, 12, 4)
    for bases, r0, p, xa in _row_tiles(b, plan, x, xp, C):
        s = b.tile(small, p, 1, F32).ap()
        b.tensor_reduce(s, xa, AluOp.ADD)
        mu = b.tile(small, p, 1, F32).ap()
        b.tensor_scalar(mu, s, AluOp.MULTIPLY, 1.0 / C)
        nmu = b.tile(small, p, 1, F32).ap()
        b.tensor_scalar(nmu, s, AluOp.MULTIPLY, -1.0 / C)
        sq = b.tile(wk, p, C, F32).ap()
        ss = b.tile(small, p, 1, F32).ap()
        b.activation(sq, xa, ActFunc.SQUARE, bias_ap=nmu, reduce=AluOp.ADD, accum=ss)
        var = b.tile(small, p, 1, F32).ap()
        b.tensor_scalar(var, ss, AluOp.MULTIPLY, 1.0 / C, op1=AluOp.ADD, operand1=a.eps)
        rs = b.tile(small, p, 1, F32).ap()
        b.activation(rs, var, ActFunc.RSQRT)
        if params:
            cur = b.tile(wk, p, C, F32).ap()
            b.tensor_scalar(cur, xa, AluOp.SUBTRACT, mu, op1=AluOp.MULTIPLY, operand1=rs)
            for j, prm in enumerate(params):
                is_w = a.has_weight and j == 0
                last = j == len(params) - 1
                nxt = b.tile(yp, p, C, y.dtype).ap() if last else b.tile(wk, p, C, F32).ap()
                b.tensor_tensor(nxt, cur, replace(prm, partitions=p),
                                AluOp.MULTIPLY if is_w else AluOp.ADD)
                cur = nxt
            yt = cur
        else:
            yt = b.tile(yp, p, C, y.dtype).ap()
            b.tensor_scalar(yt, xa, AluOp.SUBTRACT, mu, op1=AluOp.MULTIPLY, operand1=rs)
        _store_rows(b, plan, 1, y, bases, r0, p, yt)
        for slot, ref, val in ((2, mean, mu), (3, rstd, rs)):
            if val.dtype != ref.dtype:
                c = b.tile(small, p, 1, ref.dtype).ap()
                b.tensor_copy(c, val)
                val = c
            _store_rows(b, plan, slot, ref, bases, r0, p, val, free=False)
