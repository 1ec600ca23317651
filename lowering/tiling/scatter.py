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

from lowering.kir import KOp, ScatterKAttrs
from lowering.tiling.gather import ROW_BUFS, row_chunks
from lowering.tir.builder import TirBuilder
from runtime_sim.isa import DmaScatterAttrs, EngineKind, Memory, Op


def tile_scatter(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, ScatterKAttrs)
    data, index = k.ins
    table = k.outs[0]
    n = k.attrs.axis
    assert n == index.rank and table.shape[n] == k.attrs.bound, (k.attrs, table, index)
    if index.numel == 0 or data.numel == 0:
        return
    attrs = DmaScatterAttrs(k.attrs.accumulate)
    for it, p, c, dense, tab in row_chunks(b, index, data, table, n, k.attrs.bound, "s"):
        rows = b.tile("srow", Memory.SBUF, p, c, data.dtype, ROW_BUFS)
        b.dma(rows.ap(), dense)
        b.emit(Op.DMA_SCATTER, tab, (rows.ap(), it), attrs, engines=(EngineKind.DMA,))
