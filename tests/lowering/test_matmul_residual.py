"""A projection's bias and the residual stream summed before the products
(``matmul.cells.residual_plus_bias``: each output tile's evacuation is one add reading PSUM), and
the up-front A^T transposes of a norm's output unrolled (``matmul.once.load_once``, ``UNROLL_KT``: each
waits only for its own column piece). Checked against eager through torch.compile on trn3 with
M = 100 rows (a partial m-tile) and N = 768 (a partial 512-column cell), with the sum's tile and
the unrolled transposes' PSUM cells in the program, and a lost residual or column block caught."""
from __future__ import annotations

import re

import pytest
import torch

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class _Residual(torch.nn.Module):
    """Two pre-norm residual projections: h = x + fc(ln(x)); h + fc2(ln(h))."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)
        self.fc2 = torch.nn.Linear(d, d)

    def forward(self, x):
        h = x + self.fc(self.ln(x))
        return h + self.fc2(self.ln(h))


class _Mlp(torch.nn.Module):
    """A GPT-2 MLP block: x + fc2(gelu(fc1(ln(x))))."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)), approximate="tanh"))


def _run(m: torch.nn.Module, x: torch.Tensor, dump=None):
    opts = {"target": "trn3", **({"dump_dir": str(dump)} if dump else {})}
    c = torch.compile(m, backend="neuron", options=opts)
    with torch.no_grad(), neuron_compiler.profile() as p:
        y = c(x)
        ref = m(x)
    assert_ran_on_device(p)
    (rec,) = p._parts.values()
    return y, ref, rec.compiled.program


def _close(y, ref, tol=2e-2):
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol,
                               atol=tol * ref.float().abs().max().item())


def test_residual_plus_bias_matches_eager():
    torch.manual_seed(0)
    m = _Residual(768).to(torch.bfloat16).eval()
    x = torch.randn(100, 768, dtype=torch.bfloat16)
    y, ref, program = _run(m, x)
    sums = [b for b in program.buffers if b.name.endswith(".rb")]
    assert len(sums) == 2, [b.name for b in program.buffers]
    _close(y, ref)
    bad = y.clone()
    bad[:, 600:] -= x[:, 600:]               # the last cell's residual lost
    with pytest.raises(AssertionError):
        _close(bad, ref)


def test_unrolled_norm_transposes_match_eager(tmp_path):
    torch.manual_seed(0)
    m = _Mlp(768, 3072).to(torch.bfloat16).eval()
    x = torch.randn(100, 768, dtype=torch.bfloat16)
    y, ref, _ = _run(m, x, tmp_path)
    # the up-projection's six A^T transposes: one PSUM tile of four cells, allocated once
    (tir,) = tmp_path.rglob("tir.txt")
    assert re.search(r"psum k\d+\.tps: \[128x400\] float32 bufs=1\n", tir.read_text())
    _close(y, ref)
    bad = y.clone()
    bad[:, 128:256] = ref[:, 128:256] * 0.5   # one K tile's worth of columns halved
    with pytest.raises(AssertionError):
        _close(bad, ref)
