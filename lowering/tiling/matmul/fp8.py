"""fp8 matmuls in TensorE's double-row mode: K tiles of 256 packed as two K rows per partition.

nki.isa.nc_matmul (aws-neuron-sdk@81ce03a ``nki/api/nki/isa/__init__.py``, "Performance mode",
"Layout"): on NeuronCore-v3 and -v4, ``perf_mode=double_row`` takes fp8 stationary ``[P, 2, M]``
and moving ``[P, 2, N]`` tiles, "the contraction dimension of the matmul is split between the
partition dimension and the first free dimension after the partition dimension ... The first
free dimension must be 2", at twice the bf16 rate. trainium2_arch.rst ("Double FP8 Matmul
Performance"): "Both the stationary matrix ... and the moving matrix ... are sliced in two tiles,
where the first and second tile correspond to first and second halves of the contraction
dimension"; "if the contraction dimension of the matmul is not a multiple of two, programmers
are required to explicitly pad the input tensors with zeros".

Layout invariants (``KPack`` with ``pack`` = 2; ``pack`` = 1 is the plain layout, every
expression below then reduces to the K <= 128 tiler's own):
- a K tile covers ``tk = 128 * pack`` rows of K; a tile holding it has ``P = ceil(kt / pack)``
  partitions and ``pack`` halves of ``width`` elements side by side (half j from element
  ``j * width``), half j holding K rows ``k0 + j * P .. k0 + j * P + P``;
- an odd ``kt`` leaves the last partition of the last half short: that half is zeroed first
  (one memset), then loaded, so the padded row contributes 0 to every sum;
- a direct operand loads a full K tile in one DMA whose access pattern walks (partition, half,
  column); a TensorE-transposed one (rows from HBM, staged rows or a resident tensor)
  transposes each half into its part of one PSUM tile and copies both halves out at once, so
  the transposes put each half where the instruction reads it; other forms (DMA transpose,
  strided) and odd tails load each half by the operand's own form (``_Side.load``);
- the matmul reads ``[P, (width, pack), (1, f)]``: the packed axis outermost.
Used only for fp8 operands on targets whose ``fp8_matmul_speedup`` >= ``DOUBLE_ROW_PACK``
(trn2, trn3); trn1 keeps ``pack`` = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from lowering.tiling.matmul.plan import DIRECT, PE_T, RES_T
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import (DOUBLE_ROW_PACK, FP8_DTYPES, DType, EngineKind, MatmulAttrs,
                             MatmulPerfMode, Memory, Op)
from runtime_sim.targets import Target

TK = 128     # K rows per partition-row of a plain matmul (TensorE's 128 PE rows)
F32 = DType.FP32


def k_pack(dtype: DType, t: Target) -> int:
    """K rows per partition of the matmul tiles: ``DOUBLE_ROW_PACK`` for fp8 operands on a
    target with the double fp8 rate, else 1."""
    return DOUBLE_ROW_PACK if dtype in FP8_DTYPES and t.fp8_matmul_speedup >= DOUBLE_ROW_PACK else 1


@dataclass(frozen=True)
class KPack:
    pack: int = 1

    @property
    def tk(self) -> int:
        """K rows per K tile."""
        return TK * self.pack

    def parts(self, kt: int) -> int:
        """Partitions of a K tile of ``kt`` rows."""
        return -(-kt // self.pack)

    def tiles(self, K: int) -> int:
        return -(-K // self.tk)

    def koff(self, k0, width: int):
        """Element offset of the K tile starting at row ``k0`` in a tile holding every K tile of
        ``width``-element halves side by side."""
        return k0 // self.tk * self.pack * width

    def load(self, side, b: TirBuilder, dst, dst_off, bbase: Affine, k0, kt: int, f0, fw: int,
             width: int, stage=None, j=None) -> None:
        """X[k0 : k0+kt, f0 : f0+fw] into the K tile at ``dst_off`` of ``dst`` (halves
        ``width`` apart); ``side``: the operand (``matmul._Side``)."""
        if self.pack == 1:
            side.load(b, dst, dst_off, bbase, k0, kt, f0, fw, stage, j=j)
            return
        p = self.parts(kt)
        r = side.ref
        if side.form == DIRECT and kt == self.pack * p and fw > 1:
            # one DMA for both halves: partition p, half j, column f <- X[k0 + j*p + p, f0 + f]
            b.dma(dst.ap(p, elem_offset=dst_off, dims=((width, self.pack), (1, fw))),
                  hbm_ap(r.buffer, r.dtype, bbase + aff(k0) * side.kstride + f0 * side.fstride, p,
                         side.kstride, ((self.pack, p * side.kstride), (fw, side.fstride))))
            return
        if side.form in (PE_T, RES_T) and fw > 1 and kt - p > 1:
            self._transposed(side, b, dst, dst_off, bbase, k0, kt, f0, fw, width, stage)
            return
        for j in range(self.pack):
            rows = min(p, kt - j * p)
            if rows < p:        # the zero pad of an odd K (ASSUMED: memset, then load over it)
                b.memset(dst.ap(p, elem_offset=dst_off + j * width, dims=((1, fw),)), 0.0)
            if rows > 0:
                side.load(b, dst, dst_off + j * width, bbase, aff(k0) + j * p, rows, f0, fw, stage)

    def _transposed(self, side, b: TirBuilder, dst, dst_off, bbase: Affine, k0, kt: int, f0,
                    fw: int, width: int, stage) -> None:
        """A TensorE-transposed operand: per 128 columns, each half's rows transposed into its
        own part of one PSUM tile, and one copy of both into the packed tile (as many copies as
        an unpacked K tile takes). The pad row of an odd ``kt`` is zeroed in PSUM first."""
        r = side.ref
        p = self.parts(kt)
        for c0, cw in b.tiled(fw, 128, "t"):
            tps = b.tile("tps", Memory.PSUM, p, self.pack * cw, F32, side.tp_bufs)
            for j in range(self.pack):
                rows_j, kj = min(p, kt - j * p), aff(k0) + j * p
                if rows_j < p:
                    b.memset(tps.ap(p, elem_offset=j * cw, dims=((1, cw),)), 0.0)
                src = hbm_ap(r.buffer, r.dtype, bbase + (f0 + c0) * side.fstride + kj * side.kstride,
                             cw, side.fstride, ((rows_j, side.kstride),))
                rows = b.resident_view(src, cw)      # RES_T: the rows are already in SBUF
                if stage is not None:
                    st, K, off = stage
                    rows = st.ap(cw, elem_offset=off + c0 // 128 * K + kj, dims=((1, rows_j),))
                elif rows is None:
                    t = b.tile("rows", Memory.SBUF, cw, rows_j, r.dtype, 2)
                    b.dma(t.ap(), src)
                    rows = t.ap()
                b.transpose(tps.ap(rows_j, elem_offset=j * cw, dims=((1, cw),)), rows)
            b.tensor_copy(dst.ap(p, elem_offset=dst_off + c0, dims=((width, self.pack), (1, cw))),
                          tps.ap(p, dims=((cw, self.pack), (1, cw))))

    def ap(self, tile, kt: int, elem_offset, fw: int, width: int) -> TAP:
        """A matmul operand: ``fw`` columns of the K tile at ``elem_offset``."""
        if self.pack == 1:
            return tile.ap(kt, elem_offset=elem_offset, dims=((1, fw),))
        return tile.ap(self.parts(kt), elem_offset=elem_offset, dims=((width, self.pack), (1, fw)))

    def matmul(self, b: TirBuilder, dst: TAP, stat: TAP, mov: TAP, start_when: tuple) -> None:
        """``TirBuilder.matmul`` with ``perf_mode=double_row`` when packed (same start rule: a
        group starts where every non-constant ``start_when`` is 0; a non-zero constant never
        starts one)."""
        if self.pack == 1:
            b.matmul(dst, stat, mov, start_when=start_when)
            return
        sw = tuple(aff(v) for v in start_when)
        if any(v.is_const and v.const != 0 for v in sw):
            sw, acc = (), True
        else:
            sw = tuple(v for v in sw if not v.is_const)
            acc = bool(sw)
        b.emit(Op.MATMUL, dst, (stat, mov), MatmulAttrs(acc, MatmulPerfMode.DOUBLE_ROW),
               engines=(EngineKind.TENSOR,), start_when=sw)
