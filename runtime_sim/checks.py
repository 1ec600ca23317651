"""Machine errors and the static checks of a program.

Every error the machine raises is a :class:`MachineError`; its subclasses name the rule that was
broken. When the error is about an instruction it names the instruction as ``<queue> #<index>:
<instruction text>``, then the rule and the actual values, e.g.::

    dve #12: tensor_tensor(op=add) sbuf:x[p32:+48 ...] <- ...
      partition alignment: Pattern accesses 48 (> 32) partitions starting at partition 32

Static rules (checked once per program, before it runs, by ``checks_program.check_program``;
``simulate(checks=False)`` skips them; a looped stream is checked per static instruction, see
checks_loops.py)
- Buffers: unique names; SBUF/PSUM buffers have ``1 <= partitions <= 128``, an ``offset`` that is
  set and non-negative, and ``offset + bytes_per_partition`` within the partition size
  (CapacityError). Buffers may overlap in address space (the planner reuses memory over time);
  races between aliasing buffers are found at run time by physical address.
- Access patterns (AccessPatternError / BoundsError / AlignmentError):
  * SBUF/PSUM: at most 4 free dims, sizes in [1, 65535] (uint16), strides in int16
    [-32768, 32767] elements; partitions within the buffer; partition start aligned: > 64
    partitions start at 0, 33-64 start at 0 or 64, <= 32 start at 0/32/64/96 (hardware.md).
  * HBM: one partition, at most 5 free dims (the HBM side of a DMA has no partition axis, so it
    gets one more free dim), any positive size and any stride (DMA descriptors carry 64-bit
    addresses).
  * The bytes touched lie within the buffer. A written AP never names one element twice.
- Engines (EngineError): an op runs only on an engine that has its datapath
  (``isa.ENGINES_OF_OP``); DMA queue indices are below ``dma_engines * dma_queues_per_engine``;
  compute engines touch only SBUF/PSUM; DMA and GpSimdE never touch PSUM ("GpSimd Engine
  cannot access PSUM", nki/api/nki/isa/__init__.py L399, L1038, L1914). PSUM is written by
  TensorE (matmul, transpose) and may also be written by Vector/Scalar instructions (memset,
  tensor_copy, ...), but a matmul may only accumulate onto bytes a matmul wrote (run-time check).
- Operands (OperandError): operand counts and shapes per op, matmul limits (K <= 128 partitions,
  M <= 128, N <= 512 and one fp32 PSUM bank, stationary and moving of one float dtype in SBUF,
  destination fp32 in PSUM; on a target with ``psum_bf16`` (NC-v4) the destination may be bf16;
  on a target with ``matmul_psum_banks`` > 1 (NC-v4) N <= that many banks of the destination
  dtype (4096 fp32 / 8192 bf16) and a destination larger than a bank, or crossing a bank
  boundary, starts at a bank boundary and spans consecutive banks (ASSUMED: the documents give
  only the size, "matching the size of 8x PSUM banks", nc_matmul L612-615);
  ``perf_mode=double_row``: fp8 operands [P <= 128, 2, M] and
  [P, 2, N], a target whose ``fp8_matmul_speedup`` >= 2), TensorE transpose <= 128 x 128 into PSUM, VectorE transpose <= 32 x
  32, DMA sides of one dtype (DMA does not cast) and equal element counts, DMA transpose only on
  2-byte types and only where the target has it, Vector/Scalar/GpSimd free size <= 65536
  elements (<= 4096 when the operand is in PSUM), bn_stats free size <= 512; max8 and
  nc_find_index8 read 8 to 16384 data elements per partition, nc_match_replace8 at most 16384,
  their vals (and max8's / find_index8's destination) are [P, 8], find_index8 writes int32,
  match_replace8's destination has the data's shape. The NeuronCore-v4 instructions' rules
  (exponential, the MX matmul, quantize_mx; EngineError on a target without them) are in
  checks_nc4.py.
- Indirect DMA (OperandError; layout in isa.py): the index is an int32/int64 SBUF AP; the table
  an HBM AP of at least 1 + len(index.dims) + 1 dims whose lock-step sizes equal the index AP's
  shape and with at most 2 row dims; the data an SBUF AP of the table's dtype (no cast) with the
  index's partitions and ``lookups per partition x row`` free elements. Scatter: rows are
  injective (the table AP itself names an element once per lookup, by design, so it is exempt
  from the written-AP rule); accumulate only onto a float table (the DMA adds in fp32).
  The indexed dim's size is the bound; out-of-range lookup values are a run-time BoundsError
  (functional mode: values are only known then) naming the value, the lookup and the bound.

- PSUM accumulation groups (PsumAccumulateError, ``PsumGroups``): in TensorE program order, one
  open matmul accumulation group per PSUM bank; an accumulating matmul must land inside its
  bank's open group (a destination spanning several banks, NC-v4: in each bank's, piece by
  piece).

Run-time rules (raised by the simulator): UninitializedReadError (functional mode),
PsumAccumulateError (functional mode: accumulating onto bytes last written by a non-matmul),
RaceError, DeadlockError, InputError.
"""
from __future__ import annotations

from typing import NamedTuple

from .isa import (ATTRS_OF_OP, AP, ENGINES_OF_OP, ActivationAttrs, AluOp, BnAggrNkiAttrs, BnStatsNkiAttrs,
                  Buffer, DmaAttrs,
                  DmaScatterAttrs, DType, EngineKind, Instr, IotaAttrs, Memory, Op, Program, Queue,
                  TensorReduceAttrs, TensorScalarAttrs, TensorTensorScanAttrs, indirect_layout,
                  DOUBLE_ROW_PACK, FP8_DTYPES, X4_ELEMENT, MatmulAttrs, MatmulMxAttrs, MatmulPerfMode,
                  matmul_kmn)
from .checks_common import check_col, check_nsrcs, check_same_pf
from .checks_nc4 import NC4_RULES, r_mx
from .targets import Target


from .errors import (ERRORS, AccessPatternError, AlignmentError, BoundsError, CapacityError,  # noqa: F401
                     DeadlockError, EngineError, InputError, MachineError, OperandError, ProgramError,
                     PsumAccumulateError, RaceError, UninitializedReadError)


# ---- geometry of an access pattern ----------------------------------------------------------

class APGeom(NamedTuple):
    """Where an AP lands physically. ``space`` is ``Memory.SBUF``, ``Memory.PSUM`` or
    ``("hbm", name)``; ``lo``/``hi`` is the absolute per-partition byte range (bounding box);
    ``dense`` says every byte of that box is touched (so the box is exact); ``base`` is the
    absolute byte address of element 0; ``key`` identifies the exact pattern."""

    space: object
    p0: int
    p1: int
    lo: int
    hi: int
    dense: bool
    base: int
    dims: tuple[tuple[int, int], ...]
    itemsize: int
    key: tuple


def ap_geom(ap: AP, buf: Buffer) -> APGeom:
    off = 0 if buf.memory is Memory.HBM else (buf.offset or 0)
    lo, hi = ap.byte_extent()
    isz = ap.dtype.itemsize
    space: object = ("hbm", buf.name) if buf.memory is Memory.HBM else buf.memory
    base = off + ap.byte_offset
    return APGeom(space, ap.partition_start, ap.partition_start + ap.partitions, off + lo, off + hi,
                  _is_dense(ap.dims, isz, hi - lo), base, ap.dims, isz,
                  (space, ap.partition_start, ap.partitions, base, ap.dims, isz))


def _is_dense(dims: tuple[tuple[int, int], ...], isz: int, span: int) -> bool:
    n = 1
    for _, s in dims:
        n *= s
    return n * isz == span and is_injective(dims)


def is_injective(dims: tuple[tuple[int, int], ...]) -> bool:
    """True when no two index tuples address the same element (sufficient test: with the axes
    sorted by |stride|, each stride exceeds the reach of all smaller ones; falls back to
    enumeration for small patterns)."""
    ds = sorted((abs(st), sz) for st, sz in dims if sz > 1)
    reach = 0
    ok = True
    for st, sz in ds:
        if st <= reach:
            ok = False
            break
        reach += st * (sz - 1)
    if ok:
        return True
    n = 1
    for _, sz in ds:
        n *= sz
    if n > 1 << 20:
        return False
    import numpy as np
    offs = np.zeros(1, dtype=np.int64)
    for st, sz in dims:
        offs = (offs[:, None] + np.arange(sz, dtype=np.int64)[None, :] * st).ravel()
    return len(np.unique(offs)) == len(offs)


def contiguous_run_elems(dims: tuple[tuple[int, int], ...]) -> int:
    """Elements in the innermost contiguous run of a pattern (within one partition)."""
    run = 1
    for st, sz in reversed(dims):
        if sz == 1:
            continue
        if st == run:
            run *= sz
        else:
            break
    return run


# ---- static checks --------------------------------------------------------------------------

def alignment_error(start: int, n: int) -> str | None:
    """Why an SBUF/PSUM access of ``n`` partitions from ``start`` is not aligned (engines
    address partition groups of 32), or None when it is."""
    if n > 64:
        return None if start == 0 else f"Pattern accesses {n} (> 64) partitions starting at partition {start}; must start at 0"
    if n > 32:
        return None if start in (0, 64) else f"Pattern accesses {n} (> 32) partitions starting at partition {start}; must start at 0 or 64"
    return None if start % 32 == 0 else f"Pattern accesses {n} (<= 32) partitions starting at partition {start}; must start at 0, 32, 64 or 96"


def check_buffers(program: Program, target: Target) -> dict[str, Buffer]:
    bufs: dict[str, Buffer] = {}
    for b in program.buffers:
        if b.name in bufs:
            raise ProgramError(f"two buffers are named {b.name!r}")
        bufs[b.name] = b
        if b.bytes_per_partition < 0:
            raise CapacityError(f"buffer {b}: bytes_per_partition must be >= 0, got {b.bytes_per_partition}")
        if b.memory is Memory.HBM:
            if b.partitions != 1:
                raise ProgramError(f"HBM buffer {b}: partitions must be 1, got {b.partitions}")
            continue
        cap = target.sbuf_bytes_per_partition if b.memory is Memory.SBUF else target.psum_bytes_per_partition
        if not 1 <= b.partitions <= target.sbuf_partitions:
            raise CapacityError(f"buffer {b}: partitions must be in [1, {target.sbuf_partitions}], got {b.partitions}")
        if b.offset is None:
            raise CapacityError(f"buffer {b}: offset not assigned (the memory planner must set it)")
        if b.offset < 0:
            raise CapacityError(f"buffer {b}: offset must be >= 0, got {b.offset}")
        if b.offset + b.bytes_per_partition > cap:
            raise CapacityError(f"buffer {b}: offset {b.offset} + {b.bytes_per_partition} B = "
                                f"{b.offset + b.bytes_per_partition} B exceeds the {b.memory.value.upper()} "
                                f"partition size {cap} B on {target.name}")
    for kind, names in (("input", program.inputs), ("output", program.outputs)):
        for n in names:
            if n not in bufs:
                raise ProgramError(f"{kind} {n!r} is not a buffer of the program")
            if bufs[n].memory is not Memory.HBM:
                raise ProgramError(f"{kind} {n!r} must be an HBM buffer, got {bufs[n].memory.value}")
    return bufs


def check_ap(ap: AP, bufs: dict[str, Buffer], role: str) -> APGeom:
    buf = check_ap_layout(ap, bufs, role)
    lo, hi = ap.byte_extent()
    if lo < 0 or hi > buf.bytes_per_partition:
        raise BoundsError(f"{role} {ap}: bytes [{lo}, {hi}) outside buffer {buf.name!r} of "
                          f"{buf.bytes_per_partition} B per partition")
    return ap_geom(ap, buf)


def check_ap_layout(ap: AP, bufs: dict[str, Buffer], role: str) -> Buffer:
    """Every rule of ``check_ap`` except the byte bounds (none reads ``byte_offset``)."""
    buf = bufs.get(ap.buffer)
    if buf is None:
        raise ProgramError(f"{role} {ap}: no buffer named {ap.buffer!r}")
    if ap.memory is not buf.memory:
        raise ProgramError(f"{role} {ap}: AP says {ap.memory.value} but buffer {buf.name!r} is {buf.memory.value}")
    hbm = buf.memory is Memory.HBM
    maxd = 5 if hbm else 4
    if len(ap.dims) > maxd:
        raise AccessPatternError(f"{role} {ap}: at most {maxd} free dims, got {len(ap.dims)}")
    for st, sz in ap.dims:
        if sz < 1 or (not hbm and sz > 65535):
            raise AccessPatternError(f"{role} {ap}: free size must be in [1, {'inf' if hbm else 65535}], got {sz}")
        if not hbm and not -32768 <= st <= 32767:
            raise AccessPatternError(f"{role} {ap}: stride must fit int16 [-32768, 32767] elements, got {st}")
    if hbm:
        if ap.partition_start != 0 or ap.partitions != 1:
            raise AccessPatternError(f"{role} {ap}: HBM APs have one partition starting at 0, got "
                                     f"start {ap.partition_start}, {ap.partitions} partitions")
    else:
        if ap.partitions < 1 or ap.partition_start < 0 or ap.partition_start + ap.partitions > buf.partitions:
            raise BoundsError(f"{role} {ap}: partitions [{ap.partition_start}, {ap.partition_start + ap.partitions}) "
                              f"outside buffer {buf.name!r} with {buf.partitions} partitions")
        msg = alignment_error(ap.partition_start, ap.partitions)
        if msg:
            raise AlignmentError(f"{role} {ap}: {msg}")
    return buf


_REDUCIBLE = frozenset({AluOp.ADD, AluOp.MULTIPLY, AluOp.MAX, AluOp.MIN, AluOp.ABS_MAX,
                        AluOp.LOGICAL_AND, AluOp.LOGICAL_OR, AluOp.LOGICAL_XOR})


def check_instr(ins: Instr, queue: Queue, bufs: dict[str, Buffer], target: Target) -> list[APGeom]:
    """Check one instruction; return the geometry of its operands (dst, accum, srcs order)."""
    check_waits(ins)
    check_instr_shape(ins, queue, target)
    geoms = []
    for role, a in (("dst", ins.dst), ("accum", ins.accum)):
        if a is not None:
            geoms.append(check_ap(a, bufs, role))
    for k, a in enumerate(ins.srcs):
        geoms.append(check_ap(a, bufs, f"src{k}"))
    return geoms


def check_waits(ins: Instr) -> None:
    for s, n in ins.waits:
        if not s or not isinstance(n, int) or n < 1:
            raise ProgramError(f"wait ({s!r}, {n!r}): semaphore name must be non-empty and count >= 1")
    for s in ins.signals:
        if not s or not isinstance(s, str):
            raise ProgramError(f"signal {s!r}: semaphore names are non-empty strings")


def check_instr_shape(ins: Instr, queue: Queue, target: Target) -> None:
    """The rules that depend only on the op, its attributes, the queue and the operands' memory,
    partition count, free dims and dtype (not on offsets): cacheable by that signature."""
    op = ins.op
    if not isinstance(ins.attrs, ATTRS_OF_OP[op]):
        raise ProgramError(f"{op.value} needs {ATTRS_OF_OP[op].__name__}, got {type(ins.attrs).__name__}")
    eng = queue.engine
    if eng not in ENGINES_OF_OP[op]:
        raise EngineError(f"{op.value} cannot run on {queue.name}; engines with the datapath: "
                          f"{sorted(e.value for e in ENGINES_OF_OP[op])}")
    if eng is EngineKind.DMA and not 0 <= queue.index < target.dma_engines * target.dma_queues_per_engine:
        raise EngineError(f"DMA queue index must be in [0, {target.dma_engines * target.dma_queues_per_engine}), got {queue.index}")
    if op is Op.SEM:
        if ins.dst is not None or ins.srcs or ins.accum is not None:
            raise OperandError("sem has no operands")
        return
    if ins.dst is None:
        raise OperandError(f"{op.value} needs a destination AP")
    OPERAND_RULES[op](ins, queue, target)
    if ins.accum is not None and op not in (Op.ACTIVATION, Op.EXPONENTIAL, Op.QUANTIZE_MX):
        raise OperandError(f"only activation, exponential and quantize_mx have an accum destination, "
                           f"got one on {op.value}")
    for a in ins.writes:
        if op is Op.DMA_SCATTER:
            continue                      # the table AP: checked by _r_indirect
        if not is_injective(a.dims):
            raise AccessPatternError(f"written AP {a} addresses some element more than once")
    all_aps = ins.writes + ins.srcs
    if eng is EngineKind.DMA:
        if any(a.memory is Memory.PSUM for a in all_aps):
            raise EngineError("DMA cannot access PSUM (evacuate with tensor_copy first)")
    elif any(a.memory is Memory.HBM for a in all_aps):
        raise EngineError(f"{queue.name} cannot access HBM; only DMA queues can")
    elif eng is EngineKind.GPSIMD and any(a.memory is Memory.PSUM for a in all_aps):
        raise EngineError(f"{op.value} on {queue.name}: GpSimdE cannot access PSUM (run it on "
                          f"VectorE or ScalarE)")
    if eng in (EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD):
        for a in all_aps:
            lim = 4096 if a.memory is Memory.PSUM else 65536
            if a.free_size > lim:
                raise OperandError(f"{queue.name} operand {a}: free size {a.free_size} > {lim} elements "
                                   f"from {a.memory.value.upper()}")


def _r_dma(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 1)
    s, d = ins.srcs[0], ins.dst
    assert d is not None
    if s.dtype is not d.dtype:
        raise OperandError(f"DMA does not cast: src dtype {s.dtype.value} != dst dtype {d.dtype.value} "
                           f"(cast with tensor_copy)")
    if s.num_elements != d.num_elements:
        raise OperandError(f"DMA element counts differ: src {s.num_elements} {s.shape} vs dst {d.num_elements} {d.shape}")
    assert isinstance(ins.attrs, DmaAttrs)
    if ins.attrs.transpose:
        if t.dma_transpose_efficiency <= 0:
            raise EngineError(f"DMA transpose is not available on {t.name}")
        if s.dtype.itemsize != 2:
            raise OperandError(f"DMA transpose handles 2-byte types, got {s.dtype.value}")
        (r, c), (dr, dc) = dma_2d(s), dma_2d(d)
        if (dr, dc) != (c, r):
            raise OperandError(f"DMA transpose: src is {r}x{c}, dst must be {c}x{r}, got {dr}x{dc}")


_INDEX_DTYPES = (DType.INT32, DType.INT64)


def _r_indirect(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 2)
    name = ins.op.value
    scatter = ins.op is Op.DMA_SCATTER
    data, table = (ins.srcs[0], ins.dst) if scatter else (ins.dst, ins.srcs[0])
    index = ins.srcs[1]
    assert data is not None and table is not None
    if index.memory is not Memory.SBUF or index.dtype not in _INDEX_DTYPES:
        raise OperandError(f"{name} index must be int32/int64 in SBUF, got {index.dtype.value} in "
                           f"{index.memory.value} ({index})")
    if table.memory is not Memory.HBM:
        raise OperandError(f"{name} table must be in HBM, got {table.memory.value} ({table})")
    if data.memory is not Memory.SBUF:
        raise OperandError(f"{name} data side must be in SBUF, got {data.memory.value} ({data})")
    if data.dtype is not table.dtype:
        raise OperandError(f"DMA does not cast: {name} data dtype {data.dtype.value} != table dtype "
                           f"{table.dtype.value}")
    if len(table.dims) < len(index.dims) + 2:
        raise OperandError(f"{name} table AP needs {len(index.dims) + 2}+ dims (lock-step x "
                           f"{len(index.dims) + 1}, indexed, rows), got {len(table.dims)} ({table})")
    lock, _, row = indirect_layout(table, index)
    if tuple(sz for _, sz in lock) != index.shape:
        raise OperandError(f"{name} lock-step dims of the table must have the index shape "
                           f"{index.shape}, got {tuple(sz for _, sz in lock)} ({table})")
    if len(row) > 2:
        raise OperandError(f"{name} rows have at most 2 dims, got {len(row)} ({table})")
    row_elems = 1
    for _, sz in row:
        row_elems *= sz
    if data.partitions != index.partitions or data.free_size != index.free_size * row_elems:
        raise OperandError(f"{name} data must be [{index.partitions} partitions x "
                           f"{index.free_size} lookups x {row_elems} row elements], got "
                           f"[{data.partitions} x {data.free_size}] ({data})")
    if scatter:
        if not is_injective(row):
            raise AccessPatternError(f"dma_scatter row dims {row} address some element more than once")
        assert isinstance(ins.attrs, DmaScatterAttrs)
        if ins.attrs.accumulate and not table.dtype.is_float:
            raise OperandError(f"dma_scatter accumulate adds in fp32: the table must be a float "
                               f"type, got {table.dtype.value}")


def dma_2d(a: AP) -> tuple[int, int]:
    """The 2-D view a DMA transpose uses: HBM drops its single partition axis; then (first axis,
    product of the rest)."""
    shape = a.shape[1:] if a.memory is Memory.HBM else a.shape
    if not shape:
        return (1, 1)
    rest = 1
    for x in shape[1:]:
        rest *= x
    return (shape[0], rest)


def _r_matmul(ins: Instr, q: Queue, t: Target) -> None:
    assert isinstance(ins.attrs, MatmulAttrs)
    mx = ins.attrs.perf_mode is MatmulPerfMode.MX
    if mx != isinstance(ins.attrs, MatmulMxAttrs):
        raise OperandError("matmul perf_mode=mx goes with MatmulMxAttrs (its scale offsets), and "
                           f"MatmulMxAttrs with perf_mode=mx; got {type(ins.attrs).__name__} "
                           f"perf_mode={ins.attrs.perf_mode.value}")
    check_nsrcs(ins, 4 if mx else 2)
    st, mv = ins.srcs[:2]
    d = ins.dst
    assert d is not None
    for name, a in (("stationary", st), ("moving", mv)):
        if a.memory is not Memory.SBUF:
            raise OperandError(f"matmul {name} must be in SBUF, got {a.memory.value}")
        if not a.dtype.is_float and not (mx and a.dtype in X4_ELEMENT):
            raise OperandError(f"matmul {name} must be a float type, got {a.dtype.value}")
    if mx:
        r_mx(ins, t)
    elif st.dtype is not mv.dtype:
        raise OperandError(f"matmul stationary and moving must share a dtype, got {st.dtype.value} and {mv.dtype.value}")
    if ins.attrs.perf_mode is MatmulPerfMode.DOUBLE_ROW:
        _r_double_row(st, mv, t)
    k, m, n = matmul_kmn(ins)
    if mv.partitions != st.partitions:
        raise OperandError(f"matmul contraction: stationary has K={st.partitions} partitions, moving has {mv.partitions}")
    if st.partitions > t.pe_rows:
        raise OperandError(f"matmul K={k} on {st.partitions} partitions > {t.pe_rows} partitions")
    if m > t.pe_cols:
        raise OperandError(f"matmul stationary free size M={m} > {t.pe_cols}")
    if d.memory is not Memory.PSUM or d.dtype not in (DType.FP32, DType.BF16):
        raise OperandError(f"matmul destination must be fp32{' or bf16' if t.psum_bf16 else ''} in PSUM, "
                           f"got {d.dtype.value} in {d.memory.value}")
    if d.dtype is DType.BF16 and not t.psum_bf16:
        raise OperandError(
            f"matmul destination bfloat16 in PSUM needs BF16 PSUM results (NeuronCore-v4: "
            f"trainium3_arch.rst L129; nc_matmul: \"The dst tile must be a float32 tile in NeuronCore-v2 "
            f"and NeuronCore-v3\"); target {t.name} is {t.neuron_core}: the destination must be fp32")
    banks = t.matmul_psum_banks
    nmax = t.moving_free_max if banks == 1 else banks * t.psum_bank_bytes // d.dtype.itemsize
    if n > nmax:
        where = "" if banks == 1 else f" ({banks} PSUM banks of {d.dtype.value} on {t.name})"
        raise OperandError(f"matmul moving free size N={n} > {nmax}{where}")
    if d.partitions != m or d.free_size != n:
        raise OperandError(f"matmul destination must be [M={m}, N={n}], got [{d.partitions}, {d.free_size}]")
    _one_bank(d, t, banks)


def _r_double_row(st: AP, mv: AP, t: Target) -> None:
    """perf_mode=double_row (nki.isa.nc_matmul, aws-neuron-sdk@81ce03a nki/api/nki/isa/__init__.py:
    "On NeuronCore-v2, performance mode is not supported"; "stationary and moving tiles must be
    one of float8_e4m3 or float8_e5m2"; "The first free dimension must be 2")."""
    if t.fp8_matmul_speedup < DOUBLE_ROW_PACK:
        raise OperandError(f"matmul perf_mode=double_row needs a target whose fp8 matmul rate is "
                           f">= {DOUBLE_ROW_PACK}x bf16 (NeuronCore-v3+); {t.name} has "
                           f"fp8_matmul_speedup={t.fp8_matmul_speedup}")
    for name, a in (("stationary", st), ("moving", mv)):
        if a.dtype not in FP8_DTYPES:
            raise OperandError(f"matmul perf_mode=double_row takes fp8 operands, {name} is {a.dtype.value}")
        if not a.dims or a.dims[0][1] != DOUBLE_ROW_PACK:
            raise OperandError(f"matmul perf_mode=double_row: {name}'s outermost free axis must have "
                               f"size {DOUBLE_ROW_PACK} (the packed K rows), got dims {a.dims}")


def _one_bank(d: AP, t: Target, banks: int = 1) -> None:
    lo, hi = d.byte_extent()
    bank = t.psum_bank_bytes
    # d.byte_offset is relative to the buffer; banks are absolute: checked again in simulate via geometry
    if hi - lo > bank * banks:
        if banks == 1:
            raise OperandError(f"PSUM destination spans {hi - lo} B per partition > one {bank} B bank")
        raise OperandError(f"PSUM destination spans {hi - lo} B per partition > {banks} banks of {bank} B")


def psum_banks_of(ins: Instr, t: Target) -> int:
    """How many PSUM banks the destination of TensorE instruction ``ins`` may span."""
    return t.matmul_psum_banks if ins.op is Op.MATMUL else 1


def crosses_banks(lo, hi, bank: int, banks: int):
    """Is a destination [lo, hi) (ints or numpy arrays) placed against the bank rule: it crosses
    a bank boundary and may not (one bank), or does without starting at a bank boundary."""
    cross = lo // bank != (hi - 1) // bank
    return cross if banks == 1 else cross & (lo % bank != 0)


def check_psum_bank(g: APGeom, t: Target, what: str, banks: int = 1) -> None:
    bank = t.psum_bank_bytes
    if crosses_banks(g.lo, g.hi, bank, banks):
        if banks == 1:
            raise OperandError(f"{what} destination bytes [{g.lo}, {g.hi}) cross a {bank} B PSUM bank boundary")
        raise OperandError(f"{what} destination bytes [{g.lo}, {g.hi}) cross a {bank} B PSUM bank "
                           f"boundary without starting at one (a destination spanning banks starts "
                           f"at a bank boundary)")


class PsumGroups:
    """Matmul accumulation groups, one open group per PSUM bank, followed in TensorE program
    order ("with 8 PSUM banks per partition, TensorE can have up to eight outstanding matmul
    accumulation groups", trainium_inferentia2_arch.rst). A matmul with ``accumulate=False`` (or a
    TensorE transpose) opens a group on the bytes it writes and closes the bank's previous group;
    ``accumulate=True`` must land inside its bank's open group. Accumulating where no group is
    open (e.g. onto PSUM initialised by memset or a copy: undefined on NC-v2/v3) or into a group
    that another group of the same bank replaced raises PsumAccumulateError."""

    def __init__(self, t: Target) -> None:
        self.bank = t.psum_bank_bytes
        self.open: dict[int, tuple[int, int, int, int]] = {}

    def step(self, ins: Instr, g: APGeom) -> None:
        acc = ins.op is Op.MATMUL and ins.attrs.accumulate  # type: ignore[union-attr]
        B = self.bank
        for bank in range(g.lo // B, (g.hi - 1) // B + 1):   # one bank, or (NC-v4) several
            piece = g if g.lo // B == (g.hi - 1) // B else g._replace(lo=max(g.lo, bank * B),
                                                                      hi=min(g.hi, (bank + 1) * B))
            if not acc:
                self.open[bank] = (g.p0, g.p1, piece.lo, piece.hi)
                continue
            o = self.open.get(bank)
            if o is None or not (o[0] <= g.p0 and g.p1 <= o[1] and o[2] <= piece.lo and piece.hi <= o[3]):
                raise psum_group_error(piece, bank, o)


def psum_group_error(g: APGeom, bank: int, o: tuple[int, int, int, int] | None) -> PsumAccumulateError:
    """The error of an accumulating matmul at ``g`` whose bank's open group is ``o`` (None: none)."""
    if o is None:
        return PsumAccumulateError(
            f"matmul accumulates into PSUM bank {bank} (partitions [{g.p0}, {g.p1}) bytes [{g.lo}, {g.hi})) "
            f"but no accumulation group is open there: a group starts with a matmul with "
            f"accumulate=False (accumulating onto PSUM initialised by memset or a copy is undefined on NC-v2/v3)")
    return PsumAccumulateError(
        f"matmul accumulates into partitions [{g.p0}, {g.p1}) bytes [{g.lo}, {g.hi}) of PSUM bank {bank}, "
        f"outside the bank's open accumulation group (partitions [{o[0]}, {o[1]}) bytes [{o[2]}, {o[3]})): "
        f"one accumulation group per bank, 8 banks = 8 groups in flight")


def _r_transpose(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 1)
    s, d = ins.srcs[0], ins.dst
    assert d is not None
    p, f = s.partitions, s.free_size
    if d.partitions != f or d.free_size != p:
        raise OperandError(f"transpose of [{p}, {f}] needs a [{f}, {p}] destination, got [{d.partitions}, {d.free_size}]")
    if q.engine is EngineKind.TENSOR:
        if s.memory is not Memory.SBUF or d.memory is not Memory.PSUM:
            raise OperandError(f"TensorE transpose reads SBUF and writes PSUM, got {s.memory.value} -> {d.memory.value}")
        if p > t.pe_rows or f > t.pe_cols:
            raise OperandError(f"TensorE transpose handles up to {t.pe_rows}x{t.pe_cols}, got {p}x{f}")
        if d.dtype is not s.dtype and d.dtype.value != "float32":
            raise OperandError(f"TensorE transpose writes the source dtype or fp32, got {d.dtype.value}")
        _one_bank(d, t)
    elif p > 32 or f > 32:
        raise OperandError(f"VectorE transpose handles 32x32 blocks, got {p}x{f}")


def _r_activation(ins: Instr, q: Queue, t: Target) -> None:
    a = ins.attrs
    assert isinstance(a, ActivationAttrs) and ins.dst is not None
    check_nsrcs(ins, 1 + int(a.bias_from_src) + int(a.scale_from_src))
    check_same_pf(ins.dst, ins.srcs[0], "activation dst")
    for k in range(1, len(ins.srcs)):
        check_col(ins.srcs[k], ins.srcs[0].partitions, "activation bias/scale")
    if (a.reduce is None) != (ins.accum is None):
        raise OperandError("activation: reduce and accum must be given together")
    if ins.accum is not None:
        check_col(ins.accum, ins.srcs[0].partitions, "activation accum")
        if a.reduce not in _REDUCIBLE:
            raise OperandError(f"activation reduce op {a.reduce} is not a reduction")
        if a.reduce is not AluOp.ADD and not t.scalar_reduce_any_op:
            raise OperandError(f"activation reduce op {a.reduce.value} on {t.neuron_core}: only add "
                               f"(Target.scalar_reduce_any_op)")


def _r_tt(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 2)
    assert ins.dst is not None
    check_same_pf(ins.srcs[0], ins.dst, "tensor_tensor src0")
    check_same_pf(ins.srcs[1], ins.dst, "tensor_tensor src1")


def _r_scan(ins: Instr, q: Queue, t: Target) -> None:
    a = ins.attrs
    assert isinstance(a, TensorTensorScanAttrs) and ins.dst is not None
    check_nsrcs(ins, 3 if a.initial_from_src else 2)
    check_same_pf(ins.srcs[0], ins.dst, "tensor_tensor_scan src0")
    check_same_pf(ins.srcs[1], ins.dst, "tensor_tensor_scan src1")
    if a.initial_from_src:
        check_col(ins.srcs[2], ins.dst.partitions, "tensor_tensor_scan initial")


def _r_ts(ins: Instr, q: Queue, t: Target) -> None:
    a = ins.attrs
    assert isinstance(a, TensorScalarAttrs) and ins.dst is not None
    check_nsrcs(ins, 1 + int(a.operand0_from_src) + int(a.operand1_from_src and a.op1 is not None))
    check_same_pf(ins.srcs[0], ins.dst, "tensor_scalar src")
    for k in range(1, len(ins.srcs)):
        check_col(ins.srcs[k], ins.dst.partitions, "tensor_scalar operand")


def _r_reduce(ins: Instr, q: Queue, t: Target) -> None:
    a = ins.attrs
    assert isinstance(a, TensorReduceAttrs) and ins.dst is not None
    check_nsrcs(ins, 1)
    s = ins.srcs[0]
    if not 1 <= a.num_axes <= len(s.dims):
        raise OperandError(f"tensor_reduce num_axes must be in [1, {len(s.dims)}], got {a.num_axes}")
    if a.op not in _REDUCIBLE:
        raise OperandError(f"tensor_reduce op {a.op.value} is not a reduction")
    keep = 1
    for _, sz in s.dims[:len(s.dims) - a.num_axes]:
        keep *= sz
    if ins.dst.partitions != s.partitions or ins.dst.free_size != keep:
        raise OperandError(f"tensor_reduce destination must be [{s.partitions}, {keep}], got "
                           f"[{ins.dst.partitions}, {ins.dst.free_size}]")


def _r_copy(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 1)
    assert ins.dst is not None
    check_same_pf(ins.srcs[0], ins.dst, "tensor_copy src")


def _r_none(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 0)
    if ins.op is Op.IOTA:
        a = ins.attrs
        assert isinstance(a, IotaAttrs) and ins.dst is not None
        if len(a.steps) > len(ins.dst.dims):
            raise OperandError(f"iota has {len(a.steps)} steps for {len(ins.dst.dims)} free dims")


def _r_select(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 3)
    assert ins.dst is not None
    for k in range(3):
        check_same_pf(ins.srcs[k], ins.dst, f"select src{k}")


def _r_bn_stats(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 1)
    assert ins.dst is not None
    s = ins.srcs[0]
    if s.free_size > 512:
        raise OperandError(f"bn_stats free size must be <= 512, got {s.free_size}")
    _col_n(ins.dst, s.partitions, 6 if isinstance(ins.attrs, BnStatsNkiAttrs) else 2, "bn_stats dst")


def _r_bn_aggr(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 1)
    assert ins.dst is not None
    s = ins.srcs[0]
    if isinstance(ins.attrs, BnAggrNkiAttrs):
        if s.free_size < 3 or s.free_size % 3:
            raise OperandError(f"bn_aggr source holds (count, mean, variance * count) triples: free "
                               f"size must be a multiple of 3, got {s.free_size}")
    elif s.free_size < 2 or s.free_size % 2:
        raise OperandError(f"bn_aggr source holds (mean, var) pairs: free size must be even >= 2, got {s.free_size}")
    _col_n(ins.dst, s.partitions, 2, "bn_aggr dst")


SELECT8_MAX = 16384   # data elements per partition of max8 / find_index8 / match_replace8 (NKI)


def _r_select8(ins: Instr, q: Queue, t: Target) -> None:
    op = ins.op.value
    check_nsrcs(ins, 1 if ins.op is Op.MAX8 else 2)
    assert ins.dst is not None
    data = ins.srcs[0]
    lo = 1 if ins.op is Op.MATCH_REPLACE8 else 8
    if not lo <= data.free_size <= SELECT8_MAX:
        raise OperandError(f"{op} reads {lo} to {SELECT8_MAX} elements per partition, got "
                           f"{data.free_size} ({data})")
    if ins.op is not Op.MAX8:
        _col_n(ins.srcs[1], data.partitions, 8, f"{op} vals")
    if ins.op is Op.MATCH_REPLACE8:
        check_same_pf(ins.dst, data, f"{op} dst")
        return
    _col_n(ins.dst, data.partitions, 8, f"{op} dst")
    if ins.op is Op.FIND_INDEX8 and ins.dst.dtype is not DType.INT32:
        raise OperandError(f"{op} writes int32 positions, got dst dtype {ins.dst.dtype.value}")


def _r_rand(ins: Instr, q: Queue, t: Target) -> None:
    check_nsrcs(ins, 2)
    assert ins.dst is not None
    p = ins.dst.partitions
    key, ctr = ins.srcs
    _col_n(key, p, 2, "rand_philox key")
    check_col(ctr, p, "rand_philox counter")
    for a, what in ((key, "key"), (ctr, "counter")):
        if a.dtype not in (DType.INT32, DType.INT64):
            raise OperandError(f"rand_philox {what} must be int32/int64, got {a.dtype.value}")
    bits = ins.attrs.bits  # type: ignore[union-attr]
    if not 1 <= bits <= 32:
        raise OperandError(f"rand_philox bits must be in [1, 32], got {bits}")


def _col_n(a: AP, p: int, n: int, what: str) -> None:
    if a.partitions != p or a.free_size != n:
        raise OperandError(f"{what}: expected [{p}, {n}], got [{a.partitions}, {a.free_size}]")


OPERAND_RULES = {
    Op.DMA_COPY: _r_dma, Op.MATMUL: _r_matmul, Op.TRANSPOSE: _r_transpose,
    Op.ACTIVATION: _r_activation, Op.TENSOR_TENSOR: _r_tt, Op.TENSOR_TENSOR_SCAN: _r_scan,
    Op.TENSOR_SCALAR: _r_ts,
    Op.TENSOR_REDUCE: _r_reduce, Op.TENSOR_COPY: _r_copy, Op.MEMSET: _r_none, Op.IOTA: _r_none,
    Op.SELECT: _r_select, Op.BN_STATS: _r_bn_stats, Op.BN_AGGR: _r_bn_aggr,
    Op.DMA_GATHER: _r_indirect, Op.DMA_SCATTER: _r_indirect, Op.MAX8: _r_select8,
    Op.FIND_INDEX8: _r_select8, Op.MATCH_REPLACE8: _r_select8, Op.RAND_PHILOX: _r_rand,
    **NC4_RULES,
}
