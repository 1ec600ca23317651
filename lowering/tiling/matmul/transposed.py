"""Matmul in the transposed form (``Blocking.swap``): ``out^T = B^T A^T`` on TensorE.

TensorE computes ``psum[f, g] (+)= stationary[k, f].T @ moving[k, g]`` in ``max(min(64, f), g)``
cycles (runtime_sim.costs.c_matmul: a new stationary every instruction, its LoadStationary
included in the 64-cycle minimum). The usual form takes A^T tiles as the stationary and B's
512 columns as the moving operand, so with few rows (a decode step, M = 8) every instruction
streams 512 columns to make M rows. Here B tiles [128 k, 128 n] are the stationary operand and
A^T tiles [128 k, <= 512 m] the moving one: an instruction costs max(64, m) cycles for 128
columns of the output, and the cell it accumulates is ``out^T`` [128 n, m]:

    for each block of ``block`` m-tiles of 512:              A^T [K, block*512] resident in SBUF
        for each K tile: load A^T[k, block]                   (the A side's form: DMA transposes,
                                                               or its rows staged and transposed
                                                               on TensorE, ...)
        for each group of ``group`` n-tiles of 128:           cells [128 n, m], a PSUM bank each
            for each chunk of ``kb`` K tiles:
                load B[chunk, group]                          (one DMA when B is read directly)
                for K tile, m-tile, n-tile: matmul(cell, stationary=B[k, n-tile], moving=A^T[k, m-tile])
            a folded row bias: one product bias[1, n-tile].T @ ones[1, m] per cell
            out="pe":  per output tile [<= 128 m, <= 512 n]: its cells' columns copied out of
                       PSUM (one copy), transposed on TensorE side by side into one PSUM bank
                       [m, 512], then the usual epilogue (``matmul._epilogue``) and store
            out="dma": per cell, the epilogue on [n, m] (``matmul._epilogue(tr=True)``) and a
                       store of its columns (element runs: ``runtime_sim.costs`` prices each
                       run at ``dma_min_chunk_bytes``)

Invariants
- A cell accumulates in a PSUM bank of its own (``BANK`` elements apart): TensorE keeps one
  open accumulation group per bank (``runtime_sim.checks.PsumGroups``), and the K loop visits
  every cell of the group once per K tile.
- The copies out of PSUM round to the output type only when the epilogue reads the
  accumulator through casts to that type alone (a bare cast, or ``MatmulShape.acc_cast``:
  ``residual + cast(acc)``; ``matmul.plan.ev_dtype``; the transposes and the epilogue's cast are
  then exact), else they stay fp32: the result is the usual form's, value for value.
- The short-run store reads epilogue inputs and writes the output column-wise in HBM; a tensor
  resident in SBUF has rows on its partitions, so ``out="dma"`` is not a candidate when the
  output or an epilogue input is resident (``MatmulShape.no_dma_out``).
- Partial tiles (M, N, K not multiples of 512 / 128 / 128) are the peeled tails of each loop;
  a partial chunk of ``kb`` K tiles loads its full K tiles in one DMA and its partial one alone.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.tiling.matmul.plan import BANK, DIRECT, TA, TB, Blocking
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import DType, Memory

F32 = DType.FP32
TK = 128
TM, TN = 128, 512          # an output tile of the usual epilogue
BACK_BUFS = 2              # PSUM slots of the transposes back ([<= 128 m, 512 n] each)


def emit_transposed(b: TirBuilder, k, sa, sb, c: Blocking, used: list[int], folded: list[int],
                    epilogue, bias_row, out_ap, ev: DType) -> None:
    """The loop nest above. ``sa``/``sb``: matmul.py's ``_Side`` views of A and B;
    ``epilogue``: ``matmul._epilogue``; ``bias_row``: ``matmul._bias_row``; ``out_ap``:
    ``matmul.out_ap``; ``ev``: the type cells leave PSUM as (``matmul.plan.ev_dtype``)."""
    A = k.ins[0]
    *batch, M, K = A.shape
    N = k.ins[1].shape[-1]
    dt = A.dtype
    Kt = -(-K // TK)
    if c.a_form:
        sa.form = c.a_form
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        abase, bbase = sa.base(bidx), sb.base(bidx)
        rows = {fi: bias_row(b, k, fi, bidx) for fi in folded}
        ones = None
        if folded:
            ones = b.tile("ones", Memory.SBUF, 1, min(M, TA), k.ins[folded[0]].dtype, 1)
            b.memset(ones.ap(), 1.0)
        for r0, rw in b.tiled(M, c.block * TA, "blk"):
            xt = b.tile("resT", Memory.SBUF, TK, Kt * rw, dt, c.block_bufs)
            if c.whole:
                sa.load_whole(b, xt, abase, r0, rw, K)
            else:     # K tile by K tile, in the products' loops (chunks of kb, then tiles):
                # the sync pass then awaits each K tile's own load, not all of them
                stage = sa.stage(b, abase, r0, rw, K)
                for kc0, kcw in b.tiled(K, c.kb * TK, "kr"):
                    for j0, kt in b.tiled(kcw, TK, "krk"):
                        kj = (kc0 + j0) // TK
                        sa.load(b, xt, kj * rw, abase, kc0 + j0, kt, r0, rw, stage, j=kj)
            for s0, sw in b.tiled(N, c.group * TB, "grp"):
                nr, ns = -(-rw // TA), -(-sw // TB)
                acc = b.tile("acc", Memory.PSUM, TB, nr * ns * BANK, F32, c.acc_bufs)
                sstage = sb.stage(b, bbase, s0, sw, K)
                for kc0, kcw in b.tiled(K, c.kb * TK, "kc"):
                    # a partial last chunk takes a tile of its own (as a tail variant of the
                    # chunks' tile it would share their slot and wait for their products)
                    w = (b.tile("wst", Memory.SBUF, TK, c.kb * sw, dt, c.stream_bufs)
                         if kcw == c.kb * TK else b.tile("wtail", Memory.SBUF, TK, kcw // TK * sw + (
                             sw if kcw % TK else 0), dt, 2))
                    _load_chunk(b, sb, w, bbase, kc0, kcw, s0, sw, sstage)
                    for j0, kt in b.tiled(kcw, TK, "kk"):
                        kj = (kc0 + j0) // TK
                        for i0, iw in b.tiled(rw, TA, "i"):
                            for n0, nw in b.tiled(sw, TB, "j"):
                                cell = ((i0 // TA) * ns + n0 // TB) * BANK
                                b.matmul(acc.ap(nw, elem_offset=cell, dims=((1, iw),)),
                                         w.ap(kt, elem_offset=j0 // TK * sw + n0, dims=((1, nw),)),
                                         xt.ap(kt, elem_offset=kj * rw + i0, dims=((1, iw),)),
                                         start_when=(kc0, j0))
                for fi in folded:        # acc[n, m] += bias[n] * 1 (matmul.fold_row_bias)
                    for i0, iw in b.tiled(rw, TA, "bi"):
                        for n0, nw in b.tiled(sw, TB, "bj"):
                            cell = ((i0 // TA) * ns + n0 // TB) * BANK
                            b.matmul(acc.ap(nw, elem_offset=cell, dims=((1, iw),)),
                                     rows[fi].ap(1, elem_offset=s0 + n0, dims=((1, nw),)),
                                     ones.ap(1, dims=((1, iw),)), start_when=(1,))
                if c.out == "pe":
                    _back(b, k, used, bidx, acc, r0, rw, s0, sw, ns, epilogue, out_ap, ev)
                else:
                    _columns(b, k, used, bidx, acc, r0, rw, s0, sw, ns, epilogue)


def _load_chunk(b: TirBuilder, side, w, bbase, kc0, kcw: int, s0, sw: int, stage) -> None:
    """B rows ``kc0 .. kc0 + kcw`` (at most ``kb`` K tiles), columns ``s0 .. s0 + sw``, into
    ``w`` (K tile j at element ``j * sw``): a directly read B loads its full K tiles in one DMA
    (partition p of tile j holding row ``kc0 + 128 j + p``: runs of ``sw`` elements); any other
    form, and a partial K tile, K tile by K tile (``_Side.load``)."""
    full, rem = divmod(kcw, TK)
    if side.form == DIRECT and full > 1:
        r = side.ref
        b.dma(w.ap(TK, dims=((1, full * sw),)),
              hbm_ap(r.buffer, r.dtype, bbase + kc0 * side.kstride + s0 * side.fstride, TK,
                     side.kstride, ((full, TK * side.kstride), (sw, side.fstride))))
        if rem:
            side.load(b, w, full * sw, bbase, kc0 + full * TK, rem, s0, sw)
        return
    for j0, kt in b.tiled(kcw, TK, "kl"):
        side.load(b, w, j0 // TK * sw, bbase, kc0 + j0, kt, s0, sw, stage)


def _back(b: TirBuilder, k, used, bidx, acc, r0, rw: int, s0, sw: int, ns: int, epilogue, out_ap,
          ev: DType) -> None:
    """``out="pe"``: per output tile [<= 128 m, <= 512 n] of the group, the columns of its cells
    (up to four n-tiles) copied out of PSUM in one instruction (the full n-tiles; a partial one
    alone), each transposed on TensorE into its 128 columns of one PSUM bank, and the usual
    epilogue on that bank, into one tile of the group's columns per 128 rows, stored by one DMA
    (a store per output tile would pay a DMA's fixed phase each, one after another on its
    queue). An output resident in SBUF is written by the epilogue itself."""
    out = k.outs[0]
    for i0, iw in b.tiled(rw, TA, "bi"):
        for c0, cw in b.tiled(iw, TM, "bc"):
            m0 = r0 + i0 + c0
            resident = b.resident_view(out_ap(k, bidx, m0, cw, s0, 1), cw) is not None
            wide = None if resident else b.tile("wideT", Memory.SBUF, cw, sw, out.dtype, 2)
            for e0, ew in b.tiled(sw, TN, "be"):
                full, rem = divmod(ew, TB)
                parts = full + (1 if rem else 0)
                back = b.tile("back", Memory.PSUM, cw, TN, F32, BACK_BUFS)
                evt = b.tile("evT", Memory.SBUF, TB, parts * cw, ev, 2)
                cell0 = ((i0 // TA) * ns + e0 // TB) * BANK + c0
                if full:
                    b.tensor_copy(evt.ap(TB, dims=((1, full * cw),)),
                                  acc.ap(TB, elem_offset=cell0, dims=((BANK, full), (1, cw))))
                if rem:
                    b.tensor_copy(evt.ap(rem, elem_offset=full * cw, dims=((1, cw),)),
                                  acc.ap(rem, elem_offset=cell0 + full * BANK, dims=((1, cw),)))
                for q in range(parts):
                    qw = TB if q < full else rem
                    b.transpose(back.ap(cw, elem_offset=q * TB, dims=((1, qw),)),
                                evt.ap(qw, elem_offset=q * cw, dims=((1, cw),)))
                tile = back.ap(cw, dims=((1, ew),))
                if wide is None:
                    epilogue(b, k, used, bidx, m0, cw, s0 + e0, ew, tile)
                    continue
                into = wide.ap(cw, elem_offset=e0, dims=((1, ew),))
                res = epilogue(b, k, used, bidx, m0, cw, s0 + e0, ew, tile, into=into, store=False)
                if res is not None and res.buf != into.buf:
                    b.tensor_copy(into, res)
            if wide is not None:
                b.dma(out_ap(k, bidx, m0, cw, s0, sw), wide.ap())


def _columns(b: TirBuilder, k, used, bidx, acc, r0, rw: int, s0, sw: int, ns: int, epilogue) -> None:
    """``out="dma"``: the epilogue on each cell [n, m] (``matmul._epilogue(tr=True)``), the
    full n-tiles of an m-tile side by side in one tile and stored by one DMA (partition p of
    n-tile j writing column ``128 j + p`` of every row: element runs), a partial n-tile alone."""
    out = k.outs[0]
    so_n, so_m = out.strides[-1], out.strides[-2]
    full, rem = divmod(sw, TB)
    for i0, iw in b.tiled(rw, TA, "ei"):
        if full:
            wide = b.tile("colT", Memory.SBUF, TB, full * iw, out.dtype, 2)
            with b.loop(full, "ej") as jn:
                cell = ((i0 // TA) * ns + jn) * BANK
                into = wide.ap(TB, elem_offset=jn * iw, dims=((1, iw),))
                res = epilogue(b, k, used, bidx, r0 + i0, iw, s0 + jn * TB, TB,
                               acc.ap(TB, elem_offset=cell, dims=((1, iw),)), into=into,
                               store=False, tr=True)
                if res.buf != into.buf:
                    b.tensor_copy(into, res)
            base = out.offset + sum((i * st for i, st in zip(bidx, out.strides[:-2])), 0)
            b.dma(hbm_ap(out.buffer, out.dtype, base + (r0 + i0) * so_m + s0 * so_n, TB, so_n,
                         ((full, TB * so_n), (iw, so_m))), wide.ap())
        if rem:
            cell = ((i0 // TA) * ns + full) * BANK
            epilogue(b, k, used, bidx, r0 + i0, iw, s0 + full * TB, rem,
                     acc.ap(rem, elem_offset=cell, dims=((1, iw),)), tr=True)
