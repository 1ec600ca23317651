"""Residency: which intermediate tensors stay in SBUF between kernels instead of going through
HBM (kernel IR -> decision; the tile IR builder maps the accesses).

A TEMP tensor written and read by kernels of this partition (never a graph input or output)
is *resident* when it fits the budget: it lives in one SBUF buffer for the span of kernels from
its first writer to its last reader, laid out as rows of its innermost axis: element ``e`` is
row ``r = e // C``, column ``e % C`` (``C`` = the innermost size of the tensor as its first
writer produces it), row ``r`` sits on partition ``r % 128`` in row tile ``r // 128``, which
starts at element ``(r // 128) * C`` of the partition. Producers write tiles of it and
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


def choose_resident(kp: KProgram, sbuf_bytes_per_partition: int,
                    exclude: frozenset[str] = frozenset()) -> dict[str, Residency]:
    budget = int(sbuf_bytes_per_partition * BUDGET_SHARE)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    cols: dict[str, int] = {}
    outputs = {r.buffer for r in kp.outputs}
    for i, k in enumerate(kp.kernels):
        for r in k.outs:
            if r.buffer not in first:
                first[r.buffer] = i
                cols[r.buffer] = r.shape[-1] if r.shape else 1
        for r in k.ins:
            last[r.buffer] = i
    cand = []
    for name, i0 in first.items():
        h = kp.buffers[name]
        if (h.role is not Role.TEMP or name in outputs or name in exclude or name not in last
                or h.numel == 0):
            continue
        c = max(1, cols[name])
        if h.numel % c:
            continue
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
