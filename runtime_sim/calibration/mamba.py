"""The NKI fused Mamba tutorial's kernels, instruction for instruction, in our ISA (fp32).

Source (``NS`` below): aws-neuron/nki-samples @ 6905a68,
``src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py``: ``mamba_v1`` lines 18-93,
``mamba_v2`` lines 97-168, ``mamba_v3`` lines 172-260 (the version the tutorial's figures were
measured with: v1 loops batch, state, channel tile; the newest aws-neuron-sdk copy of v1 has
another loop order). Measurements: ``nki/guides/tutorials/fused_mamba.rst`` (aws-neuron-sdk).

Inputs: delta, u [batch, channels, seq]; A [channels, state]; B, C [batch, state, seq]; output
[batch, channels, seq] = sum over states of scan(exp(delta * A), delta * u * B) * C. Channels
map to partitions (tiles of 128), seq to the free axis. The body of every kernel, per (state,
channel tile[, seq tile]), as the source writes it (NS lines 56-85 / 137-162 / 218-255):

1. ``A_i = nl.load(A[...])``                                   DMA (queue ``Q_SMALL``)
2. ``deltaA = nisa.activation(op=nl.exp, data=delta_i, scale=A_i)``  ScalarE
3. ``B_i = nl.load(B[i_batch, i_state:i_state+1, ...])``       DMA, one partition
4. ``deltaU = nisa.tensor_tensor(delta_i, u_i, op=nl.multiply)`` VectorE, SBUF x SBUF: 2N
5. ``B_i_bcast = B_i.broadcast_to((128, n))``                  TensorE: a K=1 matmul of a ones
   row into PSUM (trainium_inferentia2_arch.rst, "Alternative Use Case"; fused_mamba.rst: a
   partition broadcast "requires a separate instruction on TensorE")
6. ``deltaBu = nisa.tensor_tensor(deltaU, B_i_bcast, ...)``    VectorE, one input in PSUM: N
7. ``scan_res = nisa.tensor_tensor_scan(deltaA, deltaBu, ...)`` VectorE: 2N
8. ``C_i = nl.load(...)``; ``C_i_bcast = C_i.broadcast_to(...)`` DMA; TensorE
9. ``scanC = nisa.tensor_tensor(scan_res, C_i_bcast, ...)``    VectorE, PSUM input: N
10. ``scanC_accum[...] += scanC``                              VectorE, SBUF x SBUF: 2N

**deltaU hoisted (ASSUMED, the one transformation of the source).** ``deltaU = delta_i * u_i``
reads only tiles loaded before the state loop, so it is the same in every state. The builders
compute it once per channel tile (per seq tile in v3), in place of ``u_i`` (its only use), as
the tutorial's compiler is taken to have done: sdk@v2.26.0 ``nl.affine_range`` ("Using
``affine_range`` also allows Neuron compiler to perform additional loop-level optimizations",
``general/nki/api/nki/language/__init__.py`` L239-241; every loop here is an ``affine_range``),
and the published runs agree with it and not with the source as written: per (state, channel
tile) VectorE was active 2.34 ms x 92.16% / 512 = 4,718 cycles in v1 and 1.61 ms x 99.63% / 512
= 3,509 in v2, the same VectorE instructions as written (8N + 4 penalties = 4,496); hoisting
removes one 2N instruction and its penalty from v2 (3,372) and cannot apply to v1, whose
``delta_i``, ``u_i`` are loaded inside the state loop (NS lines 56, 63). No document states the
hoist itself, so ``hoist=False`` builds the source as written and calibrate prints its value
beside every row. Nothing else is hoisted, fused or reused beyond what the source writes.

What the NKI compiler decides and the source does not say is chosen here, never from a measured
figure:
- ``nl.load`` is a DMA on one queue per role (delta/u, the small A/B/C rows, the stores);
- a tile declared inside a loop body rotates through two buffers (one when two do not fit
  SBUF); the PSUM broadcasts rotate through four banks;
- the seq 8192 ``scanC_accum``, ``delta_i`` and ``u_i`` of ``mamba_v3`` are single buffers (two
  of each, 192 KiB, would fill trn1's SBUF).

``mamba_v2`` at seq > 512 (broadcasts larger than a PSUM bank; at seq >= 7168 a working set
larger than SBUF) is ``mamba_spill.mamba_v2_long``.
"""
from __future__ import annotations

from ..isa import (SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, DmaAttrs, DType,
                   MatmulAttrs, MemsetAttrs, Op, TensorCopyAttrs, TensorTensorAttrs,
                   TensorTensorScanAttrs, dma_queue)
from .builder import KernelBuilder, tile

F32 = DType.FP32
P = 128
Q_BIG, Q_SMALL, Q_OUT = dma_queue(0), dma_queue(16), dma_queue(32)
SOURCE = "aws-neuron/nki-samples@6905a68 src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py"


class _Mamba:
    def __init__(self, target, batch: int, seq: int, channels: int, state: int, ftile: int) -> None:
        assert channels % P == 0 and seq % ftile == 0
        self.b = b = KernelBuilder(target)
        self.batch, self.seq, self.ch, self.st, self.ft = batch, seq, channels, state, ftile
        self.delta = b.hbm("delta", batch * channels, seq, F32)
        self.u = b.hbm("u", batch * channels, seq, F32)
        self.A = b.hbm("A", channels, state, F32)
        self.B = b.hbm("B", batch * state, seq, F32)
        self.C = b.hbm("C", batch * state, seq, F32)
        self.out = b.hbm("out", batch * channels, seq, F32, role="output")
        self.ones = b.sbuf("ones", P * 4, partitions=1)
        b.emit(VECTOR, Op.MEMSET, tile(self.ones, F32, 1, P), (), MemsetAttrs(1.0))
        self.n = 0

    def ring(self, name: str, free: int, depth: int = 2, partitions: int = P):
        return [self.b.sbuf(f"{name}{k}", free * 4, partitions) for k in range(depth)]

    def setup_step_buffers(self) -> None:
        ft = self.ft
        self.r_a = self.ring("A_i", 1)
        self.r_bi = self.ring("B_i", ft, partitions=1)
        self.r_ci = self.ring("C_i", ft, partitions=1)
        self.r_da = self.ring("deltaA", ft)
        self.r_du = self.ring("deltaU", ft)
        self.r_dbu = self.ring("deltaBu", ft)
        self.r_scan = self.ring("scan", ft)
        self.r_sc = self.ring("scanC", ft)
        self.ps = self.b.psum_banks("bcast", 4)

    def load_rows(self, t, row0: int, buf, col0: int = 0, cols: int | None = None) -> None:
        cols = self.seq if cols is None else cols
        self.b.emit(Q_BIG, Op.DMA_COPY, tile(buf, F32, P, cols), (t.tile(row0, P, col0, cols),), DmaAttrs())

    def load_A(self, c: int, s: int, A_i) -> None:
        self.b.emit(Q_SMALL, Op.DMA_COPY, tile(A_i, F32, P, 1), (self.A.column(c * P, P, s),), DmaAttrs())

    def step(self, bi: int, s: int, c: int, D, U, acc, col0: int = 0, scan_init=None, A_i=None,
             du_in_u: bool = False) -> None:
        """Steps 1-10 of the module docstring for one (batch, state, channel tile, seq tile)."""
        b, ft, k = self.b, self.ft, self.n % 2
        self.n += 1
        if A_i is None:
            A_i = self.r_a[k]
            self.load_A(c, s, A_i)
        dsl = tile(D, F32, P, ft, col0)
        da = tile(self.r_da[k], F32, P, ft)
        b.emit(SCALAR, Op.ACTIVATION, da, (dsl, tile(A_i, F32, P, 1)),
               ActivationAttrs(ActFunc.EXP, scale_from_src=True))
        Bi = self.r_bi[k]
        b.emit(Q_SMALL, Op.DMA_COPY, tile(Bi, F32, 1, ft), (self.B.tile(bi * self.st + s, 1, col0, ft),), DmaAttrs())
        if du_in_u:
            du = tile(U, F32, P, ft, col0)
        else:
            du = tile(self.r_du[k], F32, P, ft)
            b.emit(VECTOR, Op.TENSOR_TENSOR, du, (dsl, tile(U, F32, P, ft, col0)), TensorTensorAttrs(AluOp.MULTIPLY))
        pb = tile(self.ps[(2 * self.n) % 4], F32, P, ft)
        b.emit(TENSOR, Op.MATMUL, pb, (tile(self.ones, F32, 1, P), tile(Bi, F32, 1, ft)), MatmulAttrs())
        dbu = tile(self.r_dbu[k], F32, P, ft)
        b.emit(VECTOR, Op.TENSOR_TENSOR, dbu, (du, pb), TensorTensorAttrs(AluOp.MULTIPLY))
        sc = tile(self.r_scan[k], F32, P, ft)
        if scan_init is None:
            b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, sc, (da, dbu), TensorTensorScanAttrs())
        else:       # NS lines 243-245: initial=scan_init; scan_init[...] = scan_res[:, last]
            b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, sc, (da, dbu, tile(scan_init, F32, P, 1)),
                   TensorTensorScanAttrs(initial_from_src=True))
            b.emit(VECTOR, Op.TENSOR_COPY, tile(scan_init, F32, P, 1), (tile(self.r_scan[k], F32, P, 1, ft - 1),),
                   TensorCopyAttrs())
        Ci = self.r_ci[k]
        b.emit(Q_SMALL, Op.DMA_COPY, tile(Ci, F32, 1, ft), (self.C.tile(bi * self.st + s, 1, col0, ft),), DmaAttrs())
        pc = tile(self.ps[(2 * self.n + 1) % 4], F32, P, ft)
        b.emit(TENSOR, Op.MATMUL, pc, (tile(self.ones, F32, 1, P), tile(Ci, F32, 1, ft)), MatmulAttrs())
        scc = tile(self.r_sc[k], F32, P, ft)
        b.emit(VECTOR, Op.TENSOR_TENSOR, scc, (sc, pc), TensorTensorAttrs(AluOp.MULTIPLY))
        a = tile(acc, F32, P, ft, col0)
        b.emit(VECTOR, Op.TENSOR_TENSOR, a, (a, scc), TensorTensorAttrs(AluOp.ADD))

    def hoist_delta_u(self, D, U, seq: int) -> None:
        """``deltaU = delta_i * u_i`` once per channel tile, in place of ``u_i`` (its only use),
        one instruction per ``ftile`` columns as the body writes it."""
        for c0 in range(0, seq, self.ft):
            u = tile(U, F32, P, self.ft, c0)
            self.b.emit(VECTOR, Op.TENSOR_TENSOR, u, (tile(D, F32, P, self.ft, c0), u),
                        TensorTensorAttrs(AluOp.MULTIPLY))

    def store(self, bi: int, c: int, acc) -> None:
        self.b.emit(Q_OUT, Op.DMA_COPY, self.out.tile(bi * self.ch + c * P, P, 0, self.seq),
                    (tile(acc, F32, P, self.seq),), DmaAttrs())

    def zero(self, buf, free: int) -> None:
        self.b.emit(VECTOR, Op.MEMSET, tile(buf, F32, P, free), (), MemsetAttrs(0.0))


def mamba_v1(target, batch: int = 1, seq: int = 512, channels: int = 256, state: int = 16):
    """``mamba_v1`` (NS lines 18-93): for batch: zero ``scanC_accum`` [n_channel_tile, 128, seq]
    (line 46); for state, for channel tile: load delta_i, A_i, u_i, B_i, C_i (lines 56, 57, 63,
    64, 76) and steps 2-10; then store every channel tile's accumulator (lines 88-91)."""
    k = _Mamba(target, batch, seq, channels, state, seq)
    nt = channels // P
    accs = [k.b.sbuf(f"scanC_accum{c}", seq * 4) for c in range(nt)]
    ring = [(k.b.sbuf(f"delta{d}", seq * 4), k.b.sbuf(f"u{d}", seq * 4)) for d in range(2)]
    k.setup_step_buffers()
    j = 0
    for bi in range(batch):
        for c in range(nt):
            k.zero(accs[c], seq)
        for s in range(state):
            for c in range(nt):
                D, U = ring[j % 2]
                j += 1
                k.load_rows(k.delta, bi * channels + c * P, D)
                k.load_rows(k.u, bi * channels + c * P, U)
                k.step(bi, s, c, D, U, accs[c])
        for c in range(nt):
            k.store(bi, c, accs[c])
    return k.b.program()


def mamba_v2(target, batch: int = 1, seq: int = 512, channels: int = 4096, state: int = 16, *,
             hoist: bool = True):
    """``mamba_v2`` (NS lines 97-168): loops reordered to batch, channel tile, state; per channel
    tile zero ``scanC_accum`` (line 128), load delta_i and u_i once (lines 131-132); per state
    load A_i, B_i, C_i and steps 2-10 (deltaU written inside the state loop, line 146: once per
    channel tile with ``hoist``, the module docstring); store (165)."""
    k = _Mamba(target, batch, seq, channels, state, seq)
    nt = channels // P
    ring = [(k.b.sbuf(f"delta{d}", seq * 4), k.b.sbuf(f"u{d}", seq * 4),
             k.b.sbuf(f"scanC_accum{d}", seq * 4)) for d in range(2)]
    k.setup_step_buffers()
    j = 0
    for bi in range(batch):
        for c in range(nt):
            D, U, acc = ring[j % 2]
            j += 1
            k.zero(acc, seq)
            k.load_rows(k.delta, bi * channels + c * P, D)
            k.load_rows(k.u, bi * channels + c * P, U)
            if hoist:
                k.hoist_delta_u(D, U, seq)
            for s in range(state):
                k.step(bi, s, c, D, U, acc, du_in_u=hoist)
            k.store(bi, c, acc)
    return k.b.program()


def mamba_v3(target, batch: int = 1, seq: int = 8192, channels: int = 4096, state: int = 16,
             seq_tile: int = 512, *, hoist: bool = True):
    """``mamba_v3`` (NS lines 172-260): v2 with the seq axis tiled at ``seq_len_fsize`` = 512
    (line 194) inside the state loop: per state load A_i and zero ``scan_init`` (lines 218-221);
    per seq tile steps 2-10 on 512-column slices, the scan starting from ``scan_init`` and
    copying its last column back (lines 243-245), scanC into an SBUF tile (line 252)."""
    k = _Mamba(target, batch, seq, channels, state, seq_tile)
    nt = channels // P
    D, U, acc = (k.b.sbuf(n, seq * 4) for n in ("delta_sb", "u_sb", "scanC_accum"))
    init = k.b.sbuf("scan_init", 4)
    k.setup_step_buffers()
    for bi in range(batch):
        for c in range(nt):
            k.zero(acc, seq)
            k.load_rows(k.delta, bi * channels + c * P, D)
            k.load_rows(k.u, bi * channels + c * P, U)
            if hoist:
                k.hoist_delta_u(D, U, seq)
            for s in range(state):
                A_i = k.r_a[s % 2]
                k.load_A(c, s, A_i)
                k.zero(init, 1)
                for t in range(seq // seq_tile):
                    k.step(bi, s, c, D, U, acc, col0=t * seq_tile, scan_init=init, A_i=A_i, du_in_u=hoist)
            k.store(bi, c, acc)
    return k.b.program()


KERNELS = {"mamba_v1": mamba_v1, "mamba_v2": mamba_v2, "mamba_v3": mamba_v3}
