"""What each instruction costs: ONE table, ``COSTS: Op -> function(instr, engine, target) -> Cost``.

Every constant comes from the ``Target`` (targets.py, sources in hardware.md); the formulas are
the "Instruction costs" table of hardware.md (``sdk@2.26`` "Estimated instruction cost" notes).
Cycles are on the issuing engine's clock; ``Cost`` holds nanoseconds.

Timing model of a compute instruction (TensorE, VectorE, ScalarE, GpSimdE)
- ``busy_ns`` = cycles / clock: the queue can issue its next instruction after it (throughput).
- ``latency_ns`` = ``access_overhead_cycles`` (~60) / clock: the fixed tensor-access overhead is
  modelled as pipeline latency; the instruction completes (and signals its semaphores)
  ``busy + latency`` after it starts, but it does not occupy the engine.
- A Vector/Scalar/GpSimd instruction that reads bytes written by the previous instruction of
  the same queue (bounding boxes of the same buffer) costs ``dependent_vector_penalty_cycles``
  (~100) more busy cycles ("dependent or tiny Vector instructions add ~100 cycles"; applied to
  all three engines, since the ScalarE chain measurement shows the same effect).
- ``work_ns`` is the pure streaming time (no MIN_II floor, overhead or penalty): the element
  work used by the roofline.

Rules applied (N = free elements per partition of the streamed source, of dst for memset/iota;
MIN_II = ``min_ii_cycles``; every Vector/Scalar/GpSimd cost is floored at MIN_II; "2-byte" means
every operand is a 2-byte float type)
- matmul: ``max(min(64, M), N)`` with M = stationary free size, N = moving free size (the
  back-to-back average, LoadStationary included; 64 = ``mm_init_latency_cycles``, NC-v2's
  documented figure, ASSUMED on NC-v3/v4, targets.py); x ``fp32_matmul_slowdown`` (4) for fp32
  operands; fp8 costs as bf16 when K <= 128 (a K <= 128 instruction streams its N columns in N
  cycles whatever the input type). ``perf_mode=double_row`` (fp8, [P, 2, M] x [P, 2, N], K = 2P
  <= 256): the same ``max(min(64, M), N)`` cycles x ``2 / min(2, fp8_matmul_speedup)``, i.e.
  the bf16 time of the same M and N for twice the K, on trn2 and trn3 (trainium2_arch.rst:
  "the above double FP8 LoadStationary/MultiplyMoving instruction sequence with a 256
  contraction dimension takes the same amount of time as the regular BF16/FP16
  LoadStationary/MultiplyMoving instruction sequence with a 128 contraction dimension"; trn3's
  4x is the MX matmul). ``perf_mode=mx`` (``MatmulMxAttrs``, NC-v4 ``nc_matmul_mx``, K = 4P <= 512):
  ``max(min(64, M), N)`` x ``4 / min(4, fp8_matmul_speedup)``, the bf16 time of the same M and N
  ("An MX matmul ... runs at 4x the throughput compared to a BF16/FP16 matmul", trainium3_arch.rst
  L75; no per-instruction cycle count is published). MXFP4 (x4 dtype ``FP4_E2M1_X4``) costs
  what MXFP8 does: the guide gives one "Quad-MXFP8/MXFP4" rate (trainium3_arch.rst L70-75).
  The trn2/trn3 TensorE power ramp and the exposed LoadStationary after idle are dynamic:
  ``TensorRamp`` below (applied by the simulator); so are the NC-v2 shared ports
  (``SharedPorts``). NC-v4: N up to 4096 fp32 / 8192 bf16 across PSUM banks
  (``Target.matmul_psum_banks``) costs ``max(min(64, M), N)`` like any N; a bf16 destination
  costs what an fp32 one does (no document gives a difference).
- transpose: TensorE ``max(P, min(64, F))`` (x4 for fp32, it is a matmul against identity);
  VectorE ``max(MIN_II, N)``.
- activation: ``max(MIN_II, N / f) + (MIN_II if reduce)``; f = ``scalar_bf16_factor`` when
  2-byte (trn3: 256 bf16 elements/cycle) else 1.
- tensor_scalar, tensor_copy: ``max(MIN_II, N / f)``. On VectorE f = ``vector_fast_copy_factor``
  (trn2/trn3: 4) when 2-byte, all operands in SBUF and contiguous, else half of it (2x: "2x
  otherwise or with PSUM", matching 256 non-bf16 elements/cycle); on ScalarE f as activation;
  on GpSimdE f = 1. A tensor_scalar whose divisor is the tensor (reverse divide) is a
  reciprocal: ``max(MIN_II, 8N)``.
- tensor_tensor: ``N`` if an input is in PSUM; else if 2-byte with both inputs in SBUF:
  ``2N / vector_fast_tt_factor`` on a VectorE that has the fast mode (trn2/trn3), or ``N`` for
  contiguous add/subtract/multiply (trn1 / GpSimdE); else ``2N``. The table's "all-bf16
  contiguous add/mul/sub" rule and the trn2 "2x when both inputs SBUF and all bf16" fast mode
  describe the same path, so it is applied once. divide: ``8N`` (reciprocal rate).
- tensor_tensor_scan: ``max(MIN_II, 2N)``.
- tensor_reduce: ``N/2`` for 2-byte in and out with add or max, else ``N``.
- memset: ``N/2`` for value 0 into a 2-byte type, else ``N``. iota: ``150 + N`` (no floor).
- select: ``2N`` (three streamed inputs, like tensor_tensor). bn_stats ``N``; bn_aggr ``13N/3``.
- Strided streaming: when any operand's innermost stride exceeds 16 bytes (and that axis has
  more than one element) the streamed element count doubles ("larger strides halve it").
- max8, nc_find_index8: ``N`` (sdk@2.26 "Estimated instruction cost"; N = elements per
  partition of the data), floored at MIN_II like every VectorE instruction. nc_match_replace8:
  ``max(MIN_II, N)`` (the sdk@2.26 note prints ``min(MIN_II, N)``, which would cap a 16K-element
  search at 64 cycles; read as the max, like every other note's floor).
- rand_philox (GpSimdE): ``philox_cycles_per_element * N`` (ASSUMED, targets.py).
- quantize_mx (VectorE, NC-v4): ``max(MIN_II, N / 4)`` ("four input elements per partition, per
  cycle", trainium3_arch.rst L172).
- exponential (VectorE, NC-v4; ``c_exponential``): "4x the throughput compared to the
  nisa.activation (op=nl.exp) instruction on the Scalar Engine" (trainium3_arch.rst L179) read
  as: the streaming time of ``activation(exp)`` on the same operands on this target's ScalarE
  (``N / f`` ScalarE cycles, f as activation), divided by ``vector_exp_speedup`` (4), in VectorE
  cycles; no faster than VectorE's datapath, ``N / w`` with w = 4 elements per lane per cycle
  when src and dst are 2-byte floats, else 2 (trainium3_arch.rst L52: "512 BF16/FP16/FP8
  input/output; 256 input/output for other data types"; w = ``vector_fast_copy_factor``, the
  same table's rate, and half of it). Then, like every VectorE instruction: strided operands
  double N, the MIN_II floor, the dependent-instruction penalty; the optional sum costs nothing
  more (the guide shows it as part of the instruction). On trn3 the datapath cap binds: 4x the
  modelled ScalarE exp (256 2-byte / 128 other elements per cycle) would be 1024 / 512 per cycle,
  twice VectorE's documented width, so exponential costs N/4 cycles for 2-byte src and dst and
  N/2 otherwise: 4x ScalarE's one element per lane per cycle for 2-byte types, 2x the modelled
  2-byte ScalarE rate. The same numbers follow if activation runs at one element per lane per
  cycle whatever the dtype (ScalarE's 2x mode is documented for tensor_scalar/tensor_copy,
  trainium3_arch.rst L218); only the fp32 case then falls short of 4x (2x).
- sem: 0.

DMA model (``DmaModel`` keeps the dynamic state; evidence and sources in docs/simulator.md)
- Spread: a DMA instruction is split into one transfer per DMA engine that serves the SBUF
  partitions it touches (``dma_partitions_per_engine`` = 8 partitions per engine, so a
  128-partition tile uses all 16 engines; nki-dma-overview.rst: "each DMA transfer is by default
  parallelized up to 16 DMA engines, depending on the shape"; a [4, 4096] tile uses one engine).
  The SBUF side is the destination when it is in SBUF, else the source; HBM->HBM copies spread
  over every engine. The queue index only names the in-order instruction stream.
- Fixed phase: each transfer occupies its *queue* for ``dma_transfer_ns`` (descriptor setup,
  synchronisation, semaphore-to-start: ~1300 ns on NC-v2, nki-dma-bandwidth-guide.rst L39-41;
  the hardware DGE's ~600 ns per instruction on NC-v3, nki-dge.rst L124 and
  trainium2_arch.rst L364; NC-v4 ASSUMED as NC-v3), then its data phase follows. The queue
  issues its next DMA when the fixed phase ends, so the next transfer's fixed phase overlaps the
  previous one's data phase: one queue streams one transfer per max(fixed, data), the shape of
  the DMA overview's efficiency-versus-size figure (hardware-sources.md, "DMA cost per
  transfer"). Transfers of different queues take their fixed phases side by side. On NC-v3 a
  fixed phase of 1300 ns (the guide's figure, no generation given) contradicts the trn2
  tutorial profiles (tests/machine/test_calibration.py,
  ``test_trn2_with_the_nc_v2_fixed_phase_contradicts_the_trn2_tutorial_profiles``).
- Data phase: on each of its engines, the transfer's data starts when its fixed phase is done
  and that engine's previous data phase has ended (an engine runs one data phase at a time, in
  issue order, whatever the queue), and takes ``sum over contiguous chunks of
  max(chunk bytes, dma_min_chunk_bytes) / dma_engine_bytes_per_ns`` for the busiest engine's
  share (bytes x its partitions / all partitions; a chunk is the shorter of the source's and
  destination's innermost contiguous runs; ``dma_min_chunk_bytes`` is ASSUMED, targets.py). No
  efficiency factor: data moves at the documented per-engine rate. DMA transposes run at
  ``dma_transpose_efficiency`` (from HBM) or ``dma_transpose_sbuf_efficiency`` (SBUF->SBUF)
  of that rate instead. Every engine of the transfer is charged the busiest engine's time
  (exact when partitions are multiples of 8).
- HBM: every DMA that reads or writes HBM also passes its HBM bytes (HBM->HBM counts twice)
  through one FIFO fluid server of the core's share of HBM bandwidth
  (``hbm_bytes_per_ns / cores_per_chip``); the data phase ends no earlier than that reservation.
- Completion: at the end of the data phase (the semaphore write is part of the fixed phase's
  figure; nki-dma-overview.rst L153 shows it inside the transfer). So a lone transfer takes
  fixed + data, and one trn2 engine moving 32 KiB shows a 1,425 ns data phase (published:
  1,416 ns, nki-dma-overview.rst L153).
- A queue's DMAs complete (signal their semaphores) in issue order.
- Indirect DMA (``dma_gather`` / ``dma_scatter``): the same engine spread (by the SBUF data
  side's partitions), HBM server and completion as a copy; one descriptor per contiguous run of
  each looked-up row (a contiguous row is one descriptor), each moving at least
  ``dma_min_chunk_bytes`` of engine time like any chunk; descriptor generation (software DGE)
  occupies the queue for ``dma_swdge_ns`` (ASSUMED, targets.py) before the fixed phase.
  ``accumulate`` scatter reads and writes each row (its bytes and descriptors count twice on the
  engines and on HBM). The index read (a few bytes per lookup, SBUF) and GpSimd's time
  generating descriptors are not modelled.
- ``dma_data_ns`` and ``dma_tile_data_ns`` below are the same rules for callers that price a
  transfer before it exists (the compiler's estimators): there is one DMA formula.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .checks import contiguous_run_elems
from .isa import (AP, ActivationAttrs, AluOp, DmaAttrs, EngineKind, Instr, MemsetAttrs, Memory,
                  Op, Queue, TensorReduceAttrs, TensorScalarAttrs, TensorTensorAttrs,
                  indirect_layout, DOUBLE_ROW_PACK, MX_PACK, X4_ELEMENT, MatmulPerfMode, matmul_kmn)
from .targets import Target


class Cost(NamedTuple):
    busy_ns: float      # compute: queue occupancy. DMA: data phase on its DMA engine
    latency_ns: float   # after busy until completion (access overhead; 0 for DMAs)
    work_ns: float      # streaming time for the roofline (compute engines only)
    issue_ns: float = 0.0   # DMA: the fixed phase (and software DGE), occupies the queue
    hbm_ns: float = 0.0     # DMA: time on the core's share of HBM bandwidth
    engine_lo: int = 0      # DMA: the engines [engine_lo, engine_hi) that carry the transfer
    engine_hi: int = 0


def clock_ghz(eng: EngineKind, t: Target) -> float:
    if eng is EngineKind.TENSOR:
        return t.tensor_clock_ghz
    if eng is EngineKind.VECTOR:
        return t.vector_clock_ghz
    if eng is EngineKind.SCALAR:
        return t.scalar_clock_ghz
    return t.gpsimd_clock_ghz


def min_ii_ns(eng: EngineKind, t: Target) -> float:
    """The minimum initiation interval of a Vector/Scalar/GpSimd instruction, in ns."""
    return t.min_ii_cycles / clock_ghz(eng, t)


def static_busy(busy: dict[EngineKind, float], t: Target) -> dict[EngineKind, float]:
    """Per-engine busy time of work that runs side by side, with ``SharedPorts``' rule applied
    statically (NC-v2, ``Target.shared_ports``: VectorE and GpSimdE cannot touch SBUF at the
    same time, so each waits while the other runs: both take their sum). For estimators that
    price a body before it is simulated."""
    out = dict(busy)
    if t.shared_ports and (EngineKind.VECTOR in out or EngineKind.GPSIMD in out):
        both = out.get(EngineKind.VECTOR, 0.0) + out.get(EngineKind.GPSIMD, 0.0)
        out[EngineKind.VECTOR] = out[EngineKind.GPSIMD] = both
    return out


def _two_byte(aps: tuple[AP, ...]) -> bool:
    return all(a.dtype.itemsize == 2 and a.dtype.is_float for a in aps)


def _contiguous(a: AP) -> bool:
    for st, sz in reversed(a.dims):
        if sz > 1:
            return st == 1
    return True


def _stride_factor(aps: tuple[AP, ...]) -> float:
    for a in aps:
        for st, sz in reversed(a.dims):
            if sz > 1:
                if abs(st) * a.dtype.itemsize > 16:
                    return 2.0
                break
    return 1.0


def _compute(cycles: float, stream: float, eng: EngineKind, t: Target) -> Cost:
    clk = clock_ghz(eng, t)
    return Cost(cycles / clk, t.access_overhead_cycles / clk, stream / clk)


def _aps(ins: Instr) -> tuple[AP, ...]:
    return ins.writes + ins.srcs


# ---- one function per op --------------------------------------------------------------------

def c_matmul(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    st = ins.srcs[0]
    _, m, n = matmul_kmn(ins)
    c = max(min(t.mm_init_latency_cycles, m), n)
    if st.dtype.itemsize >= 4 and st.dtype not in X4_ELEMENT:
        c *= t.fp32_matmul_slowdown
    mode = ins.attrs.perf_mode  # type: ignore[union-attr]
    if mode is not MatmulPerfMode.NONE:
        # DOUBLE_ROW_PACK (MX: MX_PACK) K rows per PE row at the target's fp8 rate (checks refuse
        # targets without the mode): the bf16 time of the same M and N
        pack = DOUBLE_ROW_PACK if mode is MatmulPerfMode.DOUBLE_ROW else MX_PACK
        c = c * pack / min(pack, t.fp8_matmul_speedup)
    return _compute(c, 0.0, eng, t)


def c_transpose(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    s = ins.srcs[0]
    if eng is EngineKind.TENSOR:
        c = max(s.partitions, min(t.mm_init_latency_cycles, s.free_size))
        if s.dtype.itemsize >= 4:
            c *= t.fp32_matmul_slowdown
        return _compute(c, 0.0, eng, t)
    n = s.free_size
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_activation(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    a = ins.attrs
    assert isinstance(a, ActivationAttrs)
    aps = (ins.srcs[0],) + ins.writes[:1]
    f = t.scalar_bf16_factor if _two_byte(aps) else 1
    n = ins.srcs[0].free_size * _stride_factor(aps) / f
    c = max(t.min_ii_cycles, n) + (t.min_ii_cycles if a.reduce is not None else 0)
    return _compute(c, n, eng, t)


def _copy_factor(ins: Instr, eng: EngineKind, t: Target) -> float:
    aps = (ins.srcs[0],) + ins.writes
    if eng is EngineKind.VECTOR and t.vector_fast_copy_factor > 1:
        if _two_byte(aps) and all(a.memory is Memory.SBUF and _contiguous(a) for a in _aps(ins)):
            return t.vector_fast_copy_factor
        return max(1, t.vector_fast_copy_factor // 2)
    if eng is EngineKind.SCALAR and _two_byte(aps):
        return t.scalar_bf16_factor
    return 1


def c_tensor_scalar(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    a = ins.attrs
    assert isinstance(a, TensorScalarAttrs)
    n = ins.srcs[0].free_size * _stride_factor(_aps(ins))
    recip = eng is not EngineKind.SCALAR and (
        (a.op0 is AluOp.DIVIDE and a.reverse0) or (a.op1 is AluOp.DIVIDE and a.reverse1))
    if recip:
        return _compute(max(t.min_ii_cycles, 8 * n), 8 * n, eng, t)
    n /= _copy_factor(ins, eng, t)
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_tensor_copy(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    n = ins.srcs[0].free_size * _stride_factor(_aps(ins)) / _copy_factor(ins, eng, t)
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_tensor_tensor(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    a = ins.attrs
    assert isinstance(a, TensorTensorAttrs)
    n = ins.srcs[0].free_size * _stride_factor(_aps(ins))
    srcs = ins.srcs
    if a.op is AluOp.DIVIDE:
        c = 8 * n
    elif any(s.memory is Memory.PSUM for s in srcs):
        c = n
    elif _two_byte(_aps(ins)) and all(s.memory is Memory.SBUF for s in srcs):
        if eng is EngineKind.VECTOR and t.vector_fast_tt_factor > 1:
            c = 2 * n / t.vector_fast_tt_factor
        elif a.op in (AluOp.ADD, AluOp.SUBTRACT, AluOp.MULTIPLY) and all(_contiguous(x) for x in _aps(ins)):
            c = n
        else:
            c = 2 * n
    else:
        c = 2 * n
    return _compute(max(t.min_ii_cycles, c), c, eng, t)


def c_tensor_tensor_scan(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    c = 2 * ins.srcs[0].free_size * _stride_factor(_aps(ins))
    return _compute(max(t.min_ii_cycles, c), c, eng, t)


def c_tensor_reduce(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    a = ins.attrs
    assert isinstance(a, TensorReduceAttrs)
    n = ins.srcs[0].free_size * _stride_factor(ins.srcs)
    if _two_byte(_aps(ins)) and a.op in (AluOp.ADD, AluOp.MAX):
        n /= 2
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_memset(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    a = ins.attrs
    assert isinstance(a, MemsetAttrs) and ins.dst is not None
    n = float(ins.dst.free_size)
    if a.value == 0 and _two_byte((ins.dst,)):
        n /= 2
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_iota(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    assert ins.dst is not None
    n = ins.dst.free_size
    return _compute(150 + n, n, eng, t)


def c_select(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    n = 2 * ins.srcs[0].free_size * _stride_factor(_aps(ins))
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_bn_stats(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    n = ins.srcs[0].free_size * _stride_factor(ins.srcs)
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_bn_aggr(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    n = 13 * ins.srcs[0].free_size / 3
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_select8(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    """max8 / nc_find_index8 / nc_match_replace8: one pass over the data (srcs[0])."""
    n = ins.srcs[0].free_size * _stride_factor(ins.srcs[:1])
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_rand_philox(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    assert ins.dst is not None
    n = ins.dst.free_size * t.philox_cycles_per_element
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_exponential(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    """nki.isa.exponential on VectorE (module docstring, "exponential")."""
    assert ins.dst is not None
    aps = (ins.srcs[0], ins.dst)
    two = _two_byte(aps)
    n = ins.srcs[0].free_size * _stride_factor(aps)
    act_ns = n / (t.scalar_bf16_factor if two else 1) / t.scalar_clock_ghz   # ScalarE activation(exp)
    doc = act_ns / max(t.vector_exp_speedup, 1) * t.vector_clock_ghz         # 4x its throughput
    width = t.vector_fast_copy_factor if two else max(1, t.vector_fast_copy_factor // 2)
    c = max(doc, n / width)
    return _compute(max(t.min_ii_cycles, c), c, eng, t)


def c_quantize_mx(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    """quantize_mx: "four input elements per partition, per cycle (i.e., 4x Vector performance
    mode)" (trainium3_arch.rst L172): N / 4 cycles, N = source elements per partition."""
    n = ins.srcs[0].free_size * _stride_factor(_aps(ins)) / MX_PACK
    return _compute(max(t.min_ii_cycles, n), n, eng, t)


def c_sem(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    return Cost(0.0, 0.0, 0.0)


def dma_data_ns(engine_bytes: float, run_bytes: float, t: Target) -> float:
    """Data phase of ``engine_bytes`` on one DMA engine moved in contiguous chunks of
    ``run_bytes``: each chunk moves at least ``dma_min_chunk_bytes`` (module docstring)."""
    per = max(run_bytes, 1.0)
    return engine_bytes * max(per, t.dma_min_chunk_bytes) / per / t.dma_engine_bytes_per_ns


def dma_tile_data_ns(partitions: int, bytes_per_partition: float, run_bytes: float,
                     t: Target) -> float:
    """Data phase of one transfer of ``partitions`` x ``bytes_per_partition`` (SBUF side from
    partition 0) in runs of ``run_bytes``: its busiest engine's share, and no faster than the
    core's share of HBM."""
    if bytes_per_partition <= 0:
        return 0.0
    eb = min(partitions, t.dma_partitions_per_engine) * bytes_per_partition
    return max(dma_data_ns(eb, run_bytes, t),
               partitions * bytes_per_partition / t.hbm_bytes_per_ns_per_core)


def _engines(side: AP | None, t: Target) -> tuple[int, int, float]:
    """(first engine, end engine, the busiest engine's share of the bytes) of a transfer whose
    SBUF side is ``side`` (None: HBM->HBM, every engine an equal share)."""
    if side is None:
        return 0, t.dma_engines, 1.0 / t.dma_engines
    ppe = t.dma_partitions_per_engine
    p0, p1 = side.partition_start, side.partition_start + side.partitions
    lo, hi = p0 // ppe, min(t.dma_engines, (p1 - 1) // ppe + 1)
    most = max(min(p1, (e + 1) * ppe) - max(p0, e * ppe) for e in range(lo, hi))
    return lo, hi, most / side.partitions


def c_dma(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    s, d = ins.srcs[0], ins.dst
    assert d is not None and isinstance(ins.attrs, DmaAttrs)
    nbytes = s.bytes
    side = d if d.memory is Memory.SBUF else s if s.memory is Memory.SBUF else None
    lo, hi, share = _engines(side, t)
    eb = nbytes * share
    if ins.attrs.transpose:
        eff = t.dma_transpose_efficiency if s.memory is Memory.HBM else t.dma_transpose_sbuf_efficiency
        data = eb / (t.dma_engine_bytes_per_ns * max(eff, 1e-9))
    else:
        run = min(contiguous_run_elems(s.dims) * s.dtype.itemsize,
                  contiguous_run_elems(d.dims) * d.dtype.itemsize)
        data = dma_data_ns(eb, run, t)
    hbm = nbytes * ((s.memory is Memory.HBM) + (d.memory is Memory.HBM))
    return Cost(data, 0.0, 0.0, t.dma_transfer_ns, hbm / t.hbm_bytes_per_ns_per_core, lo, hi)


def indirect_bytes(ins: Instr) -> tuple[int, int, int]:
    """(bytes moved, descriptors, HBM bytes) of an indirect DMA (see the module docstring)."""
    scatter = ins.op is Op.DMA_SCATTER
    table = ins.dst if scatter else ins.srcs[0]
    index = ins.srcs[1]
    assert table is not None
    row = indirect_layout(table, index)[2]
    lookups = index.num_elements
    row_elems = 1
    for _, sz in row:
        row_elems *= sz
    runs = row_elems // max(1, contiguous_run_elems(row))
    nbytes = lookups * row_elems * table.dtype.itemsize
    rmw = 2 if scatter and ins.attrs.accumulate else 1  # type: ignore[union-attr]
    return nbytes * rmw, lookups * runs * rmw, nbytes * rmw


def c_dma_indirect(ins: Instr, eng: EngineKind, t: Target) -> Cost:
    side = ins.srcs[0] if ins.op is Op.DMA_SCATTER else ins.dst
    assert side is not None
    nbytes, desc, hbm = indirect_bytes(ins)
    lo, hi, share = _engines(side, t)
    data = dma_data_ns(nbytes * share, nbytes / max(desc, 1), t)
    return Cost(data, 0.0, 0.0, t.dma_swdge_ns + t.dma_transfer_ns, hbm / t.hbm_bytes_per_ns_per_core,
                lo, hi)


COSTS: dict[Op, Callable[[Instr, EngineKind, Target], Cost]] = {
    Op.DMA_COPY: c_dma, Op.MATMUL: c_matmul, Op.TRANSPOSE: c_transpose,
    Op.ACTIVATION: c_activation, Op.TENSOR_TENSOR: c_tensor_tensor,
    Op.TENSOR_TENSOR_SCAN: c_tensor_tensor_scan,
    Op.TENSOR_SCALAR: c_tensor_scalar, Op.TENSOR_REDUCE: c_tensor_reduce,
    Op.TENSOR_COPY: c_tensor_copy, Op.MEMSET: c_memset, Op.IOTA: c_iota, Op.SELECT: c_select,
    Op.BN_STATS: c_bn_stats, Op.BN_AGGR: c_bn_aggr, Op.DMA_GATHER: c_dma_indirect,
    Op.DMA_SCATTER: c_dma_indirect, Op.MAX8: c_select8, Op.FIND_INDEX8: c_select8,
    Op.MATCH_REPLACE8: c_select8, Op.RAND_PHILOX: c_rand_philox, Op.EXPONENTIAL: c_exponential,
    Op.QUANTIZE_MX: c_quantize_mx, Op.SEM: c_sem,
}
assert set(COSTS) == set(Op), "every op needs a cost function"


def depends_on_previous(ins: Instr, prev: Instr | None) -> bool:
    """Does ``ins`` read bytes (bounding boxes, same buffer) that ``prev`` wrote?"""
    if prev is None or prev.dst is None:
        return False
    pb = prev.dst.buffer
    pa = prev.accum.buffer if prev.accum is not None else None
    for r in ins.srcs:
        if r.buffer == pb or r.buffer == pa:
            break
    else:
        return False
    for w in prev.writes:
        for r in ins.srcs:
            if r.buffer == w.buffer and r.partition_start < w.partition_start + w.partitions \
                    and w.partition_start < r.partition_start + r.partitions:
                rl, rh = r.byte_extent()
                wl, wh = w.byte_extent()
                if rl < wh and wl < rh:
                    return True
    return False


def instr_cost(ins: Instr, queue: Queue, t: Target, prev: Instr | None = None) -> Cost:
    """The cost of ``ins`` on ``queue``, including the dependent-instruction penalty."""
    eng = queue.engine
    c = COSTS[ins.op](ins, eng, t)
    if eng in (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD) and ins.op is not Op.SEM \
            and depends_on_previous(ins, prev):
        c = c._replace(busy_ns=c.busy_ns + t.dependent_vector_penalty_cycles / clock_ghz(eng, t))
    return c


class DmaModel:
    """Dynamic DMA state: per-engine end of the last data phase and the HBM fluid server's
    backlog (module docstring, "DMA model"); the queue's fixed phase is ``Cost.issue_ns``.

    ``free`` holds the engines' free times; while every engine has the same free time ``uni`` is
    True and only ``free_all`` is meaningful (the common case of 128-partition transfers on all
    engines costs O(1) then)."""

    def __init__(self, t: Target) -> None:
        self.n = t.dma_engines
        self.free = [0.0] * t.dma_engines
        self.uni = True
        self.free_all = 0.0
        self.hbm_free = 0.0

    def engine_free(self) -> list[float]:
        return [self.free_all] * self.n if self.uni else list(self.free)

    def issue(self, start: float, c: Cost) -> tuple[float, float, float, float]:
        """Issue a DMA at ``start``; return (queue free again, data start, data end,
        completion)."""
        busy, latency, _, issue_ns, hbm_ns, lo, hi = c
        ready = start + issue_ns
        if lo == 0 and hi == self.n:
            if self.uni:
                f = self.free_all
                d0 = ready if ready > f else f
                d1 = d0 + busy
                self.free_all = d1
            else:
                fr = self.free
                f = max(fr)
                if ready >= f:
                    d0 = ready
                    d1 = ready + busy
                    self.uni = True
                    self.free_all = d1
                else:
                    d0 = min(fr)
                    if d0 < ready:
                        d0 = ready
                    d1 = f + busy
                    self.free = [(x if x > ready else ready) + busy for x in fr]
        else:
            if self.uni:
                self.free = [self.free_all] * self.n
                self.uni = False
            fr = self.free
            d0 = d1 = None
            for e in range(lo, hi):
                x = fr[e]
                s0 = x if x > ready else ready
                e1 = s0 + busy
                fr[e] = e1
                if d0 is None or s0 < d0:
                    d0 = s0
                if d1 is None or e1 > d1:
                    d1 = e1
            assert d0 is not None and d1 is not None
        if hbm_ns:
            h = self.hbm_free
            h = (d0 if d0 > h else h) + hbm_ns
            self.hbm_free = h
            if h > d1:
                d1 = h
        return ready, d0, d1, d1 + latency


class TensorRamp:
    """TensorE power ramp (trn2/trn3, ``Target.pe_ramp_*``): the engine runs at ``speed = s0 +
    (1 - s0) * w`` of its nominal rate, ``w`` in [0, 1]. ``w`` grows by busy time / ``pe_ramp_ns``
    (full speed after ~3 us of work from cold). ``u`` is the engine's utilisation, a moving average
    of busy (1) / idle (0) with time constant ``pe_ramp_window_ns``; when an instruction starts
    with ``u`` below ``pe_ramp_min_utilisation`` the engine has fallen back: ``w = 0``. It starts
    cold (``w = 0``) with ``u = 1``, so the first ~3 us ramp is not delayed; an idle window of
    ``ln 2`` x 3 us (~2.1 us) drops ``u`` below 50%. An instruction keeps the speed it starts with.
    Also applies the exposed LoadStationary time (``ls``) when the engine was idle before a matmul
    with a new stationary (at the start the engine is idle)."""

    def __init__(self, t: Target, ls: list[float] | None) -> None:
        self.s0 = t.pe_ramp_start_speed
        self.ramp = t.pe_ramp_ns
        self.win = t.pe_ramp_window_ns
        self.umin = t.pe_ramp_min_utilisation
        self.on = self.s0 < 1.0
        self.ls = ls
        self.u = 1.0
        self.w = 0.0
        self.end = -1.0
        self.extra = 0.0     # busy time added over the static costs

    def step(self, t: float, i: int, busy: float) -> tuple[float, float]:
        b, u, w = self._start(t, i, busy, self.end)
        self._progress(b, u, w)
        self.end = t + b
        self.extra += b - busy
        return t, b

    def _start(self, t: float, i: int, busy: float, end: float) -> tuple[float, float, float]:
        """An instruction starting at ``t`` after busy time ending at ``end``: its busy time
        (exposed LoadStationary added, at the ramp's speed) and the ramp state (u, w) then."""
        gap = t - end
        b = busy
        if gap > 0 and self.ls is not None:
            b += self.ls[i]
        u, w = self.u, self.w
        if self.on:
            if gap > 0:
                u *= math.exp(-gap / self.win)
            if u < self.umin:
                w = 0.0
            if w < 1.0:
                b /= self.s0 + (1.0 - self.s0) * w
        return b, u, w

    def _progress(self, new: float, u: float, w: float) -> None:
        """The ramp after ``new`` ns of busy time from state (u, w)."""
        if self.on:
            if w < 1.0:
                w += new / self.ramp
                self.w = 1.0 if w > 1.0 else w
            self.u = 1.0 - (1.0 - u) * math.exp(-new / self.win)


class TensorLanes(TensorRamp):
    """NC-v4 background transpose (``Target.background_transpose``; trainium3_arch.rst L145-150:
    "a new background transpose functionality, which allows it to run a transpose operation in
    parallel to another matrix multiplication (or another transpose). It allows us to achieve
    close to double performance on long chains of transposes, or to overlap a larger matrix
    multiplication with transpose operations in the background"; "The decision to trigger
    background transpose is made automatically by the hardware"). Used for a TensorE queue that
    has transposes on such a target; otherwise ``TensorRamp`` runs alone, unchanged.

    TensorE gets two lanes: the foreground runs every instruction, the background only a
    TensorE transpose (``tr[i]``). Instructions still issue in order: each starts no earlier
    than the one before it. A transpose takes the lane that is free first (the foreground on a
    tie); anything else waits for the foreground. So a chain of transposes runs two at a time
    (the "close to double"), and transposes that follow a long matmul run beside it. ASSUMED
    where the guide is silent: a matmul never runs in the background (a transpose issued
    before it keeps the foreground; the guide only puts transposes there), at most one
    background transpose at a time, no condition on the operands, and completion stays in
    program order (the simulator holds an instruction's completion, and its semaphores, until
    the one before it has completed: a queue's n-th signal still means its first n
    instructions are done, which the race detector and programs rely on).

    The power ramp and exposed LoadStationary are ``TensorRamp``'s, except that busy time is
    counted once where the lanes overlap: the ramp's progress, its utilisation average and
    ``extra`` (and so TensorE's busy time) use the union of the lanes' busy intervals.
    ``free`` is the earliest start of the next instruction; ``in_bg`` says whether the last one
    ran in the background lane (its trace track is ``pe.bg``)."""

    def __init__(self, t: Target, ls: list[float] | None, tr: list[bool] | None) -> None:
        super().__init__(t, ls)
        self.tr = tr
        self.fg = 0.0          # end of the foreground lane's last instruction
        self.bg = 0.0          # end of the background lane's last instruction
        self.free = 0.0
        self.in_bg = False

    def step(self, t: float, i: int, busy: float) -> tuple[float, float]:
        bg = self.tr is not None and self.tr[i] and self.fg > t and self.bg < self.fg
        lane_end = self.bg if bg else self.fg
        if lane_end > t:
            t = lane_end
        covered = self.end     # end of the union of both lanes' busy intervals so far
        b, u, w = self._start(t, i, busy, covered)
        end = t + b
        inc = end - (t if t > covered else covered)     # busy time not already covered
        if inc < 0.0:
            inc = 0.0
        self._progress(inc, u, w)
        if end > covered:
            self.end = end
        self.extra += inc - busy
        if bg:
            self.bg = end
        else:
            self.fg = end
        nxt = self.fg if self.fg < self.bg else self.bg
        self.free = nxt if nxt > t else t
        self.in_bg = bg
        return t, b


class SharedPorts:
    """NC-v2 shared SBUF/PSUM ports (``Target.shared_ports``): an instruction whose port mask
    (``sim_static.PORT_SBUF``: VectorE/GpSimdE touching SBUF; ``PORT_PSUM``: VectorE/ScalarE
    touching PSUM) names a port held by the *other* engine of that pair waits until it is released;
    it then holds the port for its busy time. Arbitration is in order of readiness."""

    def __init__(self) -> None:
        self.owner = [None, None, None]
        self.until = [0.0, 0.0, 0.0]

    def step(self, eng: object, t: float, mask: int, busy: float) -> float:
        owner, until = self.owner, self.until
        for p in (1, 2):
            if mask & p and owner[p] is not eng and until[p] > t:
                t = until[p]
        end = t + busy
        for p in (1, 2):
            if mask & p:
                if owner[p] is not eng:
                    owner[p] = eng
                    until[p] = end
                elif end > until[p]:
                    until[p] = end
        return t


def host_transfer_ns(nbytes: int, t: Target, transfers: int = 1) -> float:
    """Host <-> device HBM copy time: ``transfers`` DMA transfers over the host link, each
    paying one transfer's fixed phase (``dma_transfer_ns``), the bytes at
    ``host_link_bytes_per_ns`` (an assumption, see targets.py: hardware.md gives no host-link
    figure)."""
    if nbytes <= 0:
        return 0.0
    return transfers * t.dma_transfer_ns + nbytes / t.host_link_bytes_per_ns
