"""Matmul with the output block resident in SBUF (``Blocking.resident == "C"``).

When the operand blocks that PSUM can accumulate at once are too small to keep HBM traffic
down (trn1's slow DMA: a resident A block of 4 m-tiles re-reads B eight times for M=4096), the
output block stays in SBUF as fp32 accumulators and both operands stream in chunks of K, as the
NKI matmul tutorial's fastest kernel does:

    for each block of ``block`` m-tiles x ``group`` n-tiles:   accumulators [block x group] in SBUF
        chunk 0:          load, products, acc[m, n] = psum            (a copy: no zeroing)
        chunks 1 .. C-2:  a loop over pairs of chunks (one per half of the chunk tiles):
                          load, products, acc[m, n] += psum           (VectorE / GpSimdE)
        chunk C-1:        load, products, acc[m, n] += psum, and at once per cell
                          epilogue(acc) into the accumulator's own bytes; one store per m-tile

A is read N / (group * 512) times and B M / (block * 128) times, whatever the PSUM size; the
price is one [128, 512] fp32 add per cell and chunk. What keeps TensorE busy across blocks:
- every tile (accumulators, the two-half chunk tiles, the staged rows of a TensorE-transposed
  side, the PSUM banks) is allocated once for all blocks, so the next block's first chunk loads
  while this block's last chunk computes, and a cell of the next block waits only for its own
  m-tile's store (no memset pass, no epilogue tiles);
- the results of an m-tile are packed side by side over the fp32 bytes of cells already
  evacuated (cell j at j * 512 output elements), so a store moves rows of ``group * 512``
  contiguous elements (the DMA's per-run cost paid once per row, not once per 512);
- A^T is built one chunk ahead: the next chunk's rows (staged two chunks ahead, two slots)
  are transposed between this chunk's m-tiles, their copies out of PSUM alternating ScalarE /
  GpSimdE, so the transposes never hold TensorE;
- along a row of blocks (same m-block) the chunk order alternates (``snake``): a block starts
  with the chunk its predecessor ended with, whose A^T and the next chunk's staged rows are
  still in place, so the seam between blocks loads and transposes no A at all.
The chunks of a block and the blocks of a row are pipelines of one stage on the tile IR's
construct (``lowering/tir/pipelined.py``: the first one alone, a loop over pairs, the rest).
Invariants: chunk ``c`` keeps its A^T in half ``c % 2`` and its rows in slot ``c % 2``, the
chunk at position ``p`` of a block its B in half ``p % 2`` (static offsets, so the sync pass
sees the halves apart; an even number of chunks keeps the B halves apart at the seams, else no
snake); a partial last chunk or block uses the first elements of the full shapes; the cells of an m-tile are unrolled, their PSUM reads alternating GpSimdE / VectorE and
their banks taken in turn, the m-tiles a loop; a row bias folded into the PSUM accumulation
(``fold_row_bias``) does not take this form (``MatmulShape.no_outres``).
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.tiling.matmul.plan import PE_T, RES_T, Blocking
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder
from lowering.tir.pipelined import Stage, pipelined
from runtime_sim.isa import AluOp, DType, EngineKind, Memory

F32 = DType.FP32
TM, TN, TK = 128, 512, 128
# GpSimdE cannot access PSUM (runtime_sim.checks): a partial product's first copy out of PSUM
# alternates ScalarE / VectorE, its adds (tensor_tensor: VectorE or GpSimdE) run on VectorE
COPY_ENGINES = (EngineKind.SCALAR, EngineKind.VECTOR)
# the copies out of PSUM of consecutive transposes alternate ScalarE / VectorE
TP_COPY_ENGINES = ((EngineKind.SCALAR,), (EngineKind.VECTOR,))
TP_BUFS = 4     # PSUM slots per TensorE-transpose load site (the transposes sit between products)
# a block's K chunks, one stage each (A^T of the next chunk is transposed inside a chunk's step)
CHUNK_STAGES = (Stage("chunk", 0, same_schedule=False),)
# a row of output blocks, one stage each (the next block's first chunk loads under this one's last)
BLOCK_STAGES = (Stage("block", 0, same_schedule=False),)


def _pieces(n: int, step: int) -> list[tuple[int, int]]:
    return [(i, min(step, n - i)) for i in range(0, n, step)]


def emit_outres(b: TirBuilder, k, sa, sb, c: Blocking, used: list[int], epilogue, out_ap) -> None:
    """The loop nest above; ``sa``/``sb`` are matmul.py's ``_Side`` views of A and B,
    ``epilogue(b, k, used, bidx, m0, mt, n0, nt, acc_ap, into_ap, store)`` evaluates one cell
    (``matmul._epilogue``), ``out_ap(k, bidx, m0, mt, n0, nt)`` is the output's HBM access."""
    A = k.ins[0]
    *batch, M, K = A.shape
    N = k.ins[1].shape[-1]
    dt = A.dtype
    chunk = min(K, c.kacc * TK)
    chunks = _pieces(K, chunk)
    kts = -(-chunk // TK)
    out_dt = k.outs[0].dtype
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        abase, bbase = sa.base(bidx), sb.base(bidx)
        # one allocation of every tile for all blocks: the next block's first chunk loads
        # while this block's last chunk computes (a new allocation per block would wait for
        # every access of the previous one)
        rw_max, sw_max = min(M, c.block * TM), min(N, c.group * TN)
        acc = b.tile("accs", Memory.SBUF, TM, -(-rw_max // TM) * -(-sw_max // TN) * TN, F32, 1)
        # PSUM banks taken by the cells in turn (the cells are unrolled: the rotation is explicit)
        banks = [b.tile(f"ps{i}", Memory.PSUM, TM, TN, F32, 1) for i in range(c.acc_bufs)]
        oa = _Operand(b, sa, "ach", kts, chunks[0][1], rw_max, dt, row_slots=2)
        ob = _Operand(b, sb, "bch", kts, chunks[0][1], sw_max, dt)
        W = c.group * TN
        nfull, tail = divmod(N, W)
        modes = snake(nfull + (1 if tail else 0), len(chunks))

        def block(r0, rw, s0, sw, mode):
            _block(b, k, used, epilogue, out_ap, bidx, abase, bbase, acc, banks, oa, ob,
                   out_dt, chunks, r0, rw, s0, sw, *mode)

        for r0, rw in b.tiled(M, c.block * TM, "cm"):
            # the n-blocks of a row of blocks: the first, then pairs (one loop: the modes after
            # the first repeat with period two), the rest
            def body(j: int | Affine, slot: int, r0=r0, rw=rw):
                if isinstance(j, int):
                    return {"block": lambda: block(r0, rw, aff(j * W), W, modes[j])}
                e = 1 + (slot - 1) % 2      # the static block of this parity in the loop (1, 2)
                return {"block": lambda: block(r0, rw, j * W, W, modes[e])}

            if nfull:
                pipelined(b, nfull, BLOCK_STAGES, body, depth=2, hint="cn", loop_from=1,
                          one_slot=False)
            if tail:
                block(r0, rw, aff(nfull * W), tail, modes[nfull])


class _Operand:
    """One side's tiles for the chunks of a block: the chunk tile (two halves, chunk ``i`` in
    half ``i % 2``: explicit double buffering, the same bytes whatever the call site), the
    staged rows of a TensorE-transposed side (two slots, chunk ``i`` in slot ``i % 2``) and its
    PSUM transpose slots."""

    def __init__(self, b: TirBuilder, side, name: str, kts: int, chunk: int, f: int, dt: DType,
                 row_slots: int = 1):
        self.side, self.f, self.kts, self.chunk = side, f, kts, chunk
        self.tile = b.tile(name, Memory.SBUF, TK, 2 * kts * f, dt, 1)
        self.tp = side.form in (PE_T, RES_T) and f > 1 and chunk > 1
        self.slot_elems = -(-f // TM) * chunk
        self.rows = (b.tile(f"{name}_rows", Memory.SBUF, min(f, TM), row_slots * self.slot_elems, dt, 1)
                     if self.tp and side.form == PE_T else None)
        self.tps = b.tile(f"{name}_tp", Memory.PSUM, TK, TP_BUFS * TM, F32, 1) if self.tp else None

    def fill(self, b: TirBuilder, base: Affine, kc0: Affine, kcw: int, half: int, f0: Affine,
             fw: int) -> None:
        """Chunk ``[kc0, kc0 + kcw)`` of rows ``f0 .. f0 + fw`` into ``half`` (``fw`` at most
        the block's ``f``: a partial block uses the first ``fw`` columns of each K tile)."""
        side, f, off = self.side, self.f, half * self.kts * self.f
        if not self.tp:
            for k0, kt in b.tiled(kcw, TK, "kl"):
                side.load(b, self.tile, off + k0 // TK * f, base, kc0 + k0, kt, f0, fw)
            return
        self.stage(b, base, kc0, kcw, 0, f0, fw)
        for c0, cw in b.tiled(fw, TM, "tr"):
            self.transpose(b, base, kc0, kcw, half, 0, f0, fw, c0, cw)

    def stage(self, b: TirBuilder, base: Affine, kc0: Affine, kcw: int, slot: int, f0: Affine,
              fw: int) -> None:
        """The rows of chunk ``[kc0, kc0 + kcw)`` into row slot ``slot`` (PE_T; else nothing)."""
        if self.rows is not None:
            self.side.stage(b, base, f0, fw, kcw, always=True, k0=kc0, tile=self.rows,
                            tile_off=slot * self.slot_elems)

    def transpose(self, b: TirBuilder, base: Affine, kc0: Affine, kcw: int, half: int, slot: int,
                  f0: Affine, fw: int, c0: Affine, cw: int) -> None:
        """Rows ``f0 + c0 .. + cw`` (of the block's ``fw``) of chunk ``[kc0, kc0 + kcw)``
        (staged in row slot ``slot``, or resident) transposed into ``half``: its K tiles
        unrolled, taking the PSUM slots in turn, their copies out of PSUM alternating ScalarE /
        GpSimdE. A single row or K column is a plain copy from HBM (``_Side.load``)."""
        f, off = self.f, half * self.kts * self.f
        staged = self.rows is not None and fw > 1 and kcw > 1     # as _Side.stage decides
        for j, (k0, kt) in enumerate(_pieces(kcw, TK)):
            ps = self.tps.ap(kt, elem_offset=j % TP_BUFS * TM, dims=((1, cw),))
            via_rows = staged and cw > 1 and kt > 1
            st = (self.rows, kcw, slot * self.slot_elems + c0 // TM * kcw) if via_rows else None
            self.side.load(b, self.tile, off + k0 // TK * f + c0, base, k0 if via_rows else kc0 + k0,
                           kt, f0 + c0, cw, st, ps, TP_COPY_ENGINES[j % 2])

    def ap(self, kt: int, half: int, k0: Affine, f0: int, fw: int):
        return self.tile.ap(kt, elem_offset=half * self.kts * self.f + k0 // TK * self.f + f0,
                            dims=((1, fw),))


def _block(b, k, used, epilogue, out_ap, bidx, abase, bbase, acc, banks, oa, ob, out_dt, chunks,
           r0, rw, s0, sw, reverse: bool = False, reuse: bool = False) -> None:
    """One output block: its first chunk copies the products into the accumulators (no
    zeroing: a cell waits only for its own store of the previous block), the middle chunks add
    (a loop over pairs of chunks), the last adds and hands every cell to the epilogue at once
    (the stores run under the last chunk's products). ``reverse``: the chunks in descending
    order. ``reuse``: the previous block had the same rows of A and ended with this block's
    first chunk, so its A^T (and the staged rows of the next chunk) are in place."""
    ns = -(-sw // TN)
    chunk = chunks[0][1]
    C = len(chunks)
    width = [w for _, w in chunks]
    order = list(range(C))[::-1] if reverse else list(range(C))
    sgn = -1 if reverse else 1

    def step(pos: int, c: int, kc0: Affine) -> None:
        """Position ``pos`` of the block, chunk ``c`` (static parity and width; ``kc0`` its K
        offset, affine in a loop): A^T in half ``c % 2``, B in half ``pos % 2``."""
        kcw, ah, bh = width[c], c % 2, pos % 2
        last = pos == C - 1
        nxt = order[pos + 1] if pos + 1 < C else None
        nxt2 = order[pos + 2] if pos + 2 < C else None
        if pos == 0 and not reuse:
            if oa.tp:
                oa.stage(b, abase, kc0, kcw, ah, r0, rw)
                if nxt is not None:
                    oa.stage(b, abase, kc0 + sgn * chunk, width[nxt], nxt % 2, r0, rw)
                for c0, cw in b.tiled(rw, TM, "tr"):
                    oa.transpose(b, abase, kc0, kcw, ah, ah, r0, rw, c0, cw)
        if oa.tp:
            # A^T one chunk ahead: the next chunk's rows transposed between this chunk's
            # m-tiles (the copies out of PSUM never hold TensorE), rows staged two ahead
            if nxt2 is not None:
                oa.stage(b, abase, kc0 + 2 * sgn * chunk, width[nxt2], nxt2 % 2, r0, rw)
        elif not (pos == 0 and reuse):
            oa.fill(b, abase, kc0, kcw, ah, r0, rw)
        ob.fill(b, bbase, kc0, kcw, bh, s0, sw)
        # a loop over groups of m-tiles, their cells unrolled (static): enough m-tiles per
        # iteration that the cells take every PSUM bank in turn (one n-tile per block would
        # otherwise put every cell on one bank, each product waiting for the previous cell's
        # add), their PSUM reads alternating GpSimdE / VectorE (one engine alone falls behind
        # TensorE at two K tiles per chunk)
        per = max(1, len(banks) // ns)
        for g0, gw in b.tiled(rw, TM * per, "ci"):
            for ui, (o, iw) in enumerate(_pieces(gw, TM)):
                i0 = g0 + o
                if oa.tp and nxt is not None:
                    oa.transpose(b, abase, kc0 + sgn * chunk, width[nxt], nxt % 2, nxt % 2, r0, rw,
                                 i0, iw)
                row = i0 // TM * ns
                results = []
                for cj, (j0, jw) in enumerate(_pieces(sw, TN)):
                    n = row + cj
                    dst = banks[(ui * ns + cj) % len(banks)].ap(iw, dims=((1, jw),))
                    for k0, kt in b.tiled(kcw, TK, "kk"):
                        b.matmul(dst, oa.ap(kt, ah, k0, i0, iw), ob.ap(kt, bh, k0, j0, jw),
                                 start_when=(k0,))
                    cell = acc.ap(iw, elem_offset=n * TN, dims=((1, jw),))
                    if pos == 0:
                        b.tensor_copy(cell, dst, engines=(COPY_ENGINES[(ui * ns + cj) % 2],))
                    else:
                        b.tensor_tensor(cell, cell, dst, AluOp.ADD, engines=(EngineKind.VECTOR,))
                    if last:
                        # the result into the accumulators' bytes, the m-tile's cells packed side
                        # by side (cell j at j * 512 output elements: the fp32 bytes of cells
                        # j/2 .. j-1, whose results left already), so one DMA of contiguous rows
                        # stores the m-tile (runs of ``sw`` elements, not 512)
                        into = acc.ap(iw, elem_offset=row * TN + cj * TN * out_dt.itemsize // 4,
                                      dims=((1, jw),), dtype=out_dt)
                        res = epilogue(b, k, used, bidx, r0 + i0, iw, s0 + j0, jw, cell, into, False)
                        results.append(res)
                if last and all(r is not None for r in results):
                    b.dma(out_ap(k, bidx, r0 + i0, iw, s0, sw),
                          acc.ap(iw, elem_offset=row * TN, dims=((1, sw),), dtype=out_dt))
                elif last:
                    assert not any(results), "an m-tile's cells are either all resident or all stored"

    # positions 1 .. L in a loop over pairs: those whose next two chunks exist and are full
    # (the same code every iteration); the rest one by one; a position's halves by its parity
    full = [p for p in range(1, C) if p + 2 < C and all(width[order[q]] == chunk for q in (p, p + 1, p + 2))]
    L = 0
    while L + 1 in full:
        L += 1

    def body(pos: int | Affine, slot: int):
        if isinstance(pos, int):
            return {"chunk": lambda: step(pos, order[pos], aff(order[pos] * chunk))}
        e = 1 + (slot - 1) % 2          # the static position of this parity in the loop (1, 2)
        return {"chunk": lambda: step(e, order[e], (pos - e) * (sgn * chunk) + order[e] * chunk)}

    pipelined(b, C, CHUNK_STAGES, body, depth=2, hint="kp", uniform=L + 1, loop_from=1,
              one_slot=False)


def snake(n_blocks: int, chunks: int) -> list[tuple[bool, bool]]:
    """(reverse, reuse) of each block along one row of blocks: the chunk order alternates, so
    a block starts with the chunk its predecessor ended with and keeps its A^T (an even number
    of chunks keeps the B halves apart at the seam; fewer than four chunks: no gain)."""
    if chunks < 4 or chunks % 2:
        return [(False, False)] * n_blocks
    return [(j % 2 == 1, j > 0) for j in range(n_blocks)]
