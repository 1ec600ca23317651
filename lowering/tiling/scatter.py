"""Tiling of SCATTER kernels: index and data tiles by DMA, one indirect DMA (``dma_scatter``)
per tile of up to 128 lookups, straight into the HBM tensor being updated.

The lookup space (the index's shape) is collapsed over the three operands that walk it (index,
data, the updated tensor's lock-step axes); its largest axis goes on partitions in tiles of up
to 128 lookups, the others are outer loops. Each row tile loads its ``[p, 1]`` index tile once,
then, per column chunk of at most ``ROW_CHUNK_BYTES`` per partition of the row (outer row axes
are loops), loads the data chunk and scatters it. Engines: DMA only.

Invariants
- Every lookup of the index updates its row exactly once per row element, in row-major lookup
  order: the row tiles and chunks cover the lookup space x the row exactly once, and the table
  access of each ``dma_scatter`` spans the whole range its lookups may touch (the lock-step dims
  of the tile, the indexed axis of size ``bound``, the chunk), so the sync pass orders it after
  every earlier write of the tensor (the copy or fill that initialised it, earlier tiles) and
  duplicates across tiles apply in tile order.
- The updated tensor stays in HBM: indirect DMA addresses HBM, so a resident choice for it is
  refused (``NotResident``) and the program is tiled again without it.
- No value is computed on an engine: integer indices from graph inputs are used exactly.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.kir import KOp, ScatterKAttrs
from lowering.tiling.gather import ROW_CHUNK_BYTES
from lowering.tiling.layout import collapse, plan_rows
from lowering.tir.affine import aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from lowering.tir.resident import NotResident
from runtime_sim.isa import DmaScatterAttrs, EngineKind, Memory, Op

IDX_BUFS = 3
ROW_BUFS = 3


def tile_scatter(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, ScatterKAttrs)
    data, index = k.ins
    table = k.outs[0]
    n = k.attrs.axis
    assert n == index.rank and table.shape[n] == k.attrs.bound, (k.attrs, table, index)
    if b.is_resident(table.buffer):
        raise NotResident(table.buffer, "a scatter updates it by indirect DMA, which addresses HBM")
    if index.numel == 0 or data.numel == 0:
        return
    P = b.target.sbuf_partitions
    isz = table.dtype.itemsize
    plan = plan_rows(index.shape, (), [index.strides, data.strides[:n], table.strides[:n]],
                     [index.offset, data.offset, table.offset])
    rshape, rsts = collapse(tuple(data.shape[n:]), [data.strides[n:], table.strides[n + 1:]])
    row_axes = [(rshape[i], (rsts[0][i], rsts[1][i])) for i in range(len(rshape))]
    *row_outer, last = row_axes if row_axes else [(1, (1, 1))]
    rlen, (drs, trs) = last
    chunk = max(1, ROW_CHUNK_BYTES // isz)
    vstride = table.strides[n]
    attrs = DmaScatterAttrs(k.attrs.accumulate)
    with ExitStack() as es:
        bases = [aff(x) for x in plan.bases]
        for size, st in plan.outer:
            v = es.enter_context(b.loop(size, "o"))
            bases = [bk + v * st[j] for j, bk in enumerate(bases)]
        irs, drs_p, trs_p = plan.row_strides
        for r0, p in b.tiled(plan.rows, P, "r"):
            it = b.tile("sidx", Memory.SBUF, p, 1, index.dtype, IDX_BUFS)
            b.dma(it.ap(), hbm_ap(index.buffer, index.dtype, bases[0] + r0 * irs, p, irs, ()))
            with ExitStack() as es2:
                dbase = bases[1] + r0 * drs_p
                tbase = bases[2] + r0 * trs_p
                for size, (sd, st) in row_outer:
                    v = es2.enter_context(b.loop(size, "w"))
                    dbase, tbase = dbase + v * sd, tbase + v * st
                for c0, c in b.tiled(rlen, chunk, "c"):
                    rows = b.tile("srow", Memory.SBUF, p, c, data.dtype, ROW_BUFS)
                    b.dma(rows.ap(), hbm_ap(data.buffer, data.dtype, dbase + c0 * drs, p, drs_p,
                                            ((c, drs),)))
                    row = ((trs, c),) if row_axes else ()
                    tab = TAP(table.buffer, 0, 1, (tbase + c0 * trs) * isz,
                              ((trs_p, p), (0, 1), (vstride, k.attrs.bound)) + row, table.dtype)
                    b.emit(Op.DMA_SCATTER, tab, (rows.ap(), it.ap()), attrs,
                           engines=(EngineKind.DMA,))
