"""Matmul with the output block resident in SBUF (``Blocking.resident == "C"``).

When the operand blocks that PSUM can accumulate at once are too small to keep HBM traffic
down (trn1's slow DMA: a resident A block of 4 m-tiles re-reads B eight times for M=4096), the
output block stays in SBUF as fp32 accumulators and both operands stream in chunks of K, as the
NKI matmul tutorial's fastest kernel does:

    for each block of ``block`` m-tiles x ``group`` n-tiles:   accumulators [block x group] in SBUF
        for each chunk of ``kacc`` K tiles:
            load A^T[chunk, m-block], B[chunk, n-block]        (two slots each: the next chunk
                                                                loads while this one computes)
            for m-tile, n-tile:
                psum = sum over the chunk's K tiles of matmuls  (a rotating PSUM bank)
                acc[m, n] = psum (first chunk) or acc[m, n] + psum (VectorE/GpSimdE)
        for m-tile, n-tile: epilogue(acc) -> store

A is read N / (group * 512) times and B M / (block * 128) times, whatever the PSUM size; the
price is one [128, 512] fp32 add per cell and chunk (and a memset per cell and block). Invariants:
the accumulators are zeroed at the start of their block and every chunk adds (one loop of
chunks, whose tiles rotate; a partial last chunk reuses their bytes); the cells are unrolled,
their adds alternating VectorE / GpSimdE and their PSUM banks taken in turn; a row bias folded
into the PSUM accumulation (``fold_row_bias``) does not take this form
(``MatmulShape.no_outres``).
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.tiling.matmul_plan import Blocking
from lowering.tir.affine import Affine
from lowering.tir.builder import TirBuilder
from runtime_sim.isa import AluOp, DType, EngineKind, Memory

F32 = DType.FP32
TM, TN, TK = 128, 512, 128
ADD_ENGINES = (EngineKind.GPSIMD, EngineKind.VECTOR)
TP_BUFS = 4     # PSUM slots per TensorE-transpose load site (the transposes sit between products)


def _pieces(n: int, step: int) -> list[tuple[int, int]]:
    return [(i, min(step, n - i)) for i in range(0, n, step)]


def emit_outres(b: TirBuilder, k, sa, sb, c: Blocking, used: list[int], epilogue) -> None:
    """The loop nest above; ``sa``/``sb`` are matmul.py's ``_Side`` views of A and B,
    ``epilogue(b, k, used, bidx, m0, mt, n0, nt, acc_ap)`` evaluates and stores one cell."""
    from dataclasses import replace
    sa, sb = replace(sa, tp_bufs=TP_BUFS), replace(sb, tp_bufs=TP_BUFS)
    A = k.ins[0]
    *batch, M, K = A.shape
    N = k.ins[1].shape[-1]
    dt = A.dtype
    chunk = c.kacc * TK
    out_dt = k.outs[0].dtype
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        abase, bbase = sa.base(bidx), sb.base(bidx)
        # the accumulators of one block, zero between blocks: zeroed once here, and every cell
        # again right after its result left (the next block's first add then waits only for
        # that cell's store, not for a memset pass over the whole block)
        cells_max = -(-min(M, c.block * TM) // TM) * -(-min(N, c.group * TN) // TN)
        acc = b.tile("accs", Memory.SBUF, TM, cells_max * TN, F32, 1)
        for n in range(cells_max):
            b.memset(acc.ap(TM, elem_offset=n * TN, dims=((1, TN),)), 0.0,
                     engines=(ADD_ENGINES[n % 2],))
        for r0, rw in b.tiled(M, c.block * TM, "cm"):
            for s0, sw in b.tiled(N, c.group * TN, "cn"):
                nr, ns = -(-rw // TM), -(-sw // TN)
                # PSUM banks taken by the cells in turn (the cells are unrolled, so the rotation
                # is explicit), shared by the first chunk and the chunk loop
                banks = [b.tile(f"ps{i}", Memory.PSUM, TM, TN, F32, 1) for i in range(c.acc_bufs)]

                def step(kc0: Affine, kcw: int) -> None:
                    at = b.tile("ach", Memory.SBUF, TK, -(-kcw // TK) * rw, dt, 2)
                    bt = b.tile("bch", Memory.SBUF, TK, -(-kcw // TK) * sw, dt, 2)
                    # TensorE-transposed operands: the chunk's rows in one DMA (a [128, 128]
                    # transfer per transpose keeps only two in flight for the DMA latency)
                    # (one slot: the transposes read it at the start of the chunk, the next
                    # chunk's rows load while this one's products run)
                    ast = sa.stage(b, abase, r0, rw, kcw, always=True, k0=kc0, bufs=1)
                    bst = sb.stage(b, bbase, s0, sw, kcw, always=True, k0=kc0, bufs=1)
                    for k0, kt in b.tiled(kcw, TK, "ka"):
                        sa.load(b, at, k0 // TK * rw, abase, k0 if ast else kc0 + k0, kt, r0, rw, ast)
                    for k0, kt in b.tiled(kcw, TK, "kb"):
                        sb.load(b, bt, k0 // TK * sw, bbase, k0 if bst else kc0 + k0, kt, s0, sw, bst)
                    # cells unrolled (static), their adds alternating VectorE / GpSimdE: one
                    # engine alone falls behind TensorE at two K tiles per chunk
                    for ci, (i0, iw) in enumerate(_pieces(rw, TM)):
                        for cj, (j0, jw) in enumerate(_pieces(sw, TN)):
                            n = ci * ns + cj
                            dst = banks[n % len(banks)].ap(iw, dims=((1, jw),))
                            for k0, kt in b.tiled(kcw, TK, "kk"):
                                b.matmul(dst, at.ap(kt, elem_offset=k0 // TK * rw + i0, dims=((1, iw),)),
                                         bt.ap(kt, elem_offset=k0 // TK * sw + j0, dims=((1, jw),)),
                                         start_when=(k0,))
                            cell = acc.ap(iw, elem_offset=n * TN, dims=((1, jw),))
                            b.tensor_tensor(cell, cell, dst, AluOp.ADD, engines=(ADD_ENGINES[n % 2],))

                for kc0, kcw in b.tiled(K, chunk, "kc"):
                    step(kc0, kcw)
                # each result computed into its own cell's bytes (as the output dtype) and
                # stored from there, then the cell zeroed for the next block
                for ci, (i0, iw) in enumerate(_pieces(rw, TM)):
                    for cj, (j0, jw) in enumerate(_pieces(sw, TN)):
                        n = ci * ns + cj
                        cell = acc.ap(iw, elem_offset=n * TN, dims=((1, jw),))
                        into = acc.ap(iw, elem_offset=n * TN, dims=((1, jw),), dtype=out_dt)
                        epilogue(b, k, used, bidx, r0 + i0, iw, s0 + j0, jw, cell, into)
                # (after every cell's evacuation: a memset waits for its cell's store, and an
                # in-order engine must not hold the next evacuation behind it)
                for n in range(nr * ns):
                    b.memset(acc.ap(TM, elem_offset=n * TN, dims=((1, TN),)), 0.0,
                             engines=(ADD_ENGINES[n % 2],))
