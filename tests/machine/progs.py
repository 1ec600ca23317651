"""Hand-written ISA program helpers for the machine tests.

``B`` builds a program: HBM buffers, SBUF/PSUM buffers with bump-allocated offsets (tests play
the memory planner), instructions appended per queue, and fresh semaphore names.
``run_op`` wraps one compute instruction in DMA loads and a DMA store, all ordered by semaphores,
and returns the stored result as a numpy array.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime_sim import (AP, Buffer, DmaAttrs, DType, Instr, Memory, Op, Program, Queue,  # noqa: E402
                         SimResult, ap, dma_queue, simulate)

NP = {DType.FP32: np.float32}


class B:
    def __init__(self, target: str = "trn2") -> None:
        self.target = target
        self.buffers: list[Buffer] = []
        self.streams: dict[Queue, list[Instr]] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.sbuf_top = 0
        self.psum_top = 0
        self.nsem = 0
        self.ndma = 0

    def sem(self) -> str:
        self.nsem += 1
        return f"s{self.nsem}"

    def hbm(self, name: str, nbytes: int, *, data: np.ndarray | None = None, output: bool = False) -> Buffer:
        b = Buffer(name, Memory.HBM, 1, nbytes)
        self.buffers.append(b)
        if data is not None:
            self.inputs.append(name)
            self.feeds[name] = data
        if output:
            self.outputs.append(name)
        return b

    def sbuf(self, name: str, nbytes: int, partitions: int = 128, offset: int | None = None) -> Buffer:
        if offset is None:
            offset = self.sbuf_top
            self.sbuf_top += (nbytes + 63) // 64 * 64
        b = Buffer(name, Memory.SBUF, partitions, nbytes, offset)
        self.buffers.append(b)
        return b

    def psum(self, name: str, nbytes: int, partitions: int = 128, offset: int | None = None) -> Buffer:
        if offset is None:
            offset = self.psum_top
            self.psum_top += 2048 * ((nbytes + 2047) // 2048)
        b = Buffer(name, Memory.PSUM, partitions, nbytes, offset)
        self.buffers.append(b)
        return b

    def add(self, q: Queue, ins: Instr) -> int:
        s = self.streams.setdefault(q, [])
        s.append(ins)
        return len(s) - 1

    def next_dma(self) -> Queue:
        q = dma_queue(16 * (self.ndma % 16))
        self.ndma += 1
        return q

    def load(self, name: str, x: np.ndarray, dtype: DType) -> tuple[AP, str]:
        """DMA a [P, ...] array into a fresh SBUF tile; return (tile AP, semaphore to wait on)."""
        x = np.ascontiguousarray(x.astype(dtype.np))
        p = x.shape[0]
        f = x.size // p
        h = self.hbm(f"in_{name}", x.nbytes, data=x)
        s = self.sbuf(name, f * dtype.itemsize)
        dst = ap(s, dtype, [(1, f)], partitions=p)
        sem = self.sem()
        self.add(self.next_dma(), Instr(Op.DMA_COPY, dst, (ap(h, dtype, [(f, p), (1, f)]),), DmaAttrs(),
                                        signals=(sem,)))
        return dst, sem

    def store(self, name: str, src: AP, waits: tuple[tuple[str, int], ...]) -> None:
        h = self.hbm(f"o_{name}", src.bytes, output=True)
        self.add(self.next_dma(), Instr(Op.DMA_COPY, ap(h, src.dtype, [(src.free_size, src.partitions), (1, src.free_size)]),
                                        (src,), DmaAttrs(), waits=waits))

    def program(self) -> Program:
        return Program(self.target, tuple(self.buffers), {q: tuple(v) for q, v in self.streams.items()},
                       tuple(self.inputs), tuple(self.outputs))

    def run(self, **kw) -> SimResult:
        return simulate(self.program(), self.feeds, **kw)


def out(res: SimResult, name: str, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    return res.outputs[f"o_{name}"].view(dtype.np).reshape(shape)
