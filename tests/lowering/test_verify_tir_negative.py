"""Negative tests of ``lowering.tir.verify.verify_tir``: for every error site of the verifier, a
minimal ill-formed tile program that triggers exactly that site (issue 26, item 4).

The base program copies ``x`` to ``y`` through a double-buffered SBUF tile, one 4x8 fp32 tile
per iteration of loop ``i0`` (built directly, so every field is visible;
``test_real_graph_tir_passes_and_a_corruption_fails`` shows the same on a tiled graph). Each
case corrupts it in one place; the test asserts the message with ``pytest.raises(match=...)``
built from the site's template and that no other site's template matches it.
``test_every_site_has_a_negative_test`` compares the covered templates with the raise sites
read from the verifier's source (``verifier_sites.py``).
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

import lowering.pipeline as pipeline
import lowering.tir.verify as tir_verify
from lowering.errors import LoweringError
from lowering.tir.affine import Affine
from lowering.tir.ir import TAP, Loop, TBuf, TInstr, TProgram
from lowering.tir.verify import verify_tir
from lowering_helpers import compile_fn, rand
from runtime_sim.isa import DmaAttrs, DType, IotaAttrs, Memory, Op
from verifier_sites import assert_covered, error_sites, regex, sites_matching

F32 = DType.FP32
SITES = error_sites(tir_verify)
I = Affine.var("i0")
ROW = 8 * 4                    # bytes of one 8-float row of x / y


def hbm(name: str, offset: Affine) -> TAP:
    """4 rows of 8 floats of an HBM tensor (partition-major [4, 8] view)."""
    return TAP(name, 0, 1, offset, ((8, 4), (1, 8)), F32)


def tile(p0: int = 0, parts: int = 4, size: int = 8, offset: Affine = Affine(0)) -> TAP:
    return TAP("s", p0, parts, offset, ((1, size),), F32)


def load(sid: int = 0) -> TInstr:
    return TInstr(sid, Op.DMA_COPY, tile(), (hbm("x", I * (4 * ROW)),), DmaAttrs(), tag="k0:load")


def store(sid: int = 2) -> TInstr:
    return TInstr(sid, Op.DMA_COPY, hbm("y", I * (4 * ROW)), (tile(),), DmaAttrs(), tag="k0:store")


def iota(sid: int = 1) -> TInstr:
    """Overwrites the tile with its positions, ``base`` following the tile (``dyn_attrs``)."""
    return TInstr(sid, Op.IOTA, tile(), (), IotaAttrs(0, 8, (1,)), tag="k0:iota",
                  dyn_attrs=(("base", I * 32),))


def program(*body, buffers=None) -> TProgram:
    bufs = buffers or (TBuf("x", Memory.HBM, 1, (8 * ROW,), DType.UINT8, role="input"),
                       TBuf("y", Memory.HBM, 1, (8 * ROW,), DType.UINT8, role="output"),
                       TBuf("s", Memory.SBUF, 4, (8,), F32, bufs=2, scope="i0"))
    return TProgram("trn2", bufs, body or (Loop("i0", 2, (load(), iota(), store())),),
                    ("x",), ("y",))


def base() -> TProgram:
    return program()


def _second_loop(var: str, count: int) -> Loop:
    """A loop after the first writing the whole of y again from a tile of its own."""
    t = TAP("s2", 0, 4, Affine(0), ((1, 8),), F32)
    j = Affine.var(var)
    return Loop(var, count, (
        TInstr(3, Op.IOTA, t, (), IotaAttrs(), tag="k1:iota"),
        TInstr(4, Op.DMA_COPY, hbm("y", j * (4 * ROW)), (t,), DmaAttrs(), tag="k1:store")))


def _with_second_loop(var: str, count: int = 2) -> TProgram:
    tp = base()
    s2 = TBuf("s2", Memory.SBUF, 4, (8,), F32, bufs=2, scope=var)
    return program(tp.body[0], _second_loop(var, count), buffers=tp.buffers + (s2,))


def _in_loop(*instrs) -> TProgram:
    return program(Loop("i0", 2, instrs))


CASES = {
    "tile IR: loop variable {} is used by two loops":
        # two sibling loops both named i0 (the verifier used to miss this: see the module's fix)
        lambda: _with_second_loop("i0"),
    "tile IR: loop {} runs {} times (expected >= 2)":
        lambda: _with_second_loop("j1", count=1),
    "{}: statement id not increasing (after {})":
        lambda: _in_loop(load(0), iota(2), store(1)),
    "{}: uses loop variable {} outside its loop":
        # the iota's dynamic base follows a loop variable no enclosing loop defines
        lambda: _in_loop(load(), replace(iota(), dyn_attrs=(("base", Affine.var("j9") * 32),)), store()),
    "{}: unknown buffer {}":
        lambda: _in_loop(replace(load(), srcs=(replace(hbm("x", I * (4 * ROW)), buf="nope"),)),
                         iota(), store()),
    "{}: {} uses loop variable {} outside its loop":
        lambda: _in_loop(replace(load(), srcs=(hbm("x", Affine.var("j9") * (4 * ROW)),)),
                         iota(), store()),
    "{}: {} touches {} outside its scope loop {}":
        # a store after the loop reads the tile allocated per iteration of i0
        lambda: program(Loop("i0", 2, (load(), iota(), store())),
                        TInstr(3, Op.DMA_COPY, hbm("y", Affine(0)), (tile(),), DmaAttrs(),
                               tag="k1:late")),
    "{}: {} touches partitions [{}, {}) of {}, which has {}":
        lambda: _in_loop(load(), replace(iota(), dst=tile(p0=2)), store()),
    "{}: {} reaches bytes [{}, {}) of {}, which has {} B{}":
        # one float past the 32-byte slot of s
        lambda: _in_loop(load(), replace(iota(), dst=tile(size=9)), store()),
}


def test_base_program_is_well_formed():
    verify_tir(base())
    verify_tir(_with_second_loop("j1"))


@pytest.mark.parametrize("template", list(CASES))
def test_each_site(template):
    with pytest.raises(LoweringError, match=regex(template)) as info:
        verify_tir(CASES[template]())
    msg = str(info.value)
    assert sites_matching(msg, SITES) == [template], (msg, sites_matching(msg, SITES))


@pytest.mark.parametrize("offset,span", [(I * (4 * ROW) + 4, "[4, 260)"),
                                         (I * (4 * ROW) - 4, "[-4, 252)")])
def test_hbm_access_beyond_its_tensor(offset, span):
    """The byte bound of an HBM tensor (its whole size, not a slot), over every iteration: the
    last iteration of ``x + 4`` ends 4 B past x, the first of ``x - 4`` starts 4 B before it."""
    tp = _in_loop(replace(load(), srcs=(hbm("x", offset),)), iota(), store())
    with pytest.raises(LoweringError, match=re.escape(f"reaches bytes {span} of x, which has 256 B") + "$"):
        verify_tir(tp)


def test_nested_loops_reusing_a_variable():
    """A loop inside a loop of the same variable is refused too."""
    inner = Loop("i0", 2, (iota(),))
    tp = program(Loop("i0", 2, (load(), inner, store())))
    with pytest.raises(LoweringError, match=regex("tile IR: loop variable {} is used by two loops")):
        verify_tir(tp)


def test_every_site_has_a_negative_test():
    """The covered templates are exactly the verifier's raise sites (read with ast)."""
    assert_covered(CASES, SITES)


def test_real_graph_tir_passes_and_a_corruption_fails():
    """The same route from a tiled graph: its tile IR verifies, and the same program with its
    first instruction's destination moved past its tile's partitions is refused."""
    captured = {}
    real = pipeline.verify_tir

    def spy(tp, st=None):
        captured["tp"] = tp
        real(tp, st)
    pipeline.verify_tir = spy
    try:
        compile_fn(lambda x: torch.exp(x) * 2.0, rand(130, 40, seed=1))
    finally:
        pipeline.verify_tir = real
    tp = captured["tp"]
    verify_tir(tp)
    first = next(ins for ins, _ in tp.instrs() if ins.dst is not None
                 and tp.buffer(ins.dst.buf).memory is not Memory.HBM)
    buf = tp.buffer(first.dst.buf)
    bad = replace(first, dst=replace(first.dst, partition_start=buf.partitions))
    tp2 = replace(tp, body=_replace_stmt(tp.body, first, bad), _index={})
    with pytest.raises(LoweringError, match=regex("{}: {} touches partitions [{}, {}) of {}, which has {}")):
        verify_tir(tp2)


def _replace_stmt(body, old, new):
    return tuple(Loop(s.var, s.count, _replace_stmt(s.body, old, new)) if isinstance(s, Loop)
                 else (new if s is old else s) for s in body)
