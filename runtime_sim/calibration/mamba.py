"""The NKI fused Mamba tutorial's kernels as hand-written programs in our ISA (fp32).

Source: ``nki/guides/tutorials/fused_mamba.rst`` and ``mamba_v1`` / ``mamba_v2`` / ``mamba_v3`` in
aws-neuron/nki-samples ``src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py``.

Inputs: delta, u [batch, channels, seq]; A [channels, state]; B, C [batch, state, seq]; output
[batch, channels, seq] = sum over states of scan(exp(delta * A), delta * u * B) * C. Channels
map to partitions (tiles of 128), seq to the free axis. Per (state, channel tile) the tutorial
runs: ScalarE ``activation(exp, delta, scale=A_i)``; VectorE ``delta * u``; TensorE partition
broadcasts of B_i and C_i (``broadcast_to`` is a matmul against a ones row into PSUM,
trainium_inferentia2_arch.rst "Alternative Use Case"); VectorE ``deltaU * B_bcast``,
``tensor_tensor_scan``, ``scan * C_bcast`` and the ``+=`` into the SBUF accumulator.

Decisions the tutorial does not spell out in code, each from the tutorial's own account of the
measured run (docs/simulator.md):
- ``v1`` keeps delta/u of ``resident`` channel tiles in SBUF across states and reloads the rest
  per state: the profile of channels=4096 reports "we reload both the input u and delta tensors
  around 7 times" (so 19 of 32 tiles stay resident: 1 + 15 x 13/32 ~ 7); with 256 channels
  everything fits and nothing is reloaded.
- ``v2``/``v3`` compute the loop-invariant ``delta * u`` once per channel tile, outside the state
  loop (the compiler's hoisting: the measured VectorE time per state of v2, 1.61 ms x 99.63% /
  512 = 3.13 us = 3,500 cycles at 1.12 GHz, fits four VectorE instructions, not five).
- tiles declared in a loop body rotate through two buffers; PSUM broadcasts through four banks.

``mamba_v2`` at seq > 512 (broadcasts larger than a PSUM bank; at seq 8192 a working set larger
than SBUF, hence a spill plan) is ``mamba_spill.mamba_v2_long``.
"""
from __future__ import annotations

from ..isa import (SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, DmaAttrs, DType,
                   MatmulAttrs, MemsetAttrs, Op, TensorCopyAttrs, TensorTensorAttrs,
                   TensorTensorScanAttrs, dma_queue)
from .builder import KernelBuilder, tile

F32 = DType.FP32
P = 128
Q_BIG, Q_SMALL, Q_OUT = dma_queue(0), dma_queue(16), dma_queue(32)


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

    def step(self, bi: int, s: int, c: int, D, U, acc, col0: int = 0, deltaU=None, scan_init=None,
             A_i=None, scanc_psum: bool = False) -> None:
        """Steps 1-6 for one (batch, state, channel tile, seq tile): see the module docstring."""
        b, ft, k = self.b, self.ft, self.n % 2
        self.n += 1
        if A_i is None:
            A_i = self.r_a[k]
            b.emit(Q_SMALL, Op.DMA_COPY, tile(A_i, F32, P, 1), (self.A.column(c * P, P, s),), DmaAttrs())
        dsl = tile(D, F32, P, ft, col0)
        da = tile(self.r_da[k], F32, P, ft)
        b.emit(SCALAR, Op.ACTIVATION, da, (dsl, tile(A_i, F32, P, 1)),
               ActivationAttrs(ActFunc.EXP, scale_from_src=True))
        Bi = self.r_bi[k]
        b.emit(Q_SMALL, Op.DMA_COPY, tile(Bi, F32, 1, ft), (self.B.tile(bi * self.st + s, 1, col0, ft),), DmaAttrs())
        if deltaU is None:
            du = tile(self.r_du[k], F32, P, ft)
            b.emit(VECTOR, Op.TENSOR_TENSOR, du, (dsl, tile(U, F32, P, ft, col0)), TensorTensorAttrs(AluOp.MULTIPLY))
        else:
            du = tile(deltaU, F32, P, ft, col0)
        pb = tile(self.ps[(2 * self.n) % 4], F32, P, ft)
        b.emit(TENSOR, Op.MATMUL, pb, (tile(self.ones, F32, 1, P), tile(Bi, F32, 1, ft)), MatmulAttrs())
        dbu = tile(self.r_dbu[k], F32, P, ft)
        b.emit(VECTOR, Op.TENSOR_TENSOR, dbu, (du, pb), TensorTensorAttrs(AluOp.MULTIPLY))
        sc = tile(self.r_scan[k], F32, P, ft)
        if scan_init is None:
            b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, sc, (da, dbu), TensorTensorScanAttrs())
        else:
            b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, sc, (da, dbu, tile(scan_init, F32, P, 1)),
                   TensorTensorScanAttrs(initial_from_src=True))
            b.emit(VECTOR, Op.TENSOR_COPY, tile(scan_init, F32, P, 1), (tile(self.r_scan[k], F32, P, 1, ft - 1),),
                   TensorCopyAttrs())
        Ci = self.r_ci[k]
        b.emit(Q_SMALL, Op.DMA_COPY, tile(Ci, F32, 1, ft), (self.C.tile(bi * self.st + s, 1, col0, ft),), DmaAttrs())
        pc = tile(self.ps[(2 * self.n + 1) % 4], F32, P, ft)
        b.emit(TENSOR, Op.MATMUL, pc, (tile(self.ones, F32, 1, P), tile(Ci, F32, 1, ft)), MatmulAttrs())
        # v3 writes scanC to PSUM ("Use PSUM buffer to reduce accumulation latency")
        scc = pb if scanc_psum else tile(self.r_sc[k], F32, P, ft)
        b.emit(VECTOR, Op.TENSOR_TENSOR, scc, (sc, pc), TensorTensorAttrs(AluOp.MULTIPLY))
        a = tile(acc, F32, P, ft, col0)
        b.emit(VECTOR, Op.TENSOR_TENSOR, a, (a, scc), TensorTensorAttrs(AluOp.ADD))

    def store(self, bi: int, c: int, acc) -> None:
        self.b.emit(Q_OUT, Op.DMA_COPY, self.out.tile(bi * self.ch + c * P, P, 0, self.seq),
                    (tile(acc, F32, P, self.seq),), DmaAttrs())

    def zero(self, buf, free: int) -> None:
        self.b.emit(VECTOR, Op.MEMSET, tile(buf, F32, P, free), (), MemsetAttrs(0.0))


def mamba_v1(target, batch: int = 1, seq: int = 512, channels: int = 256, state: int = 16,
             resident: int | None = None):
    """``mamba_v1``: for batch, for state, for channel tile: steps 1-6 (loads inside)."""
    k = _Mamba(target, batch, seq, channels, state, seq)
    nt = channels // P
    resident = nt if resident is None else resident
    accs = [k.b.sbuf(f"scanC_accum{c}", seq * 4) for c in range(nt)]
    res = [(k.b.sbuf(f"delta_r{c}", seq * 4), k.b.sbuf(f"u_r{c}", seq * 4)) for c in range(resident)]
    ring = [(k.b.sbuf(f"delta{d}", seq * 4), k.b.sbuf(f"u{d}", seq * 4)) for d in range(2)]
    k.setup_step_buffers()
    j = 0
    for bi in range(batch):
        for c in range(nt):
            k.zero(accs[c], seq)
        for s in range(state):
            for c in range(nt):
                if c < resident:
                    D, U = res[c]
                    fresh = s == 0
                else:
                    D, U = ring[j % 2]
                    j += 1
                    fresh = True
                if fresh:
                    k.load_rows(k.delta, bi * channels + c * P, D)
                    k.load_rows(k.u, bi * channels + c * P, U)
                k.step(bi, s, c, D, U, accs[c])
        for c in range(nt):
            k.store(bi, c, accs[c])
    return k.b.program()


def mamba_v2(target, batch: int = 1, seq: int = 512, channels: int = 4096, state: int = 16):
    """``mamba_v2``: loops reordered to batch, channel tile, state; delta/u loaded once per channel
    tile (and delta * u computed once, see the module docstring)."""
    k = _Mamba(target, batch, seq, channels, state, seq)
    nt = channels // P
    ring = [(k.b.sbuf(f"delta{d}", seq * 4), k.b.sbuf(f"u{d}", seq * 4), k.b.sbuf(f"dU{d}", seq * 4),
             k.b.sbuf(f"scanC_accum{d}", seq * 4)) for d in range(2)]
    k.setup_step_buffers()
    j = 0
    for bi in range(batch):
        for c in range(nt):
            D, U, DU, acc = ring[j % 2]
            j += 1
            k.zero(acc, seq)
            k.load_rows(k.delta, bi * channels + c * P, D)
            k.load_rows(k.u, bi * channels + c * P, U)
            k.b.emit(VECTOR, Op.TENSOR_TENSOR, tile(DU, F32, P, seq), (tile(D, F32, P, seq), tile(U, F32, P, seq)),
                     TensorTensorAttrs(AluOp.MULTIPLY))
            for s in range(state):
                k.step(bi, s, c, D, U, acc, deltaU=DU)
            k.store(bi, c, acc)
    return k.b.program()


def mamba_v3(target, batch: int = 1, seq: int = 8192, channels: int = 4096, state: int = 16,
             seq_tile: int = 512):
    """``mamba_v3``: v2 with the seq axis tiled at 512 inside the state loop; the scan carries
    its last column to the next seq tile (``initial``); scanC goes through PSUM."""
    k = _Mamba(target, batch, seq, channels, state, seq_tile)
    nt = channels // P
    D, U, DU, acc = (k.b.sbuf(n, seq * 4) for n in ("delta_sb", "u_sb", "dU", "scanC_accum"))
    init = k.b.sbuf("scan_init", 4)
    k.setup_step_buffers()
    for bi in range(batch):
        for c in range(nt):
            k.zero(acc, seq)
            k.load_rows(k.delta, bi * channels + c * P, D)
            k.load_rows(k.u, bi * channels + c * P, U)
            k.b.emit(VECTOR, Op.TENSOR_TENSOR, tile(DU, F32, P, seq), (tile(D, F32, P, seq), tile(U, F32, P, seq)),
                     TensorTensorAttrs(AluOp.MULTIPLY))
            for s in range(state):
                A_i = k.r_a[s % 2]
                k.b.emit(Q_SMALL, Op.DMA_COPY, tile(A_i, F32, P, 1), (k.A.column(c * P, P, s),), DmaAttrs())
                k.zero(init, 1)
                for t in range(seq // seq_tile):
                    k.step(bi, s, c, D, U, acc, col0=t * seq_tile, deltaU=DU, scan_init=init, A_i=A_i,
                           scanc_psum=True)
            k.store(bi, c, acc)
    return k.b.program()


KERNELS = {"mamba_v1": mamba_v1, "mamba_v2": mamba_v2, "mamba_v3": mamba_v3}
