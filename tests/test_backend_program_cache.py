"""Identical partitions are lowered once per process; internal compile errors name the graph,
the partition and the op, and are never turned into a fallback."""
from __future__ import annotations

import os

import pytest
import torch

from neuron_compiler.errors import NeuronInternalError
from neuron_compiler.runtime import program_cache_info
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def no_cumsum(monkeypatch):
    api = pytest.importorskip("lowering.api")
    real = api.why_unsupported

    def why_unsupported(node):
        if "cumsum" in str(node.target):
            return "cumsum: rejected by the test"
        return real(node)

    monkeypatch.setattr(api, "why_unsupported", why_unsupported)


def blocks(x, ws, scales):
    """Identical layers cut apart by an eager op: one device partition per layer."""
    for w, c in zip(ws, scales):
        x = torch.cumsum(torch.relu(x @ w) * c * 0.1, 0)
    return x


def _layers(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(20, 20, generator=g) * 0.3 for _ in range(n)]   # shapes unique to this file


def test_identical_partitions_are_lowered_once(no_cumsum):
    ws = _layers(4)
    f = compile_for_neuron(lambda x, *ws: blocks(x, ws, (2.0,) * 4))
    x = torch.randn(12, 20)
    before = program_cache_info()
    with torch.no_grad():
        out, prof = run_on_device(f, x, *ws)
    torch.testing.assert_close(out, blocks(x, ws, (2.0,) * 4), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.5)
    assert len(d["partitions"]) == 4
    assert d["compiles"] == 4                       # four specialisations were prepared ...
    assert d["program_cache"] == {"hits": 3, "misses": 1, "disk_hits": 0}  # ... one lowered
    after = program_cache_info()
    assert after["hits"] - before["hits"] == 3 and after["misses"] - before["misses"] == 1
    programs = {id(r.compiled) for r in prof._parts.values()}
    assert len(programs) == 1                       # the four partitions share one program


def test_different_constants_are_different_programs(no_cumsum):
    ws = _layers(3, seed=1)
    scales = (2.0, 3.0, 2.0)
    f = compile_for_neuron(lambda x, *ws: blocks(x, ws, scales))
    x = torch.randn(13, 20)     # rows unique to this test: no program of another test matches
    with torch.no_grad():
        out, prof = run_on_device(f, x, *ws)
    torch.testing.assert_close(out, blocks(x, ws, scales), rtol=1e-4, atol=1e-4)
    d = assert_ran_on_device(prof, min_device_fraction=0.5)
    assert d["program_cache"] == {"hits": 1, "misses": 2, "disk_hits": 0}


def test_a_cache_hit_still_writes_a_complete_dump(no_cumsum, tmp_path):
    ws = _layers(2, seed=2)
    f = compile_for_neuron(lambda x, *ws: blocks(x, ws, (2.0, 2.0)),
                           options={"dump_dir": str(tmp_path)})
    with torch.no_grad():
        _, prof = run_on_device(f, torch.randn(12, 20), *ws)
    assert prof.to_dict()["program_cache"]["hits"] == 1
    (cdir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    dirs = sorted(p for p in cdir.iterdir() if p.is_dir())
    assert [p.name for p in dirs] == ["fused_0.s0", "fused_1.s0"]
    hit = [p for p in dirs if (p / "cache_hit.txt").exists()]
    assert len(hit) == 1
    (origin,) = set(dirs) - set(hit)
    assert set(os.listdir(hit[0])) == set(os.listdir(origin)) | {"cache_hit.txt"}
    assert origin.name.split(".")[0] in (hit[0] / "cache_hit.txt").read_text()
    assert (hit[0] / "program.txt").read_text() == (origin / "program.txt").read_text()


# ---- internal errors ---------------------------------------------------------------------------
def _break_lowering(monkeypatch, make_exc):
    api = pytest.importorskip("lowering.api")

    def compile_graph(gm, specs, target, dump=None, name=None):
        raise make_exc(gm)

    monkeypatch.setattr(api, "compile_graph", compile_graph)


def _mul_node(gm):
    return next(n for n in gm.graph.nodes if "mul" in str(n.target))


def test_internal_error_names_graph_partition_and_op(monkeypatch):
    from lowering.errors import LoweringError
    _break_lowering(monkeypatch, lambda gm: LoweringError(
        f"lowering {_mul_node(gm).format_node()} failed: tile of 8192 B/partition does not fit "
        f"pool k0.work slots of 4096 B"))
    f = compile_for_neuron(lambda x: torch.relu(x * 2.0) + 1.0)
    with pytest.raises(NeuronInternalError) as info, torch.no_grad():
        f(torch.randn(4, 8))
    e = info.value
    msg = str(e)
    assert e.graph.startswith("inference_") and e.graph in msg
    assert e.partition == "fused_0" and f"{e.graph}/fused_0" in msg
    assert "float32[4, 8]" in msg                                   # the signature
    assert e.ops == ["aten.mul.Tensor (node mul)"] and "aten.mul.Tensor (node mul)" in msg
    assert "aten.relu.default" in msg and "aten.add.Tensor" in msg  # the partition's other ops
    assert "LoweringError" in msg and "does not fit pool k0.work" in msg
    assert isinstance(e.__cause__, LoweringError)


def test_internal_error_without_a_node_name_lists_every_op(monkeypatch):
    _break_lowering(monkeypatch, lambda gm: ValueError("k3: bad tile plan"))
    f = compile_for_neuron(lambda x: torch.relu(x * 2.0))
    with pytest.raises(NeuronInternalError) as info, torch.no_grad():
        f(torch.randn(4, 8))
    assert info.value.ops == ["aten.mul.Tensor x1", "aten.relu.default x1"]
    assert "ValueError: k3: bad tile plan" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
