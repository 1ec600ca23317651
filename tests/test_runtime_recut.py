"""A partition whose lowering refuses one op only once tiling starts keeps every other op on the
device: the refused nodes (``Unsupported.nodes``) run in eager PyTorch with the lowering's reason
and the rest of the partition is cut into device partitions of its own, cut again if one of them
is refused too. (Before, the whole partition went to eager: vit_b_16 ran 0 of 551 nodes on the
device because of one convolution.)"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import neuron_compiler
from lowering.errors import Unsupported
from lowering.kir import KKind
from neuron_compiler.errors import NeuronFallbackError


@pytest.fixture
def refuse(monkeypatch):
    """Make the tilers of the given kernel kinds refuse every kernel (as a tiler that finds a
    shape it cannot fit does), naming the kernel's nodes."""
    import lowering.tiling as tiling

    def apply(*kinds: KKind) -> None:
        def refused(b, k):
            raise Unsupported(",".join(k.origin), f"{k.kind.value} refused by the test")
        for kind in kinds:
            monkeypatch.setitem(tiling.TILERS, kind, refused)
    return apply


def _run(model, x, options=None):
    with torch.no_grad():
        ref = model(x)
        compiled = torch.compile(model, backend="neuron", options=options or {})
        with neuron_compiler.profile() as prof:
            out = compiled(x)
    return ref, out, prof.to_dict()


def test_one_refused_op_leaves_the_others_on_the_device(refuse, fresh_dynamo):
    refuse(KKind.SOFTMAX)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Softmax(-1), nn.Linear(64, 16), nn.ReLU())
    ref, out, d = _run(model, torch.randn(8, 32))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert d["fallback_nodes"] == 1 and d["device_nodes"] >= 5, d
    (f,) = d["fallbacks"]
    assert f["op"] == "aten._softmax.default" and "refused by the test" in f["reason"]
    names = sorted(p["partition"] for p in d["partitions"])
    assert names == ["fused_0_r0", "fused_0_r1"], names      # before and after the softmax


def test_refused_ops_in_both_halves_are_cut_out_one_after_the_other(refuse, fresh_dynamo):
    refuse(KKind.SOFTMAX, KKind.LAYER_NORM)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 64), nn.Softmax(-1),
                          nn.Linear(64, 16))
    ref, out, d = _run(model, torch.randn(8, 32))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    ops = sorted(f["op"] for f in d["fallbacks"])
    assert ops == ["aten._softmax.default", "aten.native_layer_norm.default"], d["fallbacks"]
    assert d["fallback_nodes"] == 2 and d["device_nodes"] >= 6, d
    assert len(d["partitions"]) == 3                          # three linear layers


def test_fallback_error_names_only_the_refused_op(refuse, fresh_dynamo):
    refuse(KKind.SOFTMAX)
    model = nn.Sequential(nn.Linear(32, 64), nn.Softmax(-1), nn.Linear(64, 16))
    with pytest.raises(NeuronFallbackError) as e:
        _run(model, torch.randn(8, 32), {"fallback": "error"})
    msg = str(e.value)
    assert "aten._softmax.default" in msg and "aten.addmm" not in msg
