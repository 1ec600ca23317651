"""Tiling of CONV kernels: forward convolution as an implicit GEMM on TensorE.

``y[n, co, oh, ow] = bias[co] + sum_{ci, kh, kw} w[co, ci, kh, kw] * xpad[n, g*Cig + ci,
oh*sh + kh*dh, ow*sw + kw*dw]`` (``kir.ConvKAttrs``; ``g`` the group of ``co``). TensorE computes
``psum[co, pix] += wT[ci, co].T @ window[ci, pix]`` with input channels on partitions, so every
kernel tap ``(kh, kw)`` is one matmul whose moving operand is a *strided window* of an input
tile already in SBUF (free dims ``[(sh * tile_width, rows), (sw, cols)]``, offset
``kh*dh*tile_width + kw*dw``): the patch (im2col) matrix never exists, in HBM or in SBUF.

Loop nest, per *super-group* (``gpb`` groups packed block-diagonally, see below):
    build wT [ci chunk, (chunk, tap, co)] in SBUF: weight rows [co, ci*taps] by one DMA per
        128 output channels (contiguous), one TensorE transpose per (ci chunk, tap) through PSUM
    load the bias as one fp32-able column per 128 output channels
    for n, for each output block of R rows x Cw columns (R*Cw <= 512, one PSUM bank):
        input tile [ci chunk, chunks x Rin x Cin] (the block's receptive field with its halo):
            memset to 0 when the block touches the padding, one DMA per 128 channels of the
            valid rectangle
        for each 128 output channels:
            for each ci chunk, for each tap: matmul into one PSUM bank (the group starts at the
                first chunk's first tap)
            evacuate: ScalarE ``identity(acc + bias[co])`` (per-partition bias) or a copy, with
                the cast to the output dtype; store by DMA
Few input channels (<= 64, one chunk): the input tile is loaded ``stack`` times on partitions
32 or 64 apart (the engines' alignment; the gaps are zeros), copy ``s`` shifted down ``s*dh``
rows, so one product contracts ``stack`` kernel rows (``_Geo.units``: 6 products instead of 9
for a 3x3 conv over 64 channels). Whole input rows shorter than ``STAGE_ROW_BYTES`` go through a
contiguous staging tile (one DMA chunk per partition) and an engine copy into the padded tile,
instead of one 256-byte-overhead DMA chunk per row.
Blocks are grouped into *runs* of equal shape and clipping (the first and last blocks of an
axis touch the padding, interior blocks do not), each run one loop.

Groups: with ``Cig = Ci/groups`` and ``Cog = Co/groups`` at most 64, ``gpb`` groups (a divisor of
``groups``, ``gpb*max(Cig, Cog) <= 128``) share one 128-row contraction: the weight rows are
spread over a block-diagonal matrix by multiplying them with a 0/1 mask built by ``iota`` (one
VectorE pass per super-group), so a depthwise conv runs 128 channels per matmul instead of one.

Invariants
- Every element of an input tile the matmuls read was written by the memset or the DMA; the
  DMA reads only elements inside the input (padding is never an HBM read or an HBM tensor).
- Accumulation groups: one per (block, 128 output channels), in one PSUM bank, opened by the
  first product (``start_when`` of the ci chunk loop), every other product accumulates.
- The weight block of one super-group (``chunks * taps * Cog*gpb`` elements per partition) and
  the input tiles fit their SBUF shares (``W_SHARE``, ``X_SHARE``); else ``Unsupported``.

Cost (what this moves and computes)
- HBM: the input once per output block plus the halo (``Rin*Cin / (R*Cw*sh*sw)`` of it: ~1.3x
  for a 3x3/s1 conv on 56x56), the weights and the output once. No patch-matrix traffic
  (an explicit im2col would write and read ``Kh*Kw`` times the input).
- SBUF traffic: the staged rows are copied once more (VectorE/GpSimdE/ScalarE, beside TensorE).
- TensorE: ``chunks * len(units)`` matmuls of ``R*Cw`` columns per block and 128 output channels,
  i.e. ``max(64, R*Cw)`` cycles each; utilisation is ``Ci_chunk/128 * Co_chunk/128`` of the
  array (64-channel layers use a quarter of it), and the block-diagonal groups count their
  zero products.
- Weight preparation: one transpose + one copy per (ci chunk, tap, 128 output channels) per
  super-group, once per kernel (not per image or block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from lowering.errors import Unsupported
from lowering.kir import ConvKAttrs, KOp
from lowering.tiling.conv_plan import FREE_MAX, P, STAGE_ROW_BYTES, ConvPlan, plan_conv
from lowering.tir.affine import Affine, AffineLike, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import ActFunc, AluOp, DType, Memory

F32 = DType.FP32
OUT_BUFS = 3        # evacuated tiles: one computed, one held by its store, one free


@dataclass(frozen=True)
class Run:
    """``count`` consecutive output blocks along one axis from block ``first``: each ``size``
    outputs wide, reading ``extent`` input positions; copy ``s`` of a stacked tile (its origin
    ``s * shift`` positions further) has ``lo[s]`` padding positions first and ``hi[s]`` last."""

    first: int
    count: int
    size: int
    extent: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]

    def valid(self, s: int = 0) -> int:
        return max(0, self.extent - self.lo[s] - self.hi[s])

    @property
    def padded(self) -> bool:
        return any(self.lo) or any(self.hi)


def runs(n_out: int, blk: int, s: int, d: int, k: int, p: int, n_in: int,
         shifts: tuple[int, ...] = (0,)) -> list[Run]:
    """The output blocks of ``blk`` along an axis (stride ``s``, dilation ``d``, kernel ``k``,
    padding ``p``, input size ``n_in``) grouped into runs of equal shape and clipping; ``shifts``:
    the origin offsets of the stacked copies of the input tile."""
    out: list[Run] = []
    for i in range(-(-n_out // blk)):
        size = min(blk, n_out - i * blk)
        ext = (size - 1) * s + (k - 1) * d + 1
        firsts = [i * blk * s - p + sh for sh in shifts]
        lo = tuple(max(0, -f) for f in firsts)
        hi = tuple(max(0, f + ext - n_in) for f in firsts)
        r = out[-1] if out else None
        if r and (r.size, r.extent, r.lo, r.hi) == (size, ext, lo, hi):
            out[-1] = Run(r.first, r.count + 1, size, ext, lo, hi)
        else:
            out.append(Run(i, 1, size, ext, lo, hi))
    return out


def _dims(*pairs: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """(stride, size) pairs without the size-1 ones (at least one)."""
    d = tuple(pr for pr in pairs if pr[1] > 1)
    return d or ((1, 1),)


def tile_conv(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, ConvKAttrs)
    x, w = k.ins[0], k.ins[1]
    bias = k.ins[2] if a.has_bias else None
    N = x.shape[0]
    if a.dgrad is None:
        Co, Cig, Kh, Kw = w.shape
    else:                                # w is the forward weight [Co', Ci'/G, Kh', Kw']
        Co, Cig, Kh, Kw = w.shape[1] * a.groups, w.shape[0] // a.groups, len(a.dgrad[0]), len(a.dgrad[1])
    Ho, Wo = a.out_hw
    G = a.groups
    if N == 0 or Co == 0 or Ho <= 0 or Wo <= 0:
        return
    op = ",".join(k.origin) or "convolution"
    if Cig == 0:
        raise Unsupported(op, "convolution with 0 input channels per group is not lowered")
    H, W = a.in_hw
    dt = x.dtype
    g = plan_conv(op, b.target.sbuf_bytes_per_partition, dt.itemsize, Co=Co, Cig=Cig, Kh=Kh,
                  Kw=Kw, Ho=Ho, Wo=Wo, W=W, stride=a.stride, dilation=a.dilation, groups=G,
                  dgrad_taps=0 if a.dgrad is None else w.shape[2] * w.shape[3])
    (sh, sw), (ph, pw), (dh, dw) = a.stride, a.padding, a.dilation
    rruns = runs(Ho, g.R, sh, dh, Kh, ph, H, tuple(s * dh for s in range(g.stack)))
    cruns = runs(Wo, g.Cw, sw, dw, Kw, pw, W)
    b.note(f"conv [{N}x{x.shape[1]}x{H}x{W}] * [{Co}x{Cig}x{Kh}x{Kw}] -> [{Ho}x{Wo}] {dt.value}: "
           f"groups {G} ({g.gpb} per 128-row block, {g.SG} blocks), {g.stack} kernel rows per "
           f"product, {g.passes} weight passes of {g.cob} output channels, output blocks "
           f"{g.R}x{g.Cw}, {len(rruns)}x{len(cruns)} runs, input tiles "
           f"{'per 128-channel chunk' if g.per_chunk else 'of every chunk'} ({g.xbufs} slots), "
           f"{g.nci * len(g.units)} products per block and 128 output channels")
    with b.loop(g.SG, "sg") as sg:
        for pa, cob in b.tiled(g.cout, g.cob, "wp"):
            wT = (_weights(b, w, sg, g, Cig, Cog=Co // G, pa=pa, cob=cob) if a.dgrad is None
                  else _weights_dgrad(b, w, sg, g, Cig, a.dgrad, pa, cob))
            bt = _bias(b, bias, sg * g.cout + pa, cob) if bias is not None else None
            with b.loop(N, "n") as n:
                for rr in rruns:
                    with b.loop(rr.count, "rb") as vr:
                        for cr in cruns:
                            with b.loop(cr.count, "cb") as vc:
                                _block(b, k, g, wT, bt, n, sg, pa, cob, vr, vc, rr, cr)


def _tap_groups(g: ConvPlan, Kh: int, Kw: int) -> list[tuple[int, int, int, int]]:
    """The kernel taps whose weight rows are loaded together, ``(r0, nr, k0, nk)``: rows ``r0 ..
    r0+nr-1`` x columns ``k0 .. k0+nk-1``. The products iterate the same groups (one loop nest
    each), so every matmul instruction reads stationaries that one instruction wrote."""
    return [(r, min(g.krows, Kh - r), k, min(g.kcols, Kw - k))
            for r in range(0, Kh, g.krows) for k in range(0, Kw, g.kcols)]


def _unit_loops(b: TirBuilder, g: ConvPlan, Kh: int, Kw: int, r0: int = 0,
                nr: int | None = None, k0: int = 0, nk: int | None = None
                ) -> Iterator[tuple[AffineLike, AffineLike, int, AffineLike]]:
    """``(u, kh0, rows, kw)`` of the product units whose first kernel row is in ``r0 ..
    r0+nr-1`` (``r0`` a multiple of ``stack``) and kernel column in ``k0 .. k0+nk-1``, as loops: one nest (kernel-row groups x kernel
    columns) per run of equal stacked rows, so a kernel of many taps is a loop, not a body that
    grows with it (``u = kh0 / stack * Kw + kw`` is affine in the loop variables)."""
    S = g.stack
    end = Kh if nr is None else min(Kh, r0 + nr)
    nfull, tail = divmod(end - r0, S)            # a tail only at the last kernel rows
    for first, count, rs in ((r0, nfull, S), (r0 + nfull * S, 1 if tail else 0, tail)):
        if count == 0:
            continue
        with b.loop(count, "ku") as i:
            with b.loop(Kw - k0 if nk is None else nk, "kw") as j:
                yield (first // S + i) * Kw + k0 + j, i * S + first, rs, j + k0


def _stationaries(b: TirBuilder, g: ConvPlan, cob: int, dt):
    """The [contraction, (chunk, unit, out)] weight tile of one pass, zeroed where stacked copies
    leave gaps."""
    wT = b.tile("wT", Memory.SBUF, g.parts, g.nci * len(g.units) * cob, dt, 2)
    if g.gaps:
        b.memset(wT.ap(), 0.0)
    return wT


def _weights(b: TirBuilder, w, sg: Affine, g: ConvPlan, Cig: int, Cog: int, pa: AffineLike,
             cob: int):
    """wT[s*pitch + ci, (chunk * units + u) * cob + co] = w[sg*cout + pa + co, ci - grp*Cig,
    kh0(u) + s, kw(u)] inside the block diagonal (0 elsewhere, and between stacked copies): one
    stationary per unit. The rows are loaded per 128 output channels and ``krows`` kernel rows,
    of every input channel or per 128 (``rows_all``), then transposed on TensorE."""
    dt = w.dtype
    Kh, Kw = w.shape[2:]
    nu, cin = len(g.units), g.cin
    wT = _stationaries(b, g, cob, dt)
    for o0, ow in b.tiled(cob, P, "wo"):
        for r0, nr, k0, nk in _tap_groups(g, Kh, Kw):
            rl = nr * nk                         # elements of one channel's rows in the tile
            taps = (r0, nr, k0, nk)
            rows = _weight_rows(b, w, g, sg, pa + o0, ow, Cig, Cog, (0, cin), taps) \
                if g.rows_all else None
            for c0, cc in b.tiled(cin, P, "wc"):
                if not g.rows_all:
                    rows = _weight_rows(b, w, g, sg, pa + o0, ow, Cig, Cog, (c0, cc), taps)
                chan = c0 * rl if g.rows_all else 0
                for u, kh0, rs, kw in _unit_loops(b, g, Kh, Kw, r0, nr, k0, nk):
                    col = (c0 // P * nu + u) * cob + o0
                    at = chan + (kh0 - r0) * nk + kw - k0
                    if not g.gaps:               # every stacked row in one transpose
                        kp = g.kparts(rs, cc)
                        tp = b.tile("wtps", Memory.PSUM, kp, P, F32, 2)
                        b.transpose(tp.ap(kp, dims=((1, ow),)),
                                    rows.ap(ow, elem_offset=at, dims=_dims((nk, rs), (rl, cc))))
                        b.tensor_copy(wT.ap(kp, elem_offset=col, dims=((1, ow),)),
                                      tp.ap(kp, dims=((1, ow),)))
                        continue
                    tp = b.tile("wtps", Memory.PSUM, g.kparts(rs, cc), P, F32, 2)
                    for s in range(rs):          # one per stacked row, onto its aligned partitions
                        b.transpose(tp.ap(cc, partition_start=s * g.pitch, dims=((1, ow),)),
                                    rows.ap(ow, elem_offset=at + s * nk, dims=_dims((rl, cc))))
                        b.tensor_copy(wT.ap(cc, partition_start=s * g.pitch, elem_offset=col,
                                            dims=((1, ow),)),
                                      tp.ap(cc, partition_start=s * g.pitch, dims=((1, ow),)))
    return wT


def _weight_rows(b: TirBuilder, w, g: ConvPlan, sg: Affine, o0: AffineLike, ow: int, Cig: int,
                 Cog: int, chans: tuple[AffineLike, int], taps: tuple[int, int, int, int]):
    """rows[co, (c * nr + kh - r0) * nk + kw - k0] = w[sg*cout + o0 + co, c0 + c, kh, kw] for the
    channels ``chans = (c0, count)`` of the super-group and the kernel taps ``taps = (r0, nr,
    k0, nk)`` (rows ``r0 ..``, columns ``k0 ..``); with groups packed, spread over the block
    diagonal (the other groups' channels 0)."""
    dt = w.dtype
    s0, s1, s2, s3 = w.strides
    c0, cc = chans
    r0, nr, k0, nk = taps
    rl = nr * nk
    rows = b.tile("wrows", Memory.SBUF, ow, cc * rl, dt, 2)
    first = w.offset + (sg * g.cout + o0) * s0 + r0 * s2 + k0 * s3
    if g.gpb == 1:
        b.dma(rows.ap(), hbm_ap(w.buffer, dt, first + c0 * s1, ow, s0, ((cc, s1), (nr, s2), (nk, s3))))
    else:                                        # rows * mask[co, group]
        plain = b.tile("wplain", Memory.SBUF, ow, Cig * rl, dt, 1)
        b.dma(plain.ap(), hbm_ap(w.buffer, dt, first, ow, s0, ((Cig, s1), (nr, s2), (nk, s3))))
        _spread(b, rows, plain, 0, ow, g.gpb, Cog, Cig * rl, base=o0)
    return rows


def _spread(b: TirBuilder, rows, plain, p0: int, pn: int, gpb: int, gsize: int, n: int,
            base: AffineLike = 0) -> None:
    """rows[p, g*n + j] = plain[p, j] if partition ``p`` (counted from ``p0``, plus ``base``)
    is in group ``g`` (``(base + p) // gsize == g``), else 0: a 0/1 mask from ``iota`` times
    the broadcast rows."""
    iv = b.tile("wmask_i", Memory.SBUF, P, gpb, F32, 1)
    b.iota(iv.ap(pn, partition_start=p0), base, 1, (-gsize,))   # in [0, gsize) on the diagonal
    ge = b.tile("wmask_ge", Memory.SBUF, P, gpb, F32, 1)
    b.tensor_scalar(ge.ap(pn, partition_start=p0), iv.ap(pn, partition_start=p0), AluOp.IS_GE, 0.0)
    lt = b.tile("wmask_lt", Memory.SBUF, P, gpb, F32, 1)
    b.tensor_scalar(lt.ap(pn, partition_start=p0), iv.ap(pn, partition_start=p0), AluOp.IS_LT,
                    float(gsize))
    m = b.tile("wmask", Memory.SBUF, P, gpb, F32, 1)
    b.tensor_tensor(m.ap(pn, partition_start=p0), ge.ap(pn, partition_start=p0),
                    lt.ap(pn, partition_start=p0), AluOp.MULTIPLY)
    b.tensor_tensor(rows.ap(pn, partition_start=p0, dims=((n, gpb), (1, n))),
                    plain.ap(pn, partition_start=p0, dims=((0, gpb), (1, n))),
                    m.ap(pn, partition_start=p0, dims=((1, gpb), (0, n))), AluOp.MULTIPLY)


def _weights_dgrad(b: TirBuilder, w, sg: Affine, g: ConvPlan, Cg: int, taps_of,
                   pa: AffineLike, cob: int):
    """The stationaries of a data-gradient (transposed) convolution from the forward weight
    ``w [Co', Ci'/G, Kh', Kw']``: the contraction runs over the forward's output channels, which
    are ``w``'s rows, so no transpose is needed: wT[s*pitch + c, (chunk * units + u) * cob + o]
    = w[sg*cin + c, pa + o - grp(o)*Ci'/G, taps_of[0][kh0(u) + s], taps_of[1][kw(u)]] when
    ``c`` and ``o`` share a group (``Cg`` forward output channels per group), else 0 (with
    groups packed, one pass covers every column). One DMA per 128 rows (per stacked copy), one
    strided copy per (unit, stacked row)."""
    dt = w.dtype
    s0, s1, s2, s3 = w.strides
    _, ci_g, kh_f, kw_f = w.shape
    taps, nu, cin = kh_f * kw_f, len(g.units), g.cin
    wT = _stationaries(b, g, cob, dt)
    for c0, cc in b.tiled(cin, P, "wc"):
        rows = b.tile("wrows", Memory.SBUF, g.parts, cob * taps, dt, 2)   # [c, o*taps + tap]
        for s in range(g.stack):
            if g.gpb == 1:
                b.dma(rows.ap(cc, partition_start=s * g.pitch),
                      hbm_ap(w.buffer, dt, w.offset + (sg * cin + c0) * s0 + pa * s1, cc, s0,
                             ((cob, s1), (kh_f, s2), (kw_f, s3))))
            else:
                plain = b.tile("wplain", Memory.SBUF, g.parts, ci_g * taps, dt, 1)
                b.dma(plain.ap(cc, partition_start=s * g.pitch),
                      hbm_ap(w.buffer, dt, w.offset + (sg * cin + c0) * s0, cc, s0,
                             ((ci_g, s1), (kh_f, s2), (kw_f, s3))))
                _spread(b, rows, plain, s * g.pitch, cc, g.gpb, Cg, ci_g * taps)
        for u, kh0, rs, kw in _dgrad_units(b, g, taps_of):
            for s in range(rs):
                tap = _at(taps_of[0], kh0 + s) * kw_f + _at(taps_of[1], kw)
                b.tensor_copy(wT.ap(cc, partition_start=s * g.pitch,
                                    elem_offset=(c0 // P * nu + u) * cob, dims=((1, cob),)),
                              rows.ap(cc, partition_start=s * g.pitch, elem_offset=tap,
                                      dims=((taps, cob),)))
    return wT


def _step(seq) -> int | None:
    """The common difference of an arithmetic sequence (0 for one element), else None."""
    d = {b - a for a, b in zip(seq, seq[1:])}
    return 0 if not d else d.pop() if len(d) == 1 else None


def _at(seq, i: AffineLike) -> AffineLike:
    """``seq[i]`` of an arithmetic sequence, affine in ``i``."""
    return seq[0] + i * _step(seq) if _step(seq) else seq[0] if len(seq) == 1 else seq[i]


def _dgrad_units(b: TirBuilder, g: ConvPlan, taps_of):
    """The product units of a data-gradient kernel: loops when both axes' forward taps are
    arithmetic sequences (the phase taps are: every ``s / gcd(s, d)``-th kernel index), else
    one statement per unit."""
    if _step(taps_of[0]) is not None and _step(taps_of[1]) is not None:
        yield from _unit_loops(b, g, len(taps_of[0]), len(taps_of[1]))
        return
    for u, (kh0, rs, kw) in enumerate(g.units):
        yield u, kh0, rs, kw


def _bias(b: TirBuilder, bias, first: AffineLike, cob: int):
    """bias[first + co] as column ``co // 128`` of a [min(cob, 128), chunks] tile."""
    nco = -(-cob // P)
    bt = b.tile("bias", Memory.SBUF, min(cob, P), nco, bias.dtype, 2)
    st = bias.strides[0]
    for o0, ow in b.tiled(cob, P, "bo"):
        b.dma(bt.ap(ow, elem_offset=o0 // P, dims=((1, 1),)),
              hbm_ap(bias.buffer, bias.dtype, bias.offset + (first + o0) * st, ow, st, ()))
    return bt


def _load_x(b: TirBuilder, k: KOp, g: ConvPlan, n: Affine, sg: Affine, oy0, ox0, rr: Run,
            cr: Run, chunk: tuple[AffineLike, int] | None):
    """The block's input tile: ``stack`` shifted copies of its receptive field (with the halo),
    of every 128-channel chunk (``chunk`` None) or of one ``(c0, cc)``; zero padding by memset.
    Whole input rows shorter than ``STAGE_ROW_BYTES`` are loaded into a contiguous staging tile
    and placed by an engine copy."""
    a = k.attrs
    x = k.ins[0]
    H, W = a.in_hw
    (sh, sw), (ph, pw), dh = a.stride, a.padding, a.dilation[0]
    dt = x.dtype
    cinw = cr.extent
    area = rr.extent * cinw
    nch = g.nci if chunk is None else 1
    xt = b.tile("xin", Memory.SBUF, g.parts, nch * area, dt, g.xbufs)
    if rr.padded or cr.padded or g.gaps:
        b.memset(xt.ap(), 0.0)
    sx0, sx1, sx2 = x.strides
    ix0 = ox0 * sw + (cr.lo[0] - pw)              # first input column read
    # whole input rows that the padded tile would split into short DMA chunks: load them
    # contiguously into a staging tile (one chunk per partition) and place them with a copy
    stage = (cr.valid() == W and cinw != W and sx2 == 1 and W * dt.itemsize < STAGE_ROW_BYTES)
    st = b.tile("xstage", Memory.SBUF, g.parts, nch * rr.extent * W, dt, g.xbufs) if stage else None
    chunks = b.tiled(g.cin, P, "xc") if chunk is None else iter((chunk,))
    for c0, cc in chunks:
        ci = c0 // P if chunk is None else 0     # the chunk's place in the tile
        for s in range(g.stack):                  # copy s: the tile s*dh rows further down
            vr = rr.valid(s)
            if not (vr and cr.valid()):
                continue
            iy0 = oy0 * sh + (rr.lo[s] - ph + s * dh)
            src = hbm_ap(x.buffer, dt, x.offset + n * sx0 + (sg * g.cin + c0) * sx1
                         + (iy0 * W + ix0) * sx2, cc, sx1, ((vr, W * sx2), (cr.valid(), sx2)))
            dst = xt.ap(cc, partition_start=s * g.pitch,
                        elem_offset=ci * area + rr.lo[s] * cinw + cr.lo[0],
                        dims=_dims((cinw, vr), (1, cr.valid())))
            if st is None:
                b.dma(dst, src)
                continue
            rows = st.ap(cc, partition_start=s * g.pitch, elem_offset=ci * rr.extent * W,
                         dims=_dims((W, vr), (1, W)))
            b.dma(rows, src)
            b.tensor_copy(dst, rows)
    return xt


def _block(b: TirBuilder, k: KOp, g: ConvPlan, wT, bt, n: Affine, sg: Affine, pa: AffineLike,
           cob: int, vr: Affine, vc: Affine, rr: Run, cr: Run) -> None:
    """One output block of one weight pass: its input tile (once, or per 128 output and input
    channels with ``per_chunk``), then per 128 output channels the products, the evacuation
    (bias, cast) and the store."""
    a = k.attrs
    y = k.outs[0]
    Wo = a.out_hw[1]
    (sh, sw), dh, dw = a.stride, a.dilation[0], a.dilation[1]
    cinw = cr.extent
    area = rr.extent * cinw
    nu = len(g.units)
    oy0 = (vr + rr.first) * g.R                   # first output row / column of the block
    ox0 = (vc + cr.first) * g.Cw
    xt = None if g.per_chunk else _load_x(b, k, g, n, sg, oy0, ox0, rr, cr, None)
    pix = rr.size * cr.size
    if y.rank == 4:                  # a strided view (a phase of a data gradient)
        so0, so1, soh, so2 = y.strides
    else:
        so0, so1, so2 = y.strides
        soh = Wo * so2
    for o0, ow in b.tiled(cob, P, "co"):
        acc = b.tile("acc", Memory.PSUM, ow, FREE_MAX, F32, 2)
        for c0, cc in b.tiled(g.cin, P, "ci"):
            if g.per_chunk:
                xt = _load_x(b, k, g, n, sg, oy0, ox0, rr, cr, (c0, cc))
            base = 0 if g.per_chunk else c0 // P * area
            for u, kh0, rs, kw in (t for grp in _tap_groups(g, *a.kernel)
                                    for t in _unit_loops(b, g, *a.kernel, *grp)):
                kp = g.kparts(rs, cc)
                mov = xt.ap(kp, elem_offset=base + kh0 * dh * cinw + kw * dw,
                            dims=_dims((sh * cinw, rr.size), (sw, cr.size)))
                stat = wT.ap(kp, elem_offset=(c0 // P * nu + u) * cob + o0, dims=((1, ow),))
                b.matmul(acc.ap(ow, dims=((1, pix),)), stat, mov, start_when=(c0, u))
        res = b.tile("yout", Memory.SBUF, ow, pix, y.dtype, OUT_BUFS)
        src = acc.ap(ow, dims=((1, pix),))
        if bt is not None:
            b.activation(res.ap(), src, ActFunc.IDENTITY,
                         bias_ap=bt.ap(ow, elem_offset=o0 // P, dims=((1, 1),)))
        else:
            b.tensor_copy(res.ap(), src)
        dst = hbm_ap(y.buffer, y.dtype, y.offset + n * so0 + (sg * g.cout + pa + o0) * so1
                     + oy0 * soh + ox0 * so2, ow, so1, ((rr.size, soh), (cr.size, so2)))
        b.dma(dst, res.ap())
