"""Resident weights in the layout their matmuls read (lowering/passes/layouts.py).

An ``nn.Linear`` weight of an inference graph is read as ``W.T`` (K contiguous); the program
stores it transposed and the runtime lays it out when it uploads it (on every target: a DMA
transpose moves W.T below the plain rate, TensorE transposes cost more). A weight that other
kernels read as given (a tied embedding: gathered rows, and ``W.T`` for the LM head) keeps its
layout and the matmuls read a second resident copy stored transposed. Checked here: values
match eager over tile edges, the layout is what makes them match (without it the result is
wrong), the weight's TensorE transposes are gone, the steady state sends nothing, and a
training graph keeps torch's layout.
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from lowering.compiled import TensorSpec
from lowering.kir import KKind, KOp, KProgram, MatmulKAttrs, Role, TensorRef, HbmTensor
from lowering.passes.layouts import choose_input_layouts
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim.isa import DType, Op
from runtime_sim.targets import get_target


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _mlp(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(200, 300), torch.nn.GELU(),
                               torch.nn.Linear(300, 130)).to(dtype).eval()


def _run(m, x, target):
    c = torch.compile(m, backend="neuron", options={"target": target})
    with torch.no_grad():
        c(x)                                    # warm-up: parameters sent
        with neuron_compiler.profile() as p:
            y = c(x)
    d = assert_ran_on_device(p)
    (rec,) = p._parts.values()
    return y, d, rec.compiled


def _weight_transposes(cg) -> int:
    """TensorE transposes in the program (the activations' A^T ones included)."""
    from runtime_sim import loops
    return sum(1 for st in cg.program.streams.values() for i in loops.materialize(st)
               if i.op is Op.TRANSPOSE)


@pytest.mark.parametrize("target,dtype,tol", [("trn2", torch.float32, 1e-4), ("trn1", torch.bfloat16, 2e-2),
                                              ("trn3", torch.bfloat16, 2e-2)])
def test_linear_weights_stored_transposed_match_eager(target, dtype, tol):
    m = _mlp(dtype)
    x = torch.randn(3, 70, 200, dtype=dtype)        # M = 210 rows, K = 200 and 300: tile edges
    y, d, cg = _run(m, x, target)
    with torch.no_grad():
        ref = m(x)
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol)
    assert [p for p in cg.input_layouts if p] == [(1, 0), (1, 0)]   # the two weights
    # steady state: parameters (in their layout) and the unchanged x stay in HBM; only y leaves
    assert d["transfer_bytes"] == y.numel() * y.element_size()
    # the layout is what makes the values right: fed as given, the same program is wrong
    layouts, cg.input_layouts = cg.input_layouts, ()
    try:
        c = torch.compile(m, backend="neuron", options={"target": target})
        with torch.no_grad():
            bad = c(x)
    finally:
        cg.input_layouts = layouts
    assert (bad.float() - ref.float()).abs().max() > 10 * tol


def test_layouts_remove_the_weight_transposes_on_trn1():
    m, x = _mlp(torch.bfloat16), torch.randn(2, 64, 200, dtype=torch.bfloat16)
    _, _, cg = _run(m, x, "trn1")
    relaid = _weight_transposes(cg)
    assert get_target("trn1").dma_transpose_efficiency == 0.0   # W.T by TensorE otherwise
    # the activations' transposes remain (A^T: 2 K tiles of x, 3 of the hidden layer per m-tile);
    # the weights' (B: 2 x 3 + 3 x 1 blocks of 128 x 128) are gone
    assert relaid <= 2 * (2 + 3)


def test_a_weight_read_as_given_too_gets_a_transposed_copy():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(160, 160, bias=False)

        def forward(self, x):
            return self.lin(x) + x @ self.lin.weight     # W read as W.T and as W

    torch.manual_seed(0)
    m, x = Tied().eval(), torch.randn(130, 160)
    y, d, cg = _run(m, x, "trn2")
    with torch.no_grad():
        torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
    assert not any(cg.input_layouts)
    ((name, i, perm),) = cg.input_copies
    assert name.endswith("_t") and perm == (1, 0) and name in cg.program.inputs
    assert d["transfer_bytes"] == y.numel() * y.element_size()     # both copies stay resident
    # the copy's layout is what makes the values right: fed as given, the result is wrong
    from runtime_sim import simulate
    inputs = [x.numpy(), x.numpy()]
    inputs[i] = m.lin.weight.detach().numpy()          # placeholder i is the weight
    good = simulate(cg.program, cg.feed(inputs), mode="functional").outputs
    feed = cg.feed(inputs)
    feed[name] = feed[name].T.copy()
    bad = simulate(cg.program, feed, mode="functional").outputs
    assert any((bad[k] != good[k]).any() for k in good)


def test_tied_embedding_lm_head_reads_a_transposed_copy():
    """GPT-2's shape of it: the token table is gathered from and read as W.T by the LM head;
    bf16 on trn3 (which has DMA transposes), vocabulary 1000 and width 200 (tile edges)."""
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(1000, 200)
            self.head = torch.nn.Linear(200, 1000, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.emb(ids)))

    torch.manual_seed(0)
    m, ids = LM().to(torch.bfloat16).eval(), torch.randint(0, 1000, (1, 130))
    y, _, cg = _run(m, ids, "trn3")
    with torch.no_grad():
        torch.testing.assert_close(y.float(), m(ids).float(), rtol=2e-2, atol=2e-2)
    assert len(cg.input_copies) == 1 and not any(cg.input_layouts)


def test_training_weights_keep_their_layout():
    mt = _mlp(torch.float32).train()
    c = torch.compile(mt, backend="neuron", options={"target": "trn2"})
    with neuron_compiler.profile() as p:
        c(torch.randn(130, 200)).sum().backward()
    assert all(not any(r.compiled.input_layouts) and not r.compiled.input_copies
               for r in p._parts.values() if r.compiled is not None)


def test_rewrite_is_exact_for_batched_views():
    """A [1, C, R] view with strides [0, 1, C] of W [R, C] becomes [0, R, 1]; a view that
    reaches past a row (carry) or a non-matmul reader leaves the input alone."""
    R, C = 300, 200
    w = TensorRef("w", DType.FP32, (1, C, R), (0, 1, C))
    a = TensorRef("a", DType.FP32, (1, 128, C), (0, C, 1))
    o = TensorRef("o", DType.FP32, (1, 128, R), (0, R, 1))

    def prog(wref):
        kp = KProgram()
        kp.buffers = {"w": HbmTensor("w", R * C, DType.FP32, Role.INPUT),
                      "a": HbmTensor("a", 128 * C, DType.FP32, Role.INPUT),
                      "o": HbmTensor("o", 128 * R, DType.FP32, Role.OUTPUT)}
        kp.inputs = ["w", "a"]
        kp.kernels = [KOp(KKind.MATMUL, (o,), (a, wref), MatmulKAttrs(), ("mm",))]
        kp.outputs = [o]
        return kp

    kp = prog(w)
    assert choose_input_layouts(kp, [(R, C), (128, C)], [True, True]) == (((1, 0), None), ())
    assert kp.kernels[0].ins[1].strides == (0, R, 1)
    assert choose_input_layouts(prog(w), [(R, C), (128, C)], [False, True]) == ((None, None), ())
    flat = TensorRef("w", DType.FP32, (1, 2 * C, R // 2), (0, 1, 2 * C))   # not W.T: untouched
    assert choose_input_layouts(prog(flat), [(R, C), (128, C)], [True, True]) == ((None, None), ())
    assert TensorSpec((R, C), torch.float32).resident is False
