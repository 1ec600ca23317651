"""The streamed side of a matmul transposed once, up front (``matmul._emit``): resident rows
(``RES_T``) streamed as one group have all their K tiles transposed first, side by side in one
tile (``strT``) that every block reads; whether to (``transpose_once``), how many PSUM slots the
transposes take (``once_tp_bufs``), and the loads themselves (``load_once``).

Invariants
- ``strT`` holds K tile ``j`` at element ``j * F`` of every partition (F: the side's rows).
- The unrolled form (at most ``UNROLL_KT`` K tiles) writes the same bytes as the looped one.
"""
from __future__ import annotations

from lowering.tiling.matmul.plan import PE_T, RES_T, SBUF_SHARE, Blocking, MatmulShape, footprint
from lowering.tir.affine import aff
from lowering.tir.builder import Tile, TirBuilder
from runtime_sim.isa import DType, Memory

TM, TN, TK = 128, 512, 128


def transpose_once(shape: MatmulShape, c: Blocking, t, strm) -> bool:
    """Resident rows (``RES_T``) streamed as one group: transpose all their K tiles first, side
    by side in one tile that every block reads (instead of ``stream_bufs`` slots re-filled per
    block and K tile), when that tile fits next to the rest of the kernel. TensorE then runs
    the transposes back to back, their PSUM copies pipelined behind them, and the products
    without waiting for a copy (and with several blocks each K tile is transposed once instead
    of once per block)."""
    st = TN if c.resident == "A" else TM
    if strm.form != RES_T or c.stream or strm.F > c.group * st or shape.K <= TK or shape.k_pack > 1:
        return False
    isz = shape.dtype.itemsize
    extra = -(-shape.K // TK) * strm.F * isz - c.stream_bufs * strm.F * isz
    return footprint(shape, c, t)[0] + max(0, extra) <= int(t.sbuf_bytes_per_partition * SBUF_SHARE)


UNROLL_KT = 8        # K tiles up to which the up-front transposes are unrolled (``load_once``:
#                      each waits for its own piece only, so fc1's first transpose no longer waits
#                      for the norm's last column piece, and TensorE keeps its speed, above the
#                      power ramp's 50% utilisation, across the norm)
ONCE_TP_BUFS = 4     # PSUM slots of the up-front transposes (``once_tp_bufs``), at most


def once_tp_bufs(shape: MatmulShape, c: Blocking, t) -> int:
    """PSUM slots for the streamed side's up-front transposes (``transpose_once``): with two,
    TensorE waits for the copy out of PSUM of the transpose two before each one (a round trip
    through the copy engine per K tile, on the chain between two kernels); deeper, it runs
    ahead and the copies follow. Up to ``ONCE_TP_BUFS``, never more than the K tiles, and
    only in PSUM banks the blocking leaves free beside its accumulators (``footprint`` counts
    two transpose slots)."""
    Kt = -(-shape.K // TK)
    spare = t.psum_banks - footprint(shape, c, t)[1]
    return max(2, min(ONCE_TP_BUFS, Kt, 2 + spare))


def load_once(b: TirBuilder, strm, sbase, K: int, G: int, dt: DType, ktiles) -> Tile:
    """Every K tile of ``strm`` (a ``matmul._Side``) into one ``strT`` tile, by ``strm.load``
    per K tile of ``ktiles`` (``matmul._ktiles``: a loop, or K groups); unrolled for TensorE
    transposes of at most ``UNROLL_KT`` plain K tiles: each then waits only for its own rows (a
    loop's first transpose waits for every statement that writes the rows: a layer norm's
    column pieces on two engines), its PSUM cells in turn in one tile."""
    Kt = -(-K // TK)
    tall = b.tile("strT", Memory.SBUF, TK, Kt * strm.F, dt)
    if G == 1 and strm.form in (PE_T, RES_T) and strm.F <= TK and Kt <= UNROLL_KT:
        cells = b.tile("tps", Memory.PSUM, TK, strm.tp_bufs * strm.F, DType.FP32, 1)
        for j in range(Kt):
            kt = min(TK, K - j * TK)
            strm.load(b, tall, aff(j * strm.F), sbase, aff(j * TK), kt, aff(0), strm.F, j=j,
                      psum=cells.ap(kt, elem_offset=j % strm.tp_bufs * strm.F, dims=((1, strm.F),)))
        return tall
    for j, k0, kt, ks, _ in ktiles:
        strm.load(b, tall, j * strm.F, sbase, k0, kt, aff(0), strm.F, kstep=ks, j=j)
    return tall
