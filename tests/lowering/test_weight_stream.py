"""The weight stream and the matmul choices around it (issue 22):

- paced pieces (``lowering.tiling.stream.paced_pieces``): a weight transfer is cut into pieces
  of about one DMA fixed phase of data each, never shorter than ``PACE_MIN`` of it, so the
  one-queue weight stream issues no faster than the engines drain it;
- the row bias of a matmul added when each tile leaves PSUM, from one broadcast tile, instead
  of a ones-row product per tile on TensorE (``matmul.plan.bias_by_products``), and only where
  the weight stream keeps up with the compute;
- a weight operand that does not fit whole keeps a prefix of its blocks in slots of their own,
  its partial last block in bytes of its own (``matmul._whole_weights``, ``_emit``);
- the up-front transposes of a resident streamed side get the PSUM banks the blocking leaves
  free (``matmul.once.once_tp_bufs``);
- kernel lifetimes fall back to weights fewer streams ahead before coarse lifetimes
  (``tir.plan.plan_memory``).

Numerics are checked against eager through torch.compile (functional simulation), and each
test also checks that the path it is about was taken."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import neuron_compiler
from lowering.tiling.matmul.once import once_tp_bufs as _once_tp_bufs
from lowering.tiling.matmul.plan import (DIRECT, RES_T, Blocking, MatmulShape, bias_by_products,
                                         footprint)
from lowering.tiling.stream import PACE_MIN, paced_pieces
from lowering.tir.plan import WEIGHT_STREAMS_AHEAD
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim import loops
from runtime_sim.costs import instr_cost
from runtime_sim.isa import AP, DmaAttrs, DType, Instr, Memory, Op, dma_queue
from runtime_sim.targets import get_target

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _data_and_fixed(t, p: int, f: int) -> tuple[float, float]:
    src = AP("h", Memory.HBM, 0, 1, 0, ((f, p), (1, f)), DType.BF16)
    c = instr_cost(Instr(Op.DMA_COPY, AP("s", Memory.SBUF, 0, p, 0, ((1, f),), DType.BF16), (src,),
                         DmaAttrs()), dma_queue(0), t)
    return max(c.busy_ns, c.hbm_ns), c.issue_ns


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("f", [64, 768, 2304, 3072, 9216])
def test_paced_pieces_are_about_one_fixed_phase(target, f):
    t = get_target(target)
    data, fixed = _data_and_fixed(t, 128, f)
    n = paced_pieces(t, 128, f, 2)
    assert n >= 1
    if data < fixed:                        # shorter than a fixed phase: never cut
        assert n == 1
    else:                                   # each piece at least PACE_MIN of a fixed phase,
        assert data / n >= PACE_MIN * fixed - 1e-6   # and no more than two of them
        assert data / n < 2 * fixed


def test_paced_pieces_cut_a_gpt2_weight_tile_in_three_on_trn2():
    # [128, 2304] bf16 (GPT-2's c_attn K tile): ~2.7 fixed phases of data on trn2
    assert paced_pieces(get_target("trn2"), 128, 2304, 2) == 3


def _shape(M=128, K=768, N=2304) -> MatmulShape:
    return MatmulShape(1, M, N, K, DType.BF16, DType.BF16, RES_T, DIRECT)


def test_bias_by_products_follows_the_busier_engine():
    t = get_target("trn2")
    c = Blocking("B", 1, 1, 2, 2)
    pe_bound = replace(c, detail={"pe": 6.0, "dma": 10.0, "evac": 1.0})
    assert not bias_by_products(_shape(), pe_bound, t)         # TensorE busiest: add when evacuating
    evac_bound = replace(c, detail={"pe": 1.0, "dma": 1.5, "evac": 6.0})
    assert bias_by_products(_shape(), evac_bound, t)           # evacuation busiest: products
    dma_bound = replace(c, detail={"pe": 6.0, "dma": 6.0 * WEIGHT_STREAMS_AHEAD, "evac": 1.0})
    assert bias_by_products(_shape(), dma_bound, t)            # the weight stream is behind


def _compile_run(m, x, target, dump):
    c = torch.compile(m, backend="neuron", options={"target": target, "dump_dir": str(dump)})
    with torch.no_grad(), neuron_compiler.profile() as p:
        y = c(x)
        ref = m(x)
    assert_ran_on_device(p)
    (rec,) = p._parts.values()
    notes = "\n".join(f.read_text() for f in dump.rglob("tir.txt"))
    return y, ref, rec.compiled, notes


class _Addmm(torch.nn.Module):
    """GPT-2's Conv1D after a layer norm: ``addmm(bias, ln(x), W)`` with W [K, N] (optionally
    followed by tanh GELU); the norm is the first kernel, so the matmul's weights load ahead."""

    def __init__(self, K: int, N: int, gelu: bool):
        super().__init__()
        self.w = torch.nn.Parameter((torch.randn(K, N) / K ** 0.5).to(torch.bfloat16))
        self.b = torch.nn.Parameter(torch.randn(N).to(torch.bfloat16))
        self.gelu = gelu

    def forward(self, x):
        y = torch.addmm(self.b, torch.nn.functional.layer_norm(x, x.shape[-1:]), self.w)
        return torch.nn.functional.gelu(y, approximate="tanh") if self.gelu else y


@pytest.mark.parametrize("M,K,N,gelu", [(128, 768, 2304, False), (128, 1024, 2304, True),
                                        (129, 768, 2304, False)])
def test_broadcast_bias_matches_eager(tmp_path, M, K, N, gelu):
    torch.manual_seed(0)
    m = _Addmm(K, N, gelu).eval()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    y, ref, cg, notes = _compile_run(m, x, "trn2", tmp_path)
    assert "row bias added when evacuating PSUM" in notes
    ops = [i.op for st in cg.program.streams.values() for i in loops.materialize(st)]
    assert Op.MEMSET not in ops                      # no ones row: no bias products
    atol = 2e-2 * ref.float().abs().max().item()
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=atol)
    bad = y.float() - m.b.float()                    # a lost bias must fail
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad, ref.float(), rtol=2e-2, atol=atol)


@pytest.mark.parametrize("case", ["first_kernel", "stream_behind"])
def test_bias_products_kept(case, tmp_path):
    """first_kernel: nothing runs before the first kernel, so its bias would load in the open,
    not ahead. stream_behind: trn1's DMA is slow against its TensorE: a BERT-sized layer's
    weights take more than WEIGHT_STREAMS_AHEAD - 1 times its products, and the bias stays a
    product."""
    torch.manual_seed(0)
    m = (torch.nn.Linear(768, 2304).to(torch.bfloat16) if case == "first_kernel"
         else _Addmm(768, 2304, False)).eval()
    x = torch.randn(128, 768, dtype=torch.bfloat16)
    y, ref, _, notes = _compile_run(m, x, "trn2" if case == "first_kernel" else "trn1", tmp_path)
    assert "row bias added when evacuating PSUM" not in notes
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2,
                               atol=2e-2 * ref.float().abs().max().item())


def test_weight_prefix_slots_and_own_tail_match_eager(tmp_path):
    # x @ w.T with w [N, K] too big to keep whole: a prefix of its blocks in slots of their
    # own, the partial last block in a tile of its own (``rtail``), weights in paced pieces
    torch.manual_seed(0)
    K, N = 1024, 12 * 1536 + 100
    w = (torch.randn(N, K) / K ** 0.5).to(torch.bfloat16)
    x = torch.randn(128, K, dtype=torch.bfloat16)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w)

        def forward(self, x):              # A made on the device (as GPT-2's final norm)
            return torch.nn.functional.layer_norm(x, (K,)) @ self.w.t()

    m = Head().eval()
    y, ref, cg, _ = _compile_run(m, x, "trn2", tmp_path)
    res = [b for b in cg.program.buffers if b.name.endswith(".res")]
    assert any(".rtail" in b.name for b in cg.program.buffers), [b.name for b in cg.program.buffers]
    plan = "\n".join(f.read_text() for f in tmp_path.rglob("memory_plan.txt"))
    slots = [int(line.split("@")[1].split()[1]) for line in plan.splitlines() if ".res " in line]
    assert res and slots and max(slots) > 2, plan
    atol = 2e-2 * ref.float().abs().max().item()
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=atol)
    bad = y.clone()
    bad[:, -100:] = 0                        # the partial last block lost
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad.float(), ref.float(), rtol=2e-2, atol=atol)


def test_once_transposes_take_the_spare_psum_banks():
    t = get_target("trn2")
    for N in (768, 2304, 3072):
        s = _shape(N=N)
        c = Blocking("B", 1, 1, 1, 1)
        n = _once_tp_bufs(s, c, t)
        assert 2 <= n <= 4 and n <= -(-s.K // 128)
        assert footprint(s, c, t)[1] - 2 + n <= t.psum_banks or n == 2
