"""A small program builder for hand-written calibration kernels.

``KernelBuilder`` plays the roles the NKI compiler plays for a tutorial kernel, and nothing
more: it places buffers (bump allocation, one Buffer per tile so that dependencies are tracked
per tile like NKI's), and it inserts the semaphores that order every cross-queue dependency.
The kernels themselves (calibration/matmul.py, calibration/mamba.py) spell out the tutorial's
loop nest and choose every instruction, engine and buffer.

Synchronisation protocol (the only one used): every instruction signals its queue's semaphore
``"<queue>.done"``, so ``("<queue>.done", n)`` means "the first n instructions of that queue
have completed" (compute queues complete in order; the simulator completes a DMA queue's
instructions in order). Before an instruction is emitted, the buffers it reads and writes are
looked up: it waits for the last writer of what it reads (RAW) and for the last writer and every
reader since of what it writes (WAW, WAR). Dependencies inside one compute queue need no wait
(program order); inside a DMA queue they do (DMAs of one queue overlap in time).

Invariants: buffers never alias unless the kernel passes the same Buffer object (then the
dependencies are tracked, since they are keyed by buffer name); ``program()`` raises if SBUF or
PSUM is over-allocated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..isa import AP, Buffer, DType, EngineKind, Instr, Memory, Op, OpAttrs, Program, Queue, tile_ap
from ..targets import Target, get_target


@dataclass(frozen=True)
class HbmTensor:
    """A row-major HBM tensor viewed as 2-D [rows, cols] (leading dims folded into rows)."""

    buffer: Buffer
    rows: int
    cols: int
    dtype: DType

    def tile(self, r0: int, nr: int, c0: int, nc: int) -> AP:
        """``t[r0:r0+nr, c0:c0+nc]`` as an HBM AP of shape [nr, nc]."""
        isz = self.dtype.itemsize
        dims = ((self.cols, nr), (1, nc)) if nr > 1 else ((1, nc),)
        return AP(self.buffer.name, Memory.HBM, 0, 1, (r0 * self.cols + c0) * isz, dims, self.dtype)

    def column(self, r0: int, nr: int, c: int) -> AP:
        """``t[r0:r0+nr, c]`` as [nr, 1] (one element per row: a strided read)."""
        isz = self.dtype.itemsize
        return AP(self.buffer.name, Memory.HBM, 0, 1, (r0 * self.cols + c) * isz, ((self.cols, nr), (1, 1)), self.dtype)


class KernelBuilder:
    def __init__(self, target: Target | str) -> None:
        self.target = get_target(target) if isinstance(target, str) else target
        self.buffers: list[Buffer] = []
        self.streams: dict[Queue, list[Instr]] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.sbuf_top = 0
        self.psum_top = 0
        # dependency state, keyed by buffer name; queues by their ".done" semaphore name
        self._writer: dict[str, tuple[str, int]] = {}
        self._readers: dict[str, dict[str, int]] = {}
        self._seen: dict[tuple[str, str], int] = {}   # (waiter, producer) -> count already waited
        self._qstate: dict[Queue, tuple[list[Instr], str, bool, tuple[str]]] = {}
        self._intern: dict = {}     # equal APs / attrs share one object (smaller programs; the
                                    # simulator's precompute recognises repeated instructions by id)

    # ---- buffers -----------------------------------------------------------------------------
    def hbm(self, name: str, rows: int, cols: int, dtype: DType, *, role: str = "input") -> HbmTensor:
        b = Buffer(name, Memory.HBM, 1, rows * cols * dtype.itemsize)
        self.buffers.append(b)
        if role == "input":
            self.inputs.append(name)
        elif role == "output":
            self.outputs.append(name)
        return HbmTensor(b, rows, cols, dtype)

    def sbuf(self, name: str, free_bytes: int, partitions: int = 128) -> Buffer:
        b = Buffer(name, Memory.SBUF, partitions, free_bytes, self.sbuf_top)
        self.sbuf_top += (free_bytes + 63) // 64 * 64
        self.buffers.append(b)
        return b

    def sbuf_tiles(self, name: str, count: int, free: int, dtype: DType, partitions: int = 128) -> list[Buffer]:
        return [self.sbuf(f"{name}{k}", free * dtype.itemsize, partitions) for k in range(count)]

    def psum_banks(self, name: str, count: int) -> list[Buffer]:
        """``count`` whole PSUM banks (2 KiB per partition each)."""
        bank = self.target.psum_bank_bytes
        out = []
        for k in range(count):
            b = Buffer(f"{name}{k}", Memory.PSUM, 128, bank, self.psum_top)
            self.psum_top += bank
            self.buffers.append(b)
            out.append(b)
        return out

    def sbuf_free(self) -> int:
        """Bytes per partition still free in SBUF."""
        return self.target.sbuf_bytes_per_partition - self.sbuf_top

    # ---- instructions ------------------------------------------------------------------------
    def emit(self, q: Queue, op: Op, dst: AP | None, srcs: tuple[AP, ...], attrs: OpAttrs, *,
             accum: AP | None = None, tag: str = "") -> None:
        qs = self._qstate.get(q)
        if qs is None:
            name = f"{q.name}.done"
            qs = self._qstate[q] = (self.streams.setdefault(q, []), name, q.engine is EngineKind.DMA, (name,))
        stream, sem, dma, signals = qs
        n = len(stream) + 1                          # this instruction's count on q.done
        it = self._intern.setdefault
        attrs = it(attrs, attrs)
        srcs = tuple([it(a, a) for a in srcs])
        outs = []
        if dst is not None:
            dst = it(dst, dst)
            outs.append(dst.buffer)
        if accum is not None:
            accum = it(accum, accum)
            outs.append(accum.buffer)
        need: dict[str, int] = {}                    # producer queue's semaphore -> count
        writer, readers = self._writer, self._readers
        for a in srcs:
            w = writer.get(a.buffer)
            if w is not None and (w[0] != sem or dma) and w[1] > need.get(w[0], 0):
                need[w[0]] = w[1]
        for name in outs:
            w = writer.get(name)
            if w is not None and (w[0] != sem or dma) and w[1] > need.get(w[0], 0):
                need[w[0]] = w[1]
            for p, c in readers.get(name, {}).items():
                if (p != sem or dma) and c > need.get(p, 0):
                    need[p] = c
        waits = []
        seen = self._seen
        for p, c in need.items():
            k = (sem, p)
            if seen.get(k, 0) < c:
                waits.append((p, c))
                seen[k] = c
        stream.append(Instr(op, dst, srcs, attrs, tuple(waits), signals, tag, accum))
        for a in srcs:
            r = readers.get(a.buffer)
            if r is None:
                readers[a.buffer] = {sem: n}
            else:
                r[sem] = n
        for name in outs:
            writer[name] = (sem, n)
            readers[name] = {}

    def program(self) -> Program:
        t = self.target
        if self.sbuf_top > t.sbuf_bytes_per_partition:
            raise ValueError(f"kernel needs {self.sbuf_top} B of SBUF per partition, {t.name} has "
                             f"{t.sbuf_bytes_per_partition}")
        if self.psum_top > t.psum_bytes_per_partition:
            raise ValueError(f"kernel needs {self.psum_top} B of PSUM per partition")
        return Program(t.name, tuple(self.buffers), {q: tuple(v) for q, v in self.streams.items()},
                       tuple(self.inputs), tuple(self.outputs))


def tile(buf: Buffer, dtype: DType, partitions: int, free: int, elem_offset: int = 0) -> AP:
    return tile_ap(buf, dtype, partitions, free, elem_offset=elem_offset)


def rng_inputs(program: Program, shapes: dict[str, tuple[tuple[int, ...], DType]], seed: int = 0,
               low: float = -1.0, high: float = 1.0) -> dict[str, np.ndarray]:
    """Random inputs of the given shapes, rounded to each input's dtype."""
    r = np.random.default_rng(seed)
    return {n: r.uniform(low, high, size=s).astype(np.float32).astype(dt.np) for n, (s, dt) in shapes.items()}
