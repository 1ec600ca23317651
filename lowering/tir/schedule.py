"""Schedule pass: one queue per tile-IR instruction (the same queue in every iteration).

An instruction that several engines can run (``TInstr.engines``) goes to the engine whose
estimated busy time, counted over its top-level statement (one kernel's loop nest, each
instruction weighted by how often it runs), stays lowest; the estimate is the simulator's own
cost table (``runtime_sim.costs.instr_cost``) on the instruction's first iteration. DMA transfers
are spread over the DMA queues the same way (a queue's transfers run in order and complete in
order, so static DMAs of one loop body on distinct queues overlap).

Invariants
- Only the queue is chosen; correctness never depends on it (the sync pass derives every wait
  from the bytes touched).
- Every queue runs its instructions in program order.
"""
from __future__ import annotations

from lowering.tir.analysis import Structure
from lowering.tir.ir import TAP, TInstr, TProgram
from runtime_sim.costs import instr_cost
from runtime_sim.isa import AP, EngineKind, Instr, Queue, dma_queue
from runtime_sim.targets import Target


def machine_ap(tp: TProgram, a: TAP, byte_offset: int | None = None) -> AP:
    """The machine AP of a tile access (``byte_offset`` defaults to the constant part)."""
    mem = tp.buffer(a.buf).memory
    off = a.offset.const if byte_offset is None else byte_offset
    return AP(a.buf, mem, a.partition_start, a.partitions, off, a.dims, a.dtype)


def probe_instr(tp: TProgram, ins: TInstr) -> Instr:
    """A machine instruction with ``ins``'s shapes, for cost estimates."""
    def m(a):
        return None if a is None else machine_ap(tp, a)
    return Instr(ins.op, m(ins.dst), tuple(m(s) for s in ins.srcs), ins.attrs, accum=m(ins.accum))


def dma_queues(target: Target) -> list[Queue]:
    return [dma_queue(e * target.dma_queues_per_engine) for e in range(target.dma_engines)]


def schedule(tp: TProgram, target: Target, st: Structure | None = None) -> dict[int, Queue]:
    st = st or Structure(tp)
    dmas = dma_queues(target)
    out: dict[int, Queue] = {}
    load: dict[Queue, float] = {}
    top = -1
    rr = 0
    for sid in sorted(st.info):
        inf = st.info[sid]
        if inf.top != top:
            top = inf.top
            load = {}
        ins = inf.ins
        n = inf.count
        cands: list[Queue] = []
        for e in ins.engines:
            cands.extend(dmas if e is EngineKind.DMA else [Queue(e)])
        if not cands:
            raise AssertionError(f"instruction {sid} ({ins.op.value}) names no engine")
        if len(cands) == 1:
            q = cands[0]
            out[sid] = q
            load[q] = load.get(q, 0.0) + n * _cost(tp, ins, q, target)
            continue
        probe = probe_instr(tp, ins)
        best = None
        for i, q in enumerate(cands):
            c = instr_cost(probe, q, target)
            occ = c.issue_ns if q.engine is EngineKind.DMA else c.busy_ns
            # DMA: prefer the least-loaded queue, then round-robin so that static transfers of
            # one body land on distinct queues
            key = (load.get(q, 0.0) + n * occ, (i - rr) % len(cands) if q.engine is EngineKind.DMA else i)
            if best is None or key < best[0]:
                best = (key, q, occ)
        assert best is not None
        _, q, occ = best
        if q.engine is EngineKind.DMA:
            rr = (dmas.index(q) + 1) % len(dmas)
        out[sid] = q
        load[q] = load.get(q, 0.0) + n * occ
    return out


def _cost(tp: TProgram, ins: TInstr, q: Queue, target: Target) -> float:
    c = instr_cost(probe_instr(tp, ins), q, target)
    return c.issue_ns if q.engine is EngineKind.DMA else c.busy_ns
