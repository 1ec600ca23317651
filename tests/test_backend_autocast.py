"""The ``auto_cast`` option: fp32 matmuls (or all fp32 ops) computed in bf16, graph I/O dtypes
unchanged, and an error that grows to bf16 size (so the cast demonstrably happened)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compiler
from neuron_compiler.autocast import apply_auto_cast
from neuron_compiler.errors import NeuronOptionError
from neuron_compiler.options import validate_options

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()


def _aten_graph(model, x):
    params = dict(model.named_parameters())

    def f(p, x):
        return torch.func.functional_call(model, p, (x,))
    return make_fx(f, tracing_mode="fake")(params, x)


def _dtypes(gm):
    return {n.name: n.meta["val"].dtype for n in gm.graph.nodes
            if isinstance(n.meta.get("val"), torch.Tensor)}


@pytest.mark.parametrize("mode", ["matmul", "all"])
def test_pass_retypes_interior_keeps_io(mode):
    x = torch.randn(8, 64)
    gm = _aten_graph(_mlp(), x)
    outs_before = [a.meta["val"].dtype for a in gm.graph.output_node().args[0]]
    n = apply_auto_cast(gm, mode)
    assert n == (2 if mode == "matmul" else 3)            # the two addmm (+ gelu for "all")
    gm.graph.lint()
    assert [a.meta["val"].dtype for a in gm.graph.output_node().args[0]] == outs_before
    targets = [nd.target for nd in gm.graph.nodes if nd.op == "call_function"]
    matmuls = [nd for nd in gm.graph.nodes if nd.target in (aten.addmm.default, aten.mm.default)]
    assert matmuls and all(nd.meta["val"].dtype == torch.bfloat16 for nd in matmuls)
    gelu = next(nd for nd in gm.graph.nodes if nd.target is aten.gelu.default)
    assert gelu.meta["val"].dtype == (torch.bfloat16 if mode == "all" else torch.float32)
    casts = targets.count(aten._to_copy.default)
    # matmul: 3 + 1 casts per linear; all: the GELU reads the first addmm's bf16 result directly
    assert casts == (8 if mode == "matmul" else 6)
    assert apply_auto_cast(_aten_graph(_mlp(), x), "none") == 0


def test_option_is_validated():
    assert validate_options({"auto_cast": "matmul"}).auto_cast == "matmul"
    assert validate_options(None).auto_cast == "none"
    with pytest.raises(NeuronOptionError, match="'auto_cast' must be one of 'none', 'matmul', "
                                                "'all'"):
        validate_options({"auto_cast": "bf16"})


def test_auto_cast_error_is_bf16_sized_and_runs_on_device():
    model, x = _mlp(), torch.randn(32, 64)
    ref = model(x)
    errs = {}
    for mode in ("none", "matmul", "all"):
        torch._dynamo.reset()
        cm = torch.compile(model, backend="neuron", options={"auto_cast": mode})
        with torch.no_grad(), neuron_compiler.profile() as prof:
            y = cm(x)
        d = prof.to_dict()
        assert y.dtype == torch.float32 and d["fallback_nodes"] == 0 and d["partitions"]
        ops = {op for p in d["partitions"] for op in p["ops"]}
        assert ("aten._to_copy.default" in ops) == (mode != "none")
        errs[mode] = (y - ref).abs().max().item()
    assert errs["none"] < 1e-4
    assert 1e-3 < errs["matmul"] < 5e-2 and 1e-3 < errs["all"] < 5e-2
