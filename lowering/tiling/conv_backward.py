"""Tiling of CONV_WGRAD kernels: a convolution's weight gradient (``kir.ConvWgradKAttrs``).

``gw[co, ci, tap] = sum over (n, pixel) of g[n, co, pixel] * x_tap[n, ci, pixel]``, where
``x_tap`` is the input window of kernel tap ``(kh, kw)`` (the forward's strided window of the
padded input). The contraction runs over output pixels, so on TensorE the pixels go on
partitions. Output pixels are walked in blocks of at most 128 (``R`` rows x ``Cw`` columns); each
block's input receptive field (with its halo) is loaded once into SBUF, channels on partitions,
zero padding a memset of the tile's border (blocks grouped into runs of equal clipping, as in
``tiling/conv.py``).

TensorE (any groups; per group, per 128 output x 128 input channels, per group of taps that
fits ``ACC_BANKS`` PSUM banks):
    for n, for each pixel block:
        gT [pix, co] = transpose(g block [co, pix])             TensorE, copied to SBUF
        per tap: xT[pix, (tap, ci)] = transpose(window_tap [ci, pix])   TensorE, a PSUM bank of
                                                                         taps per copy to SBUF
        per bank: acc[co, (taps, ci)] += gT.T @ xT                       one PSUM group per bank,
                                                                         open over every block
    evacuate acc into [co, ci * taps] (tap-major -> ci-major with a strided copy), cast, store
Depthwise (one input channel per group, ``Co / groups <= 128``): VectorE, channels on
partitions (output channel ``co`` reads input channel ``co // multiplier``, a stride-0 DMA
pattern), no transposes:
    per block: prod[co, tap, pix] = g block * window_tap        one tensor_tensor per tap
               acc[co, tap] += reduce_add(prod)                 tensor_reduce + tensor_tensor

Invariants
- Every pixel of every image contributes once per tap; windows read only real input elements
  (padding is the memset zero of the tile, never an HBM read).
- PSUM accumulation groups: one per bank, opened by the first block's product and accumulated
  by every other block (``start_when`` over the n and block loops of the first run).
- fp32 accumulation throughout (PSUM or the VectorE accumulator); one rounding at the store.
"""
from __future__ import annotations

from lowering.errors import Unsupported
from lowering.kir import ConvWgradKAttrs, KOp
from lowering.tiling.conv import Run, _dims, runs
from lowering.tiling.conv_plan import blocks as _blocks
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, Memory

F32 = DType.FP32
P = 128
BANK = 512          # fp32 per partition per PSUM bank
ACC_BANKS = 4       # accumulating banks in flight (the transposes double-buffer the others)
X_BUFS = 3


def tile_conv_wgrad(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, ConvWgradKAttrs)
    x = k.ins[0]
    gw = k.outs[0]
    op = ",".join(k.origin) or "convolution_backward"
    Co, Cig, Kh, Kw = gw.shape
    N = x.shape[0]
    Ho, Wo = a.out_hw
    if Co == 0 or Cig == 0:
        return
    if N == 0 or Ho * Wo == 0:
        raise Unsupported(op, f"weight gradient over an empty batch or output ({N}x{Ho}x{Wo})")
    G = a.groups
    m = Co // G
    depthwise = Cig == 1 and m <= P
    R, Cw = _blocks(Ho, Wo, P if not depthwise else 512)
    part = b.target.sbuf_bytes_per_partition
    (sh, sw), (ph, pw), (dh, dw) = a.stride, a.padding, a.dilation
    rin, cinw = (R - 1) * sh + (Kh - 1) * dh + 1, (Cw - 1) * sw + (Kw - 1) * dw + 1
    per_part = rin * cinw * x.dtype.itemsize * X_BUFS
    if depthwise:
        per_part += Kh * Kw * R * Cw * 4 * 2
    if per_part > part // 3:
        raise Unsupported(op, f"input tile of {rin}x{cinw} for a {R}x{Cw} output block needs "
                          f"{per_part} B per SBUF partition (limit {part // 3})")
    H, W = a.in_hw
    rruns = runs(Ho, R, sh, dh, Kh, ph, H)
    cruns = runs(Wo, Cw, sw, dw, Kw, pw, W)
    b.note(f"conv weight gradient [{Co}x{Cig}x{Kh}x{Kw}] from [{N}x{x.shape[1]}x{H}x{W}] and "
           f"[{Ho}x{Wo}] ({G} groups): {'VectorE depthwise' if depthwise else 'TensorE'}, pixel "
           f"blocks {R}x{Cw}, {len(rruns)}x{len(cruns)} runs")
    if depthwise:
        _depthwise(b, k, m, rruns, cruns, R, Cw)
    else:
        _tensor(b, k, rruns, cruns, R, Cw)


def _blocks_of(b: TirBuilder, N: int, rruns: list[Run], cruns: list[Run], body) -> None:
    """``body(n, rr, vr, cr, vc, first)`` for every image and output block, in loops."""
    with b.loop(N, "n") as n:
        for i, rr in enumerate(rruns):
            with b.loop(rr.count, "rb") as vr:
                for j, cr in enumerate(cruns):
                    with b.loop(cr.count, "cb") as vc:
                        body(n, rr, vr, cr, vc, i == 0 and j == 0)


def _x_tile(b: TirBuilder, k: KOp, n: Affine, c0, cc: int, mult: int, rr: Run, cr: Run,
            vr: Affine, vc: Affine, R: int, Cw: int):
    """The padded input window of one output block for channels (c0 ..) on ``cc`` partitions
    (with ``mult`` > 1: partition ``q`` reads input channel ``(c0 + q) // mult``)."""
    a = k.attrs
    x = k.ins[0]
    W = a.in_hw[1]
    (sh, sw), (ph, pw) = a.stride, a.padding
    area = rr.extent * cr.extent
    xt = b.tile("wg_x", Memory.SBUF, cc, area, x.dtype, X_BUFS)
    if rr.padded or cr.padded:
        b.memset(xt.ap(), 0.0)
    if rr.valid() and cr.valid():
        oy0, ox0 = (vr + rr.first) * R, (vc + cr.first) * Cw
        iy0 = oy0 * sh + (rr.lo[0] - ph)
        ix0 = ox0 * sw + (cr.lo[0] - pw)
        s0, s1, s2 = x.strides
        off = x.offset + n * s0 + (iy0 * W + ix0) * s2
        free = tuple(d for d in ((W * s2, rr.valid()), (s2, cr.valid())) if d[1] > 1)
        if mult == 1:
            src = hbm_ap(x.buffer, x.dtype, off + c0 * s1, cc, s1, tuple((sz, st) for st, sz in free))
        else:
            part = tuple(d for d in ((s1, cc // mult), (0, mult)) if d[1] > 1)
            src = TAP(x.buffer, 0, 1, aff(off + (c0 // mult) * s1) * x.dtype.itemsize,
                      part + free or ((1, 1),), x.dtype)
        b.dma(xt.ap(cc, elem_offset=rr.lo[0] * cr.extent + cr.lo[0],
                    dims=_dims((cr.extent, rr.valid()), (1, cr.valid()))), src)
    return xt


def _g_tile(b: TirBuilder, k: KOp, n: Affine, c0, cc: int, rr: Run, cr: Run, vr: Affine,
            vc: Affine, R: int, Cw: int):
    a = k.attrs
    g = k.ins[1]
    Wo = a.out_hw[1]
    s0, s1, s2 = g.strides
    oy0, ox0 = (vr + rr.first) * R, (vc + cr.first) * Cw
    gt = b.tile("wg_g", Memory.SBUF, cc, rr.size * cr.size, g.dtype, 3)
    b.dma(gt.ap(), hbm_ap(g.buffer, g.dtype, g.offset + n * s0 + c0 * s1 + (oy0 * Wo + ox0) * s2,
                          cc, s1, ((rr.size, Wo * s2), (cr.size, s2))))
    return gt


def _window(xt, cc: int, rr: Run, cr: Run, kh: int, kw: int, a: ConvWgradKAttrs):
    (sh, sw), (dh, dw) = a.stride, a.dilation
    return xt.ap(cc, elem_offset=kh * dh * cr.extent + kw * dw,
                 dims=_dims((sh * cr.extent, rr.size), (sw, cr.size)))


def _depthwise(b: TirBuilder, k: KOp, mult: int, rruns, cruns, R: int, Cw: int) -> None:
    a = k.attrs
    x = k.ins[0]
    gw = k.outs[0]
    Co, _, Kh, Kw = gw.shape
    taps = Kh * Kw
    step = P - P % mult
    for c0, cc in b.tiled(Co, step, "co"):
        acc = b.tile("wg_acc", Memory.SBUF, cc, taps, F32, 1)
        b.memset(acc.ap(), 0.0)

        def body(n, rr, vr, cr, vc, first, c0=c0, cc=cc, acc=acc):
            pix = rr.size * cr.size
            gt = _g_tile(b, k, n, c0, cc, rr, cr, vr, vc, R, Cw)
            xt = _x_tile(b, k, n, c0, cc, mult, rr, cr, vr, vc, R, Cw)
            prod = b.tile("wg_prod", Memory.SBUF, cc, taps * pix, F32, 2)
            for kh in range(Kh):
                for kw in range(Kw):
                    t = kh * Kw + kw
                    b.tensor_tensor(prod.ap(cc, elem_offset=t * pix, dims=((1, pix),)), gt.ap(),
                                    _window(xt, cc, rr, cr, kh, kw, a), AluOp.MULTIPLY)
            part = b.tile("wg_part", Memory.SBUF, cc, taps, F32, 2)
            b.tensor_reduce(part.ap(), prod.ap(cc, dims=_dims((pix, taps), (1, pix))), AluOp.ADD)
            b.tensor_tensor(acc.ap(), acc.ap(), part.ap(), AluOp.ADD)

        _blocks_of(b, x.shape[0], rruns, cruns, body)
        res = b.tile("wg_out", Memory.SBUF, cc, taps, gw.dtype, 1)
        b.tensor_copy(res.ap(), acc.ap())
        b.dma(hbm_ap(gw.buffer, gw.dtype, gw.offset + c0 * taps, cc, taps, ((taps, 1),)), res.ap())


def _tensor(b: TirBuilder, k: KOp, rruns, cruns, R: int, Cw: int) -> None:
    a = k.attrs
    x = k.ins[0]
    gw = k.outs[0]
    Co, Cig, Kh, Kw = gw.shape
    G = a.groups
    Cog = Co // G
    taps = Kh * Kw
    dt = x.dtype
    with b.loop(G, "grp") as grp:
        for o0, oc in b.tiled(Cog, P, "wo"):
            for c0, ci in b.tiled(Cig, P, "wi"):
                per_bank = max(1, BANK // ci)
                per_pass = per_bank * ACC_BANKS
                res = b.tile("wg_out", Memory.SBUF, oc, ci * taps, gw.dtype, 2)
                for t0 in range(0, taps, per_pass):
                    tg = list(range(t0, min(taps, t0 + per_pass)))
                    banks = [tg[j:j + per_bank] for j in range(0, len(tg), per_bank)]
                    accs = [b.tile(f"wg_acc{j}", Memory.PSUM, oc, BANK, F32, 1) for j in range(len(banks))]

                    def body(n, rr, vr, cr, vc, first, tg=tg, banks=banks, accs=accs, o0=o0,
                             oc=oc, c0=c0, ci=ci, per_bank=per_bank):
                        pix = rr.size * cr.size
                        gt = _g_tile(b, k, n, grp * Cog + o0, oc, rr, cr, vr, vc, R, Cw)
                        gps = b.tile("wg_gps", Memory.PSUM, pix, P, F32, 2)
                        b.transpose(gps.ap(pix, dims=((1, oc),)), gt.ap())
                        gT = b.tile("wg_gT", Memory.SBUF, pix, oc, dt, 2)
                        b.tensor_copy(gT.ap(), gps.ap(pix, dims=((1, oc),)))
                        xt = _x_tile(b, k, n, grp * Cig + c0, ci, 1, rr, cr, vr, vc, R, Cw)
                        xT = b.tile("wg_xT", Memory.SBUF, pix, len(tg) * ci, dt, 2)
                        for j, bank in enumerate(banks):   # one bank of transposes, one copy
                            xps = b.tile("wg_xps", Memory.PSUM, pix, BANK, F32, 2)
                            for u, t in enumerate(bank):
                                b.transpose(xps.ap(pix, elem_offset=u * ci, dims=((1, ci),)),
                                            _window(xt, ci, rr, cr, t // Kw, t % Kw, a))
                            b.tensor_copy(xT.ap(pix, elem_offset=j * per_bank * ci,
                                                dims=((1, len(bank) * ci),)),
                                          xps.ap(pix, dims=((1, len(bank) * ci),)))
                        for j, (bank, acc) in enumerate(zip(banks, accs)):
                            nn = len(bank) * ci
                            b.matmul(acc.ap(oc, dims=((1, nn),)), gT.ap(),
                                     xT.ap(pix, elem_offset=j * per_bank * ci, dims=((1, nn),)),
                                     start_when=(n, vr, vc) if first else (1,))

                    _blocks_of(b, x.shape[0], rruns, cruns, body)
                    for bank, acc in zip(banks, accs):
                        # acc[co, (t, c)] -> res[co, c * taps + t]
                        b.tensor_copy(res.ap(oc, elem_offset=bank[0],
                                             dims=_dims((1, len(bank)), (taps, ci))),
                                      acc.ap(oc, dims=((1, len(bank) * ci),)))
                row = (grp * Cog + o0) * Cig * taps + c0 * taps
                b.dma(hbm_ap(gw.buffer, gw.dtype, gw.offset + row, oc, Cig * taps, ((ci * taps, 1),)),
                      res.ap())
