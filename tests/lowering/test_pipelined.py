"""The tile IR's software-pipelining construct (lowering/tir/pipelined.py): issue order, loop
formation, slot rotation, the body's calls, its errors, and the golden text of a pipelined loop.

Each stage of the test body loads one element of an HBM tensor into its iteration's set: the
element's index encodes (iteration, stage), so expanding the emitted loops gives back the
issue order, which must equal ``steps`` (the construct's order with every step unrolled)."""
from __future__ import annotations

import pytest

from lowering.errors import LoweringError
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import Loop
from lowering.tir.pipelined import Stage, pipelined, steps
from runtime_sim.isa import DType, Memory
from runtime_sim.targets import get_target
from test_golden import assert_golden

F32 = DType.FP32
GROUPS = (Stage("A", 0), Stage("C", 1), Stage("I", -1), Stage("B", 0))   # attention's groups


def _build(n: int, stages, depth: int = 2, loop: bool = True, fill: bool = False, **kw):
    b = TirBuilder(get_target("trn2"))
    S = len(stages)
    b.hbm_tensor("x", n * S * 4, F32, "input")
    sets = [{s.name: b.tile(f"{s.name}{u}", Memory.SBUF, 1, 1, F32) for s in stages}
            for u in range(depth)]
    calls: list[tuple[object, int]] = []

    def body(i, slot):
        calls.append((i, slot))

        def stage(x: int, name: str):
            return lambda: b.dma(sets[slot][name].ap(), hbm_ap("x", F32, i * S + x, 1, 1, ()))
        return {s.name: stage(x, s.name) for x, s in enumerate(stages)}

    pipelined(b, n, stages, body, depth=depth, hint="p", loop=loop, fill=fill, **kw)
    return b.program(("x",), ()), calls


def _expand(body, env=None):
    """(element index, destination tile) of every load, in program order, loops expanded."""
    env = env or {}
    for st in body:
        if isinstance(st, Loop):
            for v in range(st.count):
                yield from _expand(st.body, {**env, st.var: v})
        else:
            yield st.srcs[0].offset.eval(env) // 4, st.dst.buf


def _order(tp, stages):
    S = len(stages)
    return [(stages[e % S].name, e // S, buf) for e, buf in _expand(tp.body)]


def _expected(n, stages, depth, fill=False):
    return [(s.name, i, f"{s.name}{i % depth}") for step in steps(n, stages, fill)
            for s, i in step]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 9])
@pytest.mark.parametrize("loop", [True, False])
def test_issue_order_and_slots_are_the_unrolled_steps(n, loop):
    tp, _ = _build(n, GROUPS, loop=loop)
    got = _order(tp, GROUPS)
    assert got == _expected(n, GROUPS, 2)
    # every stage of every iteration exactly once
    assert sorted((s, i) for s, i, _ in got) == sorted((s.name, i) for s in GROUPS for i in range(n))


ITEMS = (Stage("late_t", -1), Stage("recips", 0), Stage("early", -3), Stage("late", 0))


@pytest.mark.parametrize("n", [4, 5, 9, 13])
def test_fill_queues_the_leading_stage_first_in_the_prologue(n):
    """attention's items, 4 deep: early(0), early(1), early(2), then late_t(0); then steps."""
    tp, _ = _build(n, ITEMS, depth=4, fill=True)
    got = _order(tp, ITEMS)
    assert got == _expected(n, ITEMS, 4, fill=True)
    assert [(s, i) for s, i, _ in got[:4]] == [("early", 0), ("early", 1), ("early", 2),
                                                ("late_t", 0)]
    assert got != _expected(n, ITEMS, 4)          # step by step: late_t(0) before early(2)


@pytest.mark.parametrize("n,uniform,trips", [(8, 8, 3), (8, 6, 2), (8, 3, 1), (8, 2, 0), (2, 2, 0)])
def test_loop_from_and_uniform_bound_the_loop(n, uniform, trips):
    """One stage (outres' chunks): iteration 0 alone, the loop over pairs of iterations in
    1 .. uniform - 1, the rest one by one; the order is the steps' whatever the bounds."""
    one = (Stage("c", 0),)
    tp, _ = _build(n, one, uniform=uniform, loop_from=1)
    assert _order(tp, one) == _expected(n, one, 2)
    loops = [st for st in tp.body if isinstance(st, Loop)]
    assert [lp.count for lp in loops] == ([trips] if trips > 1 else [])   # one trip: no loop
    if trips > 1:
        assert not isinstance(tp.body[0], Loop)      # iteration 0 before the loop


def test_a_known_wrong_order_fails_the_comparison():
    tp, _ = _build(6, GROUPS)
    got = _order(tp, GROUPS)
    swapped = got[:3] + [got[4], got[3]] + got[5:]
    assert swapped != _expected(6, GROUPS, 2)


def test_the_steady_state_is_one_loop_of_depth_steps_per_trip():
    tp, calls = _build(9, GROUPS)        # lags -1..1: 7 steady steps, 3 trips of 2, one left
    loops = [st for st in tp.body if isinstance(st, Loop)]
    assert len(loops) == 1 and loops[0].count == 3
    assert len(loops[0].body) == 2 * len(GROUPS)     # two static copies of one step
    # the loop's copies call the body with affine iterations, once per iteration and copy;
    # unrolled steps with ints, once per iteration
    ints = [i for i, _ in calls if isinstance(i, int)]
    assert len(ints) == len(set(ints))
    affine = [i for i, _ in calls if not isinstance(i, int)]
    assert len(affine) == 2 * 3            # per copy: iterations t-1, t+1 and t (A, B share)


def test_without_loop_every_iteration_is_one_call():
    _, calls = _build(5, GROUPS, loop=False)
    assert [i for i, _ in calls] == sorted(i for i, _ in calls) == list(range(5))
    assert all(u == i % 2 for i, u in calls)


def test_copies_of_a_stage_are_scheduled_as_its_first():
    tp, _ = _build(6, GROUPS, loop=False)
    ins = list(tp.body)
    first: dict[str, int] = {}
    for st in ins:
        name = st.dst.buf[0]
        if name not in first:
            assert st.copy_of is None
            first[name] = st.sid
        else:
            assert st.copy_of == first[name]


def test_errors_name_the_constraint():
    with pytest.raises(LoweringError, match="of 0 iterations"):
        _build(0, GROUPS)
    with pytest.raises(LoweringError, match="distinct"):
        _build(3, (Stage("A", 0), Stage("A", 1)))
    # I(t+1) issued before C(t-1) in a step: with two sets, I(t+1) would take C(t-1)'s set first
    with pytest.raises(LoweringError, match="stage I of iteration i \\+ 2 .* stage C of iteration i"):
        _build(4, (Stage("I", -1), Stage("A", 0), Stage("C", 1)))
    _build(4, (Stage("I", -1), Stage("A", 0), Stage("C", 1)), depth=3)      # three sets: fine


def test_golden_text_of_a_pipelined_loop(request):
    """load(t+1) ahead of use(t): the prologue's load(0), a loop of two static copies (slots 1,
    0 then 0, 1), the unrolled rest; review a diff of this file like code."""
    tp, _ = _build(6, (Stage("use", 0), Stage("load", -1)))
    assert_golden("pipelined_loop", {"tir.txt": str(tp)}, ("tir.txt",), request.config)


def test_no_tiler_unrolls_a_pipeline_by_hand():
    """The builder's construct hooks are called from the construct alone."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "lowering"
    hooks = re.compile(r"\._(replica|single_slot_loop|single_slot)\(")
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if hooks.search(p.read_text()))
    assert users == ["tir/pipelined.py"], users
