"""Accesses to resident tensors (``passes/residency.py``): HBM access patterns mapped onto the
tensor's SBUF buffer.

Tilers address every tensor as if it lived in HBM. For a resident tensor the builder maps the
access pattern onto its SBUF layout (row ``r`` of ``C`` elements on partition ``r % 128``, row
tile ``r // 128`` at element ``(r // 128) * C`` of the partition): the outermost axis with
stride ``C`` becomes the partition axis (at most 128 rows of one row tile), loop variables that
step whole row tiles move the free offset, the others must stay inside the row. A DMA between a
resident tensor and an SBUF tile becomes an engine copy when both sides cover the same
partitions (else an SBUF->SBUF DMA); a transposing DMA an SBUF->SBUF transpose (its source at
most one row tile: tilers load resident operands in pieces of 128 rows).

Invariants
- A mapped access touches exactly the elements the HBM access would have touched.
- An access that does not follow the layout raises ``NotResident`` naming the tensor: the
  compiler then keeps that tensor in HBM and tiles again (never a wrong address).
"""
from __future__ import annotations

from dataclasses import replace

from lowering.errors import LoweringError
from lowering.tir.affine import Affine
from lowering.tir.ir import TAP
from runtime_sim.isa import EngineKind, Memory

P = 128


class NotResident(LoweringError):
    def __init__(self, buffer: str, why: str):
        super().__init__(f"tensor {buffer} cannot stay in SBUF: {why}")
        self.buffer = buffer
        self.also: tuple[NotResident, ...] = ()   # more refusals found in the same tiling pass


def map_ap(res, tbuf: str, a: TAP, counts: dict[str, int]) -> TAP:
    """``a`` (an HBM access of the resident tensor ``res``) as an access of SBUF buffer
    ``tbuf``."""
    C, isz = res.cols, res.itemsize
    if a.dtype.itemsize != isz or a.offset.const % isz or any(c % isz for _, c in a.offset.terms):
        raise NotResident(res.buffer, f"access {a} does not address whole elements")
    off = a.offset // isz
    dims = list(a.dims)
    p = 1
    if dims and dims[0][0] == C and dims[0][1] > 1:
        p = dims.pop(0)[1]
    if p > P:
        raise NotResident(res.buffer, f"access {a} spans {p} rows (> {P})")
    r0, c0 = divmod(off.const, C)
    free = Affine((r0 // P) * C + c0)
    col = Affine(c0)
    for v, k in off.terms:
        if k % (P * C) == 0:
            free = free + Affine.var(v) * (k // (P * C) * C)
        elif k % C == 0:
            raise NotResident(res.buffer, f"access {a} moves rows by {k // C} per step of {v}")
        else:
            free = free + Affine.var(v) * k
            col = col + Affine.var(v) * k
    lo, hi = col.bounds(counts)
    span = sum((s - 1) * st for st, s in dims if st > 0)
    if lo < 0 or hi + span >= C or any(st < 0 for st, _ in dims):
        raise NotResident(res.buffer, f"access {a} leaves its row of {C} elements")
    p0 = r0 % P
    if p0 + p > P:
        raise NotResident(res.buffer, f"access {a} crosses a row tile (rows {r0}..{r0 + p - 1})")
    return TAP(tbuf, p0, p, free * isz, tuple(dims) or ((1, 1),), a.dtype)


def dma(b, dst: TAP, src: TAP, transpose: bool):
    """The builder's ``dma`` when a side is a resident tensor."""
    md = b.map_resident(dst)
    ms = b.map_resident(src)
    if transpose:
        return b.emit_dma(md, ms, True)
    if (md.partition_start == ms.partition_start and md.partitions == ms.partitions
            and b.buffers[md.buf].memory is not Memory.HBM and b.buffers[ms.buf].memory is not Memory.HBM
            and md.dtype == ms.dtype and _flat(md) == _flat(ms)):
        return b.tensor_copy(md, ms, engines=(EngineKind.VECTOR, EngineKind.GPSIMD, EngineKind.SCALAR))
    return b.emit_dma(md, ms, False)


def _flat(a: TAP) -> int:
    n = 1
    for _, s in a.dims:
        n *= s
    return n
