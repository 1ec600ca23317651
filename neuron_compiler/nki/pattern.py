"""NKI's explicit access patterns: ``t.ap(pattern=[[step, count], ...], offset=0, dtype=None)``.

The pattern addresses ``t``'s memory as a flat array of elements (row-major over the tensor's
shape, from the view's first element), pairs outermost first. On chip the first pair is the
partition dimension: its step must be one partition (the elements of a partition's row, as
``mx_kernel_utils.load_scales_scattered`` writes ``[[scale_f, 4], [1, scale_f]]``) and
``offset`` may start on another partition (``offset // row``). ``dtype`` reinterprets the same
bytes (a uint32 HBM tensor viewed as ``nl.float8_e5m2_x4``): steps and offset then count
elements of that type.

Invariants
- A pattern view is a view of the same Buffer: the tracer orders it with every other access of
  that memory. A reinterpreting view's storage is an alias (``Storage.alias_of``) that keeps the
  original alive and never frees memory; an HBM pattern view's box is the whole tensor (its
  accesses are ordered against all others of that tensor).
- Out-of-range patterns are IndexErrors naming the pattern, the element reached and the size.
"""
from __future__ import annotations

from runtime_sim.isa import Memory

from .tensor import NkiTensor, Storage, free_elems, to_dtype


def _alias(st: Storage, dt) -> Storage:
    if st.memory is Memory.HBM:
        shape, pdim = (st.buffer.bytes_per_partition // dt.itemsize,), None
    else:
        row = free_elems(st.shape, st.pdim) * st.dtype.itemsize
        if row % dt.itemsize:
            raise ValueError(f"{st.name}: a row of {row} B is not a whole number of {dt.value} elements")
        shape, pdim = (st.shape[st.pdim], row // dt.itemsize), 0
    a = Storage(st.buffer, shape, dt, pdim)
    a.alias_of = st
    a.placement = None
    return a


def pattern_view(v: NkiTensor, pattern, offset: int = 0, dtype=None, **kw) -> NkiTensor:
    if kw:
        raise NotImplementedError(f"tensor.ap({', '.join(kw)}=...) is not modelled by the NKI front end")
    st = v.storage
    if st.placement is not None or st.block_elems is not None:
        raise NotImplementedError(f"{v!r}: .ap(pattern=...) of a tensor with blocks is not modelled")
    dt = to_dtype(dtype) if dtype is not None else st.dtype
    if pattern is None:
        raise TypeError(f"{v!r}.ap(...) needs pattern=[[step, count], ...]")
    pairs = [(int(s), int(n)) for s, n in pattern]
    first = v.offset * st.dtype.itemsize
    if first % dt.itemsize:
        raise ValueError(f"{v!r}: the view starts at byte {first}, not on a {dt.value} element")
    tgt = _alias(st, dt) if dt is not st.dtype else st
    start = first // dt.itemsize + int(offset)
    what = f"{st.name}.ap(pattern={[list(p) for p in pairs]}, offset={offset}, dtype={dt.value})"
    if st.memory is Memory.HBM:
        size = st.buffer.bytes_per_partition // dt.itemsize
        hi = start + sum(s * (n - 1) for s, n in pairs if s > 0)
        lo = start + sum(s * (n - 1) for s, n in pairs if s < 0)
        if lo < 0 or hi >= size:
            raise IndexError(f"{what}: reaches element {lo if lo < 0 else hi} of {size}")
        axes = tuple((s, n, False, frozenset()) for s, n in pairs)
        return NkiTensor(tgt, start, 0, axes, None)
    row = free_elems(st.shape, st.pdim) * st.dtype.itemsize // dt.itemsize
    (ps, pn), free = pairs[0], pairs[1:]
    if pn > 1 and ps != row:
        raise ValueError(f"{what}: the first pair is the partition dimension; its step must be one "
                         f"partition ({row} elements), got {ps}")
    pstart = v.pstart + start // row
    eoff = start % row
    hi = eoff + sum(s * (n - 1) for s, n in free if s > 0)
    if pstart + pn > st.shape[st.pdim] or hi >= row or eoff + sum(s * (n - 1) for s, n in free if s < 0) < 0:
        raise IndexError(f"{what}: partitions [{pstart}, {pstart + pn}) of {st.shape[st.pdim]}, "
                         f"elements up to {hi} of a {row}-element row")
    axes = ((0, pn, True, frozenset()),) + tuple((s, n, False, frozenset()) for s, n in free)
    return NkiTensor(tgt, eoff, pstart, axes, None)
