"""Hand-unrolled copies of one body (TirBuilder._replica) are scheduled alike, as the iterations
of a loop are; _single_slot gives tiles of far-apart uses one slot."""
from __future__ import annotations

from lowering.tir.analysis import Structure
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.schedule import schedule
from runtime_sim.isa import AluOp, DType, EngineKind, Memory
from runtime_sim.targets import get_target

F32 = DType.FP32


def _copies(n: int, replicate: bool, width: int = 512, target: str = "trn2"):
    """``n`` copies of a body of eight flexible elementwise steps on [128, width] tiles,
    preceded by fixed-engine work (copies that only VectorE takes) that skews the balance."""
    b = TirBuilder(get_target(target))
    b.hbm_tensor("x", 128 * width * 4, F32, "input")
    copies = []
    with b.loop(2, "o"):                 # one top-level statement: one balance for the lot
        t = b.tile("x", Memory.SBUF, 128, width, F32)
        b.dma(t.ap(), hbm_ap("x", F32, 0, 128, width, ((width, 1),)))
        for _ in range(6):
            w = b.tile("w", Memory.SBUF, 128, width, F32)
            b.tensor_copy(w.ap(), t.ap(), engines=(EngineKind.VECTOR,))
        for _ in range(n):
            before = b._sid
            if replicate:
                with b._replica("body"):
                    _body(b, t, width)
            else:
                _body(b, t, width)
            copies.append(list(range(before, b._sid)))
    tp = b.program(("x",), ())
    return tp, schedule(tp, b.target, Structure(tp)), copies


def _body(b: TirBuilder, t, width: int) -> None:
    """Eight independent steps, each from the loaded tile into a tile of its own."""
    for i in range(8):
        d = b.tile("y", Memory.SBUF, 128, width, F32)
        b.tensor_scalar(d.ap(), t.ap(), AluOp.ADD, float(i))


def test_replicas_point_at_their_counterparts_and_take_their_engines():
    tp, queues, copies = _copies(4, True)
    first = copies[0]
    ins = {i.sid: i for i in tp.body[0].body}
    for c in copies[1:]:
        assert [ins[s].copy_of for s in c] == first
        assert [queues[s] for s in c] == [queues[s] for s in first]
    assert all(ins[s].copy_of is None for s in first)


def test_without_replicas_the_greedy_balance_drifts_from_copy_to_copy():
    """What replica prevents: fresh choices per copy give copies different engine patterns."""
    _, queues, copies = _copies(4, False)
    patterns = {tuple(queues[s].engine for s in c) for c in copies}
    assert len(patterns) > 1


def test_a_copy_with_another_op_at_a_position_is_scheduled_on_its_own():
    b = TirBuilder(get_target("trn2"))
    t = b.tile("x", Memory.SBUF, 128, 64, F32)
    b.memset(t.ap(), 0.0)
    with b._replica("r"):
        b.tensor_scalar(t.ap(), t.ap(), AluOp.ADD, 1.0)
        b.tensor_scalar(t.ap(), t.ap(), AluOp.ADD, 2.0)
    with b._replica("r"):
        a = b.tensor_tensor(t.ap(), t.ap(), t.ap(), AluOp.ADD)   # position 0: another op
        c = b.tensor_scalar(t.ap(), t.ap(), AluOp.ADD, 3.0)      # position 1: same op
        d = b.tensor_scalar(t.ap(), t.ap(), AluOp.ADD, 4.0)      # past the first copy's end
    assert a.copy_of is None and c.copy_of == 2 and d.copy_of is None


def test_single_slot_blocks_give_one_slot_and_inner_loops_keep_theirs():
    b = TirBuilder(get_target("trn2"))
    with b.loop(4, "o"):
        with b._single_slot():
            one = b.tile("a", Memory.SBUF, 128, 64, F32)
            with b._single_slot_loop(3, "s"):
                two = b.tile("b", Memory.SBUF, 128, 64, F32)
            with b.loop(3, "i"):
                kept = b.tile("c", Memory.SBUF, 128, 64, F32)
        after = b.tile("d", Memory.SBUF, 128, 64, F32)
    assert (one.buf.bufs, two.buf.bufs, kept.buf.bufs, after.buf.bufs) == (1, 1, 2, 2)
