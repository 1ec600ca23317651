"""Index expressions of NKI kernels: ``nl.arange``, ``nl.mgrid``, ``nl.ds``, and masks.

An index expression is affine in the positions of an index *grid*: ``nl.arange(128)[:, None]``
is position 0 of a 2-D grid of size 128, ``nl.arange(512)[None, :]`` position 1 of size 512, and
``4 * p + nl.arange(128)[:, None]`` is ``const + sum(coef[j] * idx_j)``. Indexing a tensor with
such expressions gives a view whose axes are the grid positions (numpy's advanced indexing:
the grid's axes sit where the first expression sits, slices add their own axes in order).

Masks (``mask=(i_p + 128 * t < n) & (i_f < m)``) are per-arange bounds: each comparison of an
expression of ONE arange with a constant becomes ``[lo, hi)`` on that arange's values; ``&``
intersects. An instruction with a mask runs on the masked sub-tile of every operand (tensor.py).

Invariants: expressions and masks are immutable values; an expression's coefficients and
constant are Python ints; every arange has a unique id (masks refer to aranges by id, so two
aranges of equal size are different loop variables).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

_IDS = itertools.count()


@dataclass(frozen=True)
class Arange:
    """One arange: ``size`` values ``start, start+1, ...`` at grid position ``pos`` of ``ndim``."""

    id: int
    size: int
    pos: int
    ndim: int


@dataclass(frozen=True)
class IndexExpr:
    """``const + sum(coef * arange)`` over aranges that share one grid shape."""

    const: int
    terms: tuple[tuple[Arange, int], ...]   # (arange, coefficient), no zero coefficient

    # -- grid --------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return max((a.ndim for a, _ in self.terms), default=0)

    @property
    def shape(self) -> tuple[int, ...]:
        s = [1] * self.ndim
        for a, _ in self.terms:
            s[a.pos] = a.size
        return tuple(s)

    def by_position(self) -> dict[int, int]:
        """Coefficient per grid position (aranges at one position move together)."""
        out: dict[int, int] = {}
        for a, c in self.terms:
            out[a.pos] = out.get(a.pos, 0) + c
        return {p: c for p, c in out.items() if c}

    def aranges_at(self, pos: int) -> frozenset[int]:
        return frozenset(a.id for a, _ in self.terms if a.pos == pos)

    # -- numpy-style reshaping of a 1-D arange: a[:, None], a[None, :] --------------------------
    def __getitem__(self, key) -> "IndexExpr":
        if not isinstance(key, tuple):
            key = (key,)
        if self.ndim != 1 or len(self.terms) != 1:
            raise IndexError("only a 1-D nl.arange can be reshaped with [:, None] / [None, :]")
        slots = [k for k in key if k is not None]
        if len(slots) != 1 or slots[0] != slice(None):
            raise IndexError(f"expected one ':' and None for the other axes, got {key!r}")
        pos = next(i for i, k in enumerate(key) if k is not None)
        a, c = self.terms[0]
        return IndexExpr(self.const, ((Arange(a.id, a.size, pos, len(key)), c),))

    # -- arithmetic ----------------------------------------------------------------------------
    def _combine(self, other, sign: int) -> "IndexExpr":
        if isinstance(other, IndexExpr):
            terms = dict(self.terms)
            for a, c in other.terms:
                terms[a] = terms.get(a, 0) + sign * c
            return IndexExpr(self.const + sign * other.const, tuple((a, c) for a, c in terms.items() if c))
        if isinstance(other, int) or hasattr(other, "__index__"):
            return IndexExpr(self.const + sign * int(other), self.terms)
        return NotImplemented

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        return (-self)._combine(other, 1)

    def __neg__(self) -> "IndexExpr":
        return IndexExpr(-self.const, tuple((a, -c) for a, c in self.terms))

    def __mul__(self, k):
        if isinstance(k, int) or hasattr(k, "__index__"):
            k = int(k)
            return IndexExpr(self.const * k, tuple((a, c * k) for a, c in self.terms if c * k))
        return NotImplemented

    __rmul__ = __mul__

    # -- comparisons make masks ----------------------------------------------------------------
    def _bound(self, other, op: str) -> "Mask":
        e = self - other if isinstance(other, IndexExpr) else self._combine(other, -1)
        if not isinstance(e, IndexExpr) or len(e.terms) != 1:
            raise ValueError("a mask compares an expression of one nl.arange with a constant")
        (a, c), b = e.terms[0], e.const        # c * i + b  (op)  0
        if c < 0:                              # flip to a positive coefficient
            c, b = -c, -b
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        if op == "<":                          # c*i < -b
            lo, hi = 0, math.ceil(-b / c)
        elif op == "<=":
            lo, hi = 0, math.floor(-b / c) + 1
        elif op == ">":
            lo, hi = math.floor(-b / c) + 1, a.size
        else:
            lo, hi = math.ceil(-b / c), a.size
        return Mask(((a.id, max(0, lo), min(a.size, hi)),))

    def __lt__(self, o):
        return self._bound(o, "<")

    def __le__(self, o):
        return self._bound(o, "<=")

    def __gt__(self, o):
        return self._bound(o, ">")

    def __ge__(self, o):
        return self._bound(o, ">=")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        t = " + ".join(f"{c}*i{a.id}[{a.size}]@{a.pos}" for a, c in self.terms)
        return f"IndexExpr({self.const}{' + ' + t if t else ''})"


@dataclass(frozen=True)
class Mask:
    """Bounds ``[lo, hi)`` per arange id; ``a & b`` intersects."""

    bounds: tuple[tuple[int, int, int], ...]

    def __and__(self, other: "Mask") -> "Mask":
        d: dict[int, tuple[int, int]] = {}
        for i, lo, hi in self.bounds + other.bounds:
            plo, phi = d.get(i, (lo, hi))
            d[i] = (max(lo, plo), min(hi, phi))
        return Mask(tuple((i, lo, hi) for i, (lo, hi) in d.items()))

    def of(self, ids: frozenset[int]) -> tuple[int, int] | None:
        """The bound on an axis driven by aranges ``ids`` (None when the mask says nothing)."""
        lo, hi, hit = 0, None, False
        for i, a, b in self.bounds:
            if i in ids:
                hit = True
                lo = max(lo, a)
                hi = b if hi is None else min(hi, b)
        return (lo, hi) if hit else None


def arange(*args) -> IndexExpr:
    """``nl.arange(stop)`` / ``nl.arange(start, stop)``: a 1-D grid of ``stop - start`` values."""
    if len(args) == 1:
        start, stop = 0, int(args[0])
    elif len(args) == 2:
        start, stop = int(args[0]), int(args[1])
    else:
        raise TypeError("nl.arange takes (stop) or (start, stop)")
    if stop <= start:
        raise ValueError(f"nl.arange({start}, {stop}) is empty")
    return IndexExpr(start, ((Arange(next(_IDS), stop - start, 0, 1), 1),))


class _Grid(tuple):
    """What ``nl.mgrid`` returns: a tuple of the axis expressions that also names them
    ``.p`` (the partition axis, first), ``.x``, ``.y``, ``.z`` (the free axes), as NKI does."""

    def __getattr__(self, name: str):
        i = {"p": 0, "x": 1, "y": 2, "z": 3}.get(name)
        if i is None or i >= len(self):
            raise AttributeError(f"nl.mgrid of {len(self)} axes has no .{name}")
        return self[i]


class _MGrid:
    """``nl.mgrid[0:128, 0:512]`` -> one expression per axis over a shared grid."""

    def __getitem__(self, key) -> tuple[IndexExpr, ...] | IndexExpr:
        key = key if isinstance(key, tuple) else (key,)
        out = []
        for pos, s in enumerate(key):
            if not isinstance(s, slice) or s.stop is None or (s.step not in (None, 1)):
                raise IndexError("nl.mgrid takes unit-step slices with a stop, e.g. nl.mgrid[0:128, 0:512]")
            start = s.start or 0
            out.append(IndexExpr(start, ((Arange(next(_IDS), s.stop - start, pos, len(key)), 1),)))
        return _Grid(out) if len(out) > 1 else out[0]


mgrid = _MGrid()


@dataclass(frozen=True)
class DynSlice:
    """``nl.ds(start, size)``: the slice ``start : start + size``."""

    start: int
    size: int

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size)


def ds(start, size) -> DynSlice:
    return DynSlice(int(start), int(size))
