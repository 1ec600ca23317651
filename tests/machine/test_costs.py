"""Each cost rule (hardware.md "Instruction costs") with the exact expected nanoseconds, and the
DMA model's overlap behaviour."""
from __future__ import annotations

import pytest

from progs import B
from runtime_sim import (GPSIMD, SCALAR, TENSOR, TRN1, TRN2, TRN3, VECTOR, ActFunc, ActivationAttrs,
                         AluOp, BnAggrAttrs, Buffer, DmaAttrs, DType, Instr, IotaAttrs, MatmulAttrs,
                         Memory, MemsetAttrs, Op, TensorCopyAttrs, TensorReduceAttrs,
                         TensorScalarAttrs, TensorTensorAttrs, TransposeAttrs, ap, dma_queue,
                         instr_cost, simulate, tile_ap)

F32, BF16 = DType.FP32, DType.BF16
SB = Buffer("sb", Memory.SBUF, 128, 64 * 1024, 0)
SB2 = Buffer("sb2", Memory.SBUF, 128, 64 * 1024, 64 * 1024)
PS = Buffer("ps", Memory.PSUM, 128, 16 * 1024, 0)
HB = Buffer("hb", Memory.HBM, 1, 1 << 24)


def t(p, f, dt=F32, buf=SB, off=0):
    return tile_ap(buf, dt, p, f, elem_offset=off)


def busy(ins, q, tgt=TRN2):
    return instr_cost(ins, q, tgt).busy_ns


@pytest.mark.parametrize("m,n,dt,cycles", [(128, 512, BF16, 512), (32, 16, BF16, 32), (128, 16, BF16, 64),
                                           (128, 100, F32, 400)])
def test_matmul_cost(m, n, dt, cycles):
    ins = Instr(Op.MATMUL, t(m, n, F32, PS), (t(128, m, dt), t(128, n, dt, SB2)), MatmulAttrs())
    assert busy(ins, TENSOR) == pytest.approx(cycles / 2.4)
    assert busy(ins, TENSOR, TRN1) == pytest.approx(cycles / 2.8)


def test_tensor_transpose_cost():
    a = Instr(Op.TRANSPOSE, t(32, 128, BF16, PS), (t(128, 32, BF16),), TransposeAttrs())
    assert busy(a, TENSOR) == pytest.approx(128 / 2.4)          # max(P=128, min(64, 32))
    b = Instr(Op.TRANSPOSE, t(128, 16, BF16, PS), (t(16, 128, BF16),), TransposeAttrs())
    assert busy(b, TENSOR) == pytest.approx(64 / 2.4)           # max(16, min(64, 128))
    c = Instr(Op.TRANSPOSE, t(32, 32), (t(32, 32, F32, SB2),), TransposeAttrs())
    assert busy(c, VECTOR) == pytest.approx(64 / 0.96)          # max(MIN_II, 32)


def test_tensor_tensor_cost_rules():
    def tt(dt, src_buf=SB2, op=AluOp.ADD):
        return Instr(Op.TENSOR_TENSOR, t(128, 1000, dt), (t(128, 1000, dt, src_buf), t(128, 1000, dt, SB2, 1000)),
                     TensorTensorAttrs(op))
    assert busy(tt(F32), VECTOR) == pytest.approx(2000 / 0.96)            # 2N
    assert busy(tt(BF16), VECTOR) == pytest.approx(1000 / 0.96)           # trn2 fast mode: 2N / 2
    assert busy(tt(F32, PS), VECTOR) == pytest.approx(1000 / 0.96)        # one input in PSUM: N
    assert busy(tt(BF16), VECTOR, TRN1) == pytest.approx(1000 / 1.12)     # bf16 contiguous add: N
    assert busy(tt(BF16, op=AluOp.MAX), VECTOR, TRN1) == pytest.approx(2000 / 1.12)
    assert busy(tt(F32, op=AluOp.DIVIDE), VECTOR) == pytest.approx(8000 / 0.96)
    small = Instr(Op.TENSOR_TENSOR, t(128, 10), (t(128, 10, F32, SB2), t(128, 10, F32, SB2, 10)),
                  TensorTensorAttrs(AluOp.ADD))
    assert busy(small, VECTOR) == pytest.approx(64 / 0.96)                # MIN_II floor


def test_copy_and_scalar_fast_modes():
    cp = lambda dt, n=1024, dims=None: Instr(Op.TENSOR_COPY, t(128, n, dt),
                                              (ap(SB2, dt, dims or [(1, n)]),), TensorCopyAttrs())
    assert busy(cp(BF16), VECTOR) == pytest.approx(256 / 0.96)            # 4x: bf16, SBUF, contiguous
    assert busy(cp(F32), VECTOR) == pytest.approx(512 / 0.96)             # 2x otherwise
    assert busy(cp(F32), VECTOR, TRN1) == pytest.approx(1024 / 1.12)
    assert busy(cp(BF16, 100), VECTOR) == pytest.approx(64 / 0.96)        # max(MIN_II, 25)
    assert busy(cp(F32, 512, [(8, 512)]), VECTOR) == pytest.approx(512 / 0.96)  # 32-byte stride halves: 2*512/2
    assert busy(cp(BF16), SCALAR, TRN3) == pytest.approx(512 / 1.2)       # trn3 ScalarE 2-byte x2
    recip = Instr(Op.TENSOR_SCALAR, t(128, 100), (t(128, 100, F32, SB2),),
                  TensorScalarAttrs(AluOp.DIVIDE, 1.0, reverse0=True))
    assert busy(recip, VECTOR) == pytest.approx(800 / 0.96)               # reciprocal 8N
    mul = Instr(Op.TENSOR_SCALAR, t(128, 1000), (t(128, 1000, F32, SB2),), TensorScalarAttrs(AluOp.MULTIPLY, 2.0))
    assert busy(mul, GPSIMD) == pytest.approx(1000 / 1.2)


def test_activation_reduce_memset_iota_bn_aggr_costs():
    act = Instr(Op.ACTIVATION, t(128, 1000), (t(128, 1000, F32, SB2),), ActivationAttrs(ActFunc.EXP, reduce=AluOp.ADD),
                accum=t(128, 1, F32, SB, 2000))
    assert busy(act, SCALAR) == pytest.approx((1000 + 64) / 1.2)
    red = lambda dt, op: Instr(Op.TENSOR_REDUCE, t(128, 1, dt), (t(128, 512, dt, SB2),), TensorReduceAttrs(op))
    assert busy(red(BF16, AluOp.ADD), VECTOR) == pytest.approx(256 / 0.96)
    assert busy(red(F32, AluOp.ADD), VECTOR) == pytest.approx(512 / 0.96)
    assert busy(red(BF16, AluOp.MIN), VECTOR) == pytest.approx(512 / 0.96)
    ms = lambda dt, v: Instr(Op.MEMSET, t(128, 1000, dt), (), MemsetAttrs(v))
    assert busy(ms(BF16, 0.0), VECTOR) == pytest.approx(500 / 0.96)
    assert busy(ms(BF16, 1.0), VECTOR) == pytest.approx(1000 / 0.96)
    assert busy(Instr(Op.IOTA, t(128, 50, DType.INT32), (), IotaAttrs()), GPSIMD) == pytest.approx(200 / 1.2)
    agg = Instr(Op.BN_AGGR, t(128, 2), (t(128, 300, F32, SB2),), BnAggrAttrs())
    assert busy(agg, VECTOR) == pytest.approx(1300 / 0.96)


def test_latency_and_dependent_penalty_in_a_program():
    b = B()
    x = b.sbuf("x", 4096)
    y = b.sbuf("y", 4096)
    b.add(VECTOR, Instr(Op.MEMSET, tile_ap(x, F32, 128, 1000), (), MemsetAttrs(1.0)))
    b.add(VECTOR, Instr(Op.TENSOR_SCALAR, tile_ap(y, F32, 128, 1000), (tile_ap(x, F32, 128, 1000),),
                        TensorScalarAttrs(AluOp.ADD, 1.0)))
    res = b.run(mode="timing")
    # memset N=1000 fp32: 1000 cycles; dependent tensor_scalar: N/2 (2x mode) + 100 penalty; + 60 latency
    assert res.stats.total_ns == pytest.approx((1000 + 500 + 100 + 60) / 0.96)
    assert res.stats.engine_busy_ns["dve"] == pytest.approx((1000 + 600) / 0.96)


def _dma(q, nbytes, dst_off=0, partitions=1, pstart=0):
    f = nbytes // partitions // 2
    return q, Instr(Op.DMA_COPY, ap(SB, BF16, [(1, f)], partitions=partitions, partition_start=pstart,
                                    byte_offset=dst_off),
                    (ap(HB, BF16, [(f, partitions), (1, f)], byte_offset=dst_off * 128 + pstart * 2 * f),), DmaAttrs())


def _run(dmas, tgt="trn2", checks=True):
    streams: dict = {}
    for q, ins in dmas:
        streams.setdefault(q, []).append(ins)
    from runtime_sim import Program
    p = Program(tgt, (SB, HB), {q: tuple(v) for q, v in streams.items()})
    return simulate(p, mode="timing", checks=checks)


def test_dma_cost_formula():
    # [128 partitions x 512 B] bf16: 64 KiB, 16 engines x 8 partitions x one 512-byte chunk each
    q, ins = _dma(dma_queue(0), 65536, partitions=128)
    c = instr_cost(ins, q, TRN2)
    assert (c.engine_lo, c.engine_hi) == (0, 16)
    assert c.busy_ns == pytest.approx(4096 / 23.0)           # the documented rate, no factor
    assert c.hbm_ns == pytest.approx(65536 / (2900 / 8))
    assert c.issue_ns == 600 and c.latency_ns == 0           # the fixed phase, on the queue
    # the data phase ends no earlier than the core's HBM share allows (181 ns > 178 ns here)
    assert _run([(q, ins)]).stats.total_ns == pytest.approx(600 + max(c.busy_ns, c.hbm_ns))
    # trn1: the DMA guide's ~1300 ns per transfer, 17 B/ns
    c1 = instr_cost(ins, q, TRN1)
    assert c1.issue_ns == 1300 and c1.busy_ns == pytest.approx(4096 / 17.0)


def test_dma_chunks_move_at_least_the_assumed_minimum():
    """A chunk shorter than ``dma_min_chunk_bytes`` (ASSUMED, 64 B) costs that many bytes of
    engine time: 2-byte runs cost 32x their payload, 64-byte runs and longer their payload."""
    from dataclasses import replace
    from runtime_sim.costs import dma_data_ns
    assert dma_data_ns(4096, 2, TRN2) == pytest.approx(4096 * 32 / 23.0)
    assert dma_data_ns(4096, 64, TRN2) == pytest.approx(4096 / 23.0)
    assert dma_data_ns(4096, 512, TRN2) == pytest.approx(4096 / 23.0)
    t = replace(TRN2, dma_min_chunk_bytes=128.0)
    assert dma_data_ns(4096, 64, t) == pytest.approx(2 * 4096 / 23.0)


@pytest.mark.parametrize("pstart,parts,engines", [(0, 4, (0, 1)), (0, 32, (0, 4)), (64, 64, (8, 16)),
                                                  (96, 32, (12, 16)), (0, 128, (0, 16))])
def test_dma_spreads_over_the_engines_of_its_partitions(pstart, parts, engines):
    q, ins = _dma(dma_queue(0), parts * 8192, partitions=parts, pstart=pstart)
    c = instr_cost(ins, q, TRN2)
    assert (c.engine_lo, c.engine_hi) == engines
    per_engine = min(parts, 8) * 8192          # each engine carries its 8 (or fewer) partitions
    assert c.busy_ns == pytest.approx(per_engine / 23.0)


def test_dma_one_engine_moves_32kib_like_the_measurement():
    # nki-dma-overview.rst: A[4, 4096] bf16 (32 KiB) HBM->SBUF on one trn2 engine took 1,416 ns
    q, ins = _dma(dma_queue(0), 32768, partitions=4)
    assert instr_cost(ins, q, TRN2).busy_ns == pytest.approx(1416, rel=0.05)


def test_dma_engines_are_shared_by_queues():
    d = 4096 / 23.0
    h = 65536 / (2900 / 8)                     # a 64 KiB transfer's time on the core's HBM share
    # two 128-partition DMAs on two queues: fixed phases side by side, data phases in sequence
    two_q = _run([_dma(dma_queue(0), 65536, 0, 128), _dma(dma_queue(16), 65536, 1024, 128)]).stats.total_ns
    assert two_q == pytest.approx(600 + 2 * max(d, h))
    # two 64-partition DMAs on disjoint partitions use disjoint engines: in parallel, both through
    # the core's HBM share (64 KiB together)
    par = _run([_dma(dma_queue(0), 32768, 0, 64, 0), _dma(dma_queue(1), 32768, 0, 64, 64)]).stats.total_ns
    assert par == pytest.approx(600 + max(d, h))
    # on one queue the fixed phases (600 ns) are sequential, then the engines
    one_q = _run([_dma(dma_queue(0), 32768, 0, 64, 0), _dma(dma_queue(0), 32768, 0, 64, 64)]).stats.total_ns
    assert one_q == pytest.approx(600 + 600 + d)


def test_one_queue_streams_one_transfer_per_max_of_fixed_and_data():
    """The next transfer's fixed phase overlaps the previous one's data phase: a stream of small
    transfers is fixed-phase bound, of large ones data bound (the shape of the DMA overview's
    efficiency figure)."""
    for nbytes, parts in ((128 * 512, 128), (128 * 8192, 128)):
        dmas = [_dma(dma_queue(0), nbytes, 0, parts) for _ in range(10)]
        eb = nbytes // 16
        data = max(eb / 23.0, nbytes / (2900 / 8))            # engine or HBM share
        want = 600 + data + 9 * max(600.0, data)
        assert _run(dmas, checks=False).stats.total_ns == pytest.approx(want)


def test_dma_steady_state_hides_the_fixed_phase_and_completes_in_order():
    # eight 32 KiB transfers on one engine (partitions 0-7): ~1.4 us each, one fixed phase exposed
    dmas = [_dma(dma_queue(0), 32768, 0, 8) for _ in range(8)]
    d = 4096 * 8 / 23.0
    assert _run(dmas, checks=False).stats.total_ns == pytest.approx(600 + 8 * d)
    # a small DMA behind a big one on the same queue but other engines still signals after it
    from progs import B
    b = B()
    sb = b.sbuf("t", 16384)
    big = b.hbm("big", 128 * 16384)
    small = b.hbm("small", 8 * 64)
    b.add(dma_queue(0), Instr(Op.DMA_COPY, ap(sb, BF16, [(1, 8192)], partitions=64),
                              (ap(big, BF16, [(8192, 64), (1, 8192)]),), DmaAttrs(), signals=("s",)))
    b.add(dma_queue(0), Instr(Op.DMA_COPY, ap(sb, BF16, [(1, 32)], partitions=8, partition_start=64),
                              (ap(small, BF16, [(32, 8), (1, 32)]),), DmaAttrs(), signals=("s",)))
    b.add(VECTOR, Instr(Op.MEMSET, tile_ap(b.sbuf("u", 64), F32, 8, 8), (), MemsetAttrs(0.0), waits=(("s", 1),)))
    res = b.run(mode="timing", checks=False, trace=True)
    ev = {e.queue + str(e.args["index"]): e for e in res.trace}
    assert float(ev["dma00"].args["completed_ns"]) <= float(ev["dma01"].args["completed_ns"])


def test_hbm_bandwidth_is_shared():
    # 16 x 1 MiB over the 16 engines: the engines give 16 x 23 = 368 B/ns, the HBM share 362.5 B/ns
    dmas = [(dma_queue(16 * e), Instr(Op.DMA_COPY, ap(SB, BF16, [(1, 4096)], partitions=128),
                                      (ap(HB, BF16, [(1, 128 * 4096)], byte_offset=e * (1 << 20)),), DmaAttrs()))
            for e in range(16)]
    total = _run(dmas, checks=False).stats.total_ns  # (all write one tile: racy on purpose)
    assert total >= 16 * (1 << 20) / 362.5 + 600 - 1e-6
