"""Cell-major matmul products (``lowering/tiling/matmul/cells.py``, ``matmul.plan.cell_tail``):
where every K tile of both operands is in SBUF when a group starts (a weight loaded ahead, an
activation transposed once up front), each output cell runs all its K tiles and its epilogue
follows at once, under the next cell's products.

Numerics against eager through torch.compile (functional simulation) on shapes crossing tile
edges (partial M, K and N tiles), with the path checked in the tile-IR notes; the rule that keeps
weights streamed during the kernel K-major."""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from lowering.tiling.matmul.plan import DIRECT, RES_T, Blocking, MatmulShape, cell_tail
from lowering.tir.plan import WEIGHT_STREAMS_AHEAD
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim.isa import DType
from runtime_sim.targets import get_target

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
NOTE = "cell-major products"


class _Block(torch.nn.Module):
    """A GPT-2 style ``addmm(bias, ln(x), W)`` (the norm first, so the weights load ahead),
    optionally with tanh GELU and a residual add in the epilogue, then a layer norm (the
    product stays in SBUF between the kernels, as in GPT-2's layers)."""

    def __init__(self, K: int, N: int, gelu: bool, residual: bool):
        super().__init__()
        self.w = torch.nn.Parameter((torch.randn(K, N) / K ** 0.5).to(torch.bfloat16))
        self.b = torch.nn.Parameter(torch.randn(N).to(torch.bfloat16))
        self.gelu, self.residual = gelu, residual

    def forward(self, x, r):
        y = torch.addmm(self.b, torch.nn.functional.layer_norm(x, x.shape[-1:]), self.w)
        if self.gelu:
            y = torch.nn.functional.gelu(y, approximate="tanh")
        y = y + r if self.residual else y
        return torch.nn.functional.layer_norm(y, y.shape[-1:])


def _run(m, args, target, dump):
    c = torch.compile(m, backend="neuron", options={"target": target, "dump_dir": str(dump)})
    with torch.no_grad(), neuron_compiler.profile() as p:
        y = c(*args)
        ref = m(*args)
    assert_ran_on_device(p)
    notes = "\n".join(f.read_text() for f in dump.rglob("tir.txt"))
    return y, ref, notes


@pytest.mark.parametrize("target,M,K,N,gelu,residual", [
    ("trn3", 128, 768, 2304, False, False),     # GPT-2's QKV projection: five cells
    ("trn2", 128, 768, 2304, False, False),
    ("trn3", 128, 768, 3072, True, False),      # its MLP up-projection with GELU
    ("trn3", 100, 300, 1100, False, True),      # partial M, K and N tiles, a residual add
    ("trn2", 100, 640, 1025, True, True),
])
def test_cell_major_matches_eager(tmp_path, target, M, K, N, gelu, residual):
    torch.manual_seed(0)
    m = _Block(K, N, gelu, residual).eval()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    r = torch.randn(M, N, dtype=torch.bfloat16)
    y, ref, notes = _run(m, (x, r), target, tmp_path)
    assert NOTE in notes
    atol = 2e-2 * ref.float().abs().max().item()
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=atol)
    # the last cell's bias lost must fail this tolerance
    with torch.no_grad():
        m.b[-(N % 512 or 512):] = 0
        bad = m(x, r)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y.float(), bad.float(), rtol=2e-2, atol=atol)


def test_first_kernel_stays_k_major(tmp_path):
    # a matmul that opens the program loads its weights during its own products: K-major
    torch.manual_seed(0)
    w = torch.randn(768, 2304, dtype=torch.bfloat16) / 768 ** 0.5
    x = torch.randn(128, 768, dtype=torch.bfloat16)
    y, ref, notes = _run(lambda x, w: x @ w, (x, w), "trn3", tmp_path)
    assert NOTE not in notes
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().max().item())


def _shape(K, N, ahead=True) -> MatmulShape:
    return MatmulShape(1, 128, N, K, DType.BF16, DType.BF16, RES_T, DIRECT, b_ahead=ahead)


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_cell_tail_rule(target):
    t = get_target(target)
    c = Blocking("B", 2, 1, 2, 2)
    # GPT-2's QKV weight (27 KiB per partition) is loaded ahead: every K tile cell-major
    assert cell_tail(_shape(768, 2304), c, t, WEIGHT_STREAMS_AHEAD) == 6
    assert cell_tail(_shape(300, 1100), c, t, WEIGHT_STREAMS_AHEAD) == 3
    # a weight not loaded ahead (kernel 0), or Llama-1B's 8 MiB projection (64 KiB per
    # partition: three of them do not fit the share for weights ahead): K-major
    assert cell_tail(_shape(768, 2304, ahead=False), c, t, WEIGHT_STREAMS_AHEAD) == 0
    assert cell_tail(_shape(2048, 2048), c, t, WEIGHT_STREAMS_AHEAD) == 0
