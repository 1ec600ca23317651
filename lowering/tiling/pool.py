"""Tiling of MAXPOOL_BWD kernels: the gradient of a 2-d max pool, routed through its saved
indices (``kir.MaxPoolBwdKAttrs``).

Planes (N x C) on partitions, 128 per tile. The input gradient is built in an fp32 SBUF tile
covering a block of input rows plus every window that reaches them (the left/top padding and
the windows past the right edge included, so no window is ever clipped), zeroed by a memset.
Per partition tile and row block:

    load the gradient and the int64 indices of the output rows whose windows touch the block
    d = q(index) - q0(o)         the index as a position in the tile, minus the position of the
                                 output's first tap (``iota``, GpSimdE); with column margins
                                 q = (index - index mod W) / W * Wt + index mod W  (VectorE)
    per kernel tap (kh, kw):     mask = (d == kh*dh*Wt + kw*dw)          tensor_scalar is_equal
                                 c = select(mask, grad, 0)               (NaN never leaks)
                                 acc[tap window] += c                    tensor_tensor add
    store the block's rows of acc (cast to the output dtype when it is not fp32)

Overlapping windows (stride < kernel) add up in the tile in program order; an input position
that several outputs chose receives each of their gradients, as eager's scatter-add.

Invariants
- Tile positions are unique (the tile is wider than the input when windows reach past it), so
  ``d`` names exactly one tap of the output's window: the tap holding its saved maximum.
- Each saved index lies in its output's window (what ``max_pool2d_with_indices`` returns); an
  index outside it contributes nothing (eager would scatter it anyway).
- Index arithmetic is fp32, exact for planes below 2**24 elements (else ``Unsupported``).
"""
from __future__ import annotations

from lowering.errors import Unsupported
from lowering.kir import KOp, MaxPoolBwdKAttrs
from lowering.tir.affine import Affine
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import AluOp, DType, Memory

F32 = DType.FP32
P = 128
BUDGET = 0.5
BUFS = 2


def _out_rows(a: MaxPoolBwdKAttrs, r0: int, r1: int) -> tuple[int, int]:
    """Outputs [lo, hi) whose windows touch input rows [r0, r1)."""
    (Kh, _), (sh, _), (ph, _), (dh, _) = a.kernel, a.stride, a.padding, a.dilation
    Ho = a.out_hw[0]
    lo = max(0, -(-(r0 + ph - (Kh - 1) * dh) // sh))
    hi = min(Ho, (r1 - 1 + ph) // sh + 1)
    return lo, max(lo, hi)


def _geometry(a: MaxPoolBwdKAttrs) -> tuple[int, int]:
    """(c0, Wt): first column and width of the tile."""
    W, Wo = a.in_hw[1], a.out_hw[1]
    kw, sw, pw, dw = a.kernel[1], a.stride[1], a.padding[1], a.dilation[1]
    c0 = min(0, -pw)
    c1 = max(W, (Wo - 1) * sw - pw + (kw - 1) * dw + 1)
    return c0, c1 - c0


def _rows_of(a: MaxPoolBwdKAttrs, r0: int, r1: int) -> tuple[int, int, int, int]:
    """(lo, hi, t0, t1): outputs read and the tile's rows for input rows [r0, r1)."""
    Kh, sh, ph, dh = a.kernel[0], a.stride[0], a.padding[0], a.dilation[0]
    lo, hi = _out_rows(a, r0, r1)
    t0, t1 = r0, r1
    if hi > lo:
        t0 = min(t0, lo * sh - ph)
        t1 = max(t1, (hi - 1) * sh - ph + (Kh - 1) * dh + 1)
    return lo, hi, t0, t1


def tile_maxpool_bwd(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, MaxPoolBwdKAttrs)
    op = ",".join(k.origin) or "max_pool2d_with_indices_backward"
    g = k.ins[0]
    out = k.outs[0]
    R = out.shape[0]
    H, W = a.in_hw
    if R == 0 or H * W == 0:
        return
    if H * W >= 1 << 24:
        raise Unsupported(op, f"a {H}x{W} plane has over 2**24 elements (fp32 index arithmetic)")
    c0, Wt = _geometry(a)
    Wo = a.out_hw[1]
    cap = b.target.sbuf_bytes_per_partition * BUDGET

    def nbytes(r0: int, r1: int) -> int:
        lo, hi, t0, t1 = _rows_of(a, r0, r1)
        n = (hi - lo) * Wo
        return BUFS * ((t1 - t0) * Wt * 4 + n * (g.dtype.itemsize + 8 + 4 * 4) + (r1 - r0) * W * 4)

    blk = H
    while True:
        nb = -(-H // blk)
        blk = -(-H // nb)
        spans = [(j * blk, min(H, (j + 1) * blk)) for j in range(nb)]
        if all(nbytes(*s) <= cap for s in spans):
            break
        if blk == 1:
            raise Unsupported(op, f"one input row of a {H}x{W} plane with its windows needs "
                              f"{max(nbytes(*s) for s in spans)} B per SBUF partition (limit {int(cap)})")
        blk = max(1, blk // 2)
    b.note(f"max-pool backward {H}x{W} <- {a.out_hw[0]}x{Wo}, kernel {a.kernel} stride {a.stride}: "
           f"{len(spans)} row block(s), tile width {Wt}, {a.kernel[0] * a.kernel[1]} taps")
    groups = _group(a, spans)
    for p0, p in b.tiled(R, P, "pl"):
        for (r0, lo, key, count, dr, dlo) in groups:
            with b.loop(count, "rb") as v:
                _block(b, k, p0, p, r0 + v * dr, lo + v * dlo, key, c0, Wt)


def _group(a: MaxPoolBwdKAttrs, spans):
    """Consecutive row blocks of one structure ``key`` = (rows, output rows, tile rows, first
    window row in the tile, first stored row in the tile) whose rows advance by constant steps:
    (r0, lo, key, count, r0 step, lo step) per loop."""
    out: list = []
    for r0, r1 in spans:
        lo, hi, t0, t1 = _rows_of(a, r0, r1)
        key = (r1 - r0, hi - lo, t1 - t0, lo * a.stride[0] - t0, r0 - t0)
        if out and out[-1][2] == key:
            q0, l0, _, cnt, dr, dl = out[-1]
            if cnt == 1 or (r0 - q0 == cnt * dr and lo - l0 == cnt * dl):
                out[-1] = (q0, l0, key, cnt + 1, r0 - q0 if cnt == 1 else dr, lo - l0 if cnt == 1 else dl)
                continue
        out.append((r0, lo, key, 1, 0, 0))
    return out


def _block(b: TirBuilder, k: KOp, p0: Affine, p: int, r0: Affine, lo: Affine, key, c0: int,
           Wt: int) -> None:
    a = k.attrs
    g, idx = k.ins
    out = k.outs[0]
    W = a.in_hw[1]
    Wo = a.out_hw[1]
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
    nr, nlo, nt, win0, st0 = key          # rows, output rows, tile rows, lo*sh - t0, r0 - t0
    acc = b.tile("mpb_acc", Memory.SBUF, p, nt * Wt, F32, BUFS)
    b.memset(acc.ap(), 0.0)
    n = nlo * Wo
    if n:
        gt = b.tile("mpb_g", Memory.SBUF, p, n, g.dtype, BUFS)
        b.dma(gt.ap(), hbm_ap(g.buffer, g.dtype, g.offset + p0 * g.strides[0] + lo * Wo * g.strides[1],
                              p, g.strides[0], ((n, g.strides[1]),)))
        it = b.tile("mpb_i", Memory.SBUF, p, n, idx.dtype, BUFS)
        b.dma(it.ap(), hbm_ap(idx.buffer, idx.dtype, idx.offset + p0 * idx.strides[0]
                              + lo * Wo * idx.strides[1], p, idx.strides[0], ((n, idx.strides[1]),)))
        q = it.ap()
        if Wt != W:                          # the index as (row, column) in a tile of width Wt
            m = b.tile("mpb_mod", Memory.SBUF, p, n, F32, BUFS)
            b.tensor_scalar(m.ap(), it.ap(), AluOp.MOD, float(W))
            r = b.tile("mpb_row", Memory.SBUF, p, n, F32, BUFS)
            b.tensor_tensor(r.ap(), it.ap(), m.ap(), AluOp.SUBTRACT)
            b.tensor_scalar(r.ap(), r.ap(), AluOp.DIVIDE, float(W), op1=AluOp.MULTIPLY,
                            operand1=float(Wt))
            b.tensor_tensor(r.ap(), r.ap(), m.ap(), AluOp.ADD)
            q = r.ap()
        q0 = b.tile("mpb_q0", Memory.SBUF, p, n, F32, BUFS)
        odims = tuple(d for d in ((Wo, nlo), (1, Wo)) if d[1] > 1) or ((1, 1),)
        steps = tuple(st for st, (_, sz) in zip((sh * Wt, sw), ((Wo, nlo), (1, Wo))) if sz > 1) or (0,)
        b.iota(q0.ap(dims=odims), (lo * sh - ph) * Wt - pw, 0, steps)
        d = b.tile("mpb_d", Memory.SBUF, p, n, F32, BUFS)
        b.tensor_tensor(d.ap(), q, q0.ap(), AluOp.SUBTRACT)
        zero = b.tile("mpb_zero", Memory.SBUF, p, n, F32, BUFS)
        b.memset(zero.ap(), 0.0)
        mk = b.tile("mpb_mask", Memory.SBUF, p, n, F32, BUFS)
        c = b.tile("mpb_c", Memory.SBUF, p, n, F32, BUFS)
        wdims = tuple(dd for dd in ((sh * Wt, nlo), (sw, Wo)) if dd[1] > 1) or ((1, 1),)
        for kh in range(Kh):
            for kw in range(Kw):
                b.tensor_scalar(mk.ap(), d.ap(), AluOp.IS_EQUAL, float(kh * dh * Wt + kw * dw))
                b.select(c.ap(), mk.ap(), gt.ap(), zero.ap())
                win = acc.ap(p, elem_offset=(win0 - ph + kh * dh) * Wt + (kw * dw - pw - c0),
                             dims=wdims)
                b.tensor_tensor(win, win, c.ap(), AluOp.ADD)
    src = acc.ap(p, elem_offset=st0 * Wt - c0,
                 dims=tuple(dd for dd in ((Wt, nr), (1, W)) if dd[1] > 1) or ((1, 1),))
    if out.dtype is not F32:
        res = b.tile("mpb_out", Memory.SBUF, p, nr * W, out.dtype, BUFS)
        b.tensor_copy(res.ap(), src)
        src = res.ap()
    b.dma(hbm_ap(out.buffer, out.dtype, out.offset + p0 * out.strides[0] + r0 * W * out.strides[1],
                 p, out.strides[0], ((nr * W, out.strides[1]),)), src)
