"""Partitioning: what is counted, what is fused, and compile-once-per-input-signature."""
from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compiler
from neuron_compiler.partition import format_plan, is_compute_node, partition_graph
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def no_cumsum(monkeypatch):
    """A registry decision we control: everything but cumsum is supported."""
    api = pytest.importorskip("lowering.api")

    def why_unsupported(node):
        if "cumsum" in str(node.target):
            return "cumsum: not lowered (test rule)"
        return None

    monkeypatch.setattr(api, "why_unsupported", why_unsupported)


def graph_with_a_hole(x, w):
    a = torch.relu(x @ w)                 # mm, relu
    b = torch.cumsum(a, 0)                # unsupported
    c = b * 2 + a                         # mul, add
    v, m = torch.var_mean(c, dim=1)       # one multi-output node + 2 getitems
    return v + m, c.t()                   # add, t (a view: counted)


def test_counts_and_partitions(no_cumsum):
    gm = make_fx(graph_with_a_hole)(torch.randn(8, 16), torch.randn(16, 16))
    counted = [n for n in gm.graph.nodes if is_compute_node(n)]
    assert len(counted) == 8
    plan = partition_graph(gm)
    assert plan.device_nodes == 7 and plan.fallback_nodes == 1
    assert [(e.op, e.count) for e in plan.fallbacks] == [("aten.cumsum.default", 1)]
    assert "test rule" in plan.fallbacks[0].reason
    assert len(plan.device_partitions) == 2   # merging across the cumsum would form a cycle
    ops = set()
    for name in plan.device_partitions:
        ops |= set(plan.partition_ops[name])
        sub = getattr(plan.gm, name)
        getitems = [n for n in sub.graph.nodes if n.target is operator.getitem]
        if "aten.var_mean.correction" in plan.partition_ops[name]:
            assert len(getitems) == 2       # getitems follow their producer
    assert "aten.t.default" in ops and "aten.mm.default" in ops
    text = format_plan(plan)
    assert "aten.cumsum.default x1: cumsum: not lowered (test rule)" in text
    # the fused graph still computes the same thing
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    for got, exp in zip(plan.gm(x, w), graph_with_a_hole(x, w)):
        torch.testing.assert_close(got, exp)


def test_shape_queries_are_not_counted_or_partitioned(no_cumsum):
    def f(x):
        return (x * 2).view(x.shape[0] * x.shape[1])

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 6))
    sym = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sym_size.int]
    assert sym, gm.code
    assert not any(is_compute_node(n) for n in sym)
    plan = partition_graph(gm)
    assert plan.device_nodes == 2 and plan.fallback_nodes == 0
    outer_targets = {n.target for n in plan.gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.sym_size.int in outer_targets


def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def test_compiled_once_per_input_signature():
    f = compile_for_neuron(mlp)
    w1, w2 = torch.randn(32, 64), torch.randn(64, 8)
    compiles = []
    with torch.no_grad():
        for rows in (16, 16, 24, 40, 24, 16):
            x = torch.randn(rows, 32)
            out, prof = run_on_device(f, x, w1, w2)
            torch.testing.assert_close(out, mlp(x, w1, w2), rtol=1e-4, atol=1e-4)
            assert_ran_on_device(prof)
            compiles.append(prof.to_dict()["compiles"])
    # 16: new; 16: cached; 24: Dynamo recompiles with dynamic shapes -> new; 40: a new
    # signature of the dynamic graph -> new; 24: cached; 16: Dynamo picks the (newer) dynamic
    # graph, for which 16 is a new signature -> new
    assert compiles == [1, 0, 1, 1, 0, 1]


def reshaping(x, w):
    h = (x @ w).relu()
    b, n = h.shape
    return h.reshape(b * 2, n // 2).sum(-1) + b   # SymInt inputs to the device partition


def test_dynamic_shapes_are_specialised_per_signature(tmp_path):
    f = compile_for_neuron(reshaping, dynamic=True, options={"dump_dir": str(tmp_path)})
    w = torch.randn(32, 64)
    with torch.no_grad():
        for rows in (5, 9):
            x = torch.randn(rows, 32)
            out, prof = run_on_device(f, x, w)
            torch.testing.assert_close(out, reshaping(x, w), rtol=1e-4, atol=1e-4)
            d = assert_ran_on_device(prof)
            assert d["partitions"][0]["input_shapes"] == [[rows, 32], [32, 64]]
            assert d["compiles"] == 1
    (cdir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "Sym(" in (cdir / "fx_graph_partitioned.py").read_text()
    specialised = (cdir / "fused_0.s1" / "fx_graph_readable.py").read_text()
    assert "Sym(" not in specialised and "[18, 32]" in specialised   # 2 * 9 rows, 64 // 2


def test_graph_break_gives_two_graphs():
    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    cf = compile_for_neuron(f)
    with torch.no_grad(), neuron_compiler.profile() as prof:
        out = cf(torch.ones(4))
    torch.testing.assert_close(out, torch.full((4,), 3.0))
    assert len(prof.to_dict()["graphs"]) == 2
