"""Structural rules of the lowering (DESIGN.md "Three packages, one direction", "Style").

- Imports run one way: ``lowering`` never imports ``neuron_compiler`` (``runtime_sim`` importing
  no torch is covered by tests/machine/test_checks.py).
- Registry membership IS the support table: an op without a rule is reported unsupported with a
  reason that names it; a registered op on a bad dtype names the dtype.
- The memory planner never gives two buffers that are live at the same time overlapping bytes
  (aliases excepted: see tir/ir.py), and keeps every buffer within the partition; the simulator's checks (capacity, races, uninitialised
  reads) pass on the compiled program.
"""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lowering
from lowering.api import TensorSpec, why_unsupported
from lowering.frontend import build_kir
from lowering.passes.fusion import fuse
from lowering.registry import REGISTRY, _ensure_loaded
from lowering.tiling import tile_program
from lowering.tir.plan import plan_memory
from lowering_helpers import check, compile_fn, rand, trace, unsupported_nodes
from runtime_sim.isa import Memory
from runtime_sim.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
aten = torch.ops.aten


def _run_isolated(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def _lowering_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(lowering.__path__, "lowering."))


# ---- one-way imports ------------------------------------------------------------------------
def test_lowering_does_not_import_neuron_compiler():
    """``import lowering.api`` (and then every lowering module) in a fresh interpreter loads no
    ``neuron_compiler`` module."""
    mods = _lowering_modules()
    assert "lowering.pipeline" in mods and "lowering.ops.matmul" in mods
    r = _run_isolated(
        "import importlib, sys\n"
        "import lowering.api\n"
        "def bad():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] == 'neuron_compiler')\n"
        "assert not bad(), ('lowering.api', bad())\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "    assert not bad(), (m, bad())\n")
    assert r.returncode == 0, r.stderr


def test_no_lowering_source_mentions_neuron_compiler_import():
    """A lazy ``import neuron_compiler`` inside a function would escape the subprocess check."""
    offenders = []
    for path in (ROOT / "lowering").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            if s.startswith(("import neuron_compiler", "from neuron_compiler")):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {s}")
    assert not offenders, offenders


# ---- the registry is the support table ------------------------------------------------------
def _node_of(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def test_unregistered_op_reason_names_the_op():
    gm = trace(lambda x: torch.fft.rfft(x), rand(8, 16))
    node = _node_of(gm, aten._fft_r2c.default)
    assert aten._fft_r2c.default not in REGISTRY
    reason = why_unsupported(node)
    assert reason is not None and "_fft_r2c" in reason, reason


def test_registered_op_is_supported_and_rule_matches_target():
    _ensure_loaded()
    gm = trace(lambda x, y: torch.relu(x @ y), rand(8, 16), rand(16, 4))
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert why_unsupported(n) is None
            assert n.target in REGISTRY
    for target, rule in REGISTRY.items():
        assert rule.target is target
        assert isinstance(target, torch._ops.OpOverload), target


def test_unsupported_dtype_reason_names_op_and_dtype():
    gm = trace(lambda x: x + 1, torch.ones(4, 4, dtype=torch.float64))
    node = _node_of(gm, aten.add.Tensor)
    reason = why_unsupported(node)
    assert reason is not None and "add" in reason and "float64" in reason, reason


def test_integer_graph_input_arithmetic_is_supported_and_int64_division_by_a_tensor_is_not():
    """Integer arithmetic on a graph input is exact (the integer ALU; tests/lowering/
    test_int_exact.py); int64 division of one by a tensor has no exact sequence and falls back."""
    gm = trace(lambda x: x + 1, torch.ones(4, 4, dtype=torch.int64))
    assert not unsupported_nodes(gm)
    gm = trace(lambda x: x // x.t(), torch.ones(4, 4, dtype=torch.int64))
    bad = unsupported_nodes(gm)
    assert bad and "graph input" in bad[0] and "int64 division" in bad[0], bad


def test_non_call_nodes_are_not_lowered():
    gm = trace(lambda x: x * 2, rand(4))
    ph = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert why_unsupported(ph) is not None


# ---- memory planning ------------------------------------------------------------------------
def _graph_zoo():
    def block(x, w1, b1, w2, g, beta):
        h = F.gelu(F.linear(x, w1, b1))
        y = F.linear(h, w2) + x
        y = F.layer_norm(y, (y.shape[-1],), g, beta)
        return torch.softmax(y @ y.t() * 0.1, dim=-1)
    d, f = 96, 384
    return block, (rand(257, d, seed=1), rand(f, d, seed=2) * 0.1, rand(f, seed=3),
                   rand(d, f, seed=4) * 0.1, rand(d, seed=5), rand(d, seed=6))


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_planner_never_overlaps_live_pools(target):
    """Buffers whose lifetimes (top-level statements of the tile program) overlap never share
    bytes, unless one is an alias of the other (a partial tile reusing its loop's tile, which
    the sync pass orders); every buffer stays within the partition; PSUM buffers start on a
    bank; the reported peak is the highest end."""
    fn, inputs = _graph_zoo()
    gm = trace(fn, *inputs)
    assert not unsupported_nodes(gm)
    kp = build_kir(gm, [TensorSpec(tuple(x.shape), x.dtype) for x in inputs])
    fuse(kp)
    t = get_target(target)
    tp, _ = tile_program(kp, t)
    plan = plan_memory(tp, t)
    caps = {Memory.SBUF: t.sbuf_bytes_per_partition, Memory.PSUM: t.psum_bytes_per_partition}
    used = [b for b in tp.buffers if b.name in plan.offsets]
    assert used
    for mem, cap in caps.items():
        bufs = [b for b in used if b.memory is mem]
        for b in bufs:
            off, size = plan.offsets[b.name], plan.size(b)
            assert 0 <= off and off + size <= cap, f"{b.name} @{off}+{size} exceeds {cap}"
            if mem is Memory.PSUM:
                assert off % t.psum_bank_bytes == 0, b.name
        roots = [b for b in bufs if b.alias is None]
        for i, p in enumerate(roots):
            for q in roots[i + 1:]:
                (pf, pl), (qf, ql) = plan.lifetimes[p.name], plan.lifetimes[q.name]
                po, qo = plan.offsets[p.name], plan.offsets[q.name]
                live_together = pf <= ql and qf <= pl
                share_bytes = po < qo + plan.size(q) and qo < po + plan.size(p)
                assert not (live_together and share_bytes), (
                    f"{mem.value}: {p.name} [{pf},{pl}] @{po}+{plan.size(p)} overlaps "
                    f"{q.name} [{qf},{ql}] @{qo}+{plan.size(q)}")
        for b in bufs:
            if b.alias is not None:
                root = tp.buffer(b.alias)
                assert plan.offsets[b.name] == plan.offsets[root.name]
                assert plan.size(b) <= plan.size(root) and b.partitions <= root.partitions
        if roots:
            assert plan.peaks[mem] == max(plan.offsets[b.name] + plan.size(b) for b in roots)


def test_compiled_program_passes_simulator_checks():
    """Functional simulation with every check on (capacity, bounds, races, uninitialised reads)
    passes, and values match eager."""
    fn, inputs = _graph_zoo()
    low = check(fn, *inputs, scale=8.0)
    prog = low.compiled.program
    t = get_target(prog.target)
    for buf in prog.buffers:
        if buf.memory is Memory.SBUF:
            assert buf.offset + buf.bytes_per_partition <= t.sbuf_bytes_per_partition
    assert low.result.stats.sbuf_peak_bytes > 0


def test_compile_is_deterministic():
    fn, inputs = _graph_zoo()
    d1: dict[str, str] = {}
    d2: dict[str, str] = {}
    compile_fn(fn, *inputs, dumps=d1)
    compile_fn(fn, *inputs, dumps=d2)
    assert d1.keys() == d2.keys()
    for k in ("ir_pre_fusion.txt", "ir_post_fusion.txt", "memory_plan.txt"):
        assert d1[k] == d2[k], k


def test_builder_refuses_a_tile_used_after_its_slot_was_reused():
    """A tile rotates through its slots with the loop it was taken in; touching it after that
    loop closed would read a newer allocation's values silently, so the builder raises."""
    from lowering.errors import LoweringError
    from lowering.tir.builder import TirBuilder
    from runtime_sim.isa import DType, Memory
    from runtime_sim.targets import get_target

    b = TirBuilder(get_target("trn2"))
    keep = b.tile("keep", Memory.SBUF, 8, 4, DType.FP32)     # taken outside every loop
    with b.loop(4, "i"):
        t = b.tile("t", Memory.SBUF, 8, 4, DType.FP32)
        b.memset(t.ap(), 1.0)
        b.tensor_copy(keep.ap(), t.ap())                     # inside its loop: fine
    with pytest.raises(LoweringError, match="outside its loop"):
        b.tensor_copy(keep.ap(), t.ap())
