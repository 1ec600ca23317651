"""Tiling of MATMUL kernels on TensorE.

``out[b] = A[b] @ B[b]`` over any leading batch axes, with A [M, K], B [K, N]: for each (M tile of 128, N tile of 512) the
stationary tiles A^T[k-tile, m-tile] and moving tiles B[k-tile, n-tile] meet in TensorE,
accumulating fp32 in one PSUM bank over the K tiles (``accumulate=False`` on the first); the
epilogue expression evacuates PSUM through VectorE/ScalarE and the result is stored by DMA.

The loop order keeps one operand resident in SBUF and streams the other: M outer (stationary
resident) or N outer (moving resident), whichever moves fewer HBM bytes (``choose_order``); when
neither fits (a very long K), both stream per K tile, so the working set is bounded for any K.

A^T is loaded directly when A's M axis is contiguous (e.g. a transposed view in a backward
graph); otherwise A[m-tile, k-tile] is loaded row-major and transposed on TensorE into PSUM, then
copied to SBUF (as NKI kernels do).
"""
from __future__ import annotations

import itertools
import math

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, KOp, MatmulKAttrs
from lowering.tiling.builder import TileBuilder
from lowering.tiling.exprgen import ExprGen, count_intermediates
from lowering.tiling.layout import hbm_ap
from runtime_sim.isa import AP, DType, Memory


RESIDENT_BUDGET = 96 * 1024  # bytes per partition for the operand kept resident


class _MatmulTiler:
    """Loads of stationary / moving tiles and the epilogue of one MATMUL kernel."""

    def __init__(self, b: TileBuilder, k: KOp, order: str):
        self.b, self.k = b, k
        self.A, self.B, self.out = k.ins[0], k.ins[1], k.outs[0]
        self.epi = k.attrs.epilogue
        t = b.target
        self.KT, self.MT, self.NT = t.pe_rows, t.pe_cols, t.moving_free_max
        K = self.A.shape[-1]
        self.nk = -(-K // self.KT)
        A, Bm = self.A, self.B
        self.direct = A.strides[-2] == 1 and A.shape[-2] > 1
        # B with a strided N axis but a contiguous K axis (W^T of a linear layer): load B^T rows
        # contiguously and transpose them on TensorE instead of an element-strided DMA.
        self.b_transposed = Bm.strides[-1] != 1 and Bm.strides[-2] == 1 and Bm.shape[-1] > 1
        nk = self.nk
        stat_bufs = 2 * nk if order == STATIONARY else 2
        self.stat_pool = b.pool("stat", Memory.SBUF, stat_bufs, self.MT * A.dtype.itemsize)

        needs_tps = not self.direct or self.b_transposed
        # PSUM banks: 2 x group accumulators (double buffered) + 2 for TensorE transposes
        banks = t.psum_banks - (2 if needs_tps else 0)
        self.group = max(1, min(banks // 2, -(-Bm.shape[-1] // self.NT)))
        if order == MOVING:  # the group's moving tiles stay resident: bound them by the budget
            per_tile = 2 * self.nk * self.NT * Bm.dtype.itemsize
            self.group = max(1, min(self.group, RESIDENT_BUDGET // per_tile))
        self.psum = b.pool("acc", Memory.PSUM, 2 * self.group, self.NT * 4)
        mov_bufs = 2 * nk * self.group if order == MOVING else max(2, min(2 * nk, 8))
        self.mov_pool = b.pool("mov", Memory.SBUF, mov_bufs, self.NT * Bm.dtype.itemsize)
        if needs_tps:
            isz = max(A.dtype.itemsize, Bm.dtype.itemsize)
            self.row_pool = b.pool("rows", Memory.SBUF, 2, self.KT * isz)
            self.tps = b.pool("tps", Memory.PSUM, 2, self.NT * 4)
        epi = self.epi
        self.used = sorted(epi.loads()) if epi is not None else []
        self.ep_pools = {i: b.pool(f"epi{i}", Memory.SBUF, 2, self.NT * k.ins[i].dtype.itemsize)
                         for i in self.used}
        self.work = b.pool("evac", Memory.SBUF, 2 * count_intermediates(epi), self.NT * 4)

    def _k(self, ki: int) -> tuple[int, int]:
        k0 = ki * self.KT
        return k0, min(self.KT, self.A.shape[-1] - k0)

    def stationary(self, bi: int, m0: int, mt: int, ki: int) -> AP:
        """A^T[k-tile, m-tile] in SBUF (K on partitions)."""
        b, A = self.b, self.A
        k0, kt = self._k(ki)
        base = _boff(A, bi)
        st = b.tile(self.stat_pool, kt, mt, A.dtype)
        if self.direct:
            b.dma(st.ap(), hbm_ap(A.buffer, A.dtype, base + k0 * A.strides[-1] + m0 * A.strides[-2],
                                  kt, A.strides[-1], ((mt, A.strides[-2]),)))
        else:
            rows = b.tile(self.row_pool, mt, kt, A.dtype)
            b.dma(rows.ap(), hbm_ap(A.buffer, A.dtype, base + m0 * A.strides[-2] + k0 * A.strides[-1],
                                    mt, A.strides[-2], ((kt, A.strides[-1]),)))
            tp = b.tile(self.tps, kt, mt, DType.FP32)
            b.transpose(tp.ap(), rows.ap())
            b.tensor_copy(st.ap(), tp.ap())
        return st.ap()

    def moving(self, bi: int, n0: int, nt: int, ki: int) -> AP:
        """B[k-tile, n-tile] in SBUF (K on partitions)."""
        b, Bm = self.b, self.B
        k0, kt = self._k(ki)
        base = _boff(Bm, bi)
        mv = b.tile(self.mov_pool, kt, nt, Bm.dtype)
        if self.b_transposed:
            tp = b.tile(self.tps, kt, nt, DType.FP32)
            for c0 in range(0, nt, self.MT):
                ct = min(self.MT, nt - c0)
                rows = b.tile(self.row_pool, ct, kt, Bm.dtype)
                b.dma(rows.ap(), hbm_ap(Bm.buffer, Bm.dtype, base + k0 * Bm.strides[-2]
                                        + (n0 + c0) * Bm.strides[-1], ct, Bm.strides[-1],
                                        ((kt, Bm.strides[-2]),)))
                b.transpose(tp.ap(elem_offset=c0, dims=((1, ct),)), rows.ap())
            b.tensor_copy(mv.ap(), tp.ap())
        else:
            b.dma(mv.ap(), hbm_ap(Bm.buffer, Bm.dtype, base + k0 * Bm.strides[-2] + n0 * Bm.strides[-1],
                                  kt, Bm.strides[-2], ((nt, Bm.strides[-1]),)))
        return mv.ap()

    def block(self, bi, m0: int, mt: int, group: list[tuple[int, int]], stats, movs) -> None:
        """Accumulate ``group``'s N tiles over K in PSUM (one bank each; K outer, so every
        stationary tile serves the whole group), then run the epilogue and store each."""
        b = self.b
        accs = [b.tile(self.psum, mt, nt, DType.FP32) for _, nt in group]
        for ki in range(self.nk):
            st = stats(ki)
            for (n0, nt), acc in zip(group, accs):
                b.matmul(acc.ap(), st, movs(ki, n0, nt), accumulate=ki > 0)
        for (n0, nt), acc in zip(group, accs):
            self.epilogue(bi, m0, mt, n0, nt, acc.ap())

    def epilogue(self, bi, m0: int, mt: int, n0: int, nt: int, acc: AP) -> None:
        b, out, k = self.b, self.out, self.k
        loads: dict[int, AP] = {}
        for i in self.used:
            x = k.ins[i]
            tl = b.tile(self.ep_pools[i], mt, nt, x.dtype)
            b.dma(tl.ap(), hbm_ap(x.buffer, x.dtype, _boff(x, bi) + m0 * x.strides[-2]
                                  + n0 * x.strides[-1], mt, x.strides[-2], ((nt, x.strides[-1]),)))
            loads[i] = tl.ap()

        def leaf(x: Expr) -> AP:
            if x.op is EOp.ACC:
                return acc
            if x.op is EOp.LOAD:
                return loads[x.index]
            # INDEX over [*B, M, N]: batch fixed, M runs on partitions, N along the free dim
            t = b.tile(self.work, mt, nt, x.dtype).ap()
            rank = out.rank
            base, pstep, step = ((m0, 1, 0) if x.index == rank - 2 else
                                 (n0, 0, 1) if x.index == rank - 1 else (bi[x.index], 0, 0))
            b.iota(t, base, pstep, (step,))
            return t

        gen = ExprGen(b, self.work, mt, (nt,), leaf)
        res = gen.tile_of(self.epi if self.epi is not None else Expr(EOp.ACC), out.dtype)
        if res.memory is Memory.PSUM:  # DMA does not read PSUM: evacuate first
            ev = b.tile(self.work, mt, nt, out.dtype).ap()
            b.tensor_copy(ev, res)
            res = ev
        b.dma(hbm_ap(out.buffer, out.dtype, _boff(out, bi) + m0 * out.strides[-2]
                     + n0 * out.strides[-1], mt, out.strides[-2], ((nt, out.strides[-1]),)), res)


MOVING, STATIONARY, STREAM = "moving", "stationary", "stream"


def _boff(ref, bidx: tuple[int, ...]) -> int:
    """Element offset of batch index ``bidx`` (the leading axes) in ``ref``."""
    return ref.offset + sum(i * st for i, st in zip(bidx, ref.strides[:-2]))


def choose_order(k: KOp, target) -> str:
    """Which operand stays resident in SBUF across the inner loop: ``MOVING`` (N outer),
    ``STATIONARY`` (M outer), or ``STREAM`` (neither: both are loaded per K tile, for a K too
    long to keep all its tiles). Picks the order that moves fewer HBM bytes among those whose
    resident block fits ``RESIDENT_BUDGET``."""
    A, Bm = k.ins[0], k.ins[1]
    *_, M, K = A.shape
    N = Bm.shape[-1]
    nk = -(-K // target.pe_rows)
    a_bytes, b_bytes = A.numel * A.dtype.itemsize, Bm.numel * Bm.dtype.itemsize
    options = []
    if 2 * nk * target.pe_cols * A.dtype.itemsize <= RESIDENT_BUDGET:
        options.append((a_bytes + -(-M // target.pe_cols) * b_bytes, 0, STATIONARY))
    if 2 * nk * target.moving_free_max * Bm.dtype.itemsize <= RESIDENT_BUDGET:
        options.append((b_bytes + -(-N // target.moving_free_max) * a_bytes, 1, MOVING))
    return min(options)[2] if options else STREAM


def tile_matmul(b: TileBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, MatmulKAttrs)
    A, Bm = k.ins[0], k.ins[1]
    *batch, M, K = A.shape
    N = Bm.shape[-1]
    if K == 0:
        raise Unsupported("matmul", "contraction size K=0 is not supported")
    if M == 0 or N == 0 or math.prod(batch) == 0:
        return
    order = choose_order(k, b.target)
    mm = _MatmulTiler(b, k, order)
    MT, NT, nk = mm.MT, mm.NT, mm.nk
    n_tiles = [(n0, min(NT, N - n0)) for n0 in range(0, N, NT)]
    groups = [n_tiles[i:i + mm.group] for i in range(0, len(n_tiles), mm.group)]
    for bi in itertools.product(*[range(n) for n in batch]):
        if order == MOVING:
            for group in groups:
                movs = {(ki, n0): mm.moving(bi, n0, nt, ki) for n0, nt in group for ki in range(nk)}
                for m0 in range(0, M, MT):
                    mt = min(MT, M - m0)
                    mm.block(bi, m0, mt, group,
                             lambda ki, m0=m0, mt=mt: mm.stationary(bi, m0, mt, ki),
                             lambda ki, n0, nt, movs=movs: movs[(ki, n0)])
            continue
        for m0 in range(0, M, MT):
            mt = min(MT, M - m0)
            if order == STATIONARY:
                stats = [mm.stationary(bi, m0, mt, ki) for ki in range(nk)]
                get_stat = stats.__getitem__
            else:  # STREAM: one stationary load per K tile, shared by the group
                get_stat = (lambda ki, m0=m0, mt=mt: mm.stationary(bi, m0, mt, ki))
            for group in groups:
                mm.block(bi, m0, mt, group, get_stat,
                         lambda ki, n0, nt: mm.moving(bi, n0, nt, ki))
