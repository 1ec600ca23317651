"""Small programs that measure one DMA property, for the published DMA and roofline figures.

- ``dma_example1``: ``nki/get-started/about/nki-dma-overview.rst`` Example 1 (lines 88-153):
  ``nisa.dma_copy`` of a bf16 A[4, 4096] HBM tensor to SBUF [4, 4096]; "the first DMA engine
  takes 1416 ns to load 32 KiB from HBM to SBUF" (trn2). Measured here: the DMA engines' busy
  time (their data phase), the profile's bar for that transfer.
- ``dma_stream``: ``count`` back-to-back HBM -> SBUF loads of [partitions, bytes_per_partition]
  (fp32) from one queue into rotating tiles: the achieved throughput against the documented
  per-engine rate, for the DMA guide's bytes-per-partition statements
  (``nki/deep-dives/nki-dma-bandwidth-guide.rst`` lines 71-85), and the sustained rate behind a
  roofline knee (TensorE peak / sustained HBM -> SBUF bytes per ns).
"""
from __future__ import annotations

from ..isa import DmaAttrs, DType, Op, dma_queue
from .builder import KernelBuilder, tile

Q = dma_queue(0)
CURVE_COUNT = 64     # transfers per stream of the throughput curve (the first fixed phase amortised)


def dma_example1(target):
    b = KernelBuilder(target)
    a = b.hbm("in_tensor", 4, 4096, DType.BF16)
    s = b.sbuf("sbuf_tensor", 4096 * 2, partitions=4)
    b.emit(Q, Op.DMA_COPY, tile(s, DType.BF16, 4, 4096), (a.tile(0, 4, 0, 4096),), DmaAttrs())
    return b.program()


def dma_stream(target, bytes_per_partition: int, partitions: int = 128, count: int = 16, depth: int = 4,
               dtype: DType = DType.FP32):
    b = KernelBuilder(target)
    free = bytes_per_partition // dtype.itemsize
    src = b.hbm("src", count * partitions, free, dtype)
    bufs = b.sbuf_tiles("t", depth, free, dtype, partitions)
    for i in range(count):
        b.emit(Q, Op.DMA_COPY, tile(bufs[i % depth], dtype, partitions, free),
               (src.tile(i * partitions, partitions, 0, free),), DmaAttrs())
    return b.program()
