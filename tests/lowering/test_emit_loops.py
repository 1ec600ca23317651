"""The emitted machine program keeps the tile program's loops: its size follows the tile program,
not the tensor sizes; it runs exactly as its straight-line expansion; the verifier and the emit
pass still reject a bad instance late in the loops, naming it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lowering.errors import LoweringError
from lowering.tir.affine import Affine
from lowering.frontend import build_kir
from lowering.passes.fusion import fuse
from lowering.pipeline import _tile_with_residency
from lowering.tir.analysis import Structure
from lowering.tir.emit import emit_program
from lowering.tir.plan import plan_memory
from lowering.tir.schedule import schedule
from lowering.tir.sync import Wait, synchronize
from lowering_helpers import compile_fn, to_numpy, trace
from lowering.api import TensorSpec
from runtime_sim import BoundsError, check_program, get_target, simulate
from runtime_sim import loops
from runtime_sim.loops import Index, Loop, Looped, Stream

bf16 = torch.bfloat16


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)


CASES = {
    "mm": (torch.mm, lambda: (_randn(384, 256, dtype=bf16), _randn(256, 640, dtype=bf16))),
    "layer_norm": (lambda x, w: F.layer_norm(x, (300,), w, w), lambda: (_randn(260, 300), _randn(300))),
    "softmax": (lambda x: torch.softmax(x, dim=-1), lambda: (_randn(3, 130, 257),)),
    "gelu_add": (lambda x, y: F.gelu(x) + y, lambda: (_randn(129, 513), _randn(129, 513))),
    "attention": (lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) @ v,
                  lambda: tuple(_randn(1, 2, 256, 64) for _ in range(3))),
    "embedding": (lambda w, i: F.embedding(i, w),
                  lambda: (_randn(300, 96), torch.arange(260) * 7 % 300)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target, unit", [("trn1", None), ("trn2", None), ("trn2", 7)])
def test_looped_program_runs_as_its_straight_line_expansion(case, target, unit, monkeypatch):
    """(``unit``: the simulator and the checks take the loops in units of 7 instances, so
    every carried state -- dependent penalty, LoadStationary, PSUM groups -- crosses units.)"""
    if unit is not None:
        monkeypatch.setattr(loops, "UNIT", unit)
    fn, make = CASES[case]
    args = make()
    _, cg = compile_fn(fn, *args, target=target)
    p = cg.program
    flat = p.flat()
    assert flat.num_instructions == p.num_instructions and p.num_static <= p.num_instructions
    for checks in ("static", False):
        a = simulate(p, mode="timing", checks=checks)
        b = simulate(flat, mode="timing", checks=checks)
        assert dataclasses.asdict(a.stats) == dataclasses.asdict(b.stats)
    feed = {n: np.ascontiguousarray(to_numpy(x)) for n, x in zip(p.inputs, args)}
    a = simulate(p, feed)
    b = simulate(flat, feed)
    assert dataclasses.asdict(a.stats) == dataclasses.asdict(b.stats)
    assert a.outputs.keys() == b.outputs.keys()
    for k in a.outputs:
        assert np.array_equal(a.outputs[k], b.outputs[k])


@pytest.mark.parametrize("fn, shapes", [
    (torch.mm, [((256, 256), (256, 256)), ((2048, 1024), (1024, 2048))]),
    (lambda x: torch.softmax(x, dim=-1), [((512, 1024),), ((8192, 1024),)]),
])
def test_program_size_does_not_grow_with_the_tensors(fn, shapes):
    progs = [compile_fn(fn, *(torch.empty(s, dtype=bf16) for s in ss))[1].program for ss in shapes]
    small, big = progs
    assert big.num_instructions > 8 * small.num_instructions
    assert big.num_static <= small.num_static + 2
    assert len(str(big)) < 2 * len(str(small))


def _passes(fn, *args, target="trn2"):
    gm = trace(fn, *args)
    kp = build_kir(gm, [TensorSpec(tuple(x.shape), x.dtype) for x in args])
    fuse(kp)
    tp, _ = _tile_with_residency(kp, get_target(target))
    st = Structure(tp)
    queues = schedule(tp, get_target(target), st)
    plan = plan_memory(tp, get_target(target), st)
    return tp, st, queues, plan, synchronize(tp, queues, plan, st)


def test_emit_rejects_a_wait_for_a_later_execution_in_a_late_iteration():
    tp, st, queues, plan, sync = _passes(torch.mm, torch.empty(512, 256, dtype=bf16),
                                         torch.empty(256, 1024, dtype=bf16))
    emit_program(tp, queues, plan, sync, st)
    # a wait whose count runs ahead of the awaited instruction from the second iteration of the
    # waiting instruction's outermost loop on
    sid, ws = next((s, w) for s, w in sync.waits.items() if w and st.info[s].loops)
    var = st.info[sid].loops[0].var
    bad = Wait(ws[0].sem, ws[0].count + Affine.var(var) * 10**6, ws[0].first_gen)
    sync.waits[sid] = (bad,) + ws[1:]
    with pytest.raises(LoweringError) as e:
        emit_program(tp, queues, plan, sync, st)
    msg = str(e.value)
    assert f"instruction {sid} " in msg and f"'{var}': 1" in msg and "precede it" in msg


def test_verifier_rejects_an_offset_out_of_bounds_in_the_last_iteration():
    """Push the HBM operand of a compiled matmul's DMA out of its tensor in the last iteration of
    its outermost loop only, and nowhere else."""
    _, cg = compile_fn(torch.mm, _randn(512, 256, dtype=bf16), _randn(256, 512, dtype=bf16))
    p = cg.program
    check_program(p)
    q, stream, it, k = next((q, s, i, k) for q, s in p.streams.items() for i, _ in s.statics()
                            if isinstance(i, Looped) for k, o in enumerate(i.offsets)
                            if o is not None and o.rot is None)
    loop = stream.body[0]
    assert isinstance(loop, Loop) and loop.count >= 2
    v, n = loop.var, loop.count
    size = p.buffer(([it.ins.dst, it.ins.accum] + list(it.ins.srcs))[k].buffer).bytes_per_partition
    # size * (v + 1) - size * ((v + 1) % n): 0 for v < n - 1, size * n at v = n - 1
    o = it.offsets[k]
    late = Index(o.const + size, o.terms + ((v, size),), (1, ((v, 1),), n, -size))
    moved = dataclasses.replace(it, offsets=tuple(late if j == k else x for j, x in enumerate(it.offsets)))
    bad = dataclasses.replace(p, streams={**p.streams, q: Stream(_swap(stream.body, it, moved))})
    changed = [i for i, (a, b) in enumerate(zip(bad.flat().streams[q], p.flat().streams[q])) if a != b]
    assert changed and min(changed) >= len(stream) * (n - 1) // n    # only the last iteration
    with pytest.raises(BoundsError) as e:
        check_program(bad)
    err = e.value
    assert err.queue == q and f"{v}={n - 1}" in str(err) and "outside buffer" in str(err)
    assert err.index >= len(stream) * (n - 1) // n          # an instance of the last iteration
    with pytest.raises(BoundsError) as f:
        check_program(bad.flat())
    assert (f.value.queue, f.value.index, f.value.instr) == (err.queue, err.index, err.instr)


def _swap(body, old, new):
    out = []
    for it in body:
        if isinstance(it, Loop):
            out.append(Loop(it.var, it.count, tuple(_swap(it.body, old, new))))
        else:
            out.append(new if it is old else it)
    return out


def test_side_by_side_columns_of_a_row_major_tensor_do_not_overlap():
    """Two stores of [128 rows, 512 columns] into one [128, 8192] tensor, 512 columns apart:
    their bounding boxes overlap, their bytes do not (``sync._rows``); at 256 columns apart
    they do share bytes."""
    from lowering.tir.ir import TAP
    from lowering.tir.sync import _can_overlap, _window
    from runtime_sim.isa import DType

    def store(col: int) -> TAP:
        return TAP("out", 0, 1, Affine(col * 2), ((8192, 128), (1, 512)), DType.BF16)

    a = store(0)
    for col, meets in ((512, False), (1024, False), (256, True), (8192 - 256, True), (0, True)):
        b = store(col)
        assert _can_overlap(b.offset - a.offset, _window(a, b), {}) is meets, col
    # a loop of such stores, one per 512 columns: two different iterations never meet
    b = TAP("out", 0, 1, Affine.var("j") * 1024, ((8192, 128), (1, 512)), DType.BF16)
    assert not _can_overlap(b.offset.subs({"j": Affine.var("j") + 1}) - b.offset,
                            _window(b, b), {"j": 15})
