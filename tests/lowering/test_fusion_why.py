"""Why kernels stayed apart (lowering/passes/fusion_why.py): after fusion every producer ->
consumer pair that still meets through a temporary has a WhyNoFuse line naming both kernels'
ATen nodes, the tensor and the reason the rule that would fuse them gave."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, lower_and_run, rand


def _why(low) -> list[str]:
    return [ln[2:] for ln in low.dumps["ir_post_fusion.txt"].splitlines() if ln.startswith("# WhyNoFuse")]


def _pairs(low) -> set[str]:
    """Temporaries that pass from one kernel to another after fusion."""
    lines = [ln for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]
    written = {ln.split("[", 1)[0].strip("% ") for ln in lines}
    temps = {ln.split()[1].rstrip(":").lstrip("%") for ln in low.dumps["ir_post_fusion.txt"].splitlines()
             if ln.startswith("buffer %") and ln.endswith("(temp)")}
    read = set()
    for ln in lines:
        rhs = ln.split(" = ", 1)[1]
        read |= {t for t in temps if f"%{t}[" in rhs}
    return written & read & temps


def test_every_kernel_boundary_of_a_mlp_block_has_its_reason():
    """norm -> matmul (no rule), matmul -> epilogue (fused), gelu output read by a matmul (no
    rule), a matmul output with two readers (an epilogue takes the only one): each pair left
    apart says why, and the values still match eager."""
    x, w1, w2 = rand(130, 96, seed=1), rand(96, 200, seed=2) * 0.1, rand(200, 96, seed=3) * 0.1

    def fn(x, w1, w2):
        h = F.layer_norm(x, (96,)) @ w1
        return F.gelu(h) @ w2, h.sum(dim=-1)

    low = lower_and_run(fn, x, w1, w2)
    for got, ref in zip(low.outputs, fn(x, w1, w2)):
        assert_close(got, ref)
    why = _why(low)
    pairs = _pairs(low)
    assert pairs, low.dumps["ir_post_fusion.txt"]
    for t in pairs:                    # every temporary between two kernels has its line
        assert any(f": %{t}:" in w for w in why), (t, why)
    assert any("layer_norm -> matmul" in w and "no fusion rule" in w for w in why), why
    assert any("matmul ->" in w and "readers (an epilogue takes the only one)" in w for w in why), why


def test_a_pointwise_producer_read_by_a_reduction_says_so():
    x = rand(130, 513, seed=4)
    fn = lambda x: torch.softmax(x * 2.0, dim=-1)   # noqa: E731
    low = lower_and_run(fn, x)
    assert_close(low.outputs[0], fn(x))
    why = _why(low)
    assert any("pointwise -> softmax" in w and "read by a softmax kernel" in w for w in why), why
