"""Tiling of MATMUL kernels on TensorE.

``out[b] = A[b] @ B[b]`` with A [M, K], B [K, N]: for each batch, for each M tile (128) the
stationary tiles A^T[k-tile, m-tile] are loaded once for all K tiles; for each N tile (512) the
moving tiles B[k-tile, n-tile] stream through TensorE, accumulating fp32 in one PSUM bank
(``accumulate=False`` on the first K tile); the epilogue expression evacuates PSUM through
VectorE/ScalarE and the result is stored by DMA.

A^T is loaded directly when A's M axis is contiguous (e.g. a transposed view in a backward
graph); otherwise A[m-tile, k-tile] is loaded row-major and transposed on TensorE into PSUM, then
copied to SBUF (as NKI kernels do).
"""
from __future__ import annotations

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, KOp, MatmulKAttrs
from lowering.tiling.builder import TileBuilder
from lowering.tiling.exprgen import ExprGen, count_intermediates
from lowering.tiling.layout import hbm_ap
from runtime_sim.isa import AP, DType, Memory


def tile_matmul(b: TileBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, MatmulKAttrs)
    A, Bm = k.ins[0], k.ins[1]
    out = k.outs[0]
    extra = k.ins[2:]
    epi = k.attrs.epilogue
    nb, M, K = A.shape
    N = Bm.shape[2]
    if K == 0:
        raise Unsupported("matmul", "contraction size K=0 is not supported")
    if M == 0 or N == 0 or nb == 0:
        return
    t = b.target
    KT, MT, NT = t.pe_rows, t.pe_cols, t.moving_free_max
    nk = -(-K // KT)
    direct = A.strides[1] == 1 and M > 1
    # B with a strided N axis but contiguous K axis (W^T of a linear layer): load B^T rows
    # contiguously and transpose them on TensorE instead of an element-strided DMA.
    b_transposed = Bm.strides[2] != 1 and Bm.strides[1] == 1 and N > 1
    stat_pool = b.pool("stat", Memory.SBUF, 2 * nk, MT * A.dtype.itemsize)
    mov_pool = b.pool("mov", Memory.SBUF, max(2, min(2 * nk, 8)), NT * Bm.dtype.itemsize)
    psum = b.pool("acc", Memory.PSUM, 2, NT * 4)
    if not direct or b_transposed:
        a_pool = b.pool("arow", Memory.SBUF, 2, KT * max(A.dtype.itemsize, Bm.dtype.itemsize))
        tps = b.pool("tps", Memory.PSUM, 2, NT * 4)
    used = sorted(epi.loads()) if epi is not None else []
    ep_pools = {i: b.pool(f"epi{i}", Memory.SBUF, 2, NT * k.ins[i].dtype.itemsize) for i in used}
    work = b.pool("evac", Memory.SBUF, 2 * count_intermediates(epi), NT * 4)

    for bi in range(nb):
        a_base = A.offset + bi * A.strides[0]
        b_base = Bm.offset + bi * Bm.strides[0]
        for m0 in range(0, M, MT):
            mt = min(MT, M - m0)
            stats: list[AP] = []
            for ki in range(nk):
                k0 = ki * KT
                kt = min(KT, K - k0)
                st_tile = b.tile(stat_pool, kt, mt, A.dtype)
                if direct:
                    src = hbm_ap(A.buffer, A.dtype, a_base + k0 * A.strides[2] + m0 * A.strides[1],
                                 kt, A.strides[2], ((mt, A.strides[1]),))
                    b.dma(st_tile.ap(), src)
                else:
                    rows = b.tile(a_pool, mt, kt, A.dtype)
                    src = hbm_ap(A.buffer, A.dtype, a_base + m0 * A.strides[1] + k0 * A.strides[2],
                                 mt, A.strides[1], ((kt, A.strides[2]),))
                    b.dma(rows.ap(), src)
                    tp = b.tile(tps, kt, mt, DType.FP32)
                    b.transpose(tp.ap(), rows.ap())
                    b.tensor_copy(st_tile.ap(), tp.ap())
                stats.append(st_tile.ap())
            for n0 in range(0, N, NT):
                nt = min(NT, N - n0)
                acc = b.tile(psum, mt, nt, DType.FP32)
                for ki in range(nk):
                    k0 = ki * KT
                    kt = min(KT, K - k0)
                    mv = b.tile(mov_pool, kt, nt, Bm.dtype)
                    if b_transposed:
                        tp = b.tile(tps, kt, nt, DType.FP32)
                        for c0 in range(0, nt, MT):
                            ct = min(MT, nt - c0)
                            rows = b.tile(a_pool, ct, kt, Bm.dtype)
                            src = hbm_ap(Bm.buffer, Bm.dtype, b_base + k0 * Bm.strides[1]
                                         + (n0 + c0) * Bm.strides[2], ct, Bm.strides[2],
                                         ((kt, Bm.strides[1]),))
                            b.dma(rows.ap(), src)
                            b.transpose(tp.ap(elem_offset=c0, dims=((1, ct),)), rows.ap())
                        b.tensor_copy(mv.ap(), tp.ap())
                    else:
                        src = hbm_ap(Bm.buffer, Bm.dtype, b_base + k0 * Bm.strides[1]
                                     + n0 * Bm.strides[2], kt, Bm.strides[1], ((nt, Bm.strides[2]),))
                        b.dma(mv.ap(), src)
                    b.matmul(acc.ap(), stats[ki], mv.ap(), accumulate=ki > 0)
                loads: dict[int, AP] = {}
                for i in used:
                    x = k.ins[i]
                    tl = b.tile(ep_pools[i], mt, nt, x.dtype)
                    src = hbm_ap(x.buffer, x.dtype, x.offset + bi * x.strides[0] + m0 * x.strides[1]
                                 + n0 * x.strides[2], mt, x.strides[1], ((nt, x.strides[2]),))
                    b.dma(tl.ap(), src)
                    loads[i] = tl.ap()

                def leaf(x: Expr, acc=acc, loads=loads) -> AP:
                    return acc.ap() if x.op is EOp.ACC else loads[x.index]

                gen = ExprGen(b, work, mt, (nt,), leaf)
                res = gen.tile_of(epi if epi is not None else Expr(EOp.ACC), out.dtype)
                if res.memory is Memory.PSUM:  # DMA does not read PSUM: evacuate first
                    ev = b.tile(work, mt, nt, out.dtype).ap()
                    b.tensor_copy(ev, res)
                    res = ev
                dst = hbm_ap(out.buffer, out.dtype, out.offset + bi * out.strides[0]
                             + m0 * out.strides[1] + n0 * out.strides[2], mt, out.strides[1],
                             ((nt, out.strides[2]),))
                b.dma(dst, res)
