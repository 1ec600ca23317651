"""The NKI matrix-multiplication tutorial's four kernels as hand-written programs in our ISA.

Sources (``MMK``): aws-neuron-sdk@v2.26.0
``general/nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py`` --
``nki_matmul_tiled_`` lines 65-116, ``nki_matmul_hoist_load_`` 119-186,
``nki_matmul_block_free_dimension_`` 189-273, ``nki_matmul_fully_optimized_`` 276-396 (the trn1
measurements: ``general/nki/tutorials/matrix_multiplication.rst`` lines 338-356); the trn2
walk-through of the same four steps, ``nki/guides/tutorials/kernel-optimization.rst`` (aws-neuron-sdk
@81ce03a) code at lines 203-288, 360-458, 486-608, 634-798, the same loop nests and loads (its
driver feeds fp32, lines 298-299).

``result[M, N] = lhsT[K, M].T @ rhs[K, N]``; tiles are TILE_K = 128 (partitions, contraction),
TILE_M = 128 (stationary free size), TILE_N = 512 (moving free size, one PSUM bank of fp32).
Each builder follows its tutorial kernel's loop nest and load placement; what the NKI compiler
decides and the tutorial does not say is chosen here and stated (never from a published figure):
- tiles declared inside a loop body rotate through buffers (the tile framework's allocation):
  ``depth`` = 4 in ``tiled`` (the trn2 activity rows depend on it up to 4 and not beyond: depth
  2 gives TensorE 59.5% / DMA 45.7%, 3 gives 67.5 / 82.5, 4 and 8 give 80.1 / 99.9 at M=1024; a
  ring allocation, NKI's ``AllocationMode.RING``, "a fresh address for each tile", gives >= 4),
  two elsewhere when SBUF allows, one when it does not;
- ``nl.load`` / ``nl.store`` are DMAs on one queue per tensor (lhsT, rhs, result); PSUM -> SBUF
  copies and the SBUF accumulation of the last kernel run on VectorE;
- when a tutorial block does not fit SBUF (the blocked kernel's rhs block in fp32: 256 KiB per
  partition on trn2's 224 KiB) its tiles are reloaded for every use (a compiler's spill/reload).
The dtype is a parameter: the trn1 tutorial ran bf16; the trn2 walk-through's driver feeds fp32.
"""
from __future__ import annotations

from ..isa import (AluOp, DmaAttrs, DType, MatmulAttrs, MemsetAttrs, Op, TENSOR, VECTOR,
                   TensorCopyAttrs, TensorTensorAttrs, dma_queue)
from .builder import KernelBuilder, tile

TK, TM, TN = 128, 128, 512
F32 = DType.FP32
Q_LHS, Q_RHS, Q_OUT = dma_queue(0), dma_queue(16), dma_queue(32)


def _setup(target, M: int, K: int, N: int, dtype: DType):
    b = KernelBuilder(target)
    lhsT = b.hbm("lhsT", K, M, dtype)
    rhs = b.hbm("rhs", K, N, dtype)
    res = b.hbm("result", M, N, dtype, role="output")
    return b, lhsT, rhs, res


def _load(b: KernelBuilder, q, buf, src, dtype: DType, free: int, off: int = 0) -> None:
    b.emit(q, Op.DMA_COPY, tile(buf, dtype, TK, free, off), (src,), DmaAttrs())


def _mm(b: KernelBuilder, ps, st, mv, acc: bool, dtype: DType) -> None:
    b.emit(TENSOR, Op.MATMUL, tile(ps, F32, TM, TN), (st, mv), MatmulAttrs(accumulate=acc))


def _evacuate(b: KernelBuilder, ps, out_buf, res, m0: int, n0: int, dtype: DType) -> None:
    """``nl.copy`` PSUM -> SBUF (cast to the result dtype) on VectorE, then ``nl.store``."""
    b.emit(VECTOR, Op.TENSOR_COPY, tile(out_buf, dtype, TM, TN), (tile(ps, F32, TM, TN),), TensorCopyAttrs())
    b.emit(Q_OUT, Op.DMA_COPY, res.tile(m0, TM, n0, TN), (tile(out_buf, dtype, TM, TN),), DmaAttrs())


def tiled(target, M: int = 4096, K: int = 8192, N: int = 8192, dtype: DType = DType.BF16, depth: int = 4):
    """``nki_matmul_tiled_`` (MMK lines 65-116): for m, for n, for k: load lhsT[k, m] and rhs[k, n],
    matmul into PSUM; copy to SBUF, store."""
    b, lhsT, rhs, res = _setup(target, M, K, N, dtype)
    lt = b.sbuf_tiles("lhsT_tile", depth, TM, dtype)
    rt = b.sbuf_tiles("rhs_tile", depth, TN, dtype)
    ot = b.sbuf_tiles("res_sb", 2, TN, dtype)
    ps = b.psum_banks("res_psum", 2)
    it = j = 0
    for m in range(M // TM):
        for n in range(N // TN):
            p = ps[j % 2]
            for k in range(K // TK):
                s = it % depth
                _load(b, Q_LHS, lt[s], lhsT.tile(k * TK, TK, m * TM, TM), dtype, TM)
                _load(b, Q_RHS, rt[s], rhs.tile(k * TK, TK, n * TN, TN), dtype, TN)
                _mm(b, p, tile(lt[s], dtype, TK, TM), tile(rt[s], dtype, TK, TN), k > 0, dtype)
                it += 1
            _evacuate(b, p, ot[j % 2], res, m * TM, n * TN, dtype)
            j += 1
    return b.program()


def hoisted(target, M: int = 4096, K: int = 8192, N: int = 8192, dtype: DType = DType.BF16):
    """``nki_matmul_hoist_load_`` (MMK lines 119-186): for m: load the K column of lhsT tiles; for n:
    load the K column of rhs tiles, then K matmuls."""
    b, lhsT, rhs, res = _setup(target, M, K, N, dtype)
    nk = K // TK
    lhs_set = TM * dtype.itemsize * nk
    rhs_set = TN * dtype.itemsize * nk
    ld = 2 if 2 * lhs_set + 2 * rhs_set + 4 * TN * dtype.itemsize <= b.sbuf_free() else 1
    rd = 2 if ld * lhs_set + 2 * rhs_set + 4 * TN * dtype.itemsize <= b.sbuf_free() else 1
    lt = [b.sbuf_tiles(f"lhsT{d}_", nk, TM, dtype) for d in range(ld)]
    rt = [b.sbuf_tiles(f"rhs{d}_", nk, TN, dtype) for d in range(rd)]
    ot = b.sbuf_tiles("res_sb", 2, TN, dtype)
    ps = b.psum_banks("res_psum", 2)
    j = 0
    for m in range(M // TM):
        L = lt[m % ld]
        for k in range(nk):
            _load(b, Q_LHS, L[k], lhsT.tile(k * TK, TK, m * TM, TM), dtype, TM)
        for n in range(N // TN):
            R = rt[j % rd]
            for k in range(nk):
                _load(b, Q_RHS, R[k], rhs.tile(k * TK, TK, n * TN, TN), dtype, TN)
            p = ps[j % 2]
            for k in range(nk):
                _mm(b, p, tile(L[k], dtype, TK, TM), tile(R[k], dtype, TK, TN), k > 0, dtype)
            _evacuate(b, p, ot[j % 2], res, m * TM, n * TN, dtype)
            j += 1
    return b.program()


def blocked_mn(target, M: int = 4096, K: int = 8192, N: int = 8192, dtype: DType = DType.BF16,
               tiles_m: int = 2, tiles_n: int = 2):
    """``nki_matmul_block_free_dimension_`` (MMK lines 189-273): for each [BLOCK_M = 256] block of
    lhsT columns and each [BLOCK_N = 1024] block of rhs columns, load the blocks, then for bm, bn:
    K matmuls."""
    b, lhsT, rhs, res = _setup(target, M, K, N, dtype)
    nk = K // TK
    isz = dtype.itemsize
    lt = [b.sbuf_tiles(f"lhsT{bm}_", nk, TM, dtype) for bm in range(tiles_m)]
    fits = tiles_n * nk * TN * isz + 4 * TN * isz <= b.sbuf_free()
    rt = [b.sbuf_tiles(f"rhs{bn}_", nk, TN, dtype) for bn in range(tiles_n if fits else 1)]
    ot = b.sbuf_tiles("res_sb", 2, TN, dtype)
    ps = b.psum_banks("res_psum", 2)
    j = 0
    for m in range(M // (TM * tiles_m)):
        for bm in range(tiles_m):
            for k in range(nk):
                _load(b, Q_LHS, lt[bm][k], lhsT.tile(k * TK, TK, (m * tiles_m + bm) * TM, TM), dtype, TM)
        for n in range(N // (TN * tiles_n)):
            if fits:
                for bn in range(tiles_n):
                    for k in range(nk):
                        _load(b, Q_RHS, rt[bn][k], rhs.tile(k * TK, TK, (n * tiles_n + bn) * TN, TN), dtype, TN)
            for bm in range(tiles_m):
                for bn in range(tiles_n):
                    R = rt[bn if fits else 0]
                    if not fits:            # SBUF overflow: reload the rhs tiles for this use
                        for k in range(nk):
                            _load(b, Q_RHS, R[k], rhs.tile(k * TK, TK, (n * tiles_n + bn) * TN, TN), dtype, TN)
                    p = ps[j % 2]
                    for k in range(nk):
                        _mm(b, p, tile(lt[bm][k], dtype, TK, TM), tile(R[k], dtype, TK, TN), k > 0, dtype)
                    _evacuate(b, p, ot[j % 2], res, (m * tiles_m + bm) * TM, (n * tiles_n + bn) * TN, dtype)
                    j += 1
    return b.program()


def fully_optimized(target, M: int = 4096, K: int = 8192, N: int = 8192, dtype: DType = DType.BF16,
                    tiles_m: int = 16, tiles_n: int = 2, tiles_k: int = 8, psum_banks: int = 4):
    """``nki_matmul_fully_optimized_`` (MMK lines 276-396; blocks of 2048 x 1024 x 1024 by default):
    for each N block, zero the SBUF result tiles; for each K block (sequential), load the rhs block as
    TILES_IN_BLOCK_K [128, BLOCK_N] tiles, and for each M block load lhsT as TILES_IN_BLOCK_K
    [128, BLOCK_M] tiles, run the bn, bm, bk matmuls into PSUM and add each PSUM tile into its SBUF
    result tile (VectorE); finally pack each row of result tiles into [128, BLOCK_N] and store it."""
    b, lhsT, rhs, res = _setup(target, M, K, N, dtype)
    isz = dtype.itemsize
    BM, BN, BK = TM * tiles_m, TN * tiles_n, TK * tiles_k
    nbm = M // BM
    ntiles = nbm * tiles_m * tiles_n
    result = b.sbuf_tiles("result_tiles", ntiles, TN, dtype)
    one = tiles_k * (BN + BM) * isz
    depth = 2 if 2 * one + BN * isz <= b.sbuf_free() else 1
    rt = [b.sbuf_tiles(f"rhs{d}_", tiles_k, BN, dtype) for d in range(depth)]
    lt = [b.sbuf_tiles(f"lhsT{d}_", tiles_k, BM, dtype) for d in range(depth)]
    # result_packed; when SBUF is full (fp32 on trn2) it reuses an lhsT tile's bytes (tracked)
    packed = b.sbuf("result_packed", BN * isz) if BN * isz <= b.sbuf_free() else lt[0][0]
    ps = b.psum_banks("res_psum", psum_banks)
    rid = lambda m, bm, bn: (m * tiles_m + bm) * tiles_n + bn
    it = il = j = 0
    for n in range(N // BN):
        for r in result:                                # nl.zeros / nisa.memset
            b.emit(VECTOR, Op.MEMSET, tile(r, dtype, TM, TN), (), MemsetAttrs(0.0))
        for k in range(K // BK):
            R = rt[it % depth]
            for bk in range(tiles_k):
                _load(b, Q_RHS, R[bk], rhs.tile((tiles_k * k + bk) * TK, TK, BN * n, BN), dtype, BN)
            for m in range(nbm):
                L = lt[il % depth]
                il += 1
                for bk in range(tiles_k):
                    _load(b, Q_LHS, L[bk], lhsT.tile((tiles_k * k + bk) * TK, TK, BM * m, BM), dtype, BM)
                for bn in range(tiles_n):
                    for bm in range(tiles_m):
                        p = ps[j % psum_banks]
                        for bk in range(tiles_k):
                            _mm(b, p, tile(L[bk], dtype, TK, TM, bm * TM), tile(R[bk], dtype, TK, TN, bn * TN),
                                bk > 0, dtype)
                        acc = tile(result[rid(m, bm, bn)], dtype, TM, TN)
                        b.emit(VECTOR, Op.TENSOR_TENSOR, acc, (acc, tile(p, F32, TM, TN)), TensorTensorAttrs(AluOp.ADD))
                        j += 1
            it += 1
        for m in range(nbm):
            for bm in range(tiles_m):
                for bn in range(tiles_n):
                    b.emit(VECTOR, Op.TENSOR_COPY, tile(packed, dtype, TM, TN, bn * TN),
                           (tile(result[rid(m, bm, bn)], dtype, TM, TN),), TensorCopyAttrs())
                b.emit(Q_OUT, Op.DMA_COPY, res.tile((tiles_m * m + bm) * TM, TM, BN * n, BN),
                       (tile(packed, dtype, TM, BN),), DmaAttrs())
    return b.program()


KERNELS = {"tiled": tiled, "hoisted": hoisted, "blocked_mn": blocked_mn, "fully_optimized": fully_optimized}
