"""``torch.linalg.vector_norm`` (``F.normalize``, weight norm: SigLIP, wav2vec2) runs on the device
through ``torch.compile``: the backend decomposes it (``EXTRA_DECOMPOSITIONS``) into abs/pow, a
sum or max and a root, in fp32 for 16-bit inputs as eager accumulates. Forward and gradient
against eager, with every node on the device, on shapes crossing partition and free-axis tiles;
a norm over the wrong axis fails the tolerance."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neuron_compiler


def _run(fn, *args):
    c = torch.compile(fn, backend="neuron")
    with neuron_compiler.profile() as p:
        out = c(*args)
    d = p.to_dict()
    assert d["device_nodes"] > 0 and not d["fallbacks"], d["fallbacks"]
    return out


@pytest.mark.parametrize("ord_,dim,keepdim", [(2, -1, True), (1, 0, False), (float("inf"), -1, False),
                                              (3, (0, 1), False)])
def test_vector_norm_matches_eager(ord_, dim, keepdim, fresh_dynamo):
    x = torch.randn(130, 700, generator=torch.Generator().manual_seed(1))
    fn = lambda x: torch.linalg.vector_norm(x, ord_, dim=dim, keepdim=keepdim)  # noqa: E731
    out = _run(fn, x)
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)
    if dim == -1:
        wrong = torch.linalg.vector_norm(x, ord_, dim=0, keepdim=keepdim)
        assert out.shape != wrong.shape or not torch.allclose(out, wrong, rtol=1e-5, atol=1e-5)


def test_normalize_bf16_and_its_gradient(fresh_dynamo):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 129, 257, generator=g).to(torch.bfloat16)
    out = _run(lambda x: F.normalize(x, dim=-1), x)
    torch.testing.assert_close(out, F.normalize(x, dim=-1), rtol=2e-2, atol=2e-2)
    w = torch.randn(200, 96, generator=g, requires_grad=True)
    fn = lambda w: (F.normalize(w, dim=0) * torch.arange(96.0)).sum()  # noqa: E731
    c = torch.compile(fn, backend="neuron")
    c(w).backward()
    got = w.grad.clone()
    w.grad = None
    fn(w).backward()
    torch.testing.assert_close(got, w.grad, rtol=1e-4, atol=1e-5)
