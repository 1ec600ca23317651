"""Constant folding (neuron_compiler/fold.py): input-independent subgraphs with a kernel of their
own (a cumsum) become constants at compile time; constructors, elementwise chains of them (a mask
from arange), random ops and anything reading an input stay in the graph."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compiler
from neuron_compiler.fold import fold_constants


def _causal_scores(x):
    n = x.shape[-1]
    i = torch.arange(n)
    keep = (i[:, None] >= i[None, :]) & torch.full((), True)
    pos = torch.cumsum(torch.ones(n, dtype=torch.int64), 0)
    return torch.softmax(x.masked_fill(~keep, float("-inf")) + pos.to(x.dtype) * 0.01, -1)


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_mask_chain_folds_and_values_are_unchanged():
    x = torch.randn(3, 37, 37)
    gm = make_fx(_causal_scores)(x)
    before = gm(x)
    folded = fold_constants(gm)
    assert folded, "the cumsum reads no input"
    ops = _targets(gm)
    assert not any("cumsum" in o for o in ops), ops
    # the elementwise mask (arange, ge, bitwise_and) stays: the lowering inlines it as indices
    assert any("arange" in o for o in ops) and any("aten.ge" in o for o in ops), ops
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x), before, rtol=0, atol=0)
    y = torch.randn(3, 37, 37)
    torch.testing.assert_close(gm(y), _causal_scores(y), rtol=0, atol=0)


def test_constructors_alone_random_and_input_dependent_stay():
    def f(x):
        i = torch.arange(x.shape[-1])
        x = x.masked_fill(i[None, :] > i[:, None] + 1, 0.0)
        ones = torch.ones(x.shape[-1]).unsqueeze(0).expand(x.shape[0], -1)
        r = torch.rand(x.shape)
        return x + ones + r * 0 + torch.arange(x.shape[-1]) * x.sum()
    gm = make_fx(f)(torch.randn(5, 5))
    assert fold_constants(gm) == []
    ops = _targets(gm)
    assert any("rand" in o for o in ops) and any("ones" in o for o in ops), ops


def test_compiled_model_runs_folded_mask_on_device_and_matches_eager(tmp_path):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(40, 40)

        def forward(self, x):
            return _causal_scores(self.lin(x))

    torch.manual_seed(0)
    m = M().eval()
    x = torch.randn(2, 40, 40)
    torch._dynamo.reset()
    c = torch.compile(m, backend="neuron", options={"target": "trn2", "dump_dir": str(tmp_path)})
    with torch.no_grad(), neuron_compiler.profile() as p:
        got = c(x)
    want = m(x)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    # a wrong answer fails the same tolerance
    assert not torch.allclose(got * 0.5, want, rtol=2e-3, atol=2e-3)
    d = p.to_dict()
    assert d["fallbacks"] == [], d["fallbacks"]
    assert d["simulated_time_us"] > 0
    folded = list(tmp_path.rglob("fx_graph_folded.py"))
    assert folded and "_frozen_param" in folded[0].read_text()
