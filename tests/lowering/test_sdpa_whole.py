"""``_scaled_dot_product_flash_attention_for_cpu`` kept whole by the backend's decomposition
table (traced with grad mode off, no dropout, no mask, equal heads) and lowered by
``lowering/ops/attention.py`` to one ATTENTION kernel, against eager.

The graph is traced with the backend's own table (``decomposition_table``), so these cases take
the path ``torch.compile(..., backend="neuron")`` takes in inference; the decomposed path (masks,
grouped-query heads, training) is ``test_attention.py``'s and ``test_train_sdpa_grads.py``'s.
Shapes cross the tile edges: query rows 1 / 129 / 300 (blocks of 128), keys 1 / 700 / 1537
(blocks of 512), head widths 16 / 64 / 128, one and two batches of heads.
"""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import TensorSpec, compile_graph, why_unsupported
from lowering_helpers import assert_close, from_numpy, to_numpy
from neuron_compiler.backend import decomposition_table

SDPA_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
CASES = [(1, 2, 129, 700, 64), (2, 3, 300, 1537, 16), (1, 1, 1, 1, 128), (1, 4, 128, 128, 64)]


def _run(fn, *inputs):
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    dumps: dict[str, str] = {}
    cg = compile_graph(gm, [TensorSpec(tuple(x.shape), x.dtype) for x in inputs],
                       dump=lambda name, text: dumps.__setitem__(name, text))
    outs, res = cg.run([to_numpy(x) for x in inputs], mode="functional")
    assert res.stats.instructions > 0
    return gm, [from_numpy(o, v.dtype).reshape(v.shape) for o, v in zip(outs, cg.outputs)], dumps


def _kernels(dumps) -> list[str]:
    return [ln.split("= ", 1)[1].split("[", 1)[0]
            for ln in dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_whole_sdpa_is_one_attention_kernel_and_matches_eager(shape, dtype, causal):
    B, H, S, Sk, D = shape
    g = torch.Generator().manual_seed(S + 3 * Sk + D)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (S, Sk, Sk))
    scale = None if D != 16 else 0.3
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,  # noqa: E731
                                                        scale=scale)
    gm, outs, dumps = _run(fn, q, k, v)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert SDPA_CPU in ops, gm.code                    # kept whole, not decomposed
    assert _kernels(dumps) == ["attention"], dumps["ir_post_fusion.txt"]
    ref = fn(q, k, v)
    assert_close(outs[0], ref)
    bad = outs[0].clone()              # the tolerance can fail: one query row dropped
    bad[..., -1, :] = 0
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


def test_heads_merged_into_the_model_width_read_the_op_layout():
    """The op's output is [L, N, H, E] in memory: transpose(1, 2).reshape(N, L, H*E) is a view
    of it, and a consumer reads it in place."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 12, 130, 64, generator=g).to(torch.bfloat16) for _ in range(3))

    def fn(q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(1, 130, 768) * 2

    _, outs, dumps = _run(fn, q, k, v)
    assert _kernels(dumps) == ["attention", "pointwise"], dumps["ir_post_fusion.txt"]
    assert_close(outs[0], fn(q, k, v))


@pytest.mark.parametrize("why", ["mask", "gqa", "grad"])
def test_other_calls_are_decomposed(why):
    """A mask, grouped-query heads or grad mode on: the op is decomposed (its logsumexp may be
    read by the backward; the math path takes masks and head groups)."""
    q = torch.randn(1, 4, 32, 16, requires_grad=why == "grad")
    kv = torch.randn(1, 2 if why == "gqa" else 4, 32, 16)
    mask = torch.rand(32, 32) < 0.8 if why == "mask" else None
    fn = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=mask, enable_gqa=why == "gqa")
    with torch.set_grad_enabled(why == "grad"):
        gm = make_fx(fn, decomposition_table=decomposition_table())(q, kv, kv)
    assert SDPA_CPU not in [n.target for n in gm.graph.nodes], gm.code


def test_a_read_logsumexp_is_refused_with_its_reason():
    """Calling the op itself and reading its logsumexp: the rule cannot give it, so the node is
    unsupported (the partition falls back) and says why."""
    q = torch.randn(1, 2, 16, 8)
    fn = lambda q: SDPA_CPU(q, q, q)[1] * 1.0  # noqa: E731
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(q)
    node = next(n for n in gm.graph.nodes if n.target is SDPA_CPU)
    reason = why_unsupported(node)
    assert reason is not None and "logsumexp output is read" in reason, reason
    assert any(n.target is operator.getitem for n in node.users)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_query_heads_are_decomposed_fused_and_match_eager(causal):
    """Grouped-query heads (2 key/value heads for 6 query heads), full and causal: decomposed
    (the logsumexp of the decomposition repeats each key head over its group), fused back into
    one ATTENTION kernel that reads each key/value head once per group through a broadcast
    axis."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 6, 130, 32, generator=g)
    k, v = (torch.randn(1, 2, 600, 32, generator=g) for _ in range(2))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,  # noqa: E731
                                                        enable_gqa=True)
    gm, outs, dumps = _run(fn, q, k, v)
    assert SDPA_CPU not in [n.target for n in gm.graph.nodes]
    assert "attention" in _kernels(dumps), dumps["ir_post_fusion.txt"]
    ref = fn(q, k, v)
    assert_close(outs[0], ref)
    bad = outs[0].clone()
    bad[:, -1] = 0                     # the last query head (of the second group) dropped
    with pytest.raises(AssertionError):
        assert_close(bad, ref)


def test_causal_grouped_query_heads_run_on_the_device_through_the_backend():
    """Causal grouped-query attention through ``torch.compile``: one device partition, no
    fallback (the attention's batch is [N, Hkv, G] with the key heads a stride-0 axis; its
    PSUM sets keep one slot each under those batch loops), and eager's result."""
    import neuron_compiler
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 6, 130, 32, generator=g)
    k, v = (torch.randn(1, 2, 600, 32, generator=g) for _ in range(2))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                        enable_gqa=True)
    torch._dynamo.reset()
    c = torch.compile(fn, backend="neuron")
    with torch.no_grad(), neuron_compiler.profile() as p:
        out = c(q, k, v)
    d = p.to_dict()
    assert d["fallbacks"] == [] and len(d["partitions"]) == 1, d["fallbacks"]
    ref = fn(q, k, v)
    assert_close(out, ref)
    with pytest.raises(AssertionError):
        assert_close(out * 0.5, ref)
