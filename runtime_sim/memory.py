"""The memories of one NeuronCore, as bytes: HBM buffers, SBUF and PSUM.

Invariants
- SBUF is ``uint8[sbuf_partitions, sbuf_bytes_per_partition]``, PSUM is
  ``uint8[sbuf_partitions, psum_bytes_per_partition]``; each HBM buffer is its own
  ``uint8[1, bytes_per_partition]``. Everything starts as 0xFF bytes, which is NaN in every float
  dtype, and a parallel boolean "written" mask starts False.
- An AP is read or written through a numpy strided view: ``as_strided`` over the memory with
  shape ``(partitions, *sizes, itemsize)`` and byte strides ``(row bytes, *stride*itemsize, 1)``,
  then reinterpreted as the AP's dtype (so unaligned offsets work). SBUF/PSUM addresses are
  absolute: ``buffer.offset + ap.byte_offset``; partition ``p`` of an AP is physical partition
  ``ap.partition_start + p`` (buffers span partitions from 0).
- Reads copy (so an instruction whose destination overlaps its source sees the old values).
- With ``track=True`` (checks on): reading a byte never written raises UninitializedReadError
  naming the first such partition/byte; PSUM remembers per byte whether its last writer was a
  matmul (TensorE) or another instruction, and a matmul accumulating onto bytes not last written
  by a matmul raises PsumAccumulateError (undefined on NC-v2/v3, hardware.md).
- Bounds are always re-checked here (cheaply) so that a bad AP can never touch memory outside
  its buffer even with checks off.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .checks import BoundsError, InputError, OperandError, PsumAccumulateError, UninitializedReadError
from .isa import AP, Buffer, DType, Memory, Program
from .targets import Target

WRITER_NONE, WRITER_MATMUL, WRITER_OTHER = 0, 1, 2


class MachineMemory:
    def __init__(self, program: Program, target: Target, *, track: bool = True) -> None:
        self.target = target
        self.track = track
        P = target.sbuf_partitions
        self.sbuf = np.full((P, target.sbuf_bytes_per_partition), 0xFF, dtype=np.uint8)
        self.psum = np.full((P, target.psum_bytes_per_partition), 0xFF, dtype=np.uint8)
        self.buffers: dict[str, Buffer] = {b.name: b for b in program.buffers}
        self.hbm: dict[str, np.ndarray] = {
            b.name: np.full((1, b.bytes_per_partition), 0xFF, dtype=np.uint8)
            for b in program.buffers if b.memory is Memory.HBM}
        if track:
            self.sbuf_w = np.zeros(self.sbuf.shape, dtype=bool)
            self.psum_w = np.zeros(self.psum.shape, dtype=bool)
            self.psum_writer = np.zeros(self.psum.shape, dtype=np.uint8)
            self.hbm_w = {k: np.zeros(v.shape, dtype=bool) for k, v in self.hbm.items()}

    # ---- host side ---------------------------------------------------------------------------
    def load(self, name: str, array: np.ndarray) -> None:
        dst = self.hbm.get(name)
        if dst is None:
            raise InputError(f"{name!r} is not an HBM buffer of the program")
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if raw.size > dst.shape[1]:
            raise InputError(f"input {name!r} has {raw.size} B, buffer holds {dst.shape[1]} B")
        dst[0, :raw.size] = raw
        if self.track:
            self.hbm_w[name][0, :raw.size] = True

    def dump(self, name: str) -> np.ndarray:
        return self.hbm[name].reshape(-1).copy()

    # ---- views -----------------------------------------------------------------------------
    def _arrays(self, ap: AP) -> tuple[np.ndarray, np.ndarray | None, int, Buffer]:
        buf = self.buffers[ap.buffer]
        if buf.memory is Memory.HBM:
            return self.hbm[ap.buffer], (self.hbm_w[ap.buffer] if self.track else None), 0, buf
        if buf.memory is Memory.SBUF:
            return self.sbuf, (self.sbuf_w if self.track else None), buf.offset or 0, buf
        return self.psum, (self.psum_w if self.track else None), buf.offset or 0, buf

    def _bytes_view(self, arr: np.ndarray, ap: AP, off: int, buf: Buffer) -> np.ndarray:
        lo, hi = ap.byte_extent()
        if (lo < 0 or hi > buf.bytes_per_partition or ap.partition_start < 0
                or ap.partition_start + ap.partitions > arr.shape[0]
                or (buf.memory is not Memory.HBM and ap.partition_start + ap.partitions > buf.partitions)):
            raise BoundsError(f"{ap} is outside buffer {buf}")
        isz = ap.dtype.itemsize
        row = arr.strides[0]
        start = ap.partition_start * row + off + ap.byte_offset
        flat = arr.reshape(-1)
        shape = (ap.partitions,) + tuple(sz for _, sz in ap.dims) + (isz,)
        strides = (row,) + tuple(st * isz for st, _ in ap.dims) + (1,)
        # as_strided measures from the data pointer of flat[start:]; negative strides reach back
        # into the same (bounds-checked) buffer.
        return as_strided(flat[start:] if start < flat.size else flat[flat.size - 1:], shape=shape,
                          strides=strides, writeable=True)

    def view(self, ap: AP) -> np.ndarray:
        """The AP as a writable numpy array of its dtype and shape ``(partitions, *sizes)``."""
        arr, _, off, buf = self._arrays(ap)
        b = self._bytes_view(arr, ap, off, buf)
        return b.view(ap.dtype.np)[..., 0]

    # ---- reads and writes -------------------------------------------------------------------
    def read(self, ap: AP) -> np.ndarray:
        """A copy of the AP's elements in its own dtype, shape ``(partitions, *sizes)``."""
        arr, mask, off, buf = self._arrays(ap)
        b = self._bytes_view(arr, ap, off, buf)
        if mask is not None:
            m = self._bytes_view(mask, ap, off, buf)
            if not m.all():
                idx = np.argwhere(~m)[0]
                self._uninit(ap, buf, idx)
        return b.view(ap.dtype.np)[..., 0].copy()

    def read_f32(self, ap: AP) -> np.ndarray:
        x = self.read(ap)
        if x.dtype == np.float32:
            return x
        return x.astype(np.float32)

    def _uninit(self, ap: AP, buf: Buffer, idx: np.ndarray) -> None:
        p = ap.partition_start + int(idx[0])
        byte = ap.byte_offset + sum(int(i) * st * ap.dtype.itemsize for i, (st, _) in zip(idx[1:-1], ap.dims)) + int(idx[-1])
        raise UninitializedReadError(
            f"reads {ap}, but byte {byte} of partition {p} of {buf.memory.value}:{buf.name} was never "
            f"written (element index {tuple(int(i) for i in idx[:-1])})")

    def write(self, ap: AP, values: np.ndarray, *, by_matmul: bool = False) -> None:
        """Round ``values`` (any float/int array with ``ap.num_elements`` elements, taken in
        row-major order) to the AP's dtype and store them."""
        arr, mask, off, buf = self._arrays(ap)
        b = self._bytes_view(arr, ap, off, buf)
        v = b.view(ap.dtype.np)[..., 0]
        v[...] = cast_to(np.asarray(values).reshape(v.shape), ap.dtype)
        if mask is not None:
            self._bytes_view(mask, ap, off, buf)[...] = True
            if buf.memory is Memory.PSUM:
                self._bytes_view(self.psum_writer, ap, off, buf)[...] = WRITER_MATMUL if by_matmul else WRITER_OTHER

    def check_accumulate(self, ap: AP) -> None:
        """Matmul accumulate=True onto ``ap``: every byte must have been last written by a matmul."""
        if not self.track:
            return
        arr, mask, off, buf = self._arrays(ap)
        w = self._bytes_view(self.psum_writer, ap, off, buf)
        bad = w != WRITER_MATMUL
        if bad.any():
            idx = np.argwhere(bad)[0]
            kind = int(w[tuple(idx)])
            if kind == WRITER_NONE:
                self._uninit(ap, buf, idx)
            p = ap.partition_start + int(idx[0])
            raise PsumAccumulateError(
                f"matmul accumulates into {ap}, but partition {p} of it was last written by a "
                f"non-matmul instruction (memset/copy); accumulating onto such PSUM is undefined on "
                f"NC-v2/v3 - start the group with accumulate=False")


_INT_RANGE = {DType.INT32: (-2**31, 2**31 - 1), DType.INT64: (-2**63, 2**63 - 1),
              DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.UINT32: (0, 2**32 - 1)}


FP8_E4M3_MAX = 448.0


def cast_to(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Round to a machine dtype. Floats: round-to-nearest-even (ml_dtypes for bf16/fp8;
    float8_e4m3fn saturates to +-448, e5m2 overflows to +-inf).
    Integers: from floats truncate toward zero, NaN -> 0, saturate to the range; integers of
    another width are converted exactly/saturated. BOOL: 1 where the value is non-zero."""
    npd = dtype.np
    if values.dtype == npd and dtype is not DType.BOOL:
        return values
    if dtype is DType.BOOL:
        return (values != 0).astype(np.uint8)
    if dtype.is_float:
        if values.dtype.kind in "iu" and npd.itemsize < 4:
            values = values.astype(np.float32)
        if dtype is DType.FP8_E4M3:
            # e4m3fn has no infinity: out-of-range values (and +-inf) saturate to +-448, as
            # torch's conversion does; NaN stays NaN (ml_dtypes alone would give NaN)
            values = np.clip(values, -FP8_E4M3_MAX, FP8_E4M3_MAX)
        return values.astype(npd)
    if dtype not in _INT_RANGE:
        raise OperandError(f"{dtype.value} holds packed MX values: only MX instructions and copies "
                           f"of its own type write it, got {values.dtype} values")
    lo, hi = _INT_RANGE[dtype]
    if values.dtype.kind in "iub":
        return np.clip(values.astype(np.int64), lo, hi).astype(npd)
    v = np.trunc(np.asarray(values, dtype=np.float64))
    v = np.nan_to_num(v, nan=0.0, posinf=float(hi), neginf=float(lo))
    if dtype is DType.INT64:
        big = 9.2233720368547748e18  # largest float64 below 2**63
        return np.clip(v, -big, big).astype(npd)
    return np.clip(v, lo, hi).astype(npd)
