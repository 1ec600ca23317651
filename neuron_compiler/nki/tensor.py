"""Tensors of a traced NKI kernel: storages in HBM/SBUF/PSUM and views of them.

A ``Storage`` is one allocation: an HBM tensor (a kernel argument or an ``nl.ndarray(...,
buffer=nl.shared_hbm)``), or an on-chip tile in SBUF/PSUM (``nl.ndarray``/``nl.zeros``/the
result of an ``nl.*`` op). An ``NkiTensor`` is a view of a storage: an element offset and a
list of axes ``(stride in elements, size)``; on-chip views also have a partition range, one of
their axes being the partition axis. Indexing a view (ints, slices, ``nl.ds``, ``nl.arange``
expressions, ``...``) gives a view; no data moves until an instruction reads it.

Invariants
- A view's ``shape`` is the sizes of its axes; elements are visited in row-major order of that
  shape, as the machine's access patterns do (runtime_sim.isa.AP).
- An on-chip view has at most one partition axis and, to become an instruction operand, it must
  be the first axis (``ap()``): partition = first dimension, as in NKI. A view that indexed its
  partition axis with an integer has one partition.
- An HBM view of a base tensor carries the box (index range per tensor dimension) it touches;
  the tracer orders HBM accesses by these boxes (views of views keep their parent's box, a
  superset).
- Broadcast views (stride 0) are read-only operands; writing through them is an AccessPatternError
  of the machine.
"""
from __future__ import annotations

import weakref

import ml_dtypes
import numpy as np

from runtime_sim.isa import AP, Buffer, DType, Memory

from .index import DynSlice, IndexExpr, Mask


# ---- dtypes -----------------------------------------------------------------------------------

_ALIASES = {"float8_e4m3": DType.FP8_E4M3, "float8_e4m3fn": DType.FP8_E4M3, "float8_e8m0fnu": DType.UINT8,
            "float8_e5m2": DType.FP8_E5M2, "bool": DType.BOOL, "bool_": DType.BOOL}


def to_dtype(dt) -> DType:
    """A machine dtype from an NKI/numpy/torch/ml_dtypes dtype (or a DType)."""
    if isinstance(dt, DType):
        return dt
    name = getattr(dt, "name", None) if not isinstance(dt, str) else dt
    if name is None and isinstance(dt, type):
        name = np.dtype(dt).name
    if isinstance(name, str):
        name = name.replace("torch.", "")
        if name in _ALIASES:
            return _ALIASES[name]
        for d in DType:
            if d.value == name:
                return d
    if str(dt).startswith("torch."):
        return to_dtype(str(dt)[6:])
    try:
        return DType.from_numpy(np.dtype(dt))
    except (TypeError, ValueError):
        raise TypeError(f"NKI dtype {dt!r} has no machine type (supported: "
                        f"{', '.join(d.value for d in DType)})") from None


def np_dtype(d: DType):
    """The numpy dtype a kernel sees as ``tensor.dtype`` (bool for BOOL)."""
    return np.dtype(np.bool_) if d is DType.BOOL else d.np


# ---- buffers (nl.sbuf, nl.psum, nl.shared_hbm, ...) ---------------------------------------------

class BufferKind:
    """``nl.sbuf`` / ``nl.psum`` / ``nl.hbm`` / ``nl.shared_hbm`` / ``nl.private_hbm``."""

    def __init__(self, name: str, memory: Memory) -> None:
        self.name, self.memory = name, memory

    def __repr__(self) -> str:
        return f"nl.{self.name}"


class PlacedKind(BufferKind):
    """``ncc.sbuf.mod_alloc(...)`` / ``ncc.psum.alloc(fn)``: a buffer kind with an allocation
    function (placement.py) that places each block of the tensor."""

    def __init__(self, kind: BufferKind, place, how: str) -> None:
        super().__init__(kind.name, kind.memory)
        self.place, self.how = place, how

    def __repr__(self) -> str:
        return self.how


sbuf = BufferKind("sbuf", Memory.SBUF)
psum = BufferKind("psum", Memory.PSUM)
hbm = BufferKind("hbm", Memory.HBM)
shared_hbm = BufferKind("shared_hbm", Memory.HBM)
private_hbm = BufferKind("private_hbm", Memory.HBM)


class par_dim:
    """``nl.par_dim(n)``: marks the partition dimension of a tile's shape."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __index__(self) -> int:
        return self.size

    def __int__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"par_dim({self.size})"


# ---- storages -----------------------------------------------------------------------------------

class Storage:
    """One allocation. ``pdim``: the partition dimension of an on-chip tile's shape (None for
    HBM). ``block_elems``: in PSUM, the blocks of a tensor with dimensions before the partition
    dimension (``(n, par_dim(128), 512)``) each start a bank, as NKI places PSUM tiles; None:
    row-major. PSUM state for matmul accumulation (ops.py): ``mm_open``, the views a matmul wrote
    that nothing has read since (``accumulate=None``); ``mm_written``, the views a matmul wrote
    since the last other write (``+=``); ``zeroed``, set to 0 by a memset and not written since."""

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], dtype: DType, pdim: int | None,
                 block_elems: int | None = None) -> None:
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self.pdim = pdim
        self.block_elems = block_elems      # address stride of one block (dims before pdim)
        self.placement = None               # placement.Placement: blocks placed one by one
        self.alias_of: "Storage | None" = None   # the storage whose bytes this one reinterprets
        self.written_boxes: set = set()     # footprint boxes instructions wrote (tracer.emit)
        self.dead = ""                      # why its memory was reclaimed while referenced
        self.reclaim = None                 # releases its memory now (on_release)
        self.mm_open: set = set()
        self.mm_written: set = set()
        self.zeroed = False
        # (partitions, first kept) of the tile the kernel meant when a mask cut this one's
        # partition axis (a masked nl.load; inherited by tiles computed from it, tracer.emit)
        self.nominal: tuple[int, int] | None = None
        # (first, count): a whole tile of which only these partitions were written, by an
        # assignment of such a cut tile (ops.assign); reads through a full index grid see those
        self.valid: tuple[int, int] | None = None

    def window(self, pstart: int, n: int, lo: int, hi: int) -> tuple[int, int, int] | None:
        """An index grid over rows ``[lo, hi)`` of a view of ``n`` partitions from ``pstart``
        covering the whole tile: the rows of the nominal tile that hold data, ``(lo, hi,
        shift)`` (physical = nominal - shift), when a mask cut this tile (``nominal``; only a
        grid reaching past the cut tile means the nominal rows) or only part of it was written
        (``valid``); else None."""
        if pstart != 0 or self.pdim is None or n != self.shape[self.pdim]:
            return None
        if self.nominal is not None and n < self.nominal[0] and (lo < 0 or hi > n):
            return self.nominal[1], self.nominal[1] + n, self.nominal[1]
        if self.valid is not None and (lo < self.valid[0] or hi > self.valid[0] + self.valid[1]):
            return self.valid[0], self.valid[0] + self.valid[1], 0
        return None

    def cut_of(self, partitions: int) -> tuple[int, int] | None:
        """The ``nominal`` a tile computed from ``partitions`` rows of this one inherits."""
        if self.nominal is not None:
            return self.nominal
        if self.valid is not None and partitions == self.valid[1]:
            return self.shape[self.pdim], self.valid[0]
        return None

    @property
    def memory(self) -> Memory:
        return self.buffer.memory

    @property
    def name(self) -> str:
        return self.buffer.name

    def strides(self) -> list[int]:
        """Element strides per dimension (the partition dimension gets 0: it is not addressed)."""
        st = [0] * len(self.shape)
        acc = 1
        for d in reversed(range(len(self.shape))):
            if d == self.pdim:
                if self.block_elems is not None:
                    acc = self.block_elems
                continue
            st[d] = acc
            acc *= self.shape[d]
        return st

    def view(self) -> "NkiTensor":
        axes = tuple((0 if d == self.pdim else s, n, d == self.pdim, frozenset())
                     for d, (s, n) in enumerate(zip(self.strides(), self.shape)))
        box = tuple((0, n) for n in self.shape) if self.memory is Memory.HBM else None
        return NkiTensor(self, 0, 0, axes, box, base=True)


def free_elems(shape: tuple[int, ...], pdim: int | None) -> int:
    n = 1
    for d, s in enumerate(shape):
        if d != pdim:
            n *= s
    return n


# ---- views ------------------------------------------------------------------------------------

Axis = tuple  # (stride, size, is_partition, arange ids)


class NkiTensor:
    """A view of a storage (see the module docstring). Arithmetic operators call ``nl.*``
    (``operators.py`` installs them)."""

    __array_priority__ = 1000   # numpy scalars defer to our operators

    def __init__(self, storage: Storage, offset: int, pstart: int, axes: tuple[Axis, ...],
                 box, base: bool = False, checks: tuple = (), clips: tuple = ()) -> None:
        self.storage = storage
        self.offset = offset
        self.pstart = pstart
        self.axes = axes
        self.box = box
        self.base = base
        self.checks = checks    # (what, const, ((arange, coef), ...), bound): index in [0, bound)
        self.clips = clips      # ((arange id, lo, hi), ...): mask bounds applied to this view

    # -- what a kernel sees ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a[1] for a in self.axes)

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def dtype(self):
        return np_dtype(self.storage.dtype)

    @property
    def mdtype(self) -> DType:
        return self.storage.dtype

    @property
    def buffer(self) -> BufferKind:
        m = self.storage.memory
        return sbuf if m is Memory.SBUF else psum if m is Memory.PSUM else shared_hbm

    @property
    def memory(self) -> Memory:
        return self.storage.memory

    @property
    def partitions(self) -> int:
        for st, n, isp, _ in self.axes:
            if isp:
                return n
        return 1

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"NkiTensor({self.storage.name}, shape={self.shape}, dtype={self.storage.dtype.value}, {self.memory.value})"

    # -- geometry --------------------------------------------------------------------------------
    def key(self) -> tuple:
        """Identity of the elements addressed (storage, offset, partitions, axes)."""
        return (self.storage.name, self.offset, self.pstart, tuple(a[:3] for a in self.axes))

    def ap(self, pattern=None, offset: int = 0, dtype=None, **kw):
        """With no arguments, this view as a machine access pattern (partition axis first for
        on-chip views). With NKI's arguments, ``t.ap(pattern=[[step, count], ...], offset=,
        dtype=)``: a view of the same memory (``pattern_view``)."""
        if pattern is None and dtype is None and not offset and not kw:
            return self._ap()
        return pattern_view(self, pattern, offset, dtype, **kw)

    def _ap(self) -> AP:
        st = self.storage
        isz = st.dtype.itemsize
        if st.memory is Memory.HBM:
            dims = _merge([(s, n) for s, n, _, _ in self.axes])
            return AP(st.name, Memory.HBM, 0, 1, self.offset * isz, tuple(dims) or ((1, 1),), st.dtype)
        axes = self.axes
        if st.placement is not None:       # blocks placed one by one (placement.py)
            _, poff, boff, free = st.placement.locate(self)
            kept = [a for a in axes if a[2] or a in free]
            parts = next((a[1] for a in kept if a[2]), 1)
            if parts > 1 and not kept[0][2]:
                raise ValueError(f"{self!r}: the partition dimension must be the first dimension "
                                 f"of an operand")
            dims = _merge([(s, n) for s, n, _, _ in free])
            return AP(st.name, st.memory, self.pstart + poff, parts, boff,
                      tuple(dims) or ((1, 1),), st.dtype)
        if axes and axes[0][2]:
            parts, free = axes[0][1], axes[1:]
        elif any(a[2] for a in axes):
            raise ValueError(f"{self!r}: the partition dimension must be the first dimension of an "
                             f"operand (axes {[a[1] for a in axes]}, partition at "
                             f"{[a[2] for a in axes].index(True)})")
        else:
            parts, free = 1, axes
        dims = _merge([(s, n) for s, n, _, _ in free])
        return AP(st.name, st.memory, self.pstart, parts, self.offset * isz, tuple(dims) or ((1, 1),), st.dtype)

    def footprint(self):
        """(space, box) the tracer orders accesses by: HBM tensor box, or physical on-chip
        (partition range, byte range)."""
        st = self.storage
        if st.memory is Memory.HBM:
            return st.name, self.box
        a = self.ap()
        lo, hi = a.byte_extent()
        off = st.buffer.offset or 0
        space = st.placement.space if st.placement is not None else st.name
        return space, ((a.partition_start, a.partition_start + a.partitions), (off + lo, off + hi))

    def _with(self, **kw) -> "NkiTensor":
        d = dict(storage=self.storage, offset=self.offset, pstart=self.pstart, axes=self.axes, box=self.box,
                 checks=self.checks, clips=self.clips)
        d.update(kw)
        return NkiTensor(**d)

    # -- indexing -----------------------------------------------------------------------------------
    def __getitem__(self, key) -> "NkiTensor":
        return index_view(self, key)

    def reshape(self, shape) -> "NkiTensor":
        return reshape(self, tuple(int(s) for s in shape))

    def masked(self, mask: Mask | None) -> "NkiTensor":
        if mask is None:
            return self
        v = self
        for k, (s, n, isp, ids) in enumerate(self.axes):
            b = mask.of(ids)
            if b is not None:
                v = v.clip(k, b[0], b[1])
        return v

    def clip(self, k: int, lo: int, hi: int) -> "NkiTensor":
        """Axis ``k`` restricted to ``[lo, hi)``."""
        s, n, isp, ids = self.axes[k]
        hi = min(hi, n)
        if hi <= lo:
            raise ValueError(f"{self!r}: mask leaves axis {k} empty ([{lo}, {hi}))")
        axes = self.axes[:k] + ((s, hi - lo, isp, ids),) + self.axes[k + 1:]
        clips = self.clips + tuple((i, lo, hi) for i in ids)
        if isp:
            return self._with(pstart=self.pstart + lo, axes=axes, clips=clips)
        return self._with(offset=self.offset + s * lo, axes=axes, clips=clips)

    def validate(self) -> None:
        """Raise IndexError if an arange index reaches outside its tensor dimension once the
        masks applied to this view are taken into account (NKI: out-of-range indices must be
        masked off)."""
        for what, const, terms, bound in self.checks:
            lo = hi = const
            for a, c in terms:
                r0, r1 = 0, a.size
                for i, l, h in self.clips:
                    if i == a.id:
                        r0, r1 = max(r0, l), min(r1, h)
                lo += min(c * r0, c * (r1 - 1))
                hi += max(c * r0, c * (r1 - 1))
            if lo < 0 or hi >= bound:
                raise IndexError(f"index out of bounds: {what} indexed over [{lo}, {hi + 1}); "
                                 f"mask the out-of-range indices (mask=...)")

    # -- operators: ``+ - * / ** < <= > >= & |``, unary ``-``, ``t[i] = v``, ``+= -= *= /=`` and
    # ``broadcast_to`` are set on this class by ``operators.install()`` (they are nl.* / ops.*
    # calls, which build on this module)

    __hash__ = object.__hash__


def _merge(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drop size-1 axes and merge axes that are contiguous with their inner neighbour."""
    out: list[tuple[int, int]] = []
    for s, n in dims:
        if n == 1:
            continue
        if out and out[-1][0] == s * n:
            out[-1] = (s, out[-1][1] * n)
        else:
            out.append((s, n))
    return out


def _norm_key(key, ndim: int) -> list:
    key = list(key) if isinstance(key, tuple) else [key]
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        fill = ndim - (len(key) - 1)
        key = key[:i] + [slice(None)] * fill + key[i + 1:]
    if len(key) > ndim:
        raise IndexError(f"too many indices: {len(key)} for a tensor of {ndim} dimensions")
    return key + [slice(None)] * (ndim - len(key))


def index_view(v: NkiTensor, key) -> NkiTensor:
    """``v[key]`` (module docstring)."""
    items = _norm_key(key, v.ndim)
    grid_nd = max((k.ndim for k in items if isinstance(k, IndexExpr)), default=0)
    grid = [[0, 1, False, frozenset()] for _ in range(grid_nd)]   # stride, size, is_p, ids
    offset, pstart = v.offset, v.pstart
    out: list = []
    grid_at = None
    checks = list(v.checks)
    box = list(v.box) if (v.box is not None and v.base) else None
    cut = None                      # (output position of the partition grid axis, lo, hi)
    for d, (item, (s, n, isp, _)) in enumerate(zip(items, v.axes)):
        name = f"{v.storage.name} dimension {d} (size {n})"
        if isinstance(item, DynSlice):
            item = item.as_slice()
        if isinstance(item, IndexExpr):
            if grid_at is None:
                grid_at = len(out)
                out.append(None)
            lo = item.const + sum(min(0, c * (a.size - 1)) for a, c in item.terms)
            hi = item.const + sum(max(0, c * (a.size - 1)) for a, c in item.terms) + 1
            win = v.storage.window(v.pstart, n, lo, hi) if isp and len(item.terms) == 1 else None
            if win is not None and item.terms[0][1] == 1:
                # a full index grid over a tile a mask cut: the rows that hold data (NKI
                # computes every partition; the others are never stored)
                (a, _), = item.terms
                (pos, _), = item.by_position().items()
                cut = (pos - (item.ndim - grid_nd), max(0, win[0] - item.const),
                       min(a.size, win[1] - item.const))
                pstart -= win[2]
                lo, hi = win[0] - win[2], win[1] - win[2]
            elif lo < 0 or hi > n:                  # allowed if a mask cuts it (validate())
                checks.append((name, item.const, item.terms, n))
                lo, hi = max(lo, 0), min(hi, n)
            coefs = item.by_position()
            off_pos = item.ndim - grid_nd   # an expression of fewer dims aligns right (numpy)
            if isp:
                if len(coefs) != 1 or next(iter(coefs.values())) != 1:
                    raise IndexError(f"{name} is the partition dimension: its index must be one "
                                     f"nl.arange with coefficient 1, got {item!r}")
                pstart += item.const
                (pos, _), = coefs.items()
                g = grid[pos - off_pos]
                g[2] = True
            else:
                offset += s * item.const
            for pos, c in coefs.items():
                g = grid[pos - off_pos]
                size = item.shape[pos]
                if g[1] not in (1, size):
                    raise IndexError(f"index grids do not broadcast: {g[1]} and {size}")
                g[1] = size
                if not isp:
                    g[0] += s * c
                g[3] = g[3] | item.aranges_at(pos)
            if box is not None:
                box[d] = (lo, hi)
        elif isinstance(item, slice):
            start, stop, step = item.indices(n)
            if item.start is not None and not -n <= int(item.start) <= n or \
                    item.stop is not None and int(item.stop) > n:
                raise IndexError(f"index out of bounds: {name} sliced as [{item.start}:{item.stop}]")
            size = max(0, (stop - start + step - 1) // step) if step > 0 else max(0, (start - stop - step - 1) // -step)
            if size == 0:
                raise IndexError(f"empty slice of {name}: [{item.start}:{item.stop}]")
            if isp:
                if step != 1:
                    raise IndexError(f"{name} is the partition dimension: slices need step 1")
                pstart += start
                out.append((0, size, True, frozenset()))
            else:
                offset += s * start
                out.append((s * step, size, False, frozenset()))
            if box is not None:
                box[d] = (min(start, start + step * (size - 1)), max(start, start + step * (size - 1)) + 1)
        else:
            i = int(item)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"index out of bounds: {name} indexed with {int(item)}")
            if isp:
                pstart += i
            else:
                offset += s * i
            if box is not None:
                box[d] = (i, i + 1)
    if grid_at is not None:
        out[grid_at:grid_at + 1] = [tuple(g) for g in grid]
    r = NkiTensor(v.storage, offset, pstart, tuple(out), tuple(box) if box is not None else v.box,
                  checks=tuple(checks), clips=v.clips)
    if cut is not None:
        r = r.clip(grid_at + cut[0], cut[1], cut[2])
    return r


def reshape(v: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    """Reshape a view whose free axes are contiguous (partition axis, if any, kept first)."""
    if int(np.prod(shape)) != int(np.prod(v.shape)):
        raise ValueError(f"cannot reshape {v.shape} to {shape}")
    free = [a for a in v.axes if not a[2]]
    dims = _merge([(s, n) for s, n, _, _ in free])
    if len(dims) > 1 or (dims and dims[0][0] != 1):
        raise ValueError(f"{v!r}: only contiguous free axes can be reshaped")
    has_p = any(a[2] for a in v.axes)
    axes = []
    rest = shape
    if has_p:
        if shape[0] != v.partitions:
            raise ValueError(f"reshape keeps the partition dimension ({v.partitions}) first, got {shape}")
        axes.append((0, shape[0], True, frozenset()))
        rest = shape[1:]
    acc = 1
    tail = []
    for n in reversed(rest):
        tail.append((acc, n, False, frozenset()))
        acc *= n
    return v._with(axes=tuple(axes + tail[::-1]), box=v.box if v.storage.memory is Memory.HBM else None)


def on_release(storage: Storage, fn, *args) -> None:
    """Call ``fn(*args)`` when ``storage`` is no longer referenced (its memory may be reused),
    or when ``storage.reclaim()`` is called first (once)."""
    storage.reclaim = weakref.finalize(storage, fn, *args)


bfloat16 = np.dtype(ml_dtypes.bfloat16)


# ---- NKI's explicit access patterns: ``t.ap(pattern=[[step, count], ...], offset=0, dtype=None)``
# The pattern addresses ``t``'s memory as a flat array of elements (row-major over the tensor's
# shape, from the view's first element), pairs outermost first. On chip the first pair is the
# partition dimension: its step must be one partition (the elements of a partition's row, as
# ``mx_kernel_utils.load_scales_scattered`` writes ``[[scale_f, 4], [1, scale_f]]``) and
# ``offset`` may start on another partition (``offset // row``). ``dtype`` reinterprets the same
# bytes (a uint32 HBM tensor viewed as ``nl.float8_e5m2_x4``): steps and offset then count
# elements of that type.
# - A pattern view is a view of the same Buffer: the tracer orders it with every other access of
#   that memory. A reinterpreting view's storage is an alias (``Storage.alias_of``) that keeps the
#   original alive and never frees memory; an HBM pattern view's box is the whole tensor (its
#   accesses are ordered against all others of that tensor).
# - Out-of-range patterns are IndexErrors naming the pattern, the element reached and the size.
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
