"""Wide output stores (lowering/tiling/matmul/kernel.py ``_wide_rows``): a matmul whose output goes to
HBM row-major evacuates each m-tile of a group into one [rows, group columns] tile and stores
it with one DMA, instead of one DMA of 512 columns (1 KiB runs in bf16) per PSUM tile (GPT-2's
logits). Checked against eager through torch.compile (weights resident, as a model's are) over
M, N and K tile edges, with and without an epilogue, bf16 and fp32 (where the accumulator
itself is the result and is copied into the wide tile), with the wide stores in the program,
and a lost column block caught."""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim import loops
from runtime_sim.isa import Memory, Op


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _wide_widths(cg) -> list[int]:
    return [i.srcs[0].free_size for st in cg.program.streams.values() for i in loops.materialize(st)
            if i.op is Op.DMA_COPY and i.dst.memory is Memory.HBM and ".wide" in i.srcs[0].buffer]


@pytest.mark.parametrize("target,dtype,M,K,N,epi,tol", [
    ("trn2", torch.bfloat16, 100, 768, 2100, False, 2e-2),
    ("trn1", torch.bfloat16, 70, 768, 1300, True, 2e-2),
    ("trn1", torch.bfloat16, 70, 640, 2600, True, 2e-2),
    ("trn1", torch.float32, 70, 768, 1300, False, 1e-4),
    ("trn1", torch.float32, 100, 1024, 1100, True, 1e-4),
])
def test_wide_stores_match_eager(target, dtype, M, K, N, epi, tol):
    torch.manual_seed(0)
    lin = torch.nn.Linear(K, N, bias=epi)
    m = (torch.nn.Sequential(lin, torch.nn.GELU()) if epi else lin).to(dtype).eval()
    x = torch.randn(M, K, dtype=dtype)
    c = torch.compile(m, backend="neuron", options={"target": target})
    with torch.no_grad(), neuron_compiler.profile() as p:
        y = c(x)
        ref = m(x)
    assert_ran_on_device(p)
    (rec,) = p._parts.values()
    widths = _wide_widths(rec.compiled)
    assert widths and max(widths) > 512, widths
    atol = tol * ref.float().abs().max().item()
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=atol)
    bad = y.clone()
    bad[:, 512:1024] = 0                       # one 512-column tile of every row lost
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad.float(), ref.float(), rtol=tol, atol=atol)
