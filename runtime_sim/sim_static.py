"""Static facts of one instruction, shared by the simulator's two precompute passes
(``sim_prepare`` for straight-line streams, ``sim_prepare_loops`` for looped ones): its cost and
static statistics per *signature* (``cost_signature``: op, cost-relevant attributes
``COST_ATTRS``, and each operand's memory, partition start and count, free dims and dtype), the
dependent-instruction penalty of its engine, and the per-queue lists both passes fill
(``QueueLists``).

Transcendental functions (``TRANSCENDENTAL``): the ``activation`` functions that only ScalarE's
lookup tables compute -- exp, log, tanh, sigmoid, gelu (erf and tanh forms), silu, erf, sin, cos.
Not in the set: sqrt, rsqrt and reciprocal (VectorE computes them with its ``pow`` / ``divide``
ALU ops, so they are not work that must run on ScalarE), and identity/copy/relu/square/abs/sign/
neg (VectorE work as well). Their time at the ScalarE rate is ``elements / (lanes x ScalarE
clock x the 2-byte factor when input and output are 2-byte floats)``: one element per lane per
cycle, all 128 lanes, no fixed cost, stride penalty or MIN_II floor.

Invariant: nothing here reads or advances simulated time, and nothing depends on byte offsets.
"""
from __future__ import annotations

from typing import Callable

from .costs import Cost, clock_ghz, indirect_bytes, instr_cost
from .isa import ActFunc, EngineKind, Instr, Memory, Op, Queue, matmul_kmn
from .targets import Target

PENALIZED = (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD)  # dependent-instruction penalty
PORT_SBUF, PORT_PSUM = 1, 2   # NC-v2 shared ports: VectorE/GpSimdE on SBUF, VectorE/ScalarE on PSUM
TRANSCENDENTAL = frozenset({ActFunc.EXP, ActFunc.LOG, ActFunc.TANH, ActFunc.SIGMOID, ActFunc.GELU,
                            ActFunc.GELU_TANH, ActFunc.SILU, ActFunc.ERF, ActFunc.SIN, ActFunc.COS})


class StaticFacts:
    """Per-signature facts of an instruction: its cost and its static statistics."""

    __slots__ = ("cost", "busy", "lat", "flops", "tensor_ns", "trans", "trans_ns", "dma_bytes",
                 "hbm_bytes", "port")

    def __init__(self, ins: Instr, q: Queue, tgt: Target) -> None:
        self.cost = c = instr_cost(ins, q, tgt, None)
        self.busy, self.lat = c.busy_ns, c.latency_ns
        self.flops = 0
        self.tensor_ns = 0.0
        self.trans = 0             # transcendental elements (ScalarE activation)
        self.trans_ns = 0.0
        self.dma_bytes = 0
        self.hbm_bytes = 0
        self.port = 0
        if ins.op is Op.MATMUL:
            st = ins.srcs[0]
            kk, mm, nn = matmul_kmn(ins)
            self.flops = 2 * kk * mm * nn
            self.tensor_ns = self.flops / tgt.peak_flops_per_ns(st.dtype.itemsize)
        elif ins.op is Op.ACTIVATION and ins.attrs.func in TRANSCENDENTAL:  # type: ignore[union-attr]
            s0 = ins.srcs[0]
            self.trans = s0.partitions * s0.free_size
            two = all(a.dtype.itemsize == 2 and a.dtype.is_float for a in (s0,) + ins.writes[:1])
            lanes_per_ns = tgt.lanes * tgt.scalar_clock_ghz * (
                tgt.scalar_bf16_factor if two else 1)
            self.trans_ns = self.trans / lanes_per_ns
        elif ins.op is Op.DMA_COPY:
            s0, d0 = ins.srcs[0], ins.dst
            assert d0 is not None
            self.dma_bytes = s0.bytes
            self.hbm_bytes = s0.bytes * ((s0.memory is Memory.HBM) + (d0.memory is Memory.HBM))
        elif ins.op is Op.DMA_GATHER or ins.op is Op.DMA_SCATTER:
            self.dma_bytes, _, self.hbm_bytes = indirect_bytes(ins)
        elif tgt.shared_ports and ins.op is not Op.SEM:
            mems = {a.memory for a in ins.writes + ins.srcs}
            e = q.engine
            if Memory.SBUF in mems and e in (EngineKind.VECTOR, EngineKind.GPSIMD):
                self.port |= PORT_SBUF
            if Memory.PSUM in mems and e in (EngineKind.VECTOR, EngineKind.SCALAR):
                self.port |= PORT_PSUM


# Which attributes the *cost* of an op depends on (the key used when checks are off; with checks
# on the whole attrs object is part of the key, since the operand rules read all of it).
COST_ATTRS: dict[Op, Callable[[object], object]] = {
    Op.DMA_COPY: lambda a: a.transpose, Op.MATMUL: lambda a: a.perf_mode, Op.TRANSPOSE: lambda a: None,
    Op.ACTIVATION: lambda a: (a.reduce, a.func), Op.TENSOR_TENSOR: lambda a: a.op,
    Op.TENSOR_TENSOR_SCAN: lambda a: a.initial_from_src,
    Op.TENSOR_SCALAR: lambda a: (a.op0, a.reverse0, a.op1, a.reverse1),
    Op.TENSOR_REDUCE: lambda a: a.op, Op.TENSOR_COPY: lambda a: None,
    Op.MEMSET: lambda a: a.value == 0, Op.IOTA: lambda a: None, Op.SELECT: lambda a: None,
    Op.BN_STATS: lambda a: None, Op.BN_AGGR: lambda a: None, Op.DMA_GATHER: lambda a: None,
    Op.DMA_SCATTER: lambda a: a.accumulate, Op.MAX8: lambda a: None,
    Op.FIND_INDEX8: lambda a: None, Op.MATCH_REPLACE8: lambda a: None,
    Op.RAND_PHILOX: lambda a: None, Op.EXPONENTIAL: lambda a: None, Op.QUANTIZE_MX: lambda a: None,
    Op.SEM: lambda a: None,
}


def cost_signature(ins: Instr, akey: object) -> tuple:
    """Everything an instruction's cost and operand rules depend on, except byte offsets."""
    d = ins.dst
    k: tuple = (ins.op, akey) if d is None else (ins.op, akey, d.memory, d.partition_start, d.partitions,
                                                 d.dims, d.dtype)
    a = ins.accum
    if a is not None:
        k += (None, a.memory, a.partition_start, a.partitions, a.dims, a.dtype)
    for a in ins.srcs:
        k += (a.memory, a.partition_start, a.partitions, a.dims, a.dtype)
    return k


class QueueLists:
    """One queue's per-instance lists (index = position in the stream) and its statistics."""

    __slots__ = ("busy", "lat", "waits", "sigs", "dcost", "ports", "ls", "tr", "geoms", "wait_set",
                 "sig_set", "nst", "spill")

    def __init__(self) -> None:
        self.busy: list[float] = []
        self.lat: list[float] = []
        self.waits: list[tuple] = []
        self.sigs: list[tuple] = []
        self.dcost: list[Cost] | None = None
        self.ports: list[int] | None = None
        self.ls: list[float] | None = None
        self.tr: list[bool] | None = None
        self.geoms: list[tuple] = []
        self.wait_set: set[str] = set()
        self.sig_set: set[str] = set()
        self.nst: dict[StaticFacts, int] = {}     # DMA / matmul / transcendental signatures -> count,
        self.spill = 0                        # in order of first occurrence


def penalty_ns(eng: EngineKind, tgt: Target) -> float:
    """The dependent-instruction penalty of a compute engine (0 on TensorE and DMA)."""
    if eng in (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD):
        return tgt.dependent_vector_penalty_cycles / clock_ghz(eng, tgt)
    return 0.0
