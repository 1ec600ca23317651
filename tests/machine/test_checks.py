"""Each machine check: it fires with a message naming the instruction, the rule and the value, and
the corrected program passes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from progs import B
from runtime_sim import (GPSIMD, SCALAR, TENSOR, VECTOR, AccessPatternError, AlignmentError,
                         AluOp, BoundsError, Buffer, CapacityError, DeadlockError, DmaAttrs, DType,
                         EngineError, InputError, Instr, MatmulAttrs, Memory, MemsetAttrs,
                         OperandError, Op, Program, PsumAccumulateError, RaceError,
                         TensorCopyAttrs, TensorScalarAttrs, TensorTensorAttrs,
                         UninitializedReadError, ap, check_program, dma_queue, simulate, tile_ap,
                         write_chrome_trace)

F32, BF16 = DType.FP32, DType.BF16
ROOT = Path(__file__).resolve().parents[2]


def _load_then_scale(with_sem: bool) -> B:
    """DMA writes a tile; VectorE scales it (ordered by a semaphore or not); DMA stores it."""
    b = B()
    x = np.ones((128, 64), np.float32)
    h = b.hbm("x", x.nbytes, data=x)
    t = tile_ap(b.sbuf("t", 256), F32, 128, 64)
    y = tile_ap(b.sbuf("y", 256), F32, 128, 64)
    b.add(dma_queue(0), Instr(Op.DMA_COPY, t, (ap(h, F32, [(64, 128), (1, 64)]),), DmaAttrs(),
                              signals=("loaded",) if with_sem else ()))
    b.add(VECTOR, Instr(Op.TENSOR_SCALAR, y, (t,), TensorScalarAttrs(AluOp.MULTIPLY, 2.0),
                        waits=(("loaded", 1),) if with_sem else (), signals=("scaled",)))
    b.store("y", y, (("scaled", 1),))
    return b


@pytest.mark.parametrize("mode", ["functional", "timing"])
def test_race_between_engines_without_semaphore(mode):
    with pytest.raises(RaceError) as e:
        _load_then_scale(False).run(mode=mode)
    msg = str(e.value)
    assert "dve #0" in msg and "tensor_scalar" in msg and "dma0 #0" in msg and "no semaphore path" in msg
    res = _load_then_scale(True).run(mode=mode)
    if mode == "functional":
        np.testing.assert_array_equal(res.outputs["o_y"].view(np.float32), np.full(128 * 64, 2.0, np.float32))
    _load_then_scale(False).run(mode=mode, checks=False)   # checks off: no error
    _load_then_scale(False).run(mode=mode, checks="static")  # static rules only: no race check


def test_write_after_read_race_and_aliasing_buffers():
    b = _load_then_scale(True)
    # GpSimd reuses the bytes of "t" (another buffer at the same SBUF offset) while VectorE may still read it
    alias = b.sbuf("alias", 256, offset=b.buffers[1].offset)
    b.add(GPSIMD, Instr(Op.MEMSET, tile_ap(alias, F32, 128, 64), (), MemsetAttrs(0.0), waits=(("loaded", 1),)))
    with pytest.raises(RaceError, match=r"(?s)pool #0: memset.*dve #0 .*reads"):
        b.run(mode="timing")
    b = _load_then_scale(True)
    alias = b.sbuf("alias", 256, offset=b.buffers[1].offset)
    b.add(GPSIMD, Instr(Op.MEMSET, tile_ap(alias, F32, 128, 64), (), MemsetAttrs(0.0), waits=(("scaled", 1),)))
    b.run(mode="timing")


def test_no_false_race_on_interleaved_strided_tiles_and_transitive_order():
    b = B()
    o = b.hbm("o_out", 8 * 64 * 4, output=True)
    t = b.sbuf("t", 64 * 4)
    s = b.sem()
    b.add(VECTOR, Instr(Op.MEMSET, tile_ap(t, F32, 8, 64), (), MemsetAttrs(1.0), signals=(s,)))
    # two queues store the even / odd columns of one HBM matrix: bounding boxes overlap, bytes do not
    for k, q in enumerate((dma_queue(0), dma_queue(16))):
        b.add(q, Instr(Op.DMA_COPY, ap(o, F32, [(64, 8), (2, 32)], byte_offset=4 * k),
                       (ap(t, F32, [(2, 32)], partitions=8, byte_offset=4 * k),), DmaAttrs(), waits=((s, 1),)))
    res = b.run()
    np.testing.assert_array_equal(res.outputs["o_out"].view(np.float32), np.ones(8 * 64, np.float32))
    # transitive: memset (dve) -> act -> pool, pool overwrites what dve wrote: ordered through act
    b = B()
    t = tile_ap(b.sbuf("t", 64), F32, 8, 16)
    u = tile_ap(b.sbuf("u", 64), F32, 8, 16)
    b.add(VECTOR, Instr(Op.MEMSET, t, (), MemsetAttrs(1.0), signals=("a",)))
    b.add(SCALAR, Instr(Op.TENSOR_COPY, u, (t,), TensorCopyAttrs(), waits=(("a", 1),), signals=("b",)))
    b.add(GPSIMD, Instr(Op.MEMSET, t, (), MemsetAttrs(3.0), waits=(("b", 1),)))
    b.run()


def test_counting_semaphore_with_two_signallers():
    def build(count):
        b = B()
        t = b.sbuf("t", 64)
        for k, q in enumerate((VECTOR, GPSIMD)):
            b.add(q, Instr(Op.MEMSET, ap(t, F32, [(1, 8)], partitions=32, partition_start=32 * k), (),
                           MemsetAttrs(float(k)), signals=("both",)))
        b.store("t", ap(t, F32, [(1, 8)], partitions=64), (("both", count),))
        return b
    build(2).run()
    with pytest.raises(RaceError):
        build(1).run()


def test_sbuf_overflow_and_unplaced_buffer():
    b = B()
    b.sbuf("big", 200 * 1024, offset=32 * 1024)
    with pytest.raises(CapacityError, match=r"offset 32768 \+ 204800 B = 237568 B exceeds the SBUF partition size 229376"):
        b.run(mode="timing")
    b = B()
    b.buffers.append(Buffer("p", Memory.SBUF, 128, 64, None))
    with pytest.raises(CapacityError, match="offset not assigned"):
        b.run(mode="timing")


def test_misaligned_partition_start():
    b = B()
    t = b.sbuf("t", 64)
    b.add(VECTOR, Instr(Op.MEMSET, ap(t, F32, [(1, 8)], partitions=48, partition_start=32), (), MemsetAttrs(0.0)))
    with pytest.raises(AlignmentError, match=r"(?s)dve #0: memset.*Pattern accesses 48 \(> 32\) partitions starting at partition 32"):
        b.run(mode="timing")
    with pytest.raises(AlignmentError):
        b.run(mode="timing", checks="static")
    for start, n in ((64, 48), (96, 32), (0, 128)):
        b = B()
        t = b.sbuf("t", 64)
        b.add(VECTOR, Instr(Op.MEMSET, ap(t, F32, [(1, 8)], partitions=n, partition_start=start), (), MemsetAttrs(0.0)))
        b.run(mode="timing")


def test_read_of_never_written_memory():
    b = B()
    t, u = b.sbuf("t", 64), b.sbuf("u", 64)
    b.add(VECTOR, Instr(Op.MEMSET, ap(t, F32, [(1, 8)], partitions=8), (), MemsetAttrs(0.0)))
    # reads 9 columns: the last one was never written
    b.add(VECTOR, Instr(Op.TENSOR_COPY, ap(u, F32, [(1, 9)], partitions=8), (ap(t, F32, [(1, 9)], partitions=8),),
                        TensorCopyAttrs()))
    with pytest.raises(UninitializedReadError, match=r"(?s)dve #1: tensor_copy.*byte 32 of partition 0 of sbuf:t"):
        b.run()
    b.run(mode="timing")   # timing mode has no memory contents


def test_accumulate_into_memset_psum():
    def build(first_accumulates: bool, init_by_memset: bool) -> B:
        b = B()
        a, s = b.load("a", np.ones((128, 32), np.float32), F32)
        ps = tile_ap(b.psum("ps", 128), F32, 32, 32)
        waits = [(s, 1)]
        if init_by_memset:
            b.add(VECTOR, Instr(Op.MEMSET, ps, (), MemsetAttrs(0.0), signals=("z",)))
            waits.append(("z", 1))
        b.add(TENSOR, Instr(Op.MATMUL, ps, (a, a), MatmulAttrs(accumulate=first_accumulates), waits=tuple(waits)))
        return b
    # no open accumulation group: caught statically, in both modes and by check_program
    for mode in ("functional", "timing"):
        with pytest.raises(PsumAccumulateError, match=r"(?s)pe #0: matmul.*no accumulation group is open"):
            build(True, True).run(mode=mode)
    with pytest.raises(PsumAccumulateError):
        check_program(build(True, True).program())
    with pytest.raises(PsumAccumulateError, match="no accumulation group"):
        build(True, False).run()
    build(False, True).run()   # overwrite (accumulate=False) after a memset is fine
    # a group is open, but VectorE overwrites part of it before the next accumulation (run time)
    b = B()
    a, s = b.load("a", np.ones((128, 32), np.float32), F32)
    ps = tile_ap(b.psum("ps", 128), F32, 32, 32)
    b.add(TENSOR, Instr(Op.MATMUL, ps, (a, a), MatmulAttrs(), waits=((s, 1),), signals=("g",)))
    b.add(VECTOR, Instr(Op.MEMSET, tile_ap(b.buffers[-1], F32, 32, 8), (), MemsetAttrs(0.0), waits=(("g", 1),),
                        signals=("z",)))
    b.add(TENSOR, Instr(Op.MATMUL, ps, (a, a), MatmulAttrs(accumulate=True), waits=(("z", 1),)))
    with pytest.raises(PsumAccumulateError, match=r"(?s)pe #1: matmul.*last written by a non-matmul"):
        b.run()


def test_psum_accumulation_groups_one_per_bank():
    def build(second_bank_offset: int) -> B:
        b = B()
        a, s = b.load("a", np.ones((128, 32), np.float32), F32)
        ps = b.psum("ps", 4096)
        g1 = tile_ap(ps, F32, 32, 32)
        g2 = tile_ap(ps, F32, 32, 32, elem_offset=second_bank_offset // 4)
        for dst, acc in ((g1, False), (g2, False), (g1, True), (g2, True)):
            b.add(TENSOR, Instr(Op.MATMUL, dst, (a, a), MatmulAttrs(accumulate=acc), waits=((s, 1),)))
        return b
    # two groups interleaved in one bank: the second closes the first
    with pytest.raises(PsumAccumulateError, match=r"(?s)pe #2: matmul.*outside the bank's open accumulation group"):
        build(256).run(mode="timing")
    build(2048).run()        # the same two groups in two banks: fine
    with pytest.raises(PsumAccumulateError):
        check_program(build(256).program())


def test_deadlock_names_instructions_and_semaphores():
    b = B()
    t, u = b.sbuf("t", 64), b.sbuf("u", 64)
    b.add(VECTOR, Instr(Op.MEMSET, tile_ap(t, F32, 8, 8), (), MemsetAttrs(0.0), waits=(("from_pool", 1),), signals=("from_dve",)))
    b.add(GPSIMD, Instr(Op.MEMSET, tile_ap(u, F32, 8, 8), (), MemsetAttrs(0.0), waits=(("from_dve", 1),), signals=("from_pool",)))
    b.add(SCALAR, Instr(Op.TENSOR_COPY, tile_ap(u, F32, 8, 8), (tile_ap(t, F32, 8, 8),), TensorCopyAttrs(), waits=(("never", 2),)))
    with pytest.raises(DeadlockError) as e:
        b.run(mode="timing")
    msg = str(e.value)
    assert "dve #0: memset" in msg and "'from_pool' >= 1 (count is 0; signalled by pool)" in msg
    assert "pool #0: memset" in msg and "'never' >= 2 (count is 0; no instruction signals it)" in msg


def _single(q, ins, *bufs):
    return Program("trn2", tuple(bufs), {q: (ins,)})


def test_engine_operand_and_pattern_rules():
    sb = Buffer("sb", Memory.SBUF, 128, 8192, 0)
    ps = Buffer("ps", Memory.PSUM, 128, 16384, 0)
    hb = Buffer("hb", Memory.HBM, 1, 1 << 20)
    mm = lambda n, m=64, dst_off=0: Instr(Op.MATMUL, tile_ap(ps, F32, m, n, elem_offset=dst_off),
                                          (tile_ap(sb, BF16, 128, m), tile_ap(sb, BF16, 128, n)), MatmulAttrs())
    cases = [
        (EngineError, "matmul cannot run on dve", VECTOR, mm(64)),
        (OperandError, "moving free size N=513 > 512", TENSOR, mm(513)),
        (OperandError, "stationary free size M=129 > 128", TENSOR, mm(64, 129)),
        (OperandError, "cross a 2048 B PSUM bank boundary", TENSOR, mm(64, 64, 500)),
        (EngineError, "DMA cannot access PSUM", dma_queue(0),
         Instr(Op.DMA_COPY, tile_ap(ps, F32, 1, 8), (ap(hb, F32, [(1, 8)]),), DmaAttrs())),
        (OperandError, "DMA does not cast", dma_queue(0),
         Instr(Op.DMA_COPY, tile_ap(sb, BF16, 1, 8), (ap(hb, F32, [(1, 8)]),), DmaAttrs())),
        (EngineError, "dve cannot access HBM", VECTOR,
         Instr(Op.TENSOR_COPY, tile_ap(sb, F32, 1, 8), (ap(hb, F32, [(1, 8)]),), TensorCopyAttrs())),
        (AccessPatternError, "stride must fit int16", VECTOR,
         Instr(Op.MEMSET, ap(sb, BF16, [(40000, 2)]), (), MemsetAttrs(0.0))),
        (AccessPatternError, "at most 4 free dims", VECTOR,
         Instr(Op.MEMSET, ap(sb, BF16, [(1, 1)] * 5), (), MemsetAttrs(0.0))),
        (AccessPatternError, "addresses some element more than once", VECTOR,
         Instr(Op.MEMSET, ap(sb, F32, [(0, 4)]), (), MemsetAttrs(0.0))),
        (BoundsError, r"bytes \[8000, 8200\) outside buffer 'sb' of 8192 B", VECTOR,
         Instr(Op.MEMSET, ap(sb, F32, [(1, 50)], byte_offset=8000), (), MemsetAttrs(0.0))),
        (OperandError, "expected \\[128 partitions x 8\\] elements, got \\[128 x 9\\]", VECTOR,
         Instr(Op.TENSOR_TENSOR, tile_ap(sb, F32, 128, 8), (tile_ap(sb, F32, 128, 9), tile_ap(sb, F32, 128, 8)),
               TensorTensorAttrs(AluOp.ADD))),
    ]
    for err, pattern, q, ins in cases:
        with pytest.raises(err, match=pattern):
            simulate(_single(q, ins, sb, ps, hb), mode="timing")


def test_access_pattern_limits_and_psum_capacity():
    sb = Buffer("sb", Memory.SBUF, 128, 160 * 1024, 0)
    hb = Buffer("hb", Memory.HBM, 1, 1 << 20)
    ms = lambda dims, dt=BF16: Instr(Op.MEMSET, ap(sb, dt, dims), (), MemsetAttrs(0.0))
    cases = [
        (AccessPatternError, r"free size must be in \[1, 65535\], got 65536", ms([(1, 65536)])),
        (AccessPatternError, r"free size must be in \[1, 65535\], got 0", ms([(1, 0)])),
        (AccessPatternError, r"stride must fit int16 \[-32768, 32767\] elements, got -32769", ms([(-32769, 2)])),
        (AccessPatternError, "at most 4 free dims, got 5", ms([(16, 2), (8, 2), (4, 2), (2, 2), (1, 2)])),
        (AccessPatternError, "at most 5 free dims, got 6",
         Instr(Op.DMA_COPY, ap(sb, BF16, [(1, 64)], partitions=1),
               (ap(hb, BF16, [(32, 2), (16, 2), (8, 2), (4, 2), (2, 2), (1, 2)]),), DmaAttrs())),
    ]
    for err, pattern, ins in cases:
        q = dma_queue(0) if ins.op is Op.DMA_COPY else VECTOR
        with pytest.raises(err, match=pattern):
            simulate(_single(q, ins, sb, hb), mode="timing")
        with pytest.raises(err, match=pattern):
            check_program(_single(q, ins, sb, hb))
    # limits met exactly: 4 dims, size 65535, strides at both int16 ends
    for ins in (ms([(1, 2), (2, 2), (4, 2), (8, 2)]), ms([(1, 65535)]), ms([(32767, 2)], DType.UINT8),
                Instr(Op.MEMSET, ap(sb, DType.UINT8, [(-32768, 2)], byte_offset=32768), (), MemsetAttrs(0.0))):
        simulate(_single(VECTOR, ins, sb, hb), mode="timing")
    # PSUM capacity: 16 KiB per partition
    b = B()
    b.psum("ps", 2048, offset=15 * 1024)
    with pytest.raises(CapacityError, match=r"exceeds the PSUM partition size 16384"):
        b.run(mode="timing")


def test_accumulate_onto_psum_initialised_by_a_copy():
    b = B()
    a, s = b.load("a", np.ones((128, 32), np.float32), F32)
    ps = tile_ap(b.psum("ps", 128), F32, 32, 32)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, ps, (ap(b.buffers[1], F32, [(1, 32)], partitions=32),), TensorCopyAttrs(),
                        waits=((s, 1),), signals=("c",)))
    b.add(TENSOR, Instr(Op.MATMUL, ps, (a, a), MatmulAttrs(accumulate=True), waits=(("c", 1),)))
    with pytest.raises(PsumAccumulateError, match="no accumulation group is open"):
        b.run()


def test_missing_input():
    b = _load_then_scale(True)
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        simulate(b.program(), {})


def test_stats_and_chrome_trace(tmp_path):
    b = B()
    a, s = b.load("a", np.ones((128, 64), np.float32), BF16)
    ps = tile_ap(b.psum("ps", 512 * 4), F32, 64, 64)
    b.add(TENSOR, Instr(Op.MATMUL, ps, (a, a), MatmulAttrs(), waits=((s, 1),), signals=("mm",)))
    sp = b.hbm("spill0", 64 * 64 * 4)
    r = tile_ap(b.sbuf("r", 256), F32, 64, 64)
    b.add(VECTOR, Instr(Op.TENSOR_COPY, r, (ps,), TensorCopyAttrs(), waits=(("mm", 1),), signals=("cp",)))
    b.add(dma_queue(5), Instr(Op.DMA_COPY, ap(sp, F32, [(64, 64), (1, 64)]), (r,), DmaAttrs(), waits=(("cp", 1),)))
    res = b.run(trace=True)
    st = res.stats
    assert st.flops == 2 * 128 * 64 * 64 and st.dma_count == 2 and st.instructions == 4
    assert st.hbm_bytes == 128 * 64 * 2 + 64 * 64 * 4 and st.spill_bytes == 64 * 64 * 4
    assert st.min_hbm_bytes == 128 * 64 * 2
    assert st.sbuf_peak_bytes == (b.buffers[1].offset + 128 + 256) * 128 and st.psum_peak_bytes == 2048 * 128
    assert 0 < st.roofline_ns < st.total_ns
    assert all(0.0 <= v <= 1.0 for v in st.busy_fraction().values())
    assert st.semaphore_wait_ns["pe"] > 0
    p = write_chrome_trace(tmp_path / "t.json", res)
    tr = json.loads(p.read_text())
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(xs) == 4 and {"pe", "dve", "dma0", "dma5"} <= names
    assert all(e["dur"] >= 0 and "instr" in e["args"] and "completed_ns" in e["args"] for e in xs)
    by_track: dict = {}
    for e in xs:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["dur"]))
    for evs in by_track.values():           # slices on one track never overlap
        evs.sort()
        assert all(a[0] + a[1] <= b[0] + 1e-9 for a, b in zip(evs, evs[1:]))


def test_runtime_sim_never_imports_torch():
    code = ("import runtime_sim, runtime_sim.isa, runtime_sim.targets, runtime_sim.stats, runtime_sim.memory, "
            "runtime_sim.semantics, runtime_sim.costs, runtime_sim.checks, runtime_sim.races, "
            "runtime_sim.simulator, runtime_sim.trace, runtime_sim.sim_prepare, runtime_sim.errors, "
            "runtime_sim.calibration, runtime_sim.calibration.matmul, runtime_sim.calibration.mamba, "
            "runtime_sim.calibrate; import sys; "
            "bad = [m for m in ('torch', 'lowering', 'neuron_compiler') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
