"""Residency: which intermediate tensors stay in SBUF between kernels instead of going through
HBM (kernel IR -> decision; the tile IR builder maps the accesses).

A TEMP tensor written and read by kernels of this partition (never a graph input or output)
is *resident* when it fits the budget: it lives in one SBUF buffer for the span of kernels from
its first writer to its last reader, laid out as rows of its innermost axis: element ``e`` is
row ``r = e // C``, column ``e % C``, row ``r`` sits on partition ``r % 128`` in row tile
``r // 128``, which starts at element ``(r // 128) * C`` of the partition. ``C`` is the
innermost size of one of the views its kernels access it through (the writer may produce
[heads, rows, 64] blocks of what the reader takes as rows of 768): the longest first; when
an access does not fit, the next (``narrow``), and the tensor is dropped after the last. Producers write tiles of it and
consumers read tiles of it where they would have stored to and loaded from HBM; an access
whose pattern does not follow that layout (``tir.builder.NotResident``) makes the compiler
drop the tensor from the set and tile again.

Invariants
- At every kernel the resident tensors live there take at most ``budget`` bytes per partition.
- Graph inputs and outputs are never resident (the host reads and writes them in HBM).
"""
from __future__ import annotations

from dataclasses import dataclass

from lowering.kir import KProgram, Role

BUDGET_SHARE = 0.25      # of an SBUF partition for resident tensors at any kernel


@dataclass(frozen=True)
class Residency:
    buffer: str
    rows: int
    cols: int             # C: elements per row
    itemsize: int

    @property
    def tiles(self) -> int:
        return -(-self.rows // 128)

    @property
    def bytes_per_partition(self) -> int:
        return self.tiles * self.cols * self.itemsize


def row_lengths(kp: KProgram) -> dict[str, list[int]]:
    """Per tensor, the candidate row lengths ``C`` (longest first): the innermost sizes of the
    views its kernels access it through that divide its size."""
    seen: dict[str, set[int]] = {}
    for k in kp.kernels:
        for r in k.outs + k.ins:
            seen.setdefault(r.buffer, set()).add(max(1, r.shape[-1]) if r.shape else 1)
    return {n: sorted((c for c in cs if kp.buffers[n].numel % c == 0), reverse=True)
            for n, cs in seen.items()}


def choose_resident(kp: KProgram, sbuf_bytes_per_partition: int,
                    exclude: frozenset[str] = frozenset(),
                    narrow: dict[str, int] | None = None) -> dict[str, Residency]:
    """``narrow[name]``: how many of the tensor's longest row lengths to skip (their layout did
    not fit an access)."""
    budget = int(sbuf_bytes_per_partition * BUDGET_SHARE)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    lengths = row_lengths(kp)
    cols: dict[str, int] = {}
    outputs = {r.buffer for r in kp.outputs}
    for i, k in enumerate(kp.kernels):
        for r in k.outs:
            if r.buffer not in first:
                first[r.buffer] = i
                skip = (narrow or {}).get(r.buffer, 0)
                cs = lengths.get(r.buffer, [])
                cols[r.buffer] = cs[skip] if skip < len(cs) else 0
        for r in k.ins:
            last[r.buffer] = i
    cand = []
    for name, i0 in first.items():
        h = kp.buffers[name]
        if (h.role is not Role.TEMP or name in outputs or name in exclude or name not in last
                or h.numel == 0 or cols[name] <= 0):
            continue
        c = cols[name]
        res = Residency(name, h.numel // c, c, h.dtype.itemsize)
        cand.append((i0, last[name], res))
    cand.sort(key=lambda x: (x[0], x[2].buffer))
    chosen: dict[str, Residency] = {}
    live: list[tuple[int, int]] = []          # (last reader, bytes) of accepted tensors
    for i0, i1, res in cand:
        live = [(e, n) for e, n in live if e >= i0]
        if sum(n for _, n in live) + res.bytes_per_partition > budget:
            continue
        live.append((i1, res.bytes_per_partition))
        chosen[res.buffer] = res
    return chosen
