"""Iteration-space layout: map an N-d loop nest shared by several strided tensors onto
[partition, free] tiles.

``plan_2d`` drops size-1 axes, merges adjacent axes that every operand can merge (so a
contiguous tensor becomes one axis), then picks the innermost axis as the free axis and the next
one as the partition axis; the remaining axes are outer loops. A lone axis is split into
``[128, n / 128]`` (plus a tail region) so that all partitions work, and so is a long free axis
whose partition axis would use fewer than half of the partitions.

Invariants
- A ``Region`` describes, for every operand, an affine map from (outer..., row, col) to an
  element offset: ``base + sum(i_k * outer_strides[k]) + row * row_stride + col * col_stride``.
- The regions of one plan cover the iteration space exactly once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass


Strides = tuple[int, ...]


@dataclass(frozen=True)
class Region:
    bases: tuple[int, ...]                       # per operand
    outer: tuple[tuple[int, Strides], ...]       # (size, per-operand strides)
    rows: int
    row_strides: Strides
    free: tuple[tuple[int, Strides], ...]        # 1-3 free axes, outermost first

    @property
    def cols(self) -> int:
        n = 1
        for s, _ in self.free:
            n *= s
        return n

    def outer_offsets(self):
        """Yield per-operand base offsets for every outer index, in row-major order."""
        ranges = [range(s) for s, _ in self.outer]
        for idx in itertools.product(*ranges):
            yield tuple(b + sum(i * st[k] for i, (_, st) in zip(idx, self.outer))
                        for k, b in enumerate(self.bases))


def collapse(shape: tuple[int, ...], strides: list[Strides]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge mergeable neighbours. Returns (shape, per-operand strides)."""
    dims = [d for d, s in enumerate(shape) if s != 1]
    shp = [shape[d] for d in dims]
    sts = [[st[d] for d in dims] for st in strides]
    i = len(shp) - 2
    while i >= 0:
        if all(st[i] == st[i + 1] * shp[i + 1] for st in sts):
            shp[i] *= shp[i + 1]
            for st in sts:
                st[i] = st[i + 1]
            del shp[i + 1]
            for st in sts:
                del st[i + 1]
        i -= 1
    return shp, sts


def plan_2d(shape: tuple[int, ...], strides: list[Strides], offsets: list[int],
            partitions: int = 128, free_max: int = 2048) -> list[Region]:
    """Regions covering ``shape``. The free axes are the innermost axes (several small ones
    merged up to ``free_max`` elements, at most 3); the partition axis is the largest remaining
    axis; the rest are outer loops. A single free axis longer than ``free_max`` is tiled later."""
    n_ops = len(strides)
    if any(s == 0 for s in shape):
        return []
    shp, sts = collapse(shape, strides)
    zeros = (0,) * n_ops
    if not shp:
        return [Region(tuple(offsets), (), 1, zeros, ((1, zeros),))]
    axes = [(shp[d], tuple(st[d] for st in sts)) for d in range(len(shp))]
    if len(axes) == 1:
        n, cs = axes[0]
        q, tail = divmod(n, partitions)
        if n < 2 * partitions:
            return [Region(tuple(offsets), (), 1, zeros, ((n, cs),))]
        regions = [Region(tuple(offsets), (), partitions, tuple(c * q for c in cs), ((q, cs),))]
        if tail:
            tb = tuple(o + c * q * partitions for o, c in zip(offsets, cs))
            regions.append(Region(tb, (), 1, zeros, ((tail, cs),)))
        return regions
    free = [axes.pop()]
    if free[0][0] < free_max // 4:
        # merge small inner axes into the free dims; keep at least one axis for the partitions
        while len(axes) > 1 and len(free) < 3 and axes[-1][0] * _prod(free) <= free_max:
            free.insert(0, axes.pop())
    p_idx = max(range(len(axes)), key=lambda d: axes[d][0])
    rows, rs = axes.pop(p_idx)
    if (len(free) == 1 and rows < partitions // 2 and free[0][0] > free_max
            and free[0][0] % partitions == 0):
        # a few long rows ([2, 128 x 768] once a contiguous [2, 128, 768] is merged): the
        # long axis splits into [partitions, n / partitions], the short one becomes a loop
        n, cs = free[0]
        q = n // partitions
        axes.insert(p_idx, (rows, rs))
        return [Region(tuple(offsets), tuple(axes), partitions, tuple(c * q for c in cs), ((q, cs),))]
    return [Region(tuple(offsets), tuple(axes), rows, rs, tuple(free))]


def _prod(free) -> int:
    n = 1
    for s, _ in free:
        n *= s
    return n


@dataclass(frozen=True)
class RowPlan:
    """Rows (kept axes) on partitions, the reduced axes along the free dim.

    ``outer``: kept axes looped outside; ``rows``/``row_strides``: the partition axis;
    ``red``: reduced axes (size, per-operand strides), innermost last."""

    bases: tuple[int, ...]
    outer: tuple[tuple[int, Strides], ...]
    rows: int
    row_strides: Strides
    red: tuple[tuple[int, Strides], ...]

    def outer_offsets(self):
        ranges = [range(s) for s, _ in self.outer]
        for idx in itertools.product(*ranges):
            yield tuple(b + sum(i * st[k] for i, (_, st) in zip(idx, self.outer))
                        for k, b in enumerate(self.bases))

    @property
    def red_size(self) -> int:
        return _prod(self.red)


def plan_rows(shape: tuple[int, ...], red_dims: tuple[int, ...], strides: list[Strides],
              offsets: list[int]) -> RowPlan:
    """Split ``shape`` into kept and reduced axes (each collapsed on its own, across all
    operands); the largest kept axis becomes the partition axis."""
    n_ops = len(strides)
    kept = [d for d in range(len(shape)) if d not in red_dims]
    red = [d for d in range(len(shape)) if d in red_dims]
    kshape, ksts = collapse(tuple(shape[d] for d in kept), [tuple(st[d] for d in kept) for st in strides])
    rshape, rsts = collapse(tuple(shape[d] for d in red), [tuple(st[d] for d in red) for st in strides])
    kaxes = [(kshape[i], tuple(s[i] for s in ksts)) for i in range(len(kshape))]
    raxes = tuple((rshape[i], tuple(s[i] for s in rsts)) for i in range(len(rshape)))
    if not raxes:
        raxes = ((1, (0,) * n_ops),)
    if not kaxes:
        return RowPlan(tuple(offsets), (), 1, (0,) * n_ops, raxes)
    p_idx = max(range(len(kaxes)), key=lambda i: kaxes[i][0])
    rows, rs = kaxes.pop(p_idx)
    return RowPlan(tuple(offsets), tuple(kaxes), rows, rs, raxes)
