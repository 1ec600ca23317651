"""On-chip memory planning: give every SBUF/PSUM pool an offset from its lifetime.

A pool lives from the first to the last instruction (in program order) that touches it. Offsets
come from ``pack_offsets`` with the partition size as capacity. Lifetimes are first padded so that
pools of neighbouring kernels prefer distinct bytes (then the next kernel's loads need not wait
for the previous kernel to release its memory); if the padded problem does not fit, the exact
lifetimes are packed. PSUM pools have bank-multiple sizes, so every offset is bank-aligned.

Invariants
- Two pools whose lifetimes overlap never share bytes.
- Every planned offset + size is within the target's partition size, or ``Unsupported`` is
  raised naming the working set and the capacity.
"""
from __future__ import annotations

from lowering.errors import Unsupported
from lowering.memory.packing import PackingError, pack_offsets
from lowering.tiling.builder import Pool
from runtime_sim.isa import Memory
from runtime_sim.targets import Target

LIFETIME_PAD = 256  # instructions


def plan_pools(pools: dict[str, Pool], target: Target) -> dict[Memory, int]:
    """Set ``pool.offset`` for every used pool; return the peak bytes per partition per memory."""
    peaks: dict[Memory, int] = {}
    for mem, cap in ((Memory.SBUF, target.sbuf_bytes_per_partition),
                     (Memory.PSUM, target.psum_bytes_per_partition)):
        used = [p for p in pools.values() if p.memory is mem and p.first >= 0]
        if not used:
            peaks[mem] = 0
            continue
        offsets = None
        for pad in (LIFETIME_PAD, 0):
            items = [(p.name, max(0, p.first - pad), p.last + 1 + pad, p.bytes_per_partition)
                     for p in used]
            try:
                offsets = pack_offsets(items, capacity=cap)
                break
            except PackingError:
                continue
        if offsets is None:
            need = max(p.bytes_per_partition for p in used)
            raise Unsupported("memory planner", f"{mem.value.upper()} working set does not fit: "
                              f"{len(used)} pools, largest {need} B/partition, capacity {cap} B/partition")
        peak = 0
        for p in used:
            p.offset = offsets[p.name]
            if mem is Memory.PSUM and p.offset % target.psum_bank_bytes:
                raise AssertionError(f"PSUM pool {p.name} not bank-aligned at {p.offset}")
            peak = max(peak, p.offset + p.bytes_per_partition)
        peaks[mem] = peak
    return peaks
