"""Tiling of MATMUL kernels on TensorE: blocked loop nests chosen by ``matmul.plan``.

``out[b] = A[b] @ B[b]`` over any leading batch axes, with A [M, K], B [K, N]. TensorE computes
``psum[m, n] (+)= stationary[k, m].T @ moving[k, n]`` with K on partitions (<= 128), the
stationary free size M <= 128 and the moving free size N <= 512 (one fp32 PSUM bank). Both
operands are needed as [K on partitions, free] tiles: A^T for the stationary side, B for the
moving side. Each side is obtained by its *form* (``matmul.plan.operand_form``): a direct DMA
when the free axis is contiguous in HBM; a DMA transpose (2-byte types, trn2+) when K is the
contiguous axis (a row-major A, or the W^T of a linear layer); else rows loaded row-major and
transposed on TensorE through PSUM.

Loop nest (resident A; resident B is the mirror image), per batch index:
    for each block of ``block`` m-tiles:              A^T block [K, block*128] resident in SBUF
        for each K tile: load A^T[k, block]            (one DMA per K tile; prefetched with 2 slots)
        for each group of ``group`` n-tiles:           accumulators [block x group] in PSUM
            for each K tile:
                load B[k, group]                       (three slots: loads run ahead)
                for m-tile, n-tile: matmul             (the group starts at k == 0)
            for m-tile, n-tile: epilogue(psum) -> SBUF -> store
Where every K tile of both sides is in SBUF when a group starts (a weight loaded ahead, an
activation transposed once), the group's products run cell-major instead, each cell's epilogue
under the next cell's products (``matmul/cells.py``, ``matmul.plan.cell_tail``).
The epilogue (bias, activation, cast, fused consumers) is evaluated while evacuating PSUM; a
row bias is either folded into the accumulation, its row loaded once, whole (``matmul.cells.bias_row``), or
added while evacuating from one broadcast tile per kernel (``matmul.cells.bias_bcast``), whichever
``matmul.plan.bias_by_products`` prefers; weights come in paced pieces of about one DMA fixed
phase each (``stream.paced_pieces``, ``_Side.pieces``); a weight operand too big to keep whole
keeps a prefix of its blocks in slots of their own (``_whole_weights``); an output going to
HBM in short 512-column runs is evacuated per m-tile into one tile of the group's columns and
stored by one DMA (``_wide_rows``). A per-K scale/shift of A (a folded layer-norm affine) is
applied where A^T tiles are made (``matmul/prologue.py``). A resident block
of short plain rows loads G K tiles per DMA (``_kgroup``: K groups, G consecutive rows per
partition), the K loops then running over groups and tiles within them.
Partial tiles (M, N, K not multiples of the tile sizes) are the peeled tails of each loop.
A third form keeps the output block in SBUF and streams both operands in chunks of K
(``resident="C"``, matmul/outres.py) when PSUM would bound the block. A fourth, transposed form
computes ``out^T = B^T A^T`` with B tiles [128 k, 128 n] as the stationary operand and A^T tiles
[128 k, <= 512 m] as the moving one (``Blocking.swap``, matmul/transposed.py): a product costs
its moving size m instead of 512 columns of B, for few rows (a decode step) or a partial last
m-tile; it is a candidate only where that saves TensorE time, and never for fp8 double-row K
tiles (the note says so). fp8 operands on trn2/trn3 take K tiles of 256 in TensorE's double-row
mode (matmul/fp8.py; not in the third or fourth form). A resident block of a few rows whose K
tiles, loaded one by one, would each be bound by the DMA's fixed phase comes by one DMA of all
of K (``Blocking.whole``, ``_Side.load_whole``: a decode step's x^T); so does a streamed side of
a few such rows (``matmul.plan.stream_whole``), and one row resident in SBUF reaches [128, K/128]
by TensorE transposes where those beat the DMA's fixed phase (``_Side._transpose_row``). A
one-row kernel's streamed weights get a slot for every load (``_stream_ahead``).
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, KOp, MatmulKAttrs
from lowering.tiling.exprgen import ExprGen, count_intermediates
from lowering.tiling.matmul.cells import (Slice, acc_cast, bias_bcast, bias_products, bias_row,
                                          residual_plus_bias,
                                          boff, cell_operands, cell_tile, emit_cells)
from lowering.tiling.matmul.fp8 import KPack, k_pack
from lowering.tiling.matmul.once import load_once, once_tp_bufs, transpose_once
from lowering.tiling.matmul.outres import emit_outres
from lowering.tiling.matmul.prologue import APrologue, Prologue
from lowering.tiling.matmul.plan import (DIRECT, DMA_T, PE_T, RES_T, Blocking, MatmulShape,
                                         SBUF_SHARE, bias_by_products, choose_blocking, ev_dtype,
                                         stream_whole,
                                         cell_tail, footprint, operand_form, staged, AHEAD_SHARE)
from lowering.tiling.matmul.transposed import emit_transposed
from lowering.tiling.stream import paced_pieces, row_by_transposes, stream_loads
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import Tile, TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from lowering.tir.plan import WEIGHT_STREAMS_AHEAD
from runtime_sim.isa import DType, Memory

F32 = DType.FP32
TM, TN, TK = 128, 512, 128
# slots per epilogue tile: a store holds its tile for its whole DMA latency (~2 us), and the
# next group's products wait for the evacuation of their PSUM cell
EPI_BUFS = 4


@dataclass
class _Side:
    """One operand viewed as X[*batch, K, F] (A^T: F = M; B: F = N)."""

    ref: object
    kstride: int
    fstride: int
    F: int
    form: str
    tp_bufs: int = 2      # PSUM slots per TensorE-transpose load site
    pro: Prologue | None = None     # made as its tiles leave PSUM or arrive (matmul/prologue.py)

    def base(self, bidx: tuple[Affine, ...]) -> Affine:
        return self.ref.offset + sum((i * st for i, st in zip(bidx, self.ref.strides[:-2])), aff(0))

    def stage(self, b: TirBuilder, bbase: Affine, f0: Affine, fw: int, K: int, always: bool = False,
              k0: Affine | int = 0, bufs: int = 2, tile: Tile | None = None, tile_off: int = 0):
        """PE_T operands whose rows fit (``matmul.plan.staged``, or any PE_T operand with
        ``always``): rows f0 .. f0+fw of X^T, K columns from ``k0`` (default: all of K), in one
        tile ([128 rows, K] per 128 of fw, one DMA for all of them when every chunk is full), for
        ``load`` to transpose from (its k0 then counts from the staged ``k0``); None otherwise
        (then every K tile loads its own rows). ``tile``: the rows tile to load into (shared
        by several call sites; at element ``tile_off``), default a new one of ``bufs`` slots."""
        r = self.ref
        ok = self.form == PE_T if always else staged(self.form, fw, K, r.dtype.itemsize, b.target)
        if not ok or fw <= 1 or K <= 1:
            return None
        nch = -(-fw // 128)
        rows = tile or b.tile("stage", Memory.SBUF, min(fw, 128), nch * K, r.dtype, bufs)
        base = bbase + aff(k0) * self.kstride
        if fw % 128 == 0:      # every chunk has 128 rows: all of them in one DMA
            b.dma(rows.ap(128, elem_offset=tile_off, dims=((K, nch), (1, K))),
                  hbm_ap(r.buffer, r.dtype, base + f0 * self.fstride, 128, self.fstride,
                         ((nch, 128 * self.fstride), (K, self.kstride))))
            return (rows, K, tile_off)
        for c0, cw in b.tiled(fw, 128, "sg"):
            b.dma(rows.ap(cw, elem_offset=tile_off + c0 // 128 * K, dims=((1, K),)),
                  hbm_ap(r.buffer, r.dtype, base + (f0 + c0) * self.fstride, cw, self.fstride,
                         ((K, self.kstride),)))
        return (rows, K, tile_off)

    def load(self, b: TirBuilder, dst: Tile, dst_off: Affine, bbase: Affine, k0: Affine, kt: int,
             f0: Affine, fw: int, stage=None, psum: TAP | None = None,
             copy_engines: tuple | None = None, kstep: int = 1, j=None) -> None:
        """X[k0:k0+kt, f0:f0+fw] -> dst[0:kt, dst_off : dst_off + fw] (a single row or column
        is a plain strided copy whatever the form); ``stage``: the rows from ``stage``
        (``(tile, K, offset)`` as ``stage`` returns it: row ``f0`` sits ``offset`` elements into
        the tile); ``psum``: where a TensorE transpose of at most 128 rows lands (default: a new tile
        of ``tp_bufs`` slots); ``copy_engines``: the engines its copy out of PSUM may take;
        ``kstep``: the tile's K rows are ``k0, k0 + kstep, ...`` (a K group, see ``_kgroup``);
        ``j``: the K tile's index, for the prologue (``pro``) of an A side."""
        r = self.ref
        ks = self.kstride * kstep
        dap = dst.ap(kt, elem_offset=dst_off, dims=((1, fw),))
        if self.form == DMA_T and fw > 1 and kt > 1:
            n = self.pieces(b, kt, fw, True)
            cw = -(-fw // n)
            for c0 in range(0, fw, cw):
                w = min(cw, fw - c0)
                src = hbm_ap(r.buffer, r.dtype, bbase + (f0 + c0) * self.fstride + k0 * self.kstride, w,
                             self.fstride, ((kt, ks),))
                b.dma(dst.ap(kt, elem_offset=dst_off + c0, dims=((1, w),)), src, transpose=True)
            if self.pro is not None:
                self.pro.make(b, dap, dap, j, kt)
            return
        if self.form in (PE_T, RES_T) and fw > 1 and kt > 1:
            for c0, cw in b.tiled(fw, 128, "t"):
                src = hbm_ap(r.buffer, r.dtype, bbase + (f0 + c0) * self.fstride + k0 * self.kstride,
                             cw, self.fstride, ((kt, ks),))
                rows = b.resident_view(src, cw)      # RES_T: the rows are already in SBUF
                if stage is not None:
                    st, K, off = stage
                    rows = st.ap(cw, elem_offset=off + c0 // 128 * K + k0, dims=((kstep, kt),))
                elif rows is None:
                    t = b.tile("rows", Memory.SBUF, cw, kt, r.dtype, 2)
                    b.dma(t.ap(), src)
                    rows = t.ap()
                tpa = psum if psum is not None else b.tile("tps", Memory.PSUM, kt, cw, F32, self.tp_bufs).ap()
                b.transpose(tpa, rows)
                dcw = dst.ap(kt, elem_offset=dst_off + c0, dims=((1, cw),))
                if self.pro is not None:     # the copy out of PSUM applies the prologue
                    self.pro.make(b, dcw, tpa, j, kt, copy_engines)
                else:
                    b.tensor_copy(dcw, tpa, **({"engines": copy_engines} if copy_engines else {}))
            return
        n = self.pieces(b, kt, fw)
        cw = -(-fw // n)
        for c0 in range(0, fw, cw):
            w = min(cw, fw - c0)
            src = hbm_ap(r.buffer, r.dtype, bbase + k0 * self.kstride + (f0 + c0) * self.fstride, kt,
                         ks, ((w, self.fstride),))
            b.dma(dst.ap(kt, elem_offset=dst_off + c0, dims=((1, w),)), src)
        if self.pro is not None:
            self.pro.make(b, dap, dap, j, kt)

    def pieces(self, b: TirBuilder, p: int, f: int, transpose: bool = False) -> int:
        """Transfers one [p, f] load of this side is cut into along f: weights loaded ahead
        on the weight stream, during earlier kernels (``_ahead``), in ``stream.paced_pieces``,
        so those kernels' small transfers do not wait behind them; anything else whole."""
        if not _ahead(b, self.ref) or b.is_resident(self.ref.buffer) or p < 2:
            return 1
        return paced_pieces(b.target, p, f, self.ref.dtype.itemsize, transpose)

    def packed(self, K: int) -> bool:
        """Rows (F) of K contiguous elements lying back to back, K a multiple of 128: X viewed
        as [F * K/128, 128] rows (``load_whole``)."""
        return self.kstride == 1 and self.fstride == K and K % TK == 0

    def load_whole(self, b: TirBuilder, dst: Tile, bbase: Affine, f0: Affine, fw: int, K: int) -> None:
        """Rows f0 .. f0+fw of X^T, all K tiles, by one DMA (``matmul.plan.whole_block``), K tile
        j at element ``j * fw`` (the layout of one load per K tile): a direct operand by one
        strided DMA; one read by DMA transposes (rows back to back, ``packed``) by one 2-D
        transpose of the rows viewed as [fw * K/128, 128] (row ``f * Kt + j`` is K tile j of row
        f), the destination walked so that it lands at element ``j * fw + f``."""
        r = self.ref
        Kt = K // TK
        if self.form == DIRECT and fw == 1 and self._transpose_row(b, dst, bbase, f0, K):
            pass
        elif self.form == DIRECT:
            b.dma(dst.ap(TK, dims=((1, Kt * fw),)),
                  hbm_ap(r.buffer, r.dtype, bbase + f0 * self.fstride, TK, self.kstride,
                         ((Kt, TK * self.kstride), (fw, self.fstride))))
        else:
            b.dma(dst.ap(TK, dims=((1, fw), (fw, Kt))),
                  hbm_ap(r.buffer, r.dtype, bbase + f0 * self.fstride, fw * Kt, TK, ((TK, 1),)),
                  transpose=True)
        if self.pro is not None:
            with b.loop(Kt, "kw") as j:
                t = dst.ap(TK, elem_offset=j * fw, dims=((1, fw),))
                self.pro.make(b, t, t, j, TK)

    def _transpose_row(self, b: TirBuilder, dst: Tile, bbase: Affine, f0: Affine, K: int) -> bool:
        """``load_whole`` of one row resident in SBUF (a decode step's normed or attended
        activation) by TensorE transposes of its K tiles into one PSUM tile and one copy out,
        instead of an SBUF -> SBUF DMA whose fixed phase lies on the chain of dependent kernels
        (``row_by_transposes``); False (nothing emitted) where that is not cheaper or the row
        is not resident."""
        r = self.ref
        Kt = K // TK
        row0 = bbase + f0 * self.fstride
        views = [b.resident_view(hbm_ap(r.buffer, r.dtype, row0 + j * TK * self.kstride, 1,
                                        self.fstride, ((TK, self.kstride),)), 1)
                 for j in range(Kt)]
        if any(v is None for v in views) or not row_by_transposes(b.target, Kt):
            return False
        ps = b.tile("rowT", Memory.PSUM, TK, Kt, F32, 1)
        for j, v in enumerate(views):
            b.transpose(ps.ap(TK, elem_offset=j, dims=((1, 1),)), v)
        b.tensor_copy(dst.ap(TK, dims=((1, Kt),)), ps.ap(TK, dims=((1, Kt),)))
        return True

    def load_group(self, b: TirBuilder, dst: Tile, bbase: Affine, c: Affine, G: int, f0: Affine,
                   fw: int) -> None:
        """K group ``c`` of a DIRECT operand in one DMA: partition p receives rows
        ``c*G*128 + p*G + g`` (g < G), side by side (K tile ``c*G + g`` at element
        ``(c*G + g) * fw`` of ``dst``): G consecutive rows, one contiguous run of G*fw elements
        when ``fw`` is the whole row."""
        r = self.ref
        n = self.pieces(b, TK, G * fw)
        base = bbase + c * (G * TK) * self.kstride + f0 * self.fstride
        if n > 1 and self.fstride == 1 and self.kstride == fw:
            # the G rows of a partition lie back to back: n runs of them
            w = -(-(G * fw) // n)
            for e0 in range(0, G * fw, w):
                e = min(w, G * fw - e0)
                b.dma(dst.ap(TK, elem_offset=c * (G * fw) + e0, dims=((1, e),)),
                      hbm_ap(r.buffer, r.dtype, base + e0, TK, G * self.kstride, ((e, 1),)))
        else:
            src = hbm_ap(r.buffer, r.dtype, base, TK, G * self.kstride,
                         ((G, self.kstride), (fw, self.fstride)))
            b.dma(dst.ap(TK, elem_offset=c * (G * fw), dims=((1, G * fw),)), src)
        if self.pro is not None:
            for g in range(G):
                t = dst.ap(TK, elem_offset=(c * G + g) * fw, dims=((1, fw),))
                self.pro.make(b, t, t, c * G + g, TK)


def tile_matmul(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, MatmulKAttrs)
    A, Bm, out = k.ins[0], k.ins[1], k.outs[0]
    *batch, M, K = A.shape
    N = Bm.shape[-1]
    if K == 0:
        raise Unsupported("matmul", "contraction size K=0 is not supported")
    if M == 0 or N == 0 or any(n == 0 for n in batch):
        return
    t = b.target
    sa = _Side(A, A.strides[-1], A.strides[-2], M, _form(b, A, A.strides[-1], A.strides[-2], M))
    sb = _Side(Bm, Bm.strides[-2], Bm.strides[-1], N, _form(b, Bm, Bm.strides[-2], Bm.strides[-1], N))
    epi0 = k.attrs.epilogue
    epi, folded = fold_row_bias(k)
    k = KOp(k.kind, k.outs, k.ins, replace(k.attrs, epilogue=epi), k.origin)
    prologue = bool(k.attrs.prologue_inputs)
    used = sorted(epi.loads()) if epi is not None else []
    kp = KPack(k_pack(A.dtype, t))
    no_swap = "fp8 double-row K tiles (matmul/fp8.py)" if kp.pack > 1 else ""
    no_dma_out = ("the output or an epilogue input is resident in SBUF (rows on partitions: "
                  "no column-wise store)" if any(b.is_resident(x.buffer) for x in
                                                 [out] + [k.ins[i] for i in used]) else "")
    shape = MatmulShape(max(1, _prod(batch)), M, N, K, A.dtype, out.dtype, sa.form, sb.form,
                        tuple(k.ins[i].dtype for i in used), _epi_tiles(epi),
                        no_outres=bool(folded) or kp.pack > 1 or prologue, k_pack=kp.pack,
                        no_swap=no_swap, no_dma_out=no_dma_out, a_packed=sa.packed(K),
                        b_packed=sb.packed(K), a_ahead=_ahead(b, A), b_ahead=_ahead(b, Bm),
                        cast_only=_casts_only(epi), acc_cast=acc_cast(epi, out.dtype))
    try:
        best, scored = choose_blocking(shape, t)
    except ValueError as e:
        raise Unsupported(",".join(k.origin) or "matmul", str(e)) from None
    if best.resident != "C" and not best.swap:
        best = _whole_weights(b, shape, best, sa if best.resident == "A" else sb)
    if best.resident != "C":
        best = _stream_ahead(b, shape, best, sb if best.resident == "A" else sa)
    bcast: list[int] = []
    if (folded and best.resident != "C" and not best.swap
            and all(_ahead(b, k.ins[i]) and not b.is_resident(k.ins[i].buffer) for i in folded)
            and not bias_by_products(shape, best, t, len(folded), WEIGHT_STREAMS_AHEAD)):
        bcast, folded = folded, []      # added when evacuating, from one broadcast tile
        epi = _bias_add_rounds(epi0, bcast)
        k = KOp(k.kind, k.outs, k.ins, replace(k.attrs, epilogue=epi), k.origin)
        used = sorted(epi.loads())
        b.note(f"matmul: row bias added when evacuating PSUM, from one [{min(TM, M)}, {N}] "
               f"broadcast tile, not by ones-row products on TensorE (bias_by_products)")
    b.note(f"matmul {'x'.join(map(str, batch)) + ' x ' if batch else ''}[{M}x{K}] @ [{K}x{N}] "
           f"{A.dtype.value}{' double_row' if kp.pack > 1 else ''}: A {sa.form}, B {sb.form}; chose {best}; "
           f"{len(scored)} candidates, next best: " + "; ".join(str(c) for c in scored[1:3]))
    if no_swap:
        b.note(f"matmul: transposed form (B stationary) refused: {no_swap}")
    elif best.swap and no_dma_out:
        b.note(f"matmul: transposed form's short-run store (out=dma) refused: {no_dma_out}")
    if prologue:
        if kp.pack > 1:
            raise Unsupported(",".join(k.origin) or "matmul",
                              "a folded A scale/shift with fp8 double-row operands")
        assert best.resident != "C", "no_outres keeps a prologue out of the third form"
        res, strm, rt = (sa, sb, TM) if best.resident == "A" else (sb, sa, TN)
        sa.pro = APrologue(b, k, K, 1 if best.swap else _kgroup(res, strm, K, best, rt, t))
    if best.swap:
        emit_transposed(b, k, sa, sb, best, used, folded, _epilogue, bias_row, out_ap,
                        ev_dtype(shape))
    elif best.resident == "C":
        emit_outres(b, k, sa, sb, best, used, _epilogue, out_ap)
    else:
        strm = sb if best.resident == "A" else sa
        swhole = stream_whole(shape, best, t)
        once = swhole or transpose_once(shape, best, t, strm)
        if swhole:
            b.note(f"matmul: the streamed side's {-(-shape.K // TK)} K tiles of {strm.F} "
                   f"column(s) by one DMA, read by every block (stream_whole)")
        elif once:
            strm.tp_bufs = once_tp_bufs(shape, best, t)
        ctail = cell_tail(shape, best, t, WEIGHT_STREAMS_AHEAD) if once else 0
        if ctail:
            b.note("matmul: cell-major products, each cell's epilogue under the next cell's "
                   "products (matmul/cells.py)")
        _emit(b, k, sa, sb, best, used, folded, once, kp, tuple(bcast), ctail, swhole)


def _whole_weights(b: TirBuilder, shape: MatmulShape, c: Blocking, res: _Side) -> Blocking:
    """A resident side read from a graph input (weights) keeps every block in its own slot when
    all of them fit: no block load then waits for the products of an earlier block, so the
    whole operand streams in ahead of the kernel (during the kernels before it) instead of
    two blocks ahead and the rest behind the kernel's own products. When they do not fit, as
    many blocks as fit in ``AHEAD_SHARE`` of the kernel's SBUF share (a prefetch distance: an
    LM head's first blocks load during the last layer, then the rest follow its products), the
    partial last block in bytes of its own (``_emit``: as the first slot's tail alias it would
    wait for the products of the block that used that slot last)."""
    buf = b.buffers.get(res.ref.buffer)
    if c.stream or buf is None or buf.role != "input" or b.is_resident(res.ref.buffer):
        return c
    width = c.block * (TM if c.resident == "A" else TN)
    nblocks = -(-res.F // width)
    if nblocks <= c.block_bufs:
        return c
    cap = int(b.target.sbuf_bytes_per_partition * SBUF_SHARE)
    whole = replace(c, block_bufs=nblocks)
    if footprint(shape, whole, b.target)[0] <= cap:
        return whole
    if not _ahead(b, res.ref):      # nothing runs before it to load a prefix during
        return c
    # else a prefix of the blocks in slots of their own, loaded ahead during the kernels
    # before, in at most AHEAD_SHARE of the kernel's share (the partial last block, if any, in
    # bytes of its own: ``_emit``)
    full = res.F // width
    tail = replace(c, block=-(-(res.F - full * width) // (TM if c.resident == "A" else TN)),
                   block_bufs=1) if res.F % width else None
    extra = footprint(shape, tail, b.target)[0] - footprint(shape, replace(tail, block_bufs=0),
                                                               b.target)[0] if tail else 0
    for bufs in range(min(full, nblocks - 1) - 1, c.block_bufs, -1):
        more = replace(c, block_bufs=bufs)
        if footprint(shape, more, b.target)[0] + extra <= cap * AHEAD_SHARE:
            return more
    return c


def _stream_ahead(b: TirBuilder, shape: MatmulShape, c: Blocking, strm: _Side) -> Blocking:
    """A streamed side read from weights (a graph input loaded ahead, ``_ahead``) of a kernel
    with one row (a decode step's projections and MLP: their weights are the streamed side)
    gets a slot for every load, as many as fit ``AHEAD_SHARE`` of the kernel's SBUF share:
    the loads run during the kernels before it (the attention, the norms and the chain of
    one-row kernels, where the DMA engines idle otherwise), up to the lifetimes
    ``tir/plan.py`` gives weight buffers (``WEIGHT_STREAMS_AHEAD``). With a decode step's
    cache loads off the chain (``passes/decode_cache.py`` on) every load ahead measured faster
    than all but the last; with them on the chain (off) all but the last measured faster:
    there the last load, waiting for the kernel's first products, kept the stream at most one
    kernel ahead and the DMA engines (which serve transfers in issue order) free for the cache
    loads on the chain."""
    buf = b.buffers.get(strm.ref.buffer)
    if (c.stream or shape.M != 1 or buf is None or buf.role != "input"
            or b.is_resident(strm.ref.buffer) or not _ahead(b, strm.ref) or shape.k_pack > 1):
        return c
    cap = int(b.target.sbuf_bytes_per_partition * SBUF_SHARE * AHEAD_SHARE)
    for n in range(stream_loads(shape, c), c.stream_bufs, -1):
        more = replace(c, stream_bufs=n)
        if footprint(shape, more, b.target)[0] <= cap:
            b.note(f"matmul: the streamed weights in {n} slots (every load ahead, "
                   f"_stream_ahead)")
            return more
    return c


def _ahead(b: TirBuilder, ref) -> bool:
    """Can the operand's loads run ahead, during earlier kernels (``MatmulShape.a_ahead``)? A
    graph input (weights: the schedule's prefetch queues), unless this kernel opens the
    program (kernel 0: nothing runs before it)."""
    buf = b.buffers.get(ref.buffer)
    return buf is not None and buf.role == "input" and b.prefix != "k0."


def _casts_only(epi: Expr | None) -> bool:
    """No epilogue, or one that only casts the accumulator."""
    return epi is None or (epi.op is EOp.CAST and epi.args[0].op is EOp.ACC)


def _epi_tiles(epi: Expr | None) -> int:
    """SBUF tiles the epilogue evaluates per output tile (``MatmulShape.epi_tiles``): one when
    it only casts the accumulator (``ExprGen`` writes the cast straight into the output tile)."""
    if _casts_only(epi):
        return 1
    return count_intermediates(epi)


def _form(b: TirBuilder, ref, kstride: int, fstride: int, free: int) -> str:
    """``operand_form``, except that rows of a tensor resident in SBUF are transposed on TensorE
    straight from its buffer (``RES_T``) instead of taking a DMA transpose (SBUF -> SBUF, the DMA
    latency on the critical path)."""
    form = operand_form(kstride, fstride, free, ref.dtype, b.target)
    return RES_T if form in (DMA_T, PE_T) and b.is_resident(ref.buffer) else form


def fold_row_bias(k: KOp) -> tuple[Expr | None, list[int]]:
    """``add(acc, bias)`` in the epilogue, where the bias view is the same for every row (stride
    0 along M) and every use of the product is that sum, becomes part of the PSUM accumulation: one more product ``ones[1, M].T @
    bias[1, N]`` per cell, so the bias row is loaded once per group (one partition) instead of
    a [128, 512] broadcast per cell. With one row (M == 1, a decode step) the bias view's row
    stride does not matter: there is no other row for it to differ on, so the row is loaded
    once instead of [1, 512] per output tile on the kernel's chain. Returns (new epilogue,
    folded input indices)."""
    epi = k.attrs.epilogue
    if epi is None:
        return None, []
    folded: list[int] = []

    def walk(x: Expr) -> Expr:
        if x.op is EOp.ADD:
            a, c = x.args
            for acc_side, other in ((a, c), (c, a)):
                if (acc_side.op is EOp.ACC and other.op is EOp.LOAD and other.index >= 2
                        and (k.ins[other.index].strides[-2] == 0 or one_row)
                        and k.ins[other.index].dtype == k.ins[0].dtype and x.dtype.is_float
                        and (other.index in folded or not folded)):
                    if other.index not in folded:    # the same sum may occur more than once
                        folded.append(other.index)
                    hits[0] += 1
                    return Expr(EOp.CAST, (Expr(EOp.ACC),), x.dtype)
        if not x.args:
            return x
        return Expr(x.op, tuple(walk(y) for y in x.args), x.dtype, x.index, x.value)

    one_row = k.ins[0].shape[-2] == 1 and k.outs[0].shape[-2] == 1   # no other row to differ
    hits = [0]
    new = walk(epi)
    if hits[0] != _count_acc(epi):     # the bare product is used too: it must stay bias-free
        return epi, []
    return (new if folded else epi), folded


def _bias_add_rounds(x: Expr, rows: list[int]) -> Expr:
    """``cast(add(acc, row))`` -> ``add(acc, row)`` of the cast's dtype, for the row biases
    ``rows``: one instruction reading PSUM that rounds once, as the cast of the fp32 sum did
    (the simulator computes in fp32 and rounds to the destination's dtype)."""
    if (x.op is EOp.CAST and x.args[0].op is EOp.ADD and x.args[0].dtype is DType.FP32
            and {a.op for a in x.args[0].args} == {EOp.ACC, EOp.LOAD}
            and all(a.index in rows for a in x.args[0].args if a.op is EOp.LOAD)):
        return Expr(EOp.ADD, x.args[0].args, x.dtype)
    if not x.args:
        return x
    return replace(x, args=tuple(_bias_add_rounds(a, rows) for a in x.args))


def _count_acc(x: Expr) -> int:
    return (x.op is EOp.ACC) + sum(_count_acc(a) for a in x.args)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _emit(b: TirBuilder, k: KOp, sa: _Side, sb: _Side, c: Blocking, used: list[int],
          folded: list[int], once: bool = False, kp: KPack = KPack(),
          bcast: tuple[int, ...] = (), ctail: int = 0, swhole: bool = False) -> None:
    """The resident/streamed loop nest; ``once`` (``matmul.once.transpose_once``): the streamed side's K
    tiles are transposed into one tile before the block loop and read by every block; ``kp``:
    the K packing (``matmul.fp8``: fp8 double-row K tiles of 256); ``ctail``: with ``once``,
    the last ``ctail`` K tiles of a group run cell-major (``matmul/cells.py``)."""
    A = k.ins[0]
    *batch, M, K = A.shape
    dt = A.dtype
    res, strm = (sa, sb) if c.resident == "A" else (sb, sa)
    rt, st = (TM, TN) if c.resident == "A" else (TN, TM)      # tile widths: resident, streamed
    Kt = kp.tiles(K)
    TK = kp.tk      # K rows per K tile (256 when packed)
    G = _kgroup(res, strm, K, c, rt, b.target) if kp.pack == 1 else 1
    if G > 1:
        b.note(f"matmul: K in groups of {G} tiles, partition p of group c holding rows "
               f"c*{G * TK} + {G}p .. +{G - 1} ({G * res.F * dt.itemsize} B contiguous per "
               f"partition and DMA)")
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        rbase, sbase = res.base(bidx), strm.base(bidx)
        rows = {fi: bias_row(b, k, fi, bidx) for fi in folded}
        pre = {fi: bias_bcast(b, k, fi, bidx, _ahead(b, k.ins[fi])) for fi in bcast}
        pair = residual_plus_bias(b, k, pre, bidx) if pre and c.resident != "C" else None
        if pair is not None:      # the epilogue as one add reading PSUM (matmul/cells.py)
            k, used = pair
        if swhole:      # one DMA of all K tiles (``matmul.plan.stream_whole``)
            tall = b.tile("strT", Memory.SBUF, TK, Kt * strm.F, dt)
            strm.load_whole(b, tall, sbase, aff(0), strm.F, K)
        elif once:
            tall = load_once(b, strm, sbase, K, G, dt, _ktiles(b, K, G, "kt", TK))
        for r0, rw in b.tiled(res.F, c.block * rt, "blk"):
            if not c.stream:
                # the partial last block of a refilled prefix (``_whole_weights``) in bytes of
                # its own: as a tail alias it would wait for the products of the block that
                # used the first slot last, not of the one ``block_bufs`` before it
                own = rw < c.block * rt and 2 < c.block_bufs < res.F // (c.block * rt)
                blk = b.tile("rtail" if own else "res", Memory.SBUF, kp.parts(TK), Kt * kp.pack * rw,
                             dt, 1 if own else c.block_bufs)
                rstage = res.stage(b, rbase, r0, rw, K)
            if G > 1:
                with b.loop(K // (G * TK), "kr") as cg:
                    res.load_group(b, blk, rbase, cg, G, r0, rw)
            elif c.whole:
                res.load_whole(b, blk, rbase, r0, rw, K)
            else:
                for k0, kt in b.tiled(K, TK, "kr"):
                    if not c.stream:
                        kp.load(res, b, blk, kp.koff(k0, rw), rbase, k0, kt, r0, rw, rw, rstage,
                                j=k0 // TK)
            for s0, sw in b.tiled(strm.F, c.group * st, "grp"):
                nr, ns = -(-rw // rt), -(-sw // st)
                acc = b.tile("acc", Memory.PSUM, TM, nr * ns * TN, F32, c.acc_bufs)
                wide = _wide_rows(b, k, c, rw, sw, bidx, r0, s0)
                nch = -(-K // TK) if G == 1 else K // (G * TK)     # K chunks: tiles or groups
                split = nch - -(-ctail // G) if once and ctail and not c.stream and not wide else nch
                sstage = strm.stage(b, sbase, s0, sw, K)
                for j, k0, kt, ks, first in _ktiles(b, K, G, "k", TK, hi=split):
                    if once:
                        sblk = Slice(tall, j * strm.F)
                    else:
                        sblk = b.tile("str", Memory.SBUF, kp.parts(kt), kp.pack * sw, dt, c.stream_bufs)
                        if ks > 1:    # a K group (never packed)
                            strm.load(b, sblk, aff(0), sbase, k0, kt, s0, sw, sstage, kstep=ks, j=j)
                        else:
                            kp.load(strm, b, sblk, aff(0), sbase, k0, kt, s0, sw, sw, sstage, j=j)
                    if c.stream:      # K too long to keep a block: both sides per K tile
                        blk = b.tile("res", Memory.SBUF, kp.parts(kt), kp.pack * rw, dt, 3)
                        kp.load(res, b, blk, aff(0), rbase, k0, kt, r0, rw, rw, j=j)
                        koff = aff(0)
                    else:
                        koff = j * rw if G > 1 else kp.koff(k0, rw)
                    for i0, iw in b.tiled(rw, rt, "i"):
                        for j0, jw in b.tiled(sw, st, "j"):
                            kp.matmul(b, *cell_operands(kp, c, acc, blk, sblk, kt, koff, i0, iw, j0,
                                                        jw, rw, sw, rt, st, nr, ns), first)
                if split < nch:      # the last K tiles cell-major (matmul/cells.py)
                    emit_cells(b, kp, c, acc, blk, tall, strm.F,
                               lambda: _ktiles(b, K, G, "kc", TK, lo=split),
                               rw, sw, r0, s0, rt, st, nr, ns, [rows[fi] for fi in folded],
                               lambda m0, mt, n0, nt, a: _epilogue(b, k, used, bidx, m0, mt, n0, nt,
                                                                   a, pre=pre))
                    continue
                for fi in folded:
                    bias_products(b, rows[fi], c, acc, r0, rw, s0, sw, rt, st, nr, ns)
                if wide:
                    _wide_epilogue(b, k, used, bidx, c, acc, r0, rw, s0, sw, rt, st, nr, ns, pre)
                    continue
                for i0, iw in b.tiled(rw, rt, "ei"):
                    for j0, jw in b.tiled(sw, st, "ej"):
                        m0, mt, n0, nt, a = cell_tile(c, acc, r0, s0, i0, iw, j0, jw, rt, st, nr, ns)
                        _epilogue(b, k, used, bidx, m0, mt, n0, nt, a, pre=pre)


WIDE_MAX = 8192    # bytes per partition of one wide output tile (``_wide_rows``)


def _wide_rows(b: TirBuilder, k: KOp, c: Blocking, rw: int, sw: int, bidx, r0, s0) -> bool:
    """Store a group's output rows whole (``_wide_epilogue``) when they go to HBM, row-major,
    and one 512-column tile of them is a run shorter than ``GROUP_RUN`` bytes while the group's
    columns fit ``WIDE_MAX``: GPT-2's logits, [128, 50257] bf16, went out as 1 KiB runs."""
    out = k.outs[0]
    nw = sw if c.resident == "A" else rw
    isz = out.dtype.itemsize
    if nw <= TN or out.strides[-1] != 1 or TN * isz >= GROUP_RUN or nw * isz > WIDE_MAX:
        return False
    probe = out_ap(k, bidx, s0 if c.resident == "B" else r0, 1, r0 if c.resident == "B" else s0, 1)
    return b.resident_view(probe, 1) is None


def _wide_epilogue(b: TirBuilder, k: KOp, used: list[int], bidx, c: Blocking, acc, r0, rw: int,
                   s0, sw: int, rt: int, st: int, nr: int, ns: int, pre=None) -> None:
    """The group's epilogue per m-tile into one [mt, all its columns] tile, stored by one DMA
    (runs of the whole group's columns instead of 512 per DMA)."""
    out = k.outs[0]
    if c.resident == "A":        # i: m-tiles (resident), j: n-tiles
        mtiles, ntiles, mb, nb, mstep, nstep = (rw, sw, r0, s0, rt, st)
    else:                        # j: m-tiles (streamed), i: n-tiles
        mtiles, ntiles, mb, nb, mstep, nstep = (sw, rw, s0, r0, st, rt)
    for a0, aw in b.tiled(mtiles, mstep, "wm"):
        wide = b.tile("wide", Memory.SBUF, aw, ntiles, out.dtype, 2)
        for e0, ew in b.tiled(ntiles, nstep, "wn"):
            am, en = a0 // mstep, e0 // nstep
            cell = (am * ns + en) * TN if c.resident == "A" else (am * nr + en) * TN
            into = wide.ap(aw, elem_offset=e0, dims=((1, ew),))
            res = _epilogue(b, k, used, bidx, mb + a0, aw, nb + e0, ew,
                            acc.ap(aw, elem_offset=cell, dims=((1, ew),)), into=into, store=False,
                            pre=pre)
            if res is not None and res.buf != into.buf:
                b.tensor_copy(into, res)
        b.dma(out_ap(k, bidx, mb + a0, aw, nb, ntiles), wide.ap())


GROUP_RUN = 4096   # bytes per partition from which a DMA runs at its full rate (hardware.md DMA:
#                    ">= 2 KiB approaches peak, >= 4 KiB saturates")


def _kgroup(res: _Side, strm: _Side, K: int, c: Blocking, rt: int, t) -> int:
    """K tiles per K group: a resident operand loaded by plain DMAs (``DIRECT``) in one block
    whose rows are shorter than ``GROUP_RUN`` bytes loads G tiles per DMA, partition p of group
    c holding rows ``c*G*128 + p*G + g`` (g < G: consecutive rows, one contiguous run), instead
    of one [128, row] DMA per K tile (rows of 768 bf16: 1.5 KiB runs, each paying the per-run
    DMA overhead). The contraction order does not matter, so K tile ``c*G + g`` is rows
    ``c*G*128 + g + G*p``; the streamed operand reads the same rows (its K tiles transposed on
    TensorE from columns ``G`` apart). G: the smallest divisor of the K tile count whose run
    reaches ``GROUP_RUN`` bytes (all of them when none does); 1 when K has a partial tile or
    the streamed side is not read from SBUF (a strided DMA transpose or load: not attempted)."""
    Kt, run = K // TK, res.F * res.ref.dtype.itemsize
    if (c.stream or res.form != DIRECT or K % TK or Kt < 2 or c.block * rt < res.F
            or res.fstride != 1 or res.kstride != res.F or run >= GROUP_RUN):
        return 1
    st = TN if c.resident == "A" else TM
    # the streamed rows must come from SBUF (resident, or staged whole): loaded per K tile from
    # HBM, columns G apart would be element-sized DMA runs
    if not (strm.form == RES_T or (strm.form == PE_T and staged(
            PE_T, min(strm.F, c.group * st), K, strm.ref.dtype.itemsize, t))):
        return 1
    return next((g for g in range(2, Kt + 1) if Kt % g == 0 and g * run >= GROUP_RUN), Kt)


def _ktiles(b: TirBuilder, K: int, G: int, hint: str, tk: int = TK, lo: int = 0, hi: int | None = None):
    """(tile index, first K row, rows, row step, start_when) of every K tile: the plain tiles
    of ``tk`` rows (the last one partial), or K groups of G full tiles (``_kgroup``) as two
    nested loops; only chunks (tiles, or groups of G) ``lo .. hi`` (default: all), those from
    ``lo > 0`` accumulating onto the earlier ones."""
    n = -(-K // tk) if G == 1 else K // (G * TK)
    hi = n if hi is None else hi
    if hi <= lo:
        return
    if G == 1:
        for k0, kt in b.tiled(min(K, hi * tk) - lo * tk, tk, hint):
            k0 = k0 + lo * tk
            yield k0 // tk, k0, kt, 1, ((1,) if lo else (k0,))
        return
    with b.loop(hi - lo, hint + "c") as c:
        cg = c + lo
        with b.loop(G, hint + "g") as g:
            yield cg * G + g, cg * (G * TK) + g, TK, G, ((1,) if lo else (cg, g))


def _epilogue(b: TirBuilder, k: KOp, used: list[int], bidx, m0: Affine, mt: int, n0: Affine,
              nt: int, acc: TAP, into: TAP | None = None, store: bool = True,
              tr: bool = False, pre: dict | None = None) -> TAP | None:
    """Evaluate the epilogue on one output tile (``acc``: its accumulator) and store it;
    ``into``: an SBUF access of the output's dtype to compute the result into (default: a
    tile of the epilogue's own). ``store=False`` (with ``into``): leave the result there and
    return it for the caller to store (None when the output is resident in SBUF: done).
    ``tr``: the tile is transposed, ``acc`` [nt on partitions, mt] (matmul/transposed.py): N
    runs on partitions and M along the free dim, inputs and output are read and written
    column-wise (never resident: ``MatmulShape.no_dma_out``). ``pre``: inputs already in
    SBUF for the whole kernel (``matmul.cells.bias_bcast``), by input index."""
    out = k.outs[0]
    P, F = (nt, mt) if tr else (mt, nt)
    p0, f0 = (n0, m0) if tr else (m0, n0)

    def strides(x) -> tuple[int, int]:
        """(partition stride, free stride) of ``x``'s last two axes in this tile's layout."""
        return (x.strides[-1], x.strides[-2]) if tr else (x.strides[-2], x.strides[-1])

    loads: dict[int, TAP] = {}
    for i in used:
        if pre and i in pre and not tr:
            loads[i] = pre[i].ap(P, elem_offset=f0, dims=((1, F),))
            continue
        x = k.ins[i]
        ps, fs = strides(x)
        src = hbm_ap(x.buffer, x.dtype, boff(x, bidx) + p0 * ps + f0 * fs, P, ps, ((F, fs),))
        view = None if tr else b.resident_view(src, P)
        if view is not None:
            loads[i] = view
            continue
        if fs == 0 and F > 1:
            # constant along the free dim (a per-tensor or per-row scale, e.g. _scaled_mm's; a
            # row bias in the transposed tile): one element per partition, read with free
            # stride 0 (a [P, F] broadcast DMA would move F chunks per partition)
            tl = b.tile(f"epi{i}c", Memory.SBUF, P, 1, x.dtype, 2)
            b.dma(tl.ap(), hbm_ap(x.buffer, x.dtype, boff(x, bidx) + p0 * ps, P, ps, ()))
            loads[i] = tl.ap(dims=((0, F),))
            continue
        tl = b.tile(f"epi{i}", Memory.SBUF, P, F, x.dtype, 2)
        b.dma(tl.ap(), src)
        loads[i] = tl.ap()

    def leaf(x: Expr) -> TAP:
        if x.op is EOp.ACC:
            return acc
        if x.op is EOp.LOAD:
            return loads[x.index]
        # INDEX over [*B, M, N]: batch fixed; M on partitions and N along the free dim (tr:
        # the other way round)
        tl = b.tile("idx", Memory.SBUF, P, F, x.dtype, 2).ap()
        rank = out.rank
        if x.index == (rank - 1 if tr else rank - 2):
            b.iota(tl, p0, 1, (0,))
        elif x.index == (rank - 2 if tr else rank - 1):
            b.iota(tl, f0, 0, (1,))
        else:
            b.iota(tl, bidx[x.index], 0, (0,))
        return tl

    gen = ExprGen(b, P, (F,), leaf, bufs=EPI_BUFS)
    expr = k.attrs.epilogue if k.attrs.epilogue is not None else Expr(EOp.ACC)
    ops, ofs = strides(out)
    dst = hbm_ap(out.buffer, out.dtype, boff(out, bidx) + p0 * ops + f0 * ofs, P, ops, ((F, ofs),))
    target = None if tr else b.resident_view(dst, P)
    if target is not None:            # the output stays in SBUF: evacuate PSUM straight into it
        gen.tile_of(expr, out.dtype, out=target)
        return None
    if into is not None:
        res = acc if (expr.op is EOp.ACC and acc.dtype == out.dtype) else gen.tile_of(expr, out.dtype, out=into)
        if not store:
            return res
    else:
        res = gen.tile_of(expr, out.dtype)
    if b.buffers[res.buf].memory is Memory.PSUM:  # DMA does not read PSUM: evacuate first
        ev = gen.new(out.dtype)
        b.tensor_copy(ev, res)
        res = ev
    b.dma(dst, res)
    return None


def out_ap(k: KOp, bidx, m0: Affine, mt: int, n0: Affine, nt: int) -> TAP:
    """The HBM access of output rows ``m0 .. m0+mt``, columns ``n0 .. n0+nt``."""
    out = k.outs[0]
    return hbm_ap(out.buffer, out.dtype, boff(out, bidx) + m0 * out.strides[-2]
                  + n0 * out.strides[-1], mt, out.strides[-2], ((nt, out.strides[-1]),))
