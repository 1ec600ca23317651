"""Tiling of LAYER_NORM_BWD kernels: grad_input of a layer norm, one pass over HBM.

Rows (every axis but the normalised ones) go on partitions, 128 per tile; a whole row of C
elements sits in the free dim of one tile. Per row tile, with xhat = (x - mean) * rstd and
g = dy * w (dy without a weight):

    xhat = tensor_scalar(x, subtract mean, multiply rstd)       VectorE/GpSimdE, [p, 1] operands
    g    = dy * w                                               VectorE/GpSimdE (w broadcast to all
                                                                partitions by a stride-0 DMA, once)
    s1   = sum(g);  s2 = sum(g * xhat)                          VectorE tensor_reduce
    dx   = rstd * (g - s1 / C - xhat * s2 / C)                  tensor_scalar + tensor_tensor

Invariants
- Everything is fp32 on the engines; dx is rounded once to its dtype.
- A row must fit one SBUF partition (with its intermediates); a longer one raises Unsupported.
"""
from __future__ import annotations

from lowering.errors import Unsupported
from lowering.kir import KOp, LayerNormBwdKAttrs
from lowering.tiling.layout import plan_rows
from lowering.tiling.norm_split import small
from lowering.tiling.rowwise import (RESIDENT_SHARE, SBUF_ALIGN, SMALL_TILES, fits, free_of,
                                     load_rows, row_plan, row_tiles, store_rows)
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import AluOp, DType, Memory

F32 = DType.FP32


def bytes_per_column(dy_size: int, x_size: int, dx_size: int) -> int:
    """SBUF bytes per row element of a row tile: dy, x and dx in their slots, fp32 temporaries."""
    return 3 * dy_size + 3 * x_size + 4 * 4 * 2 + 8 + 2 * dx_size


def row_fits_always(C: int, dy_size: int, x_size: int, dx_size: int, target) -> bool:
    """Does a row of ``C`` elements fit one partition whatever is resident beside it (the
    residency budget used up)? The backend keeps ``native_group_norm_backward`` whole when it
    does (``lowering.policy.KERNEL_OPS``); ``tile_layer_norm_bwd`` itself asks ``fits``."""
    resident = int(target.sbuf_bytes_per_partition * RESIDENT_SHARE)
    small_tiles = SMALL_TILES * 2 * max(SBUF_ALIGN, 16 * 4)
    return (C * bytes_per_column(dy_size, x_size, dx_size) + small_tiles + resident
            <= target.sbuf_bytes_per_partition)


def tile_layer_norm_bwd(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, LayerNormBwdKAttrs)
    dy, x, mean, rstd = k.ins[:4]
    dx = k.outs[0]
    if x.numel == 0:
        return
    red = tuple(range(x.rank - a.normalized_ndim, x.rank))
    plan, C = row_plan(k, red, [dy, x, dx, mean, rstd], 3)
    if not fits(b, C, bytes_per_column(dy.dtype.itemsize, x.dtype.itemsize, dx.dtype.itemsize)):
        raise Unsupported(",".join(k.origin) or "layer_norm_backward",
                          f"a row of {C} elements and its fp32 intermediates do not fit one SBUF partition")
    P = b.target.sbuf_partitions
    wt = None
    if a.has_weight:
        w = k.ins[4]
        wplan = plan_rows(x.shape, red, [tuple(0 for _ in range(x.rank - a.normalized_ndim)) + w.strides],
                          [w.offset])
        wt = b.tile("lnbw", Memory.SBUF, P, C, w.dtype, 1)
        b.dma(wt.ap(), hbm_ap(w.buffer, w.dtype, w.offset, P, 0, free_of(wplan, 0)))
    for bases, r0, p in row_tiles(b, plan, 5):
        dya = load_rows(b, plan, dy, bases, r0, p, C)
        xa = load_rows(b, plan, x, bases, r0, p, C)
        st = []
        for slot, ref in ((3, mean), (4, rstd)):
            t = small(b, p, ref.dtype)
            b.dma(t, hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot], p,
                            plan.row_strides[slot], ()))
            st.append(t)
        mu, rs = st
        xhat = b.tile("lnb_xhat", Memory.SBUF, p, C, F32).ap()
        b.tensor_scalar(xhat, xa, AluOp.SUBTRACT, mu, op1=AluOp.MULTIPLY, operand1=rs)
        g = dya
        if wt is not None:
            g = b.tile("lnb_g", Memory.SBUF, p, C, F32).ap()
            b.tensor_tensor(g, dya, wt.ap(p), AluOp.MULTIPLY)
        s1 = small(b, p)
        b.tensor_reduce(s1, g, AluOp.ADD)
        gx = b.tile("lnb_gx", Memory.SBUF, p, C, F32).ap()
        b.tensor_tensor(gx, g, xhat, AluOp.MULTIPLY)
        s2 = small(b, p)
        b.tensor_reduce(s2, gx, AluOp.ADD)
        c2, c1 = small(b, p), small(b, p)
        b.tensor_scalar(c2, s2, AluOp.MULTIPLY, -1.0 / C)
        b.tensor_scalar(c1, s1, AluOp.MULTIPLY, -1.0 / C)
        t = b.tile("lnb_t", Memory.SBUF, p, C, F32).ap()
        b.tensor_scalar(t, xhat, AluOp.MULTIPLY, c2, op1=AluOp.ADD, operand1=c1)
        u = b.tile("lnb_u", Memory.SBUF, p, C, F32).ap()
        b.tensor_tensor(u, t, g, AluOp.ADD)
        y = b.tile("lnb_dx", Memory.SBUF, p, C, dx.dtype, 3).ap()
        b.tensor_scalar(y, u, AluOp.MULTIPLY, rs)
        store_rows(b, plan, 2, dx, bases, r0, p, y)
