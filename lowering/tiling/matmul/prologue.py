"""The A operand's prologue in a matmul: a per-K scale and shift (``MatmulKAttrs.a_scale`` /
``a_shift``, a layer norm's affine folded by ``passes/norm_fold.py``).

Every A^T tile TensorE takes has K on partitions, so the scale and shift of K tile ``j`` are
[kt, 1] per-partition operands. They are loaded once per kernel, before its loops, as two
[128, Kt] tiles (plain K tiles: the vector loaded as [Kt, 128] rows and transposed on TensorE,
fp32; K groups: one DMA in the vector's dtype):
column ``j`` holds the rows of K tile ``j``, rows ``128 j + p`` for plain K tiles, rows
``(j // G) * 128 G + j % G + G p`` for K groups of ``G`` (``matmul._kgroup``). The tile is
then made as ``A^T * scale + shift`` by the instruction that makes it:
- a TensorE transpose's copy out of PSUM becomes a ``tensor_scalar`` with the two columns as
  its operands (same engines, same cost as the copy: the fold is free there);
- a tile that arrives by DMA (a DMA transpose, a direct load) gets one in-place
  ``tensor_scalar`` after the DMA.
The products read ``(xn rounded to A's dtype) * scale + shift`` computed in fp32 and rounded
once to A's dtype, where the unfolded layer norm rounded ``xn * w`` and ``+ b`` separately.
"""
from __future__ import annotations

from typing import Protocol

from lowering.kir import KOp, MatmulKAttrs
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, EngineKind, Memory

TK = 128
F32 = DType.FP32
EVAC_ENGINES = (EngineKind.VECTOR, EngineKind.SCALAR)
SCALAR = EngineKind.SCALAR


class Prologue(Protocol):
    """What makes an operand's tiles (``matmul._Side.pro``): ``dst = f(src)`` for K tile ``j``
    of ``kt`` rows, by the instruction that would otherwise copy ``src`` (or in place)."""

    def make(self, b: TirBuilder, dst: TAP, src: TAP, j, kt: int, engines=None) -> None: ...


class ScaleBy:
    """Tiles made as ``src * s`` (attention's Q^T with a power-of-two scale)."""

    def __init__(self, s: float) -> None:
        self.s = s

    def make(self, b: TirBuilder, dst: TAP, src: TAP, j, kt: int, engines=None) -> None:
        b.tensor_scalar(dst, src, AluOp.MULTIPLY, self.s, engines=engines or EVAC_ENGINES)


class APrologue:
    """The scale/shift columns of one matmul kernel (module docstring); ``G``: K tiles per K
    group of the kernel's K loops (1: plain tiles)."""

    def __init__(self, b: TirBuilder, k: KOp, K: int, G: int) -> None:
        a = k.attrs
        assert isinstance(a, MatmulKAttrs)
        kt_n = -(-K // TK)
        self.cols: dict[str, object] = {}
        for name, idx in (("scale", a.a_scale), ("shift", a.a_shift)):
            if idx is None:
                continue
            v = k.ins[idx]
            vs = v.strides[-1]
            if G == 1 and kt_n <= TK and K > 1:
                self.cols[name] = self._transposed(b, name, v, K, kt_n)
                continue
            t = b.tile(f"a{name}", Memory.SBUF, min(K, TK), kt_n, v.dtype, 1)
            if G > 1:       # K % (G * 128) == 0 (``_kgroup``)
                b.dma(t.ap(TK, dims=((1, kt_n),)),
                      hbm_ap(v.buffer, v.dtype, v.offset, TK, G * vs,
                             ((K // (G * TK), G * TK * vs), (G, vs))))
            else:
                full, rem = divmod(K, TK)
                if full:
                    b.dma(t.ap(TK, dims=((1, full),)),
                          hbm_ap(v.buffer, v.dtype, v.offset, TK, vs, ((full, TK * vs),)))
                if rem:
                    b.dma(t.ap(rem, elem_offset=full, dims=((1, 1),)),
                          hbm_ap(v.buffer, v.dtype, v.offset + full * TK * vs, rem, vs, ((1, 1),)))
            self.cols[name] = t

    @staticmethod
    def _transposed(b: TirBuilder, name: str, v, K: int, kt_n: int):
        """The columns of plain K tiles by one load of the vector as [Kt, 128] rows (contiguous
        runs; the column layout loaded directly is one 2-byte run per element): on a target
        with 2-byte DMA transposes, one DMA transpose of
        those rows (two or more whole rows: one row is a vector, not a 2-D transpose) (a weight load: it runs ahead with the weight stream, touching no compute
        engine); else one TensorE transpose into PSUM, copied out in fp32 on ScalarE (an
        instruction that, issued in program order after the producing layer norm's work, held
        the kernel's first x^T transposes back)."""
        vs = v.strides[-1]
        full, rem = divmod(K, TK)
        if full > 1 and not rem and v.dtype.itemsize == 2 and b.target.dma_transpose_efficiency > 0:
            t = b.tile(f"a{name}", Memory.SBUF, TK, kt_n, v.dtype, 1)
            b.dma(t.ap(TK, dims=((1, full),)), hbm_ap(v.buffer, v.dtype, v.offset, full, TK * vs, ((TK, vs),)),
                  transpose=True)
            return t
        ps = b.tile(f"a{name}p", Memory.PSUM, TK, kt_n, F32, 1)
        if full:
            rows = b.tile(f"a{name}r", Memory.SBUF, full, TK, v.dtype, 1)
            b.dma(rows.ap(), hbm_ap(v.buffer, v.dtype, v.offset, full, TK * vs, ((TK, vs),)))
            b.transpose(ps.ap(TK, dims=((1, full),)), rows.ap())
        if rem:     # the partial last tile: its own row at partition 0 (access alignment)
            tail = b.tile(f"a{name}t", Memory.SBUF, 1, rem, v.dtype, 1)
            b.dma(tail.ap(), hbm_ap(v.buffer, v.dtype, v.offset + full * TK * vs, 1, 0, ((rem, vs),)))
            b.transpose(ps.ap(rem, elem_offset=full, dims=((1, 1),)), tail.ap())
        t = b.tile(f"a{name}", Memory.SBUF, TK, kt_n, F32, 1)
        # copied out on ScalarE: VectorE's queue holds the producing layer norm's statistics
        # (bn_stats / bn_aggr run on VectorE only), which the copy would wait behind although
        # it needs only the weights
        if full:
            b.tensor_copy(t.ap(TK, dims=((1, full),)), ps.ap(TK, dims=((1, full),)), engines=(SCALAR,))
        if rem:
            b.tensor_copy(t.ap(rem, elem_offset=full, dims=((1, 1),)),
                          ps.ap(rem, elem_offset=full, dims=((1, 1),)), engines=(SCALAR,))
        return t

    def _col(self, name: str, j, kt: int) -> TAP:
        return self.cols[name].ap(kt, elem_offset=j, dims=((1, 1),))  # type: ignore[attr-defined]

    def make(self, b: TirBuilder, dst: TAP, src: TAP, j, kt: int, engines=None) -> None:
        """``dst = src * scale[:, j] + shift[:, j]`` over ``kt`` partitions (``src`` may be
        ``dst``, or the PSUM tile of a TensorE transpose)."""
        ops = [(AluOp.MULTIPLY, self._col("scale", j, kt))] if "scale" in self.cols else []
        ops += [(AluOp.ADD, self._col("shift", j, kt))] if "shift" in self.cols else []
        (op0, c0), *rest = ops
        kw = {"op1": rest[0][0], "operand1": rest[0][1]} if rest else {}
        b.tensor_scalar(dst, src, op0, c0, engines=engines or EVAC_ENGINES, **kw)
