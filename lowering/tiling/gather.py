"""Tiling of GATHER kernels: index tiles by DMA, one indirect DMA per tile of up to 128 lookups,
the gathered rows stored by DMA.

The lookup space (the index's shape) is collapsed over the three operands that walk it (index,
output, table lock-step axes); its largest axis goes on partitions in tiles of up to 128 lookups,
the others are outer loops. Each row tile loads its ``[p, 1]`` index tile once (three slots,
so the next tile's index load overlaps this tile's gather), then gathers the rows in column
chunks of at most ``ROW_CHUNK_BYTES`` per partition (the innermost row axis; outer row axes, if
the row is not collapsible to one axis, are loops) and stores each chunk. Engines: DMA only.

Invariants
- Every lookup of the index is gathered exactly once per row element: the row tiles and chunks
  cover the lookup space x the row exactly once (``TirBuilder.tiled``).
- The table access of an indirect DMA spans the whole table range its lookups may touch (the
  lock-step dims of this tile, the indexed axis of size ``bound``, the row chunk), so the sync
  pass orders it after every earlier write of any table byte; no value is computed on an engine,
  so integer indices from graph inputs are exact.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.kir import GatherKAttrs, KOp
from lowering.tiling.layout import collapse, plan_rows
from lowering.tir.affine import aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import DmaGatherAttrs, EngineKind, Memory, Op

ROW_CHUNK_BYTES = 16 * 1024   # per partition for one gathered-row tile (three slots rotate)
IDX_BUFS = 3
ROW_BUFS = 3


def tile_gather(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, GatherKAttrs)
    table, index = k.ins
    out = k.outs[0]
    n = k.attrs.axis
    assert n == index.rank and table.shape[n] == k.attrs.bound, (k.attrs, table, index)
    if out.numel == 0:
        return
    for it, p, c, dense, tab in row_chunks(b, index, out, table, n, k.attrs.bound, "g"):
        rows = b.tile("grow", Memory.SBUF, p, c, table.dtype, ROW_BUFS)
        b.emit(Op.DMA_GATHER, rows.ap(), (tab, it), DmaGatherAttrs(), engines=(EngineKind.DMA,))
        b.dma(dense, rows.ap())


def row_chunks(b: TirBuilder, index, dense, table, n: int, bound: int, tag: str):
    """The lookup tiles and row chunks of an indirect DMA over ``table`` (indexed axis ``n`` of
    size ``bound``) with ``dense`` the rows in lookup order (the gather's output, the scatter's
    data): yields ``(index tile, lookups p, chunk columns c, dense chunk in HBM, table access)``
    inside the loops that walk them (the index tile loaded once per lookup tile)."""
    P = b.target.sbuf_partitions
    isz = table.dtype.itemsize
    # lookup space: operands (index, dense, table lock-step)
    plan = plan_rows(index.shape, (), [index.strides, dense.strides[:n], table.strides[:n]],
                     [index.offset, dense.offset, table.offset])
    # row space: operands (dense, table); the innermost collapsed axis is the chunked row dim
    rshape, rsts = collapse(tuple(dense.shape[n:]), [dense.strides[n:], table.strides[n + 1:]])
    row_axes = [(rshape[i], (rsts[0][i], rsts[1][i])) for i in range(len(rshape))]
    *row_outer, last = row_axes if row_axes else [(1, (1, 1))]
    rlen, (drs, trs) = last
    chunk = max(1, ROW_CHUNK_BYTES // isz)
    vstride = table.strides[n]
    with ExitStack() as es:
        bases = [aff(x) for x in plan.bases]
        for size, st in plan.outer:
            v = es.enter_context(b.loop(size, "o"))
            bases = [bk + v * st[j] for j, bk in enumerate(bases)]
        irs, drs_p, trs_p = plan.row_strides
        for r0, p in b.tiled(plan.rows, P, "r"):
            it = b.tile(f"{tag}idx", Memory.SBUF, p, 1, index.dtype, IDX_BUFS)
            b.dma(it.ap(), hbm_ap(index.buffer, index.dtype, bases[0] + r0 * irs, p, irs, ()))
            with ExitStack() as es2:
                dbase = bases[1] + r0 * drs_p
                tbase = bases[2] + r0 * trs_p
                for size, (sd, st) in row_outer:
                    v = es2.enter_context(b.loop(size, "w"))
                    dbase, tbase = dbase + v * sd, tbase + v * st
                for c0, c in b.tiled(rlen, chunk, "c"):
                    row = ((trs, c),) if row_axes else ()
                    tab = TAP(table.buffer, 0, 1, (tbase + c0 * trs) * isz,
                              ((trs_p, p), (0, 1), (vstride, bound)) + row, table.dtype)
                    dense_ap = hbm_ap(dense.buffer, dense.dtype, dbase + c0 * drs, p, drs_p,
                                      ((c, drs),))
                    yield it.ap(), p, c, dense_ap, tab
