"""Plan pass: an SBUF/PSUM byte offset for every on-chip buffer, from its lifetime.

Lifetimes, whole kernels first: a buffer lives from the start of the kernel before the first
one that touches it to the end of the last, so no two buffers of one kernel or of neighbouring
kernels share bytes (a load never waits for another buffer to release its memory, and the next
kernel's loads start while this one computes); a buffer filled from weights (HBM data no
instruction writes) lives from the start of the kernel after the ``WEIGHT_STREAMS_AHEAD``-th
previous *weight-streaming* kernel (one that loads at least ``WEIGHT_STREAM_BYTES`` of weights; the
first stream's buffers from the start), so a matmul's weights stream in during the previous
matmul and the norm or attention kernels before it (from the previous stream's start only,
an attention between two matmuls left HBM idle; from after the third previous one since the
attention's transposes run on TensorE), while about three kernels'
weights are in flight on the in-order DMA engines; if that does not fit, the same with the
weights fewer streams ahead (down to one); a buffer filled from data the program writes only later
(a decode step's KV cache read before its one-row update) lives from the kernel of the
``CACHE_STREAMS_AHEAD``-th previous weight stream and does not count as a stream; if that does not fit either, *coarse* lifetimes: from
the start of the first to the end of the last *top-level statement* that touches it (one loop
nest of a kernel, or a lone instruction), padded by ``LIFETIME_PAD`` statements, then exact; if that does not fit either, *fine* lifetimes in
statement positions: a buffer allocated per iteration of loop S lives during S, an unscoped one
over the loop nests around its accesses, so buffers of disjoint phases of one kernel (a block
load, then the block's products) share bytes, and the sync pass orders every write of one after
the latest preceding access of the other, in both directions across loop iterations. Offsets
come from ``pack_offsets`` with the partition size as capacity.

Invariants
- Two buffers whose lifetimes overlap never share bytes.
- Slots of one buffer are ``slot_stride`` bytes apart: the slot size rounded up to 64 B in SBUF
  and to whole PSUM banks in PSUM, so every PSUM slot starts on a bank.
- Every offset + size is within the target's partition size, or ``Unsupported`` names the
  working set and the capacity.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from lowering.errors import Unsupported
from lowering.memory import lower_bound
from lowering.memory.packing import PackingError, pack_offsets
from lowering.tir.analysis import Structure, kernel_key, without_cyclic_gc
from lowering.tir.ir import Loop, TBuf, TProgram
from runtime_sim.isa import Memory
from runtime_sim.targets import Target

LIFETIME_PAD = 2     # top-level statements
KERNEL_PADS = (1,)   # kernels ahead of the first user whose bytes a buffer stays clear of (2 and
#                      3 measured slower: deeper prefetch queues more transfers ahead of the
#                      critical ones on the in-order DMA engines)
SBUF_ALIGN = 64
WEIGHT_STREAM_BYTES = 64 * 1024   # a kernel loading less (norm gains, biases) is not a weight stream
WEIGHT_STREAMS_AHEAD = 3  # a weight buffer lives from the kernel after the 3rd previous stream
#                           (2 measured slower; 4 fills SBUF)
CACHE_STREAMS_AHEAD = 4   # a buffer of data written later (a KV cache read before its update)
#                          lives from the kernel of the 4th previous weight stream: in gpt2 decode,
#                          the previous layer's QKV projection, so the cache loads can fill the HBM
#                          idle during that layer's attention (from the kernel before only, or from
#                          the 1st, 2nd, 3rd or 5th previous stream, measured slower)


@dataclass
class MemPlan:
    offsets: dict[str, int] = field(default_factory=dict)       # buffer -> byte offset
    slot_stride: dict[str, int] = field(default_factory=dict)   # buffer -> bytes between slots
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # [first, last], see modes
    peaks: dict[Memory, int] = field(default_factory=dict)
    # per memory: "coarse" (lifetimes in top-level statements) or "fine" (statement positions:
    # buffers of disjoint phases of one loop nest share bytes; the sync pass orders them)
    modes: dict[Memory, str] = field(default_factory=dict)
    # alias members placed in their root's bytes (coarse mode honours the builder's aliases;
    # fine mode plans every buffer on its own)
    roots: dict[str, str] = field(default_factory=dict)
    # SBUF in "kernel" mode: how many weight streams ahead a weight buffer's lifetime starts
    ahead: int = 0

    def root_of(self, name: str) -> str:
        return self.roots.get(name, name)

    def size(self, b: TBuf) -> int:
        return self.slot_stride[b.name] * b.bufs

    def text(self, tp: TProgram, target: Target) -> str:
        lines = [f"target {target.name}: SBUF {target.sbuf_bytes_per_partition} B/partition, "
                 f"PSUM {target.psum_bytes_per_partition} B/partition (lifetimes: whole kernels "
                 f"and the kernel before when that fits, so no load waits for another buffer's "
                 f"bytes; else top-level statements padded by {LIFETIME_PAD}, exact, or fine; "
                 f"the lower bound uses the exact lifetimes)"]
        bufs = [b for b in tp.buffers if b.name in self.offsets]
        for mem in (Memory.SBUF, Memory.PSUM):
            live = [(b.name, *self._live(b), self.size(b)) for b in bufs
                    if b.memory is mem and b.name not in self.roots]
            lb = lower_bound(live)
            peak = self.peaks.get(mem, 0)
            ratio = f"{peak / lb:.3f}" if lb else "-"
            lines.append(f"{mem.value} peak {peak} B/partition, lower bound {lb} (largest live "
                         f"total), peak/lower bound {ratio}, lifetimes {self.modes.get(mem, '-')}")
        for b in sorted(bufs, key=lambda b: (b.memory.value, self.offsets[b.name], b.name)):
            f, l = self.lifetimes[b.name]
            alias = f"  (in {self.roots[b.name]})" if b.name in self.roots else ""
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


def kernel_lifetimes(tp: TProgram, st: Structure, coarse: dict[str, tuple[int, int]],
                     before: int = 1,
                     weights: dict[str, tuple[int, set[str]]] | None = None,
                     ahead: int = 0) -> dict[str, tuple[int, int]]:
    """Coarse lifetimes widened to whole kernels, from the start of the kernel ``before``
    kernels ahead of the first one that touches the buffer to the end of the last: no two
    buffers of one kernel, or of kernels that close, share bytes (a kernel's loads never wait
    for bytes its own kernel or the ones just before still use, so they can run that far
    ahead). The kernel of a top-level statement is the ``k<i>`` prefix of its instructions'
    tags. ``weights`` (``weight_buffers``): such a buffer starts no later than the kernel after
    the ``ahead``-th (default ``WEIGHT_STREAMS_AHEAD``) previous weight-streaming kernel."""
    kern_of: dict[int, int] = {}
    order: dict[str, int] = {}
    for sid in sorted(st.info):
        inf = st.info[sid]
        if inf.top not in kern_of:
            kern_of[inf.top] = order.setdefault(kernel_key(inf.ins), len(order))
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for top, kk in kern_of.items():
        first[kk] = min(first.get(kk, top), top)
        last[kk] = max(last.get(kk, top), top)
    srcs: dict[int, set[str]] = defaultdict(set)
    late = st.written_later
    for name, (sid, bufs) in (weights or {}).items():
        srcs[kern_of[st.info[sid].top]] |= bufs - late
    wbytes = {k: sum(tp.buffer(b).free[0] for b in bufs) for k, bufs in srcs.items()}
    loaders = sorted(k for k, n in wbytes.items() if n >= WEIGHT_STREAM_BYTES)
    out = {}
    for name, (f, l) in coarse.items():
        kf, kl = kern_of.get(f, 0), kern_of.get(l, 0)
        k0 = max(0, kf - before)
        if weights and name in weights and weights[name][1] <= late:
            # data the program writes later (a KV cache read before its update): from the kernel
            # of the CACHE_STREAMS_AHEAD-th previous weight stream; not a stream itself, so the
            # weights' lifetimes do not move
            prev = [k for k in loaders if k < kf]
            if CACHE_STREAMS_AHEAD:
                k0 = min(k0, prev[-CACHE_STREAMS_AHEAD] if len(prev) >= CACHE_STREAMS_AHEAD else 0)
        elif weights and name in weights:
            prev = [k for k in loaders if k < kf]
            # from the kernel after the WEIGHT_STREAMS_AHEAD-th previous weight stream: the kernels
            # between two streams (an attention, a norm) keep HBM busy with the next streams' weights
            n = ahead or WEIGHT_STREAMS_AHEAD
            k0 = min(k0, prev[-n] + 1 if len(prev) >= n else prev[0] if prev else 0)
        out[name] = (first.get(k0, f), last.get(kl, l))
    return out


def weight_buffers(tp: TProgram, st: Structure) -> dict[str, tuple[int, set[str]]]:
    """On-chip buffers filled by weight loads (``Structure.weight_loads``): each with its first
    such load and the HBM buffers those loads read."""
    out: dict[str, tuple[int, set[str]]] = {}
    for sid in sorted(st.weight_loads):
        ins = st.info[sid].ins
        out.setdefault(ins.dst.buf, (sid, set()))[1].update(a.buf for a in ins.srcs)
    return out


def fine_lifetimes(tp: TProgram, st: Structure) -> dict[str, tuple[int, int]]:
    """[first, last] statement position (preorder) of every accessed buffer: an allocation lives
    inside one iteration of its scope loop, from its first to its last access there (an access
    in a loop nested inside the scope counts as that whole loop); an unscoped buffer from the
    first to the last loop nest around its accesses. Aliases are not merged: in fine mode every
    buffer is planned on its own."""
    pre: dict[int, int] = {}        # id(statement) -> preorder position
    end: dict[int, int] = {}
    n = 0

    def walk(body) -> None:
        nonlocal n
        for s in body:
            pre[id(s)] = n
            n += 1
            if isinstance(s, Loop):
                walk(s.body)
            end[id(s)] = n - 1

    walk(tp.body)
    out: dict[str, tuple[int, int]] = {}

    def add(name: str, lo: int, hi: int) -> None:
        f, l = out.get(name, (lo, hi))
        out[name] = (min(f, lo), max(l, hi))

    for sid, inf in st.info.items():
        for a, _ in inf.ins.accesses():
            b = tp.buffer(a.buf)
            if b.memory is Memory.HBM:
                continue
            # every allocation lives inside one iteration of its scope: from the first to the
            # last access there, each access widened to the loop around it inside the scope
            k = next(i for i, lp in enumerate(inf.loops) if lp.var == b.scope) + 1 \
                if b.scope is not None else 0
            node = inf.loops[k] if k < len(inf.loops) else inf.ins
            lo, hi = pre[id(node)], end[id(node)]
            add(b.name, lo, hi)
    return out


def slot_stride(b: TBuf, target: Target) -> int:
    if b.memory is Memory.PSUM:
        bank = target.psum_bank_bytes
        return -(-b.slot_bytes // bank) * bank
    return -(-b.slot_bytes // SBUF_ALIGN) * SBUF_ALIGN


@without_cyclic_gc
def plan_memory(tp: TProgram, target: Target, st: Structure | None = None) -> MemPlan:
    st = st or Structure(tp)
    plan = MemPlan()
    coarse = lifetimes(tp, st)
    fine = kernel = None
    kernel_by_pad: dict[tuple[int, int], dict] = {}
    for mem, cap in ((Memory.SBUF, target.sbuf_bytes_per_partition),
                     (Memory.PSUM, target.psum_bytes_per_partition)):
        present = [b for b in tp.buffers if b.memory is mem and b.name in coarse]
        if not present:
            plan.peaks[mem] = 0
            continue
        for b in present:
            plan.slot_stride[b.name] = slot_stride(b, target)
        roots = [b for b in present if b.alias is None]
        aliases = [b for b in present if b.alias is not None]
        offsets = None
        # whole loop nests first (padded, so neighbouring kernels need not share bytes; the
        # builder's aliases share their root's bytes), then phases inside a loop nest (every
        # buffer on its own: buffers of disjoint parts of one body share bytes)
        for mode, pad, ahead in ([("kernel", k, a) for k in KERNEL_PADS
                                  for a in range(WEIGHT_STREAMS_AHEAD, 0, -1)]
                                 + [("coarse", LIFETIME_PAD, 0), ("coarse", 0, 0), ("fine", 0, 0)]):
            if mode == "fine" and fine is None:
                fine = fine_lifetimes(tp, st)
            if mode == "kernel":
                if kernel_by_pad.get((pad, ahead)) is None:      # the same for SBUF and PSUM
                    kernel_by_pad[pad, ahead] = kernel_lifetimes(tp, st, coarse, pad,
                                                                 weight_buffers(tp, st), ahead)
                kernel = kernel_by_pad[pad, ahead]
                pad = 0
            live = {"coarse": coarse, "kernel": kernel, "fine": fine}[mode]
            used = roots if mode != "fine" else present
            items = [(b.name, max(0, live[b.name][0] - pad), live[b.name][1] + 1 + pad, plan.size(b))
                     for b in used]
            try:
                offsets = pack_offsets(items, capacity=cap)
            except PackingError:
                continue
            plan.modes[mem] = mode
            if mem is Memory.SBUF and mode == "kernel":
                plan.ahead = ahead
            for b in present:
                plan.lifetimes[b.name] = (coarse if mode == "kernel" else live)[b.name]
            if mode != "fine":
                for b in aliases:
                    offsets[b.name] = offsets[b.alias]
                    plan.slot_stride[b.name] = plan.slot_stride[b.alias]
                    plan.roots[b.name] = b.alias
            break
        if offsets is None:
            big = max(present, key=plan.size)
            raise Unsupported("memory planner", f"{mem.value.upper()} working set does not fit: "
                              f"{len(present)} buffers (largest {big.name}: {plan.size(big)} B), "
                              f"capacity {cap} B/partition, even sharing bytes between the phases "
                              f"of one loop nest")
        peak = 0
        for b in present:
            off = offsets[b.name]
            if mem is Memory.PSUM and off % target.psum_bank_bytes:
                raise AssertionError(f"PSUM buffer {b.name} not bank-aligned at {off}")
            plan.offsets[b.name] = off
            peak = max(peak, off + plan.size(b))
        plan.peaks[mem] = peak
    return plan
