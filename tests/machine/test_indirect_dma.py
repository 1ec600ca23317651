"""Indirect DMA (``dma_gather`` / ``dma_scatter``): semantics against numpy, the cost rule with
exact nanoseconds, the out-of-range index error, the operand rules and the race detector's view
of the table (every byte of it may be touched)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from progs import B
from runtime_sim import (TRN1, TRN2, TRN3, AccessPatternError, BoundsError, Buffer, DmaAttrs,
                         DmaGatherAttrs, DmaScatterAttrs, DType, Instr, Memory, Op, OperandError,
                         RaceError, UninitializedReadError, ap, dma_queue, instr_cost, simulate,
                         tile_ap)

F32, BF16, I32, I64 = DType.FP32, DType.BF16, DType.INT32, DType.INT64


def table_ap(h: Buffer, dt: DType, V: int, D: int, p: int, k: int = 1, *, lock=(0, 0), row_dims=None):
    """Table AP of a [V, D] row-major table for a [p, k] index: lock-step strides ``lock``."""
    rows = [(1, D)] if row_dims is None else list(row_dims)
    return ap(h, dt, [(lock[0], p), (lock[1], k), (D, V)] + rows)


def gather_prog(table: np.ndarray, idx: np.ndarray, tdt: DType, idt: DType, *, lock=(0, 0),
                row_dims=None, target="trn2"):
    """Load the index [p, k] into SBUF, gather rows of ``table`` [V, D], store the result."""
    b = B(target)
    V, D = table.shape
    p, k = idx.shape
    rd = [(1, D)] if row_dims is None else list(row_dims)
    row = int(np.prod([sz for _, sz in rd])) if rd else 1
    it, sem = b.load("idx", idx, idt)
    ht = b.hbm("table", table.nbytes, data=np.ascontiguousarray(table.astype(tdt.np)))
    dst = tile_ap(b.sbuf("rows", k * row * tdt.itemsize), tdt, p, k * row)
    tab = table_ap(ht, tdt, V, D, p, k, lock=lock, row_dims=rd)
    g = Instr(Op.DMA_GATHER, dst, (tab, it), DmaGatherAttrs(), waits=((sem, 1),), signals=("g",))
    b.add(dma_queue(1), g)
    b.store("rows", dst, (("g", 1),))
    return b


def run_gather(*a, **kw) -> tuple[np.ndarray, object]:
    b = gather_prog(*a, **kw)
    res = b.run()
    dst = b.streams[dma_queue(1)][0].dst
    return res.outputs["o_rows"].view(a[2].np).reshape(dst.partitions, -1), res


@pytest.mark.parametrize("tdt", [F32, BF16])
@pytest.mark.parametrize("idt", [I32, I64])
def test_gather_rows_repeated_out_of_order(tdt, idt):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 24)).astype(tdt.np)
    idx = np.array([[7], [3], [49], [0], [3], [7], [7], [12]])
    got, _ = run_gather(table, idx, tdt, idt)
    np.testing.assert_array_equal(got.view(np.uint8), table[idx[:, 0]].view(np.uint8))  # bytes exact


def test_gather_several_lookups_per_partition_and_strided_rows():
    table = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    idx = np.array([[1, 9, 1], [0, 4, 2]])
    got, _ = run_gather(table, idx, F32, I32)
    np.testing.assert_array_equal(got, table[idx].reshape(2, -1))
    # row = every other element of a row (4 runs of 1 element)
    got, _ = run_gather(table, idx, F32, I32, row_dims=[(2, 4)])
    np.testing.assert_array_equal(got, table[idx][..., ::2].reshape(2, -1))


def test_element_gather_with_lock_step_partition_stride():
    """torch.gather(x, 1, idx): lookup (p, k) reads x[p, idx[p, k]] -- the partition lock-step
    stride walks the rows of x, the indexed dim its columns, rows of one element."""
    x = np.arange(4 * 7, dtype=np.float32).reshape(4, 7) * 1.5
    idx = np.array([[6, 0, 3], [1, 1, 2], [5, 4, 6], [0, 0, 0]])
    b = B()
    it, sem = b.load("idx", idx, I64)
    hx = b.hbm("x", x.nbytes, data=x)
    dst = tile_ap(b.sbuf("out", 12), F32, 4, 3)
    tab = ap(hx, F32, [(7, 4), (0, 3), (1, 7)])
    b.add(dma_queue(1), Instr(Op.DMA_GATHER, dst, (tab, it), DmaGatherAttrs(), waits=((sem, 1),),
                              signals=("g",)))
    b.store("out", dst, (("g", 1),))
    res = b.run()
    np.testing.assert_array_equal(res.outputs["o_out"].view(np.float32).reshape(4, 3),
                                  np.take_along_axis(x, idx, axis=1))


@pytest.mark.parametrize("bad", [50, -1, 2 ** 40])
def test_out_of_range_index_names_instruction_value_and_bound(bad):
    table = np.ones((50, 24), np.float32)
    idx = np.array([[3], [bad], [4], [0]])
    b = gather_prog(table, idx, F32, I64)
    with pytest.raises(BoundsError) as e:
        b.run()
    msg = str(e.value)
    assert "dma1 #0: dma_gather" in msg, msg                 # the instruction
    assert f"index value {bad}" in msg and "lookup (1, 0)" in msg, msg
    assert "[0, 50)" in msg and "access out of bounds" in msg, msg
    b.run(mode="timing")    # timing mode has no values: the bound is a functional-mode check
    idx[1, 0] = 49          # in range: runs
    gather_prog(table, idx, F32, I64).run()


def test_gather_reads_only_the_rows_it_looks_up():
    """Rows never written are fine unless looked up (uninitialised read of the row)."""
    def prog(row):
        b = B()
        it, sem = b.load("idx", np.array([[row]]), I32)
        ht = b.hbm("table", 10 * 4 * 4)
        w, ws = b.load("w", np.full((1, 4), 2.0), F32)
        b.add(dma_queue(2), Instr(Op.DMA_COPY, ap(ht, F32, [(1, 4)], byte_offset=3 * 16), (w,),
                                  DmaAttrs(), waits=((ws, 1),), signals=("w",)))   # row 3 only
        dst = tile_ap(b.sbuf("rows", 16), F32, 1, 4)
        b.add(dma_queue(1), Instr(Op.DMA_GATHER, dst, (table_ap(ht, F32, 10, 4, 1), it),
                                  DmaGatherAttrs(), waits=((sem, 1), ("w", 1)), signals=("g",)))
        b.store("rows", dst, (("g", 1),))
        return b
    res = prog(3).run()
    np.testing.assert_array_equal(res.outputs["o_rows"].view(np.float32), np.full(4, 2.0, np.float32))
    with pytest.raises(UninitializedReadError, match="dma_gather"):
        prog(4).run()


def scatter_prog(table: np.ndarray, idx: np.ndarray, data: np.ndarray, accumulate: bool):
    b = B()
    V, D = table.shape
    p = idx.shape[0]
    it, s1 = b.load("idx", idx, I32)
    dt, s2 = b.load("data", data, F32)
    ht = b.hbm("table", table.nbytes, data=table.astype(np.float32), output=True)
    b.add(dma_queue(1), Instr(Op.DMA_SCATTER, table_ap(ht, F32, V, D, p), (dt, it),
                              DmaScatterAttrs(accumulate), waits=((s1, 1), (s2, 1))))
    return b


@pytest.mark.parametrize("accumulate", [False, True])
def test_scatter_with_duplicates(accumulate):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((9, 5)).astype(np.float32)
    idx = np.array([[2], [7], [2], [0], [2]])
    data = rng.standard_normal((5, 5)).astype(np.float32)
    res = scatter_prog(table, idx, data, accumulate).run()
    want = table.copy()
    for j, r in enumerate(idx[:, 0]):          # lookups in order: last wins / fp32 adds in order
        want[r] = want[r] + data[j] if accumulate else data[j]
    np.testing.assert_array_equal(res.outputs["table"].view(np.float32).reshape(9, 5), want)


def test_scatter_out_of_range_writes_nothing():
    table = np.zeros((4, 2), np.float32)
    b = scatter_prog(table, np.array([[1], [4]]), np.ones((2, 2)), True)
    with pytest.raises(BoundsError, match=r"(?s)dma_scatter.*index value 4 of lookup \(1, 0\).*\[0, 4\)"):
        b.run()


def test_indirect_dma_cost_one_descriptor_per_row():
    """Data phase on the busiest engine = its descriptors, each at least 64 B (ASSUMED), at
    23 B/ns on trn2; the queue is held by software descriptor generation (600 ns, ASSUMED) and
    the transfer's fixed phase (600 ns)."""
    hb = Buffer("t", Memory.HBM, 1, 1 << 24)
    sb = Buffer("s", Memory.SBUF, 128, 1 << 16, 0)
    idx = tile_ap(sb, I32, 128, 1)

    def gather(D, dt=F32, row=None, p=128):
        dst = tile_ap(sb, dt, p, D, elem_offset=64)
        return Instr(Op.DMA_GATHER, dst, (table_ap(hb, dt, 1000, D, p, row_dims=row),
                                          tile_ap(sb, I32, p, 1)), DmaGatherAttrs())
    c = instr_cost(gather(64), dma_queue(0), TRN2)
    # 128 rows of 256 B over 16 engines: 8 rows per engine = 2048 B in 8 descriptors
    assert c.busy_ns == pytest.approx(2048 / 23.0)
    assert c.issue_ns == pytest.approx(1200.0) and c.latency_ns == 0
    assert (c.engine_lo, c.engine_hi) == (0, 16)
    assert c.hbm_ns == pytest.approx(128 * 256 / (2900.0 / 8))
    # element rows (4 B): descriptor-bound, each moves 64 B of engine time (16x the payload)
    e = instr_cost(gather(1), dma_queue(0), TRN2)
    assert e.busy_ns == pytest.approx(8 * 64 / 23.0)
    # a row of 2 runs (every other pair of elements: stride 4, size 2 x stride 1 size 2) = 2 descriptors
    s = instr_cost(gather(4, row=[(4, 2), (1, 2)]), dma_queue(0), TRN2)
    assert s.busy_ns == pytest.approx(16 * 64 / 23.0)
    # 8 partitions: one engine carries everything
    one = instr_cost(gather(64, p=8), dma_queue(0), TRN3)
    assert one.busy_ns == pytest.approx(2048 / 33.0) and (one.engine_lo, one.engine_hi) == (0, 1)
    # trn1: no pre-built descriptors for data-dependent addresses, the same assumed generation
    # time, then NC-v2's ~1300 ns fixed phase
    t1 = instr_cost(gather(64), dma_queue(0), TRN1)
    assert t1.issue_ns == pytest.approx(600.0 + 1300.0)
    assert t1.busy_ns == pytest.approx(2048 / 17.0)
    # scatter with accumulate reads and writes every row
    sc = Instr(Op.DMA_SCATTER, table_ap(hb, F32, 1000, 64, 128), (tile_ap(sb, F32, 128, 64, elem_offset=64), idx),
               DmaScatterAttrs(True))
    a = instr_cost(sc, dma_queue(0), TRN2)
    assert a.busy_ns == pytest.approx(2 * c.busy_ns) and a.hbm_ns == pytest.approx(2 * c.hbm_ns)
    plain = instr_cost(sc.__class__(Op.DMA_SCATTER, sc.dst, sc.srcs, DmaScatterAttrs(False)), dma_queue(0), TRN2)
    assert plain.busy_ns == pytest.approx(c.busy_ns)


def test_lone_gather_total_time_and_stats():
    """One gather after the index load: index load, then 600 ns generation + 600 ns fixed + data."""
    table = np.zeros((1000, 64), np.float32)
    b = gather_prog(table, np.zeros((128, 1), np.int64), F32, I64)
    res = b.run(mode="timing")
    st = res.stats
    assert st.dma_count == 3
    assert st.dma_bytes == 128 * 8 + 128 * 256 + 128 * 256
    assert st.hbm_bytes == 128 * 8 + 128 * 256 + 128 * 256
    g = b.streams[dma_queue(1)][0]
    c = instr_cost(g, dma_queue(1), TRN2)
    alone = c.issue_ns + c.busy_ns + c.latency_ns
    assert alone == pytest.approx(600 + 600 + 2048 / 23)
    b.streams = {dma_queue(1): [Instr(g.op, g.dst, g.srcs, g.attrs)]}   # the gather alone
    # its data phase ends no earlier than the core's HBM share allows (32 KiB: 90.4 > 89.0 ns)
    assert b.run(mode="timing").stats.total_ns == pytest.approx(1200 + max(c.busy_ns, c.hbm_ns))


def test_operand_rules():
    hb = Buffer("t", Memory.HBM, 1, 4000)
    sb = Buffer("s", Memory.SBUF, 128, 4096, 0)
    idx = tile_ap(sb, I32, 8, 1)
    dst = tile_ap(sb, F32, 8, 10, elem_offset=16)
    good = (table_ap(hb, F32, 100, 10, 8), idx)

    def chk(ins):
        b = B()
        b.buffers += [hb, sb]
        b.add(dma_queue(0), ins)
        from runtime_sim import check_program
        check_program(b.program())
    chk(Instr(Op.DMA_GATHER, dst, good, DmaGatherAttrs()))
    with pytest.raises(OperandError, match="index must be int32/int64 in SBUF, got float32"):
        chk(Instr(Op.DMA_GATHER, dst, (good[0], tile_ap(sb, F32, 8, 1)), DmaGatherAttrs()))
    with pytest.raises(OperandError, match="DMA does not cast: dma_gather data dtype bfloat16"):
        chk(Instr(Op.DMA_GATHER, tile_ap(sb, BF16, 8, 10, elem_offset=32), good, DmaGatherAttrs()))
    with pytest.raises(OperandError, match=r"lock-step dims of the table must have the index shape \(8, 1\), got \(4, 1\)"):
        chk(Instr(Op.DMA_GATHER, dst, (table_ap(hb, F32, 100, 10, 4), idx), DmaGatherAttrs()))
    with pytest.raises(OperandError, match=r"data must be \[8 partitions x 1 lookups x 10 row elements\], got \[8 x 9\]"):
        chk(Instr(Op.DMA_GATHER, tile_ap(sb, F32, 8, 9, elem_offset=16), good, DmaGatherAttrs()))
    with pytest.raises(OperandError, match="table AP needs 3\\+ dims"):
        chk(Instr(Op.DMA_GATHER, dst, (ap(hb, F32, [(10, 100)]), idx), DmaGatherAttrs()))
    with pytest.raises(OperandError, match="table must be in HBM, got sbuf"):
        chk(Instr(Op.DMA_GATHER, dst, (ap(sb, F32, [(0, 1), (10, 10), (1, 10)], partitions=8), idx),
                  DmaGatherAttrs()))
    with pytest.raises(BoundsError, match="outside buffer 't'"):        # V too large for the buffer
        chk(Instr(Op.DMA_GATHER, dst, (table_ap(hb, F32, 101, 10, 8), idx), DmaGatherAttrs()))
    it64 = tile_ap(sb, I64, 8, 1)
    with pytest.raises(OperandError, match="accumulate adds in fp32: the table must be a float type, got int64"):
        chk(Instr(Op.DMA_SCATTER, table_ap(hb, I64, 10, 10, 8), (tile_ap(sb, I64, 8, 10, elem_offset=8), idx),
                  DmaScatterAttrs(True)))
    with pytest.raises(AccessPatternError, match="row dims"):
        chk(Instr(Op.DMA_SCATTER, table_ap(hb, F32, 10, 10, 8, row_dims=[(0, 10)]), (dst, it64),
                  DmaScatterAttrs(False)))
    chk(Instr(Op.DMA_SCATTER, table_ap(hb, F32, 10, 10, 8), (dst, it64), DmaScatterAttrs(False)))


@pytest.mark.parametrize("mode", ["functional", "timing"])
def test_race_on_any_table_row(mode):
    """A write anywhere in the table races with an unordered gather (its rows are unknown until
    run time, so the whole table counts as read); ordered by a semaphore it does not."""
    def prog(ordered):
        table = np.zeros((16, 4), np.float32)
        b = gather_prog(table, np.array([[0]]), F32, I32)
        ht = next(x for x in b.buffers if x.name == "table")
        src, s = b.load("w", np.ones((1, 4)), F32)
        b.add(dma_queue(3), Instr(Op.DMA_COPY, ap(ht, F32, [(1, 4)], byte_offset=15 * 16), (src,), DmaAttrs(),
                                  waits=((s, 1),), signals=("w",)))
        if ordered:
            g = b.streams[dma_queue(1)][0]
            b.streams[dma_queue(1)][0] = Instr(g.op, g.dst, g.srcs, g.attrs, g.waits + (("w", 1),), g.signals)
        return b
    with pytest.raises(RaceError, match="dma_gather"):
        prog(False).run(mode=mode)
    prog(True).run(mode=mode)


def test_bf16_bytes_exact_and_int_table():
    t = (np.arange(20 * 3).reshape(20, 3) - 30).astype(np.int64)
    got, _ = run_gather(t, np.array([[19], [0], [5]]), I64, I32)
    np.testing.assert_array_equal(got, t[[19, 0, 5]])
    bf = np.array([[np.nan, -0.0, 1e-40]], dtype=np.float32).astype(ml_dtypes.bfloat16)
    got, _ = run_gather(np.repeat(bf, 2, axis=0), np.array([[1]]), BF16, I32)
    assert got.view(np.uint16).tolist() == [bf.view(np.uint16)[0].tolist()]


@pytest.mark.parametrize("checks", [False, "static", True])
def test_gather_with_every_checks_setting(checks):
    """The cost cache key (checks off) and the static rules handle the indirect ops."""
    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    b = gather_prog(table, np.array([[3], [9]]), F32, I64)
    res = b.run(checks=checks)
    np.testing.assert_array_equal(res.outputs["o_rows"].view(np.float32), [6, 7, 18, 19])
    assert b.run(mode="timing", checks=checks).stats.total_ns == pytest.approx(res.stats.total_ns)
