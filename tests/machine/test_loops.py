"""Looped streams (runtime_sim.loops): a loop nest is the same program as its straight-line
expansion -- same instances, same simulated time and statistics, same values -- and every static
check still catches a bad instance, however late in the loops, naming it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime_sim import (TENSOR, VECTOR, AluOp, BoundsError, Buffer, DeadlockError, DmaAttrs,
                         DType, Instr, IotaAttrs, MatmulAttrs, Memory, Op, OperandError, Program,
                         ProgramError, PsumAccumulateError, TensorScalarAttrs, ap, check_program,
                         dma_queue, simulate, tile_ap)
from runtime_sim import loops
from runtime_sim.loops import Expansion, Index, Loop, Looped, LWait, Stream, materialize, units

F32, BF16 = DType.FP32, DType.BF16
LD, ST = dma_queue(0), dma_queue(16)


def V(*terms, const=0, rot=None) -> Index:
    return Index(const, tuple(terms), rot)


def scale_rows(T: int = 6, *, y_tiles: int | None = None, slots: int = 2, mod: int | None = None,
               extra_wait: int = 0) -> Program:
    """Tiles t = 0..T-1 of x [T*128, 64] fp32: load into a rotating 2-slot pool, scale by 2 on
    VectorE into another pool, store; slots reused once their readers are done (semaphores)."""
    tile = 128 * 64 * 4
    x = Buffer("x", Memory.HBM, 1, T * tile)
    y = Buffer("y", Memory.HBM, 1, (T if y_tiles is None else y_tiles) * tile)
    a = Buffer("a", Memory.SBUF, 128, slots * 256, 0)
    b = Buffer("b", Memory.SBUF, 128, slots * 256, 4096)
    m = slots if mod is None else mod
    slot = V(rot=(0, (("t", 1),), m, 256))
    at = tile_ap(a, F32, 128, 64)
    bt = tile_ap(b, F32, 128, 64)
    xt = ap(x, F32, [(64, 128), (1, 64)])
    yt = ap(y, F32, [(64, 128), (1, 64)])
    load = Looped(Instr(Op.DMA_COPY, at, (xt,), DmaAttrs(), signals=("ld",)),
                  (slot, None, V(("t", tile))), (LWait("sc", V(("t", 1), const=1 - slots)),))
    scale = Looped(Instr(Op.TENSOR_SCALAR, bt, (at,), TensorScalarAttrs(AluOp.MULTIPLY, 2.0),
                         signals=("sc",)),
                   (slot, None, slot),
                   (LWait("ld", V(("t", 1), const=1 + extra_wait)),
                    LWait("st", V(("t", 1), const=1 - slots))))
    store = Looped(Instr(Op.DMA_COPY, yt, (bt,), DmaAttrs(), signals=("st",)),
                   (V(("t", tile)), None, slot), (LWait("sc", V(("t", 1), const=1)),))
    streams = {q: Stream([Loop("t", T, (ins,))]) for q, ins in ((LD, load), (VECTOR, scale), (ST, store))}
    return Program("trn2", (x, y, a, b), streams, ("x",), ("y",))


def feed(T: int = 6) -> dict[str, np.ndarray]:
    return {"x": np.arange(T * 128 * 64, dtype=np.float32).reshape(T * 128, 64)}


def stats(r) -> dict:
    return dataclasses.asdict(r.stats)


# ---- the stream as a sequence ----------------------------------------------------------------

def test_stream_is_the_sequence_of_its_instances():
    p = scale_rows()
    s = p.streams[VECTOR]
    assert len(s) == 6 and p.num_instructions == 18 and p.num_static == 3
    flat = materialize(s)
    assert list(s) == list(flat) and [s[i] for i in range(6)] == list(flat) and s[-1] == flat[-1]
    assert s[1:3] == list(flat[1:3])
    # instance 3: slot (3 % 2) of both pools, waits ld>=4 and st>=2
    ins = s[3]
    assert ins.dst.byte_offset == 256 and ins.srcs[0].byte_offset == 256
    assert ins.waits == (("ld", 4), ("st", 2))
    # instance 0 and 1: the st wait is not active (count <= 0)
    assert s[0].waits == (("ld", 1),) and s[1].waits == (("ld", 2),)
    with pytest.raises(IndexError):
        s[6]
    assert "for t in 0..6:" in str(p) and "((t % 2))" not in str(p) and "(t % 2)" in str(p)


def test_index_eval_vector_and_bounds():
    e = V(("i", 3), ("j", -2), const=5, rot=(1, (("i", 2), ("j", 1)), 4, 100))
    counts = {"i": 3, "j": 5}
    env = {"i": np.repeat(np.arange(3), 5), "j": np.tile(np.arange(5), 3)}
    vec = e.vector(env, 15)
    vals = [e.eval({"i": i, "j": j}) for i in range(3) for j in range(5)]
    assert vec.tolist() == vals
    lo, hi = e.bounds(counts)
    assert lo <= min(vals) and hi >= max(vals)
    assert V(("i", 4), const=-1).bounds(counts) == (-1, 7)          # exact without rot
    assert V(rot=(0, (("i", 1),), 8, 10)).bounds(counts) == (0, 20)  # residues 0..2 only


def test_expansion_positions_and_counters():
    inner = Instr(Op.SEM, None, (), __import__("runtime_sim").SemAttrs())
    s = Stream([inner, Loop("i", 2, (inner, Loop("j", 3, (inner,)))), inner])
    e = Expansion(s.body)
    assert e.n == len(s) == 1 + 2 * 4 + 1
    assert [e.pos(t).tolist() for t in range(4)] == [[0], [1, 5], [2, 3, 4, 6, 7, 8], [9]]
    assert e.env(2)["j"].tolist() == [0, 1, 2, 0, 1, 2]
    assert e.tid.tolist() == [0, 1, 2, 2, 2, 1, 2, 2, 2, 3]
    assert s.locate(7) == (inner, {"i": 1, "j": 1})
    # cut into units of at most 3: [0], then each i iteration as [1] + [2, 3, 4], then [9]
    got = [(ue.n, outer, base) for ue, outer, base in units(s.body, 3)]
    assert got == [(1, {}, 0), (1, {"i": 0}, 1), (3, {"i": 0}, 2), (1, {"i": 1}, 5),
                   (3, {"i": 1}, 6), (1, {}, 9)]
    us = list(units(s.body, 3))
    assert us[2][0] is us[4][0]                 # a repeated body is expanded once
    # a long loop of a short body is cut into blocks of whole iterations
    s2 = Stream([Loop("i", 10, (inner,))])
    us = list(units(s2.body, 4))
    assert [(ue.n, outer, base) for ue, outer, base in us] == [(4, {"i": 0}, 0), (4, {"i": 4}, 4),
                                                               (2, {"i": 8}, 8)]
    assert us[0][0] is us[1][0]
    assert us[1][0].env(0, us[1][1])["i"].tolist() == [4, 5, 6, 7]
    assert us[2][0].env_at(0, 1, us[2][1]) == {"i": 9}


# ---- the same program: timing, statistics, values --------------------------------------------

@pytest.mark.parametrize("checks", [True, "static", False])
@pytest.mark.parametrize("unit", [None, 1, 4])
def test_looped_and_straight_line_simulate_identically(checks, unit, monkeypatch):
    if unit is not None:
        monkeypatch.setattr(loops, "UNIT", unit)
    p = scale_rows()
    for mode in ("timing", "functional"):
        a = simulate(p, feed(), mode=mode, checks=checks)
        b = simulate(p.flat(), feed(), mode=mode, checks=checks)
        assert stats(a) == stats(b)
        for k in b.outputs:
            assert np.array_equal(a.outputs[k], b.outputs[k])
    y = simulate(p, feed(), mode="functional").outputs["y"].view(np.float32)
    assert np.array_equal(y, (feed()["x"] * 2).ravel())


def test_an_instruction_with_more_varying_waits_than_an_integer_has_bits():
    """70 waits that never hold their count (inactive in every iteration) ahead of the real
    ones: the activity pattern per instance is not a bit mask that overflows past 63 waits."""
    p = scale_rows()
    q = p.streams[VECTOR]
    (loop,) = q.body
    (scale,) = loop.body
    idle = tuple(LWait(f"d{i}", V(("t", 1), const=-100)) for i in range(70))
    scale = dataclasses.replace(scale, waits=idle + scale.waits)
    streams = dict(p.streams)
    streams[VECTOR] = Stream([Loop("t", loop.count, (scale,))])
    p = dataclasses.replace(p, streams=streams)
    for mode, checks in (("timing", "static"), ("timing", False), ("functional", True)):
        a = simulate(p, feed(), mode=mode, checks=checks)    # timing: stepped per static instruction
        b = simulate(p.flat(), feed(), mode=mode, checks=checks)
        assert stats(a) == stats(b)
    y = simulate(p, feed(), mode="functional").outputs["y"].view(np.float32)
    assert np.array_equal(y, (feed()["x"] * 2).ravel())


def test_trace_of_a_looped_program_lists_every_instance():
    r = simulate(scale_rows(), feed(), trace=True)
    assert len(r.trace) == 18


def test_iota_base_varies_per_iteration():
    t = Buffer("t", Memory.SBUF, 128, 512, 0)
    o = Buffer("o", Memory.HBM, 1, 4 * 128 * 16 * 4)
    it = Looped(Instr(Op.IOTA, tile_ap(t, DType.INT32, 128, 16), (), IotaAttrs(0, 16, (1,)),
                      signals=("i",)),
                (V(rot=(0, (("k", 1),), 2, 256)),), (LWait("s", V(("k", 1), const=-1)),),
                fields=(("base", V(("k", 2048))),))
    st = Looped(Instr(Op.DMA_COPY, ap(o, DType.INT32, [(16, 128), (1, 16)]),
                      (tile_ap(t, DType.INT32, 128, 16),), DmaAttrs(), signals=("s",)),
                (V(("k", 8192)), None, V(rot=(0, (("k", 1),), 2, 256))), (LWait("i", V(("k", 1), const=1)),))
    from runtime_sim import GPSIMD
    p = Program("trn2", (t, o), {GPSIMD: Stream([Loop("k", 4, (it,))]), ST: Stream([Loop("k", 4, (st,))])},
                (), ("o",))
    out = simulate(p).outputs["o"].view(np.int32)
    assert np.array_equal(out, np.arange(4 * 128 * 16, dtype=np.int32))
    assert stats(simulate(p, mode="timing")) == stats(simulate(p.flat(), mode="timing"))


# ---- static checks: a bad late instance is still caught, and named ----------------------------

def _with_unit(n: int, fn, *args):
    old, loops.UNIT = loops.UNIT, n
    try:
        return fn(*args)
    finally:
        loops.UNIT = old


def _same_error(p: Program, kind: type) -> Exception:
    """The looped program fails check_program as its straight-line expansion does: same rule,
    same instance (queue, index, instruction), same message (plus the loop iteration), whether
    the checks take the loops whole or in units of 2 instances."""
    with pytest.raises(kind) as cut:
        _with_unit(2, check_program, p)
    with pytest.raises(kind) as looped:
        check_program(p)
    assert (cut.value.queue, cut.value.index, str(cut.value)) == \
        (looped.value.queue, looped.value.index, str(looped.value))
    with pytest.raises(kind) as flat:
        check_program(p.flat())
    e, f = looped.value, flat.value
    assert (e.queue, e.index, e.instr) == (f.queue, f.index, f.instr)
    assert e.message.startswith(f.message) and "[loop iteration" in e.message
    for sim_checks in (True, "static"):       # the simulator's own static pass agrees
        with pytest.raises(kind) as sim:        # (it takes the queues in their sorted order)
            simulate(p, mode="timing", checks=sim_checks)
        with pytest.raises(kind) as sim_flat:
            simulate(p.flat(), mode="timing", checks=sim_checks)
        assert (sim.value.queue, sim.value.index) == (sim_flat.value.queue, sim_flat.value.index)
    return e


def test_hbm_offset_out_of_bounds_in_the_last_iteration():
    check_program(scale_rows())
    e = _same_error(scale_rows(y_tiles=5), BoundsError)
    assert (e.queue, e.index) == (ST, 5)
    assert "t=5" in str(e) and "dma16 #5: dma_copy" in str(e) and "@163840" in str(e)


def test_rotation_past_the_pool_in_a_late_iteration():
    e = _same_error(scale_rows(mod=3), BoundsError)      # slot 2 of a 2-slot pool, first at t=2
    assert e.index == 2 and "t=2" in str(e)


def test_conservative_bounds_never_reject_a_valid_program():
    """An offset whose affine and rotating parts cancel: the extremes test is loose, the
    instances are in bounds, and the program passes."""
    a = Buffer("a", Memory.SBUF, 128, 1024 + 256, 0)
    h = Buffer("h", Memory.HBM, 1, 4 * 128 * 64 * 4)
    off = V(("t", 512), rot=(0, (("t", 1),), 2, -512))          # 0, 0, 1024, 1024
    ld = Looped(Instr(Op.DMA_COPY, tile_ap(a, F32, 128, 64), (ap(h, F32, [(64, 128), (1, 64)]),),
                      DmaAttrs()), (off, None, V(("t", 128 * 64 * 4))))
    p = Program("trn2", (a, h), {LD: Stream([Loop("t", 4, (ld,))])}, ("h",))
    assert off.bounds({"t": 4})[0] < 0
    check_program(p)
    assert [i.dst.byte_offset for i in p.streams[LD]] == [0, 0, 1024, 1024]


def _mm_program(dst: Index, opener: Index | None = None, J: int = 4, K: int = 3) -> Program:
    """for j: for k: a [128, 128] fp32 product into PSUM at ``dst``: starting a group at k == 0,
    or (with ``opener``) always accumulating after a group-opening product at ``opener``."""
    s = Buffer("s", Memory.SBUF, 128, 512, 0)
    ps = Buffer("ps", Memory.PSUM, 128, 16384, 0)
    st = tile_ap(s, BF16, 128, 128)
    mv = tile_ap(s, BF16, 128, 128, elem_offset=128)
    d = tile_ap(ps, F32, 128, 128)
    if opener is None:
        body = (Looped(Instr(Op.MATMUL, d, (st, mv), MatmulAttrs(accumulate=True)),
                       (dst, None, None, None), start_when=(V(("k", 1)),)),)
    else:
        body = (Looped(Instr(Op.MATMUL, d, (st, mv), MatmulAttrs()), (opener, None, None, None)),
                Looped(Instr(Op.MATMUL, d, (st, mv), MatmulAttrs(accumulate=True)),
                       (dst, None, None, None)))
    return Program("trn2", (s, ps), {TENSOR: Stream([Loop("j", J, (Loop("k", K, body),))])})


def test_psum_bank_crossing_in_a_late_iteration():
    check_program(_mm_program(V(("j", 2048))))
    # [128, 128] fp32 = 512 B at 448*j: j=4 spans [1792, 2304), across the 2048 B bank edge
    e = _same_error(_mm_program(V(("j", 448)), J=5), OperandError)
    assert "bank" in str(e) and "j=4, k=0" in str(e)


def test_accumulation_outside_its_group_in_a_late_iteration():
    # the group opens at 2048*j; the accumulating product follows it for j = 0, 1, 2, then at
    # j = 3 lands at 5120: bank 2, outside the group opened there at j = 2 ([4096, 4608))
    dst = V(("j", 1792), const=-256, rot=(1, (("j", 1),), 4, 256))
    assert [dst.eval({"j": j}) for j in range(4)] == [0, 2048, 4096, 5120]
    check_program(_mm_program(V(("j", 2048)), opener=V(("j", 2048))))
    e = _same_error(_mm_program(dst, opener=V(("j", 2048))), PsumAccumulateError)
    assert "outside the bank's open accumulation group" in str(e) and "j=3, k=0" in str(e)


def test_accumulation_with_no_open_group():
    # every group opens in bank 0; the accumulating product moves to bank 1 at j = 1
    e = _same_error(_mm_program(V(("j", 2048)), opener=V()), PsumAccumulateError)
    assert "no accumulation group is open" in str(e) and "j=1, k=0" in str(e)


@pytest.mark.parametrize("make, text", [
    (lambda it: Looped(it.ins, it.offsets, it.waits + (LWait("sc", V(("u", 1))),)), "counter 'u'"),
    (lambda it: Looped(it.ins, it.offsets[:2], it.waits), "offsets for"),
    (lambda it: Looped(it.ins, it.offsets, it.waits, start_when=(V(("t", 1)),)), "matmul only"),
    (lambda it: Looped(it.ins, it.offsets, it.waits, fields=(("op0", V(("t", 1))),)), "cannot vary"),
    (lambda it: Looped(it.ins, it.offsets, (LWait("", V(("t", 1))),)), "non-empty"),
])
def test_malformed_looped_instructions(make, text):
    p = scale_rows()
    it = p.streams[VECTOR].body[0].body[0]
    bad = dataclasses.replace(p, streams={**p.streams, VECTOR: Stream([Loop("t", 6, (make(it),))])})
    with pytest.raises(ProgramError, match=text) as e:
        check_program(bad)
    assert e.value.queue == VECTOR and e.value.index == 0


def test_malformed_loops():
    p = scale_rows()
    it = p.streams[VECTOR].body[0].body[0]
    for body, text in (([Loop("t", 2, (Loop("t", 3, (it,)),))], "same variable"),
                       ([Loop("t", 0, (it,))], "count must be >= 1")):
        with pytest.raises(ProgramError, match=text):
            check_program(dataclasses.replace(p, streams={**p.streams, VECTOR: Stream(body)}))


def test_a_wait_that_never_holds_deadlocks_naming_the_instance():
    with pytest.raises(DeadlockError) as e:
        simulate(scale_rows(extra_wait=1), feed(), mode="timing", checks="static")
    assert "dve #5" in str(e.value) and "ld>=7" in str(e.value)


def _replace(p: Program, q, make) -> Program:
    """``p`` with the one looped instruction of queue ``q`` replaced by ``make(it)``."""
    it = p.streams[q].body[0].body[0]
    return dataclasses.replace(p, streams={**p.streams, q: Stream([Loop("t", 6, (make(it),))])})


def test_operand_and_layout_rules_fail_at_the_first_instance():
    from runtime_sim import AlignmentError, EngineError
    p = scale_rows()
    # the load's SBUF side in bf16: DMA does not cast
    bad = _replace(p, LD, lambda it: dataclasses.replace(it, ins=dataclasses.replace(
        it.ins, dst=dataclasses.replace(it.ins.dst, dtype=BF16))))
    e = _same_error(bad, OperandError)
    assert e.index == 0 and "does not cast" in str(e)
    # 64 partitions from partition 16
    bad = _replace(p, VECTOR, lambda it: dataclasses.replace(it, ins=dataclasses.replace(
        it.ins, dst=dataclasses.replace(it.ins.dst, partition_start=16, partitions=64),
        srcs=(dataclasses.replace(it.ins.srcs[0], partition_start=16, partitions=64),))))
    e = _same_error(bad, AlignmentError)
    assert e.index == 0 and "must start at 0 or 64" in str(e)
    # a DMA on VectorE
    bad = _replace(p, VECTOR, lambda it: dataclasses.replace(it, ins=dataclasses.replace(
        it.ins, op=Op.DMA_COPY, attrs=DmaAttrs())))
    assert _same_error(bad, EngineError).index == 0


def test_checking_a_looped_program_does_not_grow_with_its_trip_counts():
    """Three million instances: the static rules hold per static instruction (no instance is
    evaluated: every offset stays in bounds at its extremes)."""
    import time
    p = scale_rows(T=10**6)
    assert p.num_instructions == 3 * 10**6
    t = time.perf_counter()
    check_program(p)
    assert time.perf_counter() - t < 0.5
    with pytest.raises(BoundsError) as e:
        check_program(scale_rows(T=10**6, y_tiles=10**6 - 1))
    assert "t=999999" in str(e.value)
