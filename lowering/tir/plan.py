"""Plan pass: an SBUF/PSUM byte offset for every on-chip buffer, from its lifetime.

A buffer's slots are reused in every iteration of every loop around its accesses, so it lives
from the start of the first to the end of the last *top-level statement* that touches it (a
top-level statement is one loop nest of a kernel, or a lone instruction). Offsets come from
``pack_offsets`` with the partition size as capacity; lifetimes are first padded by
``LIFETIME_PAD`` top-level statements so that neighbouring kernels prefer distinct bytes (then
the next kernel's loads need not wait for the previous kernel to release its memory); if that
does not fit, the exact lifetimes are packed.

Invariants
- Two buffers whose lifetimes overlap never share bytes.
- Slots of one buffer are ``slot_stride`` bytes apart: the slot size rounded up to 64 B in SBUF
  and to whole PSUM banks in PSUM, so every PSUM slot starts on a bank.
- Every offset + size is within the target's partition size, or ``Unsupported`` names the
  working set and the capacity.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lowering.errors import Unsupported
from lowering.memory import lower_bound
from lowering.memory.packing import PackingError, pack_offsets
from lowering.tir.analysis import Structure
from lowering.tir.ir import TBuf, TProgram
from runtime_sim.isa import Memory
from runtime_sim.targets import Target

LIFETIME_PAD = 2     # top-level statements
SBUF_ALIGN = 64


@dataclass
class MemPlan:
    offsets: dict[str, int] = field(default_factory=dict)       # buffer -> byte offset
    slot_stride: dict[str, int] = field(default_factory=dict)   # buffer -> bytes between slots
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # [first, last] top stmt
    peaks: dict[Memory, int] = field(default_factory=dict)

    def size(self, b: TBuf) -> int:
        return self.slot_stride[b.name] * b.bufs

    def text(self, tp: TProgram, target: Target) -> str:
        lines = [f"target {target.name}: SBUF {target.sbuf_bytes_per_partition} B/partition, "
                 f"PSUM {target.psum_bytes_per_partition} B/partition (lifetimes in top-level "
                 f"statements, padded by {LIFETIME_PAD} when that fits, so neighbouring kernels "
                 f"need not share bytes; the lower bound uses the exact lifetimes)"]
        bufs = [b for b in tp.buffers if b.name in self.offsets]
        for mem in (Memory.SBUF, Memory.PSUM):
            live = [(b.name, *self._live(b), self.size(b)) for b in bufs
                    if b.memory is mem and b.alias is None]
            lb = lower_bound(live)
            peak = self.peaks.get(mem, 0)
            ratio = f"{peak / lb:.3f}" if lb else "-"
            lines.append(f"{mem.value} peak {peak} B/partition, lower bound {lb} (largest live "
                         f"total), peak/lower bound {ratio}")
        for b in sorted(bufs, key=lambda b: (b.memory.value, self.offsets[b.name], b.name)):
            f, l = self.lifetimes[b.name]
            alias = f"  (in {b.alias})" if b.alias else ""
            lines.append(f"  {b.memory.value:4s} {b.name:14s} @{self.offsets[b.name]:7d} {b.bufs} x "
                         f"{self.slot_stride[b.name]} B  live [{f}, {l}]{alias}")
        return "\n".join(lines)

    def _live(self, b: TBuf) -> tuple[int, int]:
        f, l = self.lifetimes[b.name]
        return f, l + 1


def lifetimes(tp: TProgram, st: Structure) -> dict[str, tuple[int, int]]:
    """[first, last] top-level statement of every buffer that is accessed; an alias group's
    root covers the whole group."""
    out: dict[str, tuple[int, int]] = {}
    for sid, inf in st.info.items():
        for a, _ in inf.ins.accesses():
            for name in {a.buf, tp.buffer(a.buf).alias or a.buf}:
                f, l = out.get(name, (inf.top, inf.top))
                out[name] = (min(f, inf.top), max(l, inf.top))
    return out


def slot_stride(b: TBuf, target: Target) -> int:
    if b.memory is Memory.PSUM:
        bank = target.psum_bank_bytes
        return -(-b.slot_bytes // bank) * bank
    return -(-b.slot_bytes // SBUF_ALIGN) * SBUF_ALIGN


def plan_memory(tp: TProgram, target: Target, st: Structure | None = None) -> MemPlan:
    st = st or Structure(tp)
    plan = MemPlan()
    live = lifetimes(tp, st)
    for mem, cap in ((Memory.SBUF, target.sbuf_bytes_per_partition),
                     (Memory.PSUM, target.psum_bytes_per_partition)):
        used = [b for b in tp.buffers if b.memory is mem and b.name in live and b.alias is None]
        for b in used:
            plan.slot_stride[b.name] = slot_stride(b, target)
            plan.lifetimes[b.name] = live[b.name]
        aliases = [b for b in tp.buffers if b.memory is mem and b.name in live and b.alias is not None]
        if not used:
            plan.peaks[mem] = 0
            continue
        offsets = None
        for pad in (LIFETIME_PAD, 0):
            items = [(b.name, max(0, live[b.name][0] - pad), live[b.name][1] + 1 + pad, plan.size(b))
                     for b in used]
            try:
                offsets = pack_offsets(items, capacity=cap)
                break
            except PackingError:
                continue
        if offsets is None:
            big = max(used, key=plan.size)
            total = max(sum(plan.size(b) for b in used
                            if live[b.name][0] <= t <= live[b.name][1]) for t in range(st.top_count))
            raise Unsupported("memory planner", f"{mem.value.upper()} working set does not fit: "
                              f"{len(used)} buffers, up to {total} B/partition live at once "
                              f"(largest {big.name}: {plan.size(big)} B), capacity {cap} B/partition")
        peak = 0
        for b in used:
            off = offsets[b.name]
            if mem is Memory.PSUM and off % target.psum_bank_bytes:
                raise AssertionError(f"PSUM buffer {b.name} not bank-aligned at {off}")
            plan.offsets[b.name] = off
            peak = max(peak, off + plan.size(b))
        for b in aliases:  # the root's bytes, slot by slot
            plan.offsets[b.name] = plan.offsets[b.alias]
            plan.slot_stride[b.name] = plan.slot_stride[b.alias]
            plan.lifetimes[b.name] = live[b.name]
        plan.peaks[mem] = peak
    return plan
