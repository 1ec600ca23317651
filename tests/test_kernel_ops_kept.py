"""Ops the backend keeps out of the decompositions because the registry has a kernel for them
(``lowering.policy.KERNEL_OPS``): GroupNorm's backward runs the group-norm-backward
kernel (LAYER_NORM_BWD over the group rows) and ``F.fold`` runs ``col2im`` (indirect-DMA
accumulation) under ``torch.compile``, matching eager; calls a kernel cannot take still
decompose. Shapes cross the tile edges (more than 128 group rows, rows longer than 512)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import neuron_compiler
from neuron_compiler.backend import decomposition_table
from neuron_compiler.testing import assert_matches_eager, ensure_backends_registered

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _device_ops(d: dict) -> set[str]:
    return {op for p in d["partitions"] for op in p["ops"]}


def _group_norm_step(x: torch.Tensor, groups: int):
    ensure_backends_registered()
    torch.manual_seed(0)
    gn = nn.GroupNorm(groups, x.shape[1])
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5)
        gn.bias.uniform_(-0.5, 0.5)
    ref = nn.GroupNorm(groups, x.shape[1])
    ref.load_state_dict(gn.state_dict())
    xd, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    with neuron_compiler.profile() as prof:
        (torch.compile(gn, backend="neuron")(xd) * g).sum().backward()
    (ref(xr) * g).sum().backward()
    return (xd.grad, gn.weight.grad, gn.bias.grad), (xr.grad, ref.weight.grad, ref.bias.grad), prof.to_dict()


@pytest.mark.parametrize("shape,groups", [((3, 100, 17, 17), 50),     # 150 rows of 578
                                          ((2, 8, 9, 70), 4)])        # 8 rows of 1260
def test_group_norm_backward_runs_its_kernel(shape, groups):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    got, want, d = _group_norm_step(x, groups)
    assert not d["fallbacks"] and d["fallback_nodes"] == 0, d["fallbacks"]
    assert "aten.native_group_norm_backward.default" in _device_ops(d), sorted(_device_ops(d))
    for name, a, b in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    with pytest.raises(AssertionError):                 # the tolerance can fail
        torch.testing.assert_close(got[0] * (1 + 1e-3), want[0], rtol=1e-4, atol=1e-4)


def test_fold_runs_col2im():
    cols = torch.randn(2, 36, 156, generator=torch.Generator().manual_seed(8))
    d = assert_matches_eager(lambda c: F.fold(c, (13, 12), 3, padding=1), cols)
    assert d["fallback_nodes"] == 0
    assert "aten.col2im.default" in _device_ops(d), sorted(_device_ops(d))


def test_calls_a_kernel_cannot_take_still_decompose():
    """A group row too long for one partition, an integer fold: the decomposition runs."""
    table = decomposition_table("trn2")
    gn_bw = table[aten.native_group_norm_backward.default]
    x = torch.randn(1, 2, 300, 300)
    mean, rstd = torch.zeros(1, 1), torch.ones(1, 1)
    out = gn_bw(x, x, mean, rstd, None, 1, 2, 90000, 1, [True, False, False])
    assert out is not NotImplemented                    # 180000 elements per row: decomposed
    small = torch.randn(1, 2, 4, 4)
    assert gn_bw(small, small, mean, rstd, None, 1, 2, 16, 1, [True, False, False]) is NotImplemented
    col2im = table[aten.col2im.default]
    ci = torch.ones(1, 4, 9, dtype=torch.int64)
    assert col2im(ci, [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]) is not NotImplemented
    assert col2im(ci.float(), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]) is NotImplemented


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_layer_norm_backward_runs_its_kernel(dtype, tol):
    """LayerNorm's backward under torch.compile: the LAYER_NORM_BWD kernel (130 rows of 700:
    a partial row tile, rows longer than 512), matching eager; rows too long for a partition
    still decompose."""
    ensure_backends_registered()
    torch.manual_seed(0)
    ln = nn.LayerNorm(700).to(dtype)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    ref = nn.LayerNorm(700).to(dtype)
    ref.load_state_dict(ln.state_dict())
    x = torch.randn(2, 65, 700, dtype=dtype, generator=torch.Generator().manual_seed(3))
    g = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    xd, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    with neuron_compiler.profile() as prof:
        (torch.compile(ln, backend="neuron")(xd) * g).sum().backward()
    (ref(xr) * g).sum().backward()
    d = prof.to_dict()
    assert not d["fallbacks"] and d["fallback_nodes"] == 0, d["fallbacks"]
    assert "aten.native_layer_norm_backward.default" in _device_ops(d), sorted(_device_ops(d))
    for name, a, b in (("grad_input", xd.grad, xr.grad), ("grad_weight", ln.weight.grad, ref.weight.grad),
                       ("grad_bias", ln.bias.grad, ref.bias.grad)):
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * scale,
                                   msg=lambda m, n=name: f"{n}: {m}")
    with pytest.raises(AssertionError):                 # the tolerance can fail
        torch.testing.assert_close((xd.grad * 0.5).float(), xr.grad.float(), rtol=tol,
                                   atol=tol * max(1.0, float(xr.grad.abs().max())))
    ln_bw = decomposition_table("trn2")[aten.native_layer_norm_backward.default]
    big = torch.randn(1, 200000)
    st = torch.zeros(1, 1)
    assert ln_bw(big, big, [200000], st, st + 1, None, None, [True, False, False]) is not NotImplemented
