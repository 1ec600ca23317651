"""Integer affine expressions over loop variables: ``const + sum(coef * var)``.

The tile IR's index expressions (byte offsets of tile access patterns, semaphore counts) are
affine in the enclosing loop variables. A loop variable runs ``0 .. count-1``; any start or step
is folded into the expressions that use it (``m0 + 128 * m``).

Invariants
- An ``Affine`` is immutable and canonical: ``terms`` is sorted by variable name and holds no zero
  coefficient, so equal expressions compare (and hash) equal and print identically.
- Arithmetic is exact integer arithmetic; multiplying two non-constant expressions is an error
  (the result would not be affine).
"""
from __future__ import annotations

from typing import Mapping, Union

AffineLike = Union["Affine", int]


class Affine:
    __slots__ = ("const", "terms", "_hash")

    def __init__(self, const: int = 0, terms: tuple[tuple[str, int], ...] = ()):
        self.const = const if type(const) is int else int(const)
        self.terms = terms
        self._hash: int | None = None        # computed when first hashed

    # -- construction ---------------------------------------------------------------------
    @staticmethod
    def var(name: str) -> "Affine":
        return Affine(0, ((name, 1),))

    @staticmethod
    def of(x: AffineLike) -> "Affine":
        if isinstance(x, Affine):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"an affine index must be an int or an Affine, got {type(x).__name__} {x!r}")
        return Affine(x)

    @staticmethod
    def _make(const: int, coefs: dict[str, int]) -> "Affine":
        return Affine(const, tuple(sorted((v, c) for v, c in coefs.items() if c)))

    # -- queries --------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    def coef(self, var: str) -> int:
        for v, c in self.terms:
            if v == var:
                return c
        return 0

    def eval(self, env: Mapping[str, int]) -> int:
        s = self.const
        for v, c in self.terms:
            s += c * env[v]
        return s

    def bounds(self, counts: Mapping[str, int]) -> tuple[int, int]:
        """(min, max) over every variable ``v`` in ``0 .. counts[v]-1``."""
        lo = hi = self.const
        for v, c in self.terms:
            span = c * (counts[v] - 1)
            if span >= 0:
                hi += span
            else:
                lo += span
        return lo, hi

    def subs(self, env: Mapping[str, AffineLike]) -> "Affine":
        """Substitute variables by expressions (variables not in ``env`` stay)."""
        const, coefs = self.const, {}
        for v, c in self.terms:
            if v not in env:
                coefs[v] = coefs.get(v, 0) + c
                continue
            x = Affine.of(env[v])
            const += x.const * c
            for w, d in x.terms:
                coefs[w] = coefs.get(w, 0) + d * c
        return Affine._make(const, coefs)

    # -- arithmetic -----------------------------------------------------------------------
    def __add__(self, other: AffineLike) -> "Affine":
        o = Affine.of(other)
        if not o.terms:
            return self if o.const == 0 else Affine(self.const + o.const, self.terms)
        if not self.terms:
            return o if self.const == 0 else Affine(self.const + o.const, o.terms)
        coefs = dict(self.terms)
        for v, c in o.terms:
            coefs[v] = coefs.get(v, 0) + c
        return Affine._make(self.const + o.const, coefs)

    __radd__ = __add__

    def __neg__(self) -> "Affine":
        return Affine(-self.const, tuple((v, -c) for v, c in self.terms))

    def __sub__(self, other: AffineLike) -> "Affine":
        o = Affine.of(other)
        if not o.terms:
            return self if o.const == 0 else Affine(self.const - o.const, self.terms)
        coefs = dict(self.terms)
        for v, c in o.terms:
            coefs[v] = coefs.get(v, 0) - c
        return Affine._make(self.const - o.const, coefs)

    def __rsub__(self, other: AffineLike) -> "Affine":
        return Affine.of(other) + (-self)

    def __mul__(self, other: AffineLike) -> "Affine":
        if isinstance(other, Affine):
            if other.terms and self.terms:
                raise ValueError(f"product of two loop-dependent expressions is not affine: ({self}) * ({other})")
            if not other.terms:
                other = other.const
            else:
                return other * self.const
        k = int(other)
        if k == 0:
            return Affine(0)
        return Affine(self.const * k, tuple((v, c * k) for v, c in self.terms))

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> "Affine":
        """Exact division by a constant (every coefficient and the constant divisible)."""
        k = int(k)
        if self.const % k or any(c % k for _, c in self.terms):
            raise ValueError(f"({self}) is not divisible by {k}")
        return Affine(self.const // k, tuple((v, c // k) for v, c in self.terms))

    # -- identity ---------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return not self.terms and self.const == other
        return isinstance(other, Affine) and self.const == other.const and self.terms == other.terms

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash((self.const, self.terms))
        return h

    def __repr__(self) -> str:
        return f"Affine({self})"

    def __str__(self) -> str:
        parts = []
        for v, c in self.terms:
            parts.append(v if c == 1 else f"-{v}" if c == -1 else f"{c}*{v}")
        if self.const or not parts:
            parts.append(str(self.const))
        s = " + ".join(parts)
        return s.replace("+ -", "- ")


def aff(x: AffineLike) -> Affine:
    return Affine.of(x)
