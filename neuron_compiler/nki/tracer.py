"""The tracer: turns the ``nl``/``nisa`` calls of a running kernel into a machine program.

An NKI kernel is Python: its loops (``nl.affine_range`` and kin) run, and every API call emits
instructions through the active ``Tracer`` (one per kernel call, held in a ContextVar: the NKI
API is module-level functions). The tracer plays the part of the NKI compiler below the
kernel, and no more (as ``runtime_sim.calibration.builder`` does for the hand-written tutorial
kernels):

- **Allocation.** Each on-chip tile is a ``Buffer`` of its own. SBUF: fresh memory first; once
  at least ``ROTATE`` freed blocks of the same size exist, the oldest is reused (a tile declared
  in a loop body rotates through ``ROTATE + 1`` buffers, so iteration i+1's loads overlap
  iteration i's compute); when fresh memory runs out, any freed block that fits. PSUM: one bank
  per tile where possible (the bank least recently handed out), so accumulation groups of
  different tiles do not share a bank; tiles never cross a bank (on a target whose matmul spans
  several banks, a larger tile takes consecutive empty banks). A tile's memory is freed when
  Python drops its last reference. When memory is short, the live tiles declared earlier at
  the same kernel line are reclaimed first (marked dead: an instruction using one raises);
  then a PSUM tensor of blocks is placed modulo the free banks, its slots paged (a block
  evicted before its first read is copied out to SBUF or HBM and back: ``_page_in``;
  placement.py); a PSUM tensor of blocks that would take every free bank (NKI's compiler
  allocates blocks by liveness: ``attn_fwd_v8a``'s 32 transposed V blocks fill all 8 banks at
  s4096, and its QK^T tensor then had none) counts as short of memory too. Tiles with an
  explicit placement (``ncc.*.mod_alloc``/``alloc``) go where the kernel says (``placed``),
  never into this allocator's pools. Out of memory is the machine's ``CapacityError``.
- **Synchronisation.** Every instruction signals ``<queue>.done``; before an instruction is
  emitted, the footprints it reads and writes (physical partition x byte boxes on chip, index
  boxes of HBM tensors) are compared with earlier accesses: it waits for the last overlapping
  writers (RAW, WAW) and the readers since (WAR), unless program order already guarantees it
  (same compute queue). A write drops the records it covers. The records are an index
  (``deps.Records``: one entry per distinct box and queue), so re-reading a tile in a loop
  does not grow them.
- **Queues.** DMAs of one HBM tensor go to that tensor's queue (one queue per tensor, as the
  calibrated tutorial programs do); SBUF->SBUF DMAs to their own queue. Compute ops go to the
  engine the NKI documentation gives them (ops.py decides).
- **Checks.** Each instruction is checked by the machine's own rules (``runtime_sim.checks``)
  as it is emitted, including the PSUM accumulation groups; a violation is raised as the
  machine's error naming the instruction, with a note naming the kernel's source line.
  Every instruction's ``tag`` is that source line (``file.py:42``), so traces and the
  simulator's own errors point back to the kernel.
"""
from __future__ import annotations

import contextvars
import os
import sys
import weakref

from runtime_sim.checks import MachineError, PsumGroups, check_instr, check_psum_bank, psum_banks_of
from runtime_sim.errors import CapacityError
from runtime_sim.isa import (VECTOR, Buffer, DmaAttrs, DType, EngineKind, Instr, Memory, Op,
                             OpAttrs, Program, Queue, TensorCopyAttrs, dma_queue)
from runtime_sim.targets import Target

from .deps import Records
from .placement import Placement, StaleBlockError, blocks
from .tensor import NkiTensor, Storage, free_elems, on_release

ROTATE = 2          # freed same-size blocks kept aside before one is reused (see docstring)
ALIGN = 64          # SBUF allocation granule, bytes per partition

_ACTIVE: contextvars.ContextVar["Tracer | None"] = contextvars.ContextVar("nki_tracer", default=None)
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def active() -> "Tracer | None":
    """The tracer of the kernel being traced, or None outside a kernel."""
    return _ACTIVE.get()


def current() -> "Tracer":
    t = _ACTIVE.get()
    if t is None:
        raise RuntimeError("NKI API called outside a kernel: call the kernel decorated with "
                           "@nki.jit (or nki.simulate_kernel(kernel, ...)) instead")
    return t


def source_line() -> str:
    """``file.py:line`` of the innermost frame outside this package (the kernel's line)."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PKG_DIR:
        f = f.f_back
    if f is None:
        return ""
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


class _Sbuf:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.top = 0
        self.free: list[tuple[int, int, int]] = []   # (offset, size, freed order)
        self.seq = 0
        self.reserved: list[tuple[int, int]] = []    # explicitly placed (placement.py), for good

    def alloc(self, size: int) -> int | None:
        size = (size + ALIGN - 1) // ALIGN * ALIGN
        same = sorted((f for f in self.free if f[1] == size), key=lambda f: f[2])
        if len(same) >= ROTATE:
            self.free.remove(same[0])
            return same[0][0]
        if self.top + size <= self.capacity:
            self.top += size
            return self.top - size
        self._coalesce()
        for f in sorted(self.free, key=lambda f: f[2]):
            if f[1] >= size:
                self.free.remove(f)
                if f[1] > size:
                    self.free.append((f[0] + size, f[1] - size, f[2]))
                return f[0]
        return None

    def release(self, offset: int, size: int) -> None:
        size = (size + ALIGN - 1) // ALIGN * ALIGN
        self.seq += 1
        self.free.append((offset, size, self.seq))

    def _coalesce(self) -> None:
        fs = sorted(self.free)
        out: list[tuple[int, int, int]] = []
        for f in fs:
            if out and out[-1][0] + out[-1][1] == f[0]:
                o = out[-1]
                out[-1] = (o[0], o[1] + f[1], max(o[2], f[2]))
            else:
                out.append(f)
        self.free = out

    def live_bytes(self) -> int:
        return self.top - sum(f[1] for f in self.free)

    def reserve(self, lo: int, hi: int) -> bool:
        """Take ``[lo, hi)`` for an explicitly placed tile for good; False when a live tile of
        this allocator overlaps it."""
        held = [(o, o + n) for o, n, _ in self.free] + self.reserved
        live = _minus([(0, self.top)], held)
        if any(a < hi and lo < b for a, b in live):
            return False
        self.free = [(o2, n2, q) for o, n, q in self.free
                     for o2, n2 in _split_out(o, n, lo, hi)]
        top = (hi + ALIGN - 1) // ALIGN * ALIGN
        gaps = [(self.top, lo - self.top)] if lo > self.top else []
        if top > max(self.top, hi):
            gaps.append((max(self.top, hi), top - max(self.top, hi)))
        for o, n in gaps:                  # free memory below the new top
            self.seq += 1
            self.free.append((o, n, self.seq))
        self.top = max(self.top, top)
        self.reserved.append((lo, hi))
        return True


class _Psum:
    def __init__(self, banks: int, bank_bytes: int, multi: int) -> None:
        self.bank_bytes, self.multi = bank_bytes, multi
        self.used = [[] for _ in range(banks)]        # per bank: live (offset, size)
        self.last = [0] * banks
        self.seq = 0
        self.fixed: set[tuple[int, int]] = set()     # explicitly placed (placement.py)

    def alloc(self, size: int, blocks: bool = False) -> int | None:
        """``blocks``: a tensor of bank-aligned blocks may take several consecutive banks."""
        self.seq += 1
        nb = -(-size // self.bank_bytes)
        if nb > 1:
            if nb > self.multi and not blocks:
                return None
            for b0 in range(len(self.used) - nb + 1):
                if all(not self.used[b] for b in range(b0, b0 + nb)):
                    for b in range(b0, b0 + nb):
                        self.used[b].append((b * self.bank_bytes, self.bank_bytes))
                        self.last[b] = self.seq
                    return b0 * self.bank_bytes
            return None
        order = sorted(range(len(self.used)), key=lambda b: (len(self.used[b]) > 0, self.last[b]))
        for b in order:
            base = b * self.bank_bytes
            off = base
            for o, s in sorted(self.used[b]):
                if o - off >= size:
                    break
                off = max(off, o + s)
            if off + size <= base + self.bank_bytes:
                self.used[b].append((off, size))
                self.last[b] = self.seq
                return off
        return None

    def reserve(self, off: int, size: int) -> bool:
        """Take ``[off, off + size)`` (within one bank) for an explicitly placed tile for good;
        False when a live tile of this allocator overlaps it."""
        b = off // self.bank_bytes
        if any(o < off + size and off < o + n for o, n in self.used[b] if (o, n) not in self.fixed):
            return False
        self.used[b].append((off, size))
        self.fixed.add((off, size))
        return True

    def free_run(self) -> int:
        """The longest run of consecutive empty banks."""
        best = run = 0
        for u in self.used:
            run = 0 if u else run + 1
            best = max(best, run)
        return best

    def release(self, offset: int, size: int) -> None:
        nb = max(1, -(-size // self.bank_bytes))
        b0 = offset // self.bank_bytes
        if nb > 1:
            for b in range(b0, b0 + nb):
                self.used[b] = [u for u in self.used[b] if u != (b * self.bank_bytes, self.bank_bytes)]
        else:
            self.used[b0] = [u for u in self.used[b0] if u != (offset, size)]


def _split_out(o: int, n: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """``[o, o + n)`` without ``[lo, hi)``, as (offset, size) pieces."""
    out = []
    if o < lo:
        out.append((o, min(o + n, lo) - o))
    if o + n > hi:
        out.append((max(o, hi), o + n - max(o, hi)))
    return [p for p in out if p[1] > 0]


def _minus(spans: list[tuple[int, int]], cut: list[tuple[int, int]]) -> list[tuple[int, int]]:
    for lo, hi in cut:
        spans = [(a, a + n) for s0, s1 in spans for a, n in _split_out(s0, s1 - s0, lo, hi)]
    return spans


class Tracer:
    """The program being built for one kernel call (module docstring)."""

    def __init__(self, target: Target, kernel_name: str) -> None:
        self.target = target
        self.kernel_name = kernel_name
        self.buffers: list[Buffer] = []
        self.bufmap: dict[str, Buffer] = {}
        self.streams: dict[Queue, list[Instr]] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.written: set[str] = set()          # HBM buffers some instruction wrote
        self.sbuf = _Sbuf(target.sbuf_bytes_per_partition)
        self.psum = _Psum(target.psum_banks, target.psum_bank_bytes, target.matmul_psum_banks)
        self.sbuf_peak = 0
        self._records: dict[str, Records] = {}     # space -> its access records (deps.py)
        self._dead: list[tuple[Memory, int, int, str]] = []
        self._seen: dict[tuple[str, str], int] = {}
        self._dma_q: dict[str, Queue] = {}
        self._groups = PsumGroups(target)
        self._names: dict[str, int] = {}
        self.program_id: tuple[int, ...] = ()
        self.grid: tuple[int, ...] = ()
        self.shared: list[Storage] = []         # shared_hbm tensors, by creation order (SPMD)
        self._shared_i = 0
        self.constants: dict[str, "object"] = {}   # input name -> host data (nl.shared_constant)
        self._by_line: dict[tuple, list] = {}       # (memory, kernel line) -> weakrefs of tiles

    # ---- context -----------------------------------------------------------------------------
    def __enter__(self) -> "Tracer":
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._token)

    def begin_instance(self, pid: tuple[int, ...]) -> None:
        """Start SPMD instance ``pid``: shared_hbm tensors it creates are the first instance's."""
        self.program_id = pid
        self._shared_i = 0

    # ---- storages ----------------------------------------------------------------------------
    def _name(self, base: str) -> str:
        base = base or "t"
        k = self._names.get(base, 0)
        self._names[base] = k + 1
        return base if k == 0 and base not in self.bufmap else f"{base}.{k}"

    def hbm(self, shape: tuple[int, ...], dtype: DType, name: str, role: str = "") -> Storage:
        """An HBM tensor; ``role`` "input" for a kernel argument, "shared" for an
        ``nl.ndarray(..., buffer=nl.shared_hbm)`` (shared by the SPMD instances)."""
        if role == "shared":
            if self._shared_i < len(self.shared):
                st = self.shared[self._shared_i]
                self._shared_i += 1
                if st.shape != shape or st.dtype is not dtype:
                    raise ValueError(f"SPMD instance {self.program_id} declares shared_hbm tensor "
                                     f"#{self._shared_i} as {shape} {dtype.value}; instance 0 "
                                     f"declared {st.shape} {st.dtype.value}")
                return st
        n = 1
        for s in shape:
            n *= s
        b = Buffer(self._name(name or "hbm"), Memory.HBM, 1, n * dtype.itemsize)
        self._add_buffer(b)
        st = Storage(b, shape, dtype, None)
        if role in ("input", "constant"):
            self.inputs.append(b.name)
        elif role == "shared":
            self.shared.append(st)
            self._shared_i += 1
        return st

    def onchip(self, memory: Memory, shape: tuple[int, ...], dtype: DType, pdim: int, name: str) -> Storage:
        """A new SBUF/PSUM tile. When memory is short, the earlier tiles declared at the same
        kernel line (previous loop iterations: NKI tiles declared in a loop body live for one
        iteration) are reclaimed first, and using one of them afterwards is an error; then a
        PSUM tensor of blocks is placed modulo the free banks (``_modulo_psum``)."""
        line = source_line()
        try:
            st = self._onchip(memory, shape, dtype, pdim, name, modulo=False)
        except CapacityError:
            self._reclaim(memory, line)
            st = self._onchip(memory, shape, dtype, pdim, name, modulo=True)
        self._by_line.setdefault((memory, line), []).append(weakref.ref(st))
        return st

    def _reclaim(self, memory: Memory, line: str) -> None:
        for ref in self._by_line.pop((memory, line), ()):
            st = ref()
            if st is not None and st.reclaim is not None and st.reclaim.alive:
                st.dead = (f"{memory.value.upper()} tile {st.name} {list(st.shape)} declared at "
                           f"{line} was used after a later declaration at that line reclaimed its "
                           f"memory ({memory.value.upper()} was full; a tile declared in a loop "
                           f"body lives for one iteration)")
                st.reclaim()

    def _onchip(self, memory: Memory, shape: tuple[int, ...], dtype: DType, pdim: int, name: str,
                modulo: bool) -> Storage:
        parts = shape[pdim] if shape else 1
        t = self.target
        nbytes = free_elems(shape, pdim) * dtype.itemsize
        what = f"{memory.value.upper()} tile {name or ''} {list(shape)} {dtype.value}".replace("  ", " ")
        if not 1 <= parts <= t.sbuf_partitions:
            raise self._fail(CapacityError(
                f"{what}: partition dimension (dimension {pdim}) is {parts}; a tile has 1 to "
                f"{t.sbuf_partitions} partitions (nl.tile_size.pmax) on {t.name}"))
        if memory is Memory.SBUF:
            off = self.sbuf.alloc(nbytes)
            if off is None:
                raise self._fail(CapacityError(
                    f"{what}: needs {nbytes} B per partition; SBUF has "
                    f"{t.sbuf_bytes_per_partition} B per partition on {t.name}, "
                    f"{self.sbuf.live_bytes()} B held by live tiles"))
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf.top)
            release = self.sbuf.release
        else:
            block = None
            nblocks = 1
            for s in shape[:pdim]:
                nblocks *= s
            tile_bytes = nbytes // max(1, nblocks)
            if nblocks > 1 and tile_bytes <= t.psum_bank_bytes:   # blocks never cross a bank
                stride = 1 << max(0, (tile_bytes - 1).bit_length())
                block = stride // dtype.itemsize
                nbytes = (nblocks - 1) * stride + tile_bytes
            if block is not None and 1 < -(-nbytes // t.psum_bank_bytes) >= sum(1 for u in self.psum.used if not u):
                # it would take every free bank, leaving none for the kernel's later tiles
                if modulo and self.psum.free_run():
                    return self._modulo_psum(shape, dtype, pdim, name, what, nblocks, block, tile_bytes)
                raise CapacityError(f"{what}: would take every free PSUM bank")
            off = self.psum.alloc(nbytes, blocks=block is not None)
            if off is None and block is not None and modulo and self.psum.free_run():
                return self._modulo_psum(shape, dtype, pdim, name, what, nblocks, block, tile_bytes)
            if off is None:
                bank = t.psum_bank_bytes
                if block is not None:
                    msg = (f"{what}: its {nblocks} blocks need {-(-nbytes // bank)} consecutive free "
                           f"PSUM banks of {bank} B; {t.psum_banks} banks on {t.name}, "
                           f"{sum(1 for u in self.psum.used if u)} holding live PSUM tiles")
                elif nbytes > bank * max(1, t.matmul_psum_banks):
                    msg = (f"{what}: needs {nbytes} B per partition; a PSUM tile lies within one "
                           f"{bank} B bank (nl.tile_size.psum_fmax = {bank // 4} fp32)")
                    if t.matmul_psum_banks > 1:
                        msg += f" or {t.matmul_psum_banks} consecutive banks on {t.name}"
                else:
                    live = sum(len(u) for u in self.psum.used)
                    msg = (f"{what}: no PSUM space left: {t.psum_banks} banks of {bank} B on "
                           f"{t.name}, {live} live PSUM tiles")
                raise self._fail(CapacityError(msg))
            release = self.psum.release
        b = Buffer(self._name(name or ("psum" if memory is Memory.PSUM else "sb")), memory, parts, nbytes, off)
        self._add_buffer(b)
        self._inherit(b)
        st = Storage(b, shape, dtype, pdim, block if memory is Memory.PSUM else None)
        on_release(st, self._release, release, memory, off, nbytes, b.name)
        return st

    def _modulo_psum(self, shape, dtype: DType, pdim: int, name: str, what: str, nblocks: int,
                     block: int, tile_bytes: int) -> Storage:
        """A PSUM tensor whose blocks do not all fit: half of the longest run of free banks
        after keeping one for later tiles (at least one bank), its blocks placed modulo the slots there (placement.py: a block read after
        another overwrote it is an error, never a wrong value)."""
        bank = self.target.psum_bank_bytes
        k = max(1, (self.psum.free_run() - 1) // 2)
        off = self.psum.alloc(k * bank, blocks=True)
        assert off is not None
        stride = block * dtype.itemsize
        per_bank = bank // stride
        nslots = k * per_bank
        slots = {idx: (0, (n % nslots) // per_bank * bank + (n % nslots) % per_bank * stride)
                 for n, idx in enumerate(blocks(shape, pdim))}
        b = Buffer(self._name(name or "psum"), Memory.PSUM, shape[pdim], k * bank, off)
        self._add_buffer(b)
        self._inherit(b)
        st = Storage(b, shape, dtype, pdim, block)
        how = (f"too few free PSUM banks for its {nblocks} blocks, so the front end placed them "
               f"modulo {nslots} slots in {k} of the {self.target.psum_banks} banks; declare "
               f"fewer blocks, or place them with ncc.psum.mod_alloc")
        st.placement = Placement(what, tuple(shape[:pdim]), block, slots, b.name, how)
        st.placement.paged = True
        on_release(st, self._release, self.psum.release, Memory.PSUM, off, k * bank, b.name)
        return st

    def placed(self, memory: Memory, shape, dtype: DType, pdim: int, name: str, place,
               how: str) -> Storage:
        """A tile placed block by block by the kernel's allocation function (placement.py)."""
        t = self.target
        parts = shape[pdim]
        inner = free_elems(shape[pdim:], 0)
        fbytes = inner * dtype.itemsize
        what = f"{memory.value.upper()} tile {name} {list(shape)} {dtype.value} ({how})".replace("  ", " ")
        if not 1 <= parts <= t.sbuf_partitions:
            raise self._fail(CapacityError(
                f"{what}: partition dimension (dimension {pdim}) is {parts}; a tile "
                f"has 1 to {t.sbuf_partitions} partitions on {t.name}"))
        slots = {}
        for idx in blocks(shape, pdim):
            r = tuple(int(x) for x in place(idx, parts, fbytes))
            if memory is Memory.PSUM:
                bank, p, a = r
                if not 0 <= bank < t.psum_banks or a < 0 or a + fbytes > t.psum_bank_bytes:
                    raise self._fail(CapacityError(
                        f"{what}: block {list(idx)} at bank {bank}, byte {a}, "
                        f"{fbytes} B per partition: a PSUM block lies within one of the "
                        f"{t.psum_banks} banks of {t.psum_bank_bytes} B on {t.name}"))
                a += bank * t.psum_bank_bytes
            else:
                p, a = r
                if a < 0 or a + fbytes > t.sbuf_bytes_per_partition:
                    raise self._fail(CapacityError(
                        f"{what}: block {list(idx)} at byte {a}, {fbytes} B per "
                        f"partition, beyond SBUF's {t.sbuf_bytes_per_partition} B per partition "
                        f"on {t.name}"))
            if p < 0 or p + parts > t.sbuf_partitions:
                raise self._fail(CapacityError(
                    f"{what}: block {list(idx)} at partitions [{p}, {p + parts}), "
                    f"beyond the {t.sbuf_partitions} partitions of {t.name}"))
            slots[idx] = (p, a)
        for p, a in set(slots.values()):
            ok = (self.psum.reserve(a, fbytes) if memory is Memory.PSUM
                  else self.sbuf.reserve(a, a + fbytes))
            if not ok:
                raise self._fail(CapacityError(
                    f"{what}: bytes [{a}, {a + fbytes}) of {memory.value.upper()} are "
                    f"held by a live tile the front end placed (a tile without an explicit "
                    f"placement); place that tile explicitly too, or elsewhere"))
        lo = min(a for _, a in slots.values())
        hi = max(a for _, a in slots.values()) + fbytes
        b = Buffer(self._name(name or "placed"), memory, max(p for p, _ in slots.values()) + parts,
                   hi - lo, lo)
        self._add_buffer(b)
        self._inherit(b)
        space = f"@{memory.value}"
        self._records.setdefault(space, Records()).merge(self._records[b.name])
        self._records[b.name] = Records()
        st = Storage(b, shape, dtype, pdim)
        st.placement = Placement(what, tuple(shape[:pdim]), inner,
                                 {i: (p, a - lo) for i, (p, a) in slots.items()}, space, how)
        return st

    def _add_buffer(self, b: Buffer) -> None:
        self.buffers.append(b)
        self.bufmap[b.name] = b
        self._records[b.name] = Records()

    def _inherit(self, b: Buffer) -> None:
        """A new buffer reusing freed memory inherits the access records there (physical
        boxes), so its first accesses wait for the old tile's last ones."""
        lo, hi = b.offset, b.offset + b.bytes_per_partition
        keep = []
        recs = self._records[b.name]
        for mem, dlo, dhi, name in self._dead:
            if mem is b.memory and dlo < hi and lo < dhi:
                if name in self._records:
                    recs.merge(self._records[name], lambda box: box[1][0] < hi and lo < box[1][1])
            if not (mem is b.memory and lo <= dlo and dhi <= hi):
                keep.append((mem, dlo, dhi, name))
            elif name in self._records:
                del self._records[name]
        self._dead = keep

    def _release(self, release, memory: Memory, off: int, nbytes: int, name: str) -> None:
        release(off, nbytes)
        self._dead.append((memory, off, off + nbytes, name))

    # ---- instructions ------------------------------------------------------------------------
    def dma_queue_for(self, *views: NkiTensor) -> Queue:
        key = next((v.storage.name for v in views if v.memory is Memory.HBM), "__sbuf_sbuf__")
        q = self._dma_q.get(key)
        if q is None:
            n = self.target.dma_engines * self.target.dma_queues_per_engine
            q = self._dma_q[key] = dma_queue(len(self._dma_q) % n)
        return q

    def emit(self, queue: Queue, op: Op, dst: NkiTensor | None, srcs: tuple[NkiTensor, ...],
             attrs: OpAttrs, accum: NkiTensor | None = None) -> Instr:
        """Emit one instruction on ``queue``, with its waits (module docstring), and check it."""
        for v in (dst, accum, *srcs):
            if v is not None and v.checks:
                try:
                    v.validate()
                except IndexError as e:
                    raise IndexError(f"{e} (in NKI kernel {self.kernel_name!r} at {source_line()})") from None
        for v in (dst, accum, *srcs):
            if v is not None and v.storage.dead:
                raise self._fail(CapacityError(v.storage.dead))
        dst, srcs, accum = _partition_first(dst, srcs, accum)
        for v in (*srcs, dst, accum):      # before the stream position is taken: may emit copies
            if v is not None and v.storage.placement is not None and v.storage.placement.paged:
                self._page_in(v, write=v is dst or v is accum)
        stream = self.streams.setdefault(queue, [])
        sem = f"{queue.name}.done"
        dma = queue.engine is EngineKind.DMA
        n = len(stream) + 1
        writes = [v for v in (dst, accum) if v is not None]
        dst_ap = dst.ap() if dst is not None else None
        acc_ap = accum.ap() if accum is not None else None
        src_aps = tuple(s.ap() for s in srcs)
        need: dict[str, int] = {}

        def want(p: str, c: int) -> None:
            if (p != sem or dma) and c > need.get(p, 0):
                need[p] = c

        try:
            for v in (*srcs, *writes):
                if v.storage.placement is not None:
                    v.storage.placement.touch(v, write=v not in srcs)
        except StaleBlockError as e:
            raise self._fail(e) from None
        rfps = [s.footprint() for s in srcs]
        wfps = [w.footprint() for w in writes]
        for space, box in rfps:
            self._records[space].waits(box, False, want)
        for space, box in wfps:
            self._records[space].waits(box, True, want)
        waits = []
        for p, c in sorted(need.items()):
            k = (sem, p)
            if self._seen.get(k, 0) < c:
                waits.append((p, c))
                self._seen[k] = c
        if dst is not None and dst.storage.nominal is None and dst.memory is not Memory.HBM:
            dst.storage.nominal = next((s.storage.cut_of(s.partitions) for s in srcs
                                        if s.storage.cut_of(s.partitions)
                                        and s.partitions == dst.partitions), None)
        ins = Instr(op, dst_ap, src_aps, attrs, tuple(waits), (sem,), source_line(), acc_ap)
        self._check(queue, len(stream), ins)
        stream.append(ins)
        for space, box in rfps:
            self._records[space].add(box, sem, n, False)
        for w, (_, box) in zip(writes, wfps):
            if w.memory is Memory.PSUM:
                w.storage.written_boxes.add(box)
        for space, box in wfps:
            self._records[space].add(box, sem, n, True)
            if space in self.bufmap and self.bufmap[space].memory is Memory.HBM:
                self.written.add(space)
        return ins

    # ---- paging of the front end's modulo-placed PSUM tensors (placement.py) -----------------
    def _page_in(self, v: NkiTensor, write: bool) -> None:
        """Make ``v``'s block resident in its slot before an instruction uses it: spill the
        block there if it was written and not read since (a block already read is dropped:
        reading it again is the StaleBlockError), then copy ``v``'s block back from its backing
        store if it has one. A read of a block never written stays an error."""
        st, pl = v.storage, v.storage.placement
        idx = pl.block_of(v)
        slot = pl.slots[idx]
        occ = pl.last.get(slot)
        if occ is None or occ == idx or (not write and idx not in pl.backing):
            return
        if occ in pl.dirty and occ in pl.unread:
            self._copy_block(st, occ, out=True)
        elif occ in pl.dirty:              # read since written: taken as done with, not kept
            pl.backing.pop(occ, None)
            pl.dirty.discard(occ)
        del pl.last[slot]
        if idx in pl.backing:
            pl.last[slot] = idx
            self._copy_block(st, idx, out=False)
            pl.dirty.discard(idx)

    def _copy_block(self, st: Storage, idx: tuple, out: bool) -> None:
        """Copy block ``idx`` of paged PSUM tensor ``st`` to (``out``) or from its backing store:
        one SBUF tensor of the same shape when the whole tensor takes at most a quarter of SBUF
        per partition, else an HBM tensor through an SBUF staging tile."""
        pl = st.placement
        if pl.store is None:
            nbytes = free_elems(st.shape, st.pdim) * st.dtype.itemsize
            sb = None
            if nbytes <= self.target.sbuf_bytes_per_partition // 4:
                try:
                    sb = self._onchip(Memory.SBUF, st.shape, st.dtype, st.pdim, f"{st.name}.spill", False)
                except CapacityError:
                    sb = None
            pl.store = sb if sb is not None else self.hbm(st.shape, st.dtype, f"{st.name}.spill")
        blk, bk = st.view()[idx], pl.store.view()[idx]
        if bk.memory is Memory.SBUF:
            self.emit(VECTOR, Op.TENSOR_COPY, *((bk, (blk,)) if out else (blk, (bk,))), TensorCopyAttrs())
        else:
            stage = self._onchip(Memory.SBUF, st.shape[st.pdim:], st.dtype, 0, "spill_stage", False).view()
            if out:
                self.emit(VECTOR, Op.TENSOR_COPY, stage, (blk,), TensorCopyAttrs())
                self.emit(self.dma_queue_for(bk), Op.DMA_COPY, bk, (stage,), DmaAttrs())
            else:
                self.emit(self.dma_queue_for(bk), Op.DMA_COPY, stage, (bk,), DmaAttrs())
                self.emit(VECTOR, Op.TENSOR_COPY, blk, (stage,), TensorCopyAttrs())
        if out:
            pl.backing[idx] = True
            pl.dirty.discard(idx)
            pl.spills += 1
        else:
            pl.fills += 1

    def _check(self, q: Queue, index: int, ins: Instr) -> None:
        try:
            geoms = check_instr(ins, q, self.bufmap, self.target)
            if ins.op in (Op.MATMUL, Op.TRANSPOSE) and q.engine is EngineKind.TENSOR:
                check_psum_bank(geoms[0], self.target, ins.op.value, psum_banks_of(ins, self.target))
                self._groups.step(ins, geoms[0])
        except MachineError as e:
            raise self._fail(e.with_context(q, index, ins)) from None

    def _fail(self, e: MachineError) -> MachineError:
        e.add_note(f"in NKI kernel {self.kernel_name!r} at {source_line()} (target {self.target.name}"
                   + (f", SPMD instance {self.program_id}" if self.grid else "") + ")")
        return e

    def program(self) -> Program:
        outs = [n for n in self.outputs]
        for n in self.inputs:        # arguments the kernel wrote are outputs too (in-place kernels)
            if n in self.written and n not in outs:
                outs.append(n)
        return Program(self.target.name, tuple(self.buffers),
                       {q: tuple(v) for q, v in self.streams.items()}, tuple(self.inputs), tuple(outs))


def _partition_first(dst, srcs, accum):
    """An on-chip operand whose partition axis is not its first (a block ``(n, par_dim(P), F)``
    addressed whole): every operand of that rank gets the same axis moved first, which keeps
    element i of one operand paired with element i of the others."""
    views = [v for v in (dst, accum, *srcs) if v is not None]
    k = next((next(i for i, a in enumerate(v.axes) if a[2]) for v in views
              if any(a[2] for a in v.axes[1:])), None)
    if k is None:
        return dst, srcs, accum

    def move(v):
        if v is None or v.ndim <= k:
            return v
        return v._with(axes=(v.axes[k],) + v.axes[:k] + v.axes[k + 1:])
    return move(dst), tuple(move(s) for s in srcs), move(accum)
