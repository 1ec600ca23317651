"""The NKI LayerNorm tutorial's two kernels in our ISA (fp32, trn1).

Source: aws-neuron-sdk@v2.26.0 ``general/nki/examples/layernorm/layernorm_nki_kernel.py``:
``nki_layernorm_kernel_v1`` lines 18-68 (nki.language only), ``nki_layernorm_kernel_v2`` lines
71-140 (bn_stats / bn_aggr / a two-op tensor_scalar); measurements in
``general/nki/tutorials/layernorm.rst`` lines 97-137 (p50 2,311 us and 1,969 us "on trn1 using an
input tensor of (300, 1000)"; the script's perf mode, which the tutorial tells the reader to run
(lines 163-170), uses its defaults ``--nrows 4096 --ncols 8192``, kernel lines 147-154).

Per 128-row tile of ``input_tensor`` [rows, N] (one partition per row, the last tile masked to
the rows left), as the source writes it:

v1 (lines 47-65)                                  instruction here
- ``nl.load``                                     DMA [p, N] (queue ``Q_IN``)
- ``mean = nl.mean(input_sb, axis=1)``            VectorE tensor_reduce add (N) + x 1/N ([p, 1])
- ``nl.mean(nl.square(input_sb), axis=1)``        ScalarE square (N) + VectorE tensor_reduce (N) + x 1/N
- ``- mean * mean``                               VectorE [p, 1] ops
- ``nl.rsqrt(var + epsilon)``                     ScalarE rsqrt(x + eps) ([p, 1])
- ``(input_sb - mean) * rsqrt``                   two VectorE tensor_scalar (N each)
- ``* gamma_sb_bcast + beta_sb_bcast``            two VectorE tensor_tensor, SBUF x SBUF fp32 (2N each)
- ``nl.store``                                    DMA (queue ``Q_OUT``)

v2 (lines 100-137): the same load, ``bn_stats`` over ``ceil(N / 512)`` equal pieces of at most
512 columns (``nl.tile_size.bn_stats_fmax``; equal pieces instead of the source's masked last
piece, since this ISA's ``bn_aggr`` takes equal counts), ``bn_aggr``, ScalarE rsqrt(var + eps),
one ``tensor_scalar`` (subtract mean, multiply rsqrt: N), the same gamma/beta multiply-add and store.

Before the loop (lines 38-44 / 91-97): load gamma and beta as [1, N] rows and broadcast each to
[128, N] (``broadcast_to``: TensorE matmuls of a ones row, 512 columns per PSUM bank, each
copied to the SBUF tile on VectorE, as ``mamba_spill``'s SBUF broadcasts).

The tutorial's own cost account (lines 100-109: v1 mean N, variance "N Scalar Engine + 2N
Vector Engine", shift/scale 2N; v2 N + N) counts N more VectorE cycles for v1's variance than
the instructions above (its square is on ScalarE, its reduction N). What the compiler decides
is chosen here, never from a measured figure: every [p, N] tensor (and the [1, N] gamma and beta
rows until broadcast) holds one SBUF slot from its production to its last use, slots reused oldest
first, as many slots as fit (at most 8); ``in_place``: an elementwise result takes the slot of the
operand whose last use it is (as NKI kernels write ``a[...] = op(a, b)``; the calibration shows
both, since the choice moves the 4096 x 8192 time by a third).
"""
from __future__ import annotations

import math

from ..isa import (SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, BnAggrAttrs, BnStatsAttrs,
                   DmaAttrs, DType, MatmulAttrs, MemsetAttrs, Op, TensorCopyAttrs, TensorReduceAttrs,
                   TensorScalarAttrs, TensorTensorAttrs, dma_queue)
from .builder import KernelBuilder, tile

F32 = DType.FP32
P = 128
Q_IN, Q_SMALL, Q_OUT = dma_queue(0), dma_queue(16), dma_queue(32)
SOURCE = "aws-neuron-sdk@v2.26.0 general/nki/examples/layernorm/layernorm_nki_kernel.py"
EPS = 1e-5


def layernorm(target, version: int = 2, rows: int = 4096, cols: int = 8192, max_slots: int = 8,
              in_place: bool = False):
    """``nki_layernorm_kernel_v1`` (``version=1``) or ``_v2`` on an fp32 [rows, cols] input.
    ``in_place``: an elementwise result takes the slot of the operand it is the last use of."""
    b = KernelBuilder(target)
    x_h = b.hbm("input_tensor", rows, cols, F32)
    g_h = b.hbm("gamma", 1, cols, F32)
    be_h = b.hbm("beta", 1, cols, F32)
    y_h = b.hbm("output_tensor", rows, cols, F32, role="output")
    ones = b.sbuf("ones", P * 4, partitions=1)
    bcast = [b.sbuf(n, cols * 4) for n in ("gamma_bcast", "beta_bcast")]
    ps = b.psum_banks("bcast", 2)
    npieces = math.ceil(cols / 512)
    assert cols % npieces == 0, "bn_stats pieces must be equal"
    piece = cols // npieces
    small = {n: [b.sbuf(f"{n}{k}", 4 * (2 * npieces if n == "stats" else 2)) for k in range(2)]
             for n in ("stats", "mv", "mean", "msq", "var", "rstd")}
    nslots = min(max_slots, b.sbuf_free() // (cols * 4))
    if nslots < 3:
        raise ValueError(f"layernorm {rows}x{cols}: {nslots} SBUF slots of {cols * 4} B do not hold "
                         "a tile's working set")
    slots = [b.sbuf(f"slot{i}", cols * 4) for i in range(nslots)]
    free = list(slots)
    held: dict[str, object] = {}

    def alloc(name: str):
        held[name] = free.pop(0)
        return held[name]

    def release(name: str) -> None:
        free.append(held.pop(name))

    def result(name: str, dying: str):
        """The slot of an elementwise result whose instruction is ``dying``'s last use."""
        if in_place:
            held[name] = held[dying]
            return held[name]
        return alloc(name)

    def done(dying: str) -> None:
        if in_place:
            held.pop(dying)
        else:
            release(dying)

    b.emit(VECTOR, Op.MEMSET, tile(ones, F32, 1, P), (), MemsetAttrs(1.0))
    for h, bc in zip((g_h, be_h), bcast):                       # lines 38-44: load, broadcast_to
        r = alloc(h.buffer.name)                                 # the [1, N] row, a slot until broadcast
        b.emit(Q_SMALL, Op.DMA_COPY, tile(r, F32, 1, cols), (h.tile(0, 1, 0, cols),), DmaAttrs())
        for j, c0 in enumerate(range(0, cols, 512)):
            w = min(512, cols - c0)
            pb = tile(ps[j % 2], F32, P, w)
            b.emit(TENSOR, Op.MATMUL, pb, (tile(ones, F32, 1, P), tile(r, F32, 1, w, c0)), MatmulAttrs())
            b.emit(VECTOR, Op.TENSOR_COPY, tile(bc, F32, P, w, c0), (pb,), TensorCopyAttrs())
        release(h.buffer.name)

    def col(n: str, i: int, p: int, k: int = 1):
        return tile(small[n][i % 2], F32, p, k)

    for i in range(math.ceil(rows / P)):
        p = min(P, rows - i * P)
        t = lambda n: tile(held[n], F32, p, cols)
        b.emit(Q_IN, Op.DMA_COPY, tile(alloc("x"), F32, p, cols), (x_h.tile(i * P, p, 0, cols),), DmaAttrs())
        if version == 1:
            b.emit(VECTOR, Op.TENSOR_REDUCE, col("mean", i, p), (t("x"),), TensorReduceAttrs(AluOp.ADD))
            b.emit(VECTOR, Op.TENSOR_SCALAR, col("mean", i, p), (col("mean", i, p),),
                   TensorScalarAttrs(AluOp.MULTIPLY, 1.0 / cols))
            b.emit(SCALAR, Op.ACTIVATION, tile(alloc("sq"), F32, p, cols), (t("x"),), ActivationAttrs(ActFunc.SQUARE))
            b.emit(VECTOR, Op.TENSOR_REDUCE, col("msq", i, p), (t("sq"),), TensorReduceAttrs(AluOp.ADD))
            release("sq")
            b.emit(VECTOR, Op.TENSOR_SCALAR, col("msq", i, p), (col("msq", i, p),),
                   TensorScalarAttrs(AluOp.MULTIPLY, 1.0 / cols))
            b.emit(VECTOR, Op.TENSOR_TENSOR, col("var", i, p), (col("mean", i, p), col("mean", i, p)),
                   TensorTensorAttrs(AluOp.MULTIPLY))
            b.emit(VECTOR, Op.TENSOR_TENSOR, col("var", i, p), (col("msq", i, p), col("var", i, p)),
                   TensorTensorAttrs(AluOp.SUBTRACT))
            mean, var = col("mean", i, p), col("var", i, p)
        else:
            for j in range(npieces):
                b.emit(VECTOR, Op.BN_STATS, tile(small["stats"][i % 2], F32, p, 2, 2 * j),
                       (tile(held["x"], F32, p, piece, j * piece),), BnStatsAttrs())
            b.emit(VECTOR, Op.BN_AGGR, col("mv", i, p, 2), (col("stats", i, p, 2 * npieces),), BnAggrAttrs())
            mean = col("mv", i, p)
            var = tile(small["mv"][i % 2], F32, p, 1, 1)
        b.emit(SCALAR, Op.ACTIVATION, col("rstd", i, p), (var,), ActivationAttrs(ActFunc.RSQRT, bias=EPS))
        if version == 1:                                 # (input_sb - mean) * rsqrt(var + eps)
            b.emit(VECTOR, Op.TENSOR_SCALAR, tile(result("t1", "x"), F32, p, cols), (t("x"), mean),
                   TensorScalarAttrs(AluOp.SUBTRACT, operand0_from_src=True))
            done("x")
            b.emit(VECTOR, Op.TENSOR_SCALAR, tile(result("t2", "t1"), F32, p, cols), (t("t1"), col("rstd", i, p)),
                   TensorScalarAttrs(AluOp.MULTIPLY, operand0_from_src=True))
            done("t1")
        else:                                            # lines 128-131: one two-op tensor_scalar
            b.emit(VECTOR, Op.TENSOR_SCALAR, tile(result("t2", "x"), F32, p, cols), (t("x"), mean, col("rstd", i, p)),
                   TensorScalarAttrs(AluOp.SUBTRACT, operand0_from_src=True, op1=AluOp.MULTIPLY,
                                     operand1_from_src=True))
            done("x")
        b.emit(VECTOR, Op.TENSOR_TENSOR, tile(result("t3", "t2"), F32, p, cols),
               (t("t2"), tile(bcast[0], F32, p, cols)), TensorTensorAttrs(AluOp.MULTIPLY))
        done("t2")
        b.emit(VECTOR, Op.TENSOR_TENSOR, tile(result("y", "t3"), F32, p, cols), (t("t3"), tile(bcast[1], F32, p, cols)),
               TensorTensorAttrs(AluOp.ADD))
        done("t3")
        b.emit(Q_OUT, Op.DMA_COPY, y_h.tile(i * P, p, 0, cols), (t("y"),), DmaAttrs())
        release("y")
    return b.program()
