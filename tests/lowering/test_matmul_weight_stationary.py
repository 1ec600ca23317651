"""The transposed matmul form (``Blocking.swap``, lowering/tiling/matmul/transposed.py): out^T =
B^T A^T, B tiles [128 k, 128 n] stationary and A^T tiles [128 k, m] moving, so a product costs
its moving size m (at least the 64-cycle LoadStationary minimum) instead of 512 columns of B.

Against eager through the simulator on shapes crossing every tile edge (M in {1, 8, 33} and
past 512, K and N not multiples of 128 / 512, a partial chunk of K tiles), bf16 and fp32, both
ways back to [m, n] (TensorE transposes, or element-run stores of the columns), with epilogues
(a folded row bias, GELU, a residual, indices along M and N) and batch axes; a result with its
n-tiles in the wrong place or a dropped K tile fails the comparison. Then what the planner
chooses by itself: the transposed form where its products save TensorE time and the scores say
so, never where M is a multiple of 128, never for fp8 double-row K tiles (with the reason in the
note), and a resident block of a few rows loaded by one DMA for all of K."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import lowering.tiling.matmul.kernel as mm
from lowering.tiling.matmul import plan as matmul_plan
from lowering_helpers import assert_close, check, lower_and_run, rand
from runtime_sim.costs import instr_cost
from runtime_sim.isa import DType, EngineKind, Op, Queue
from runtime_sim.targets import get_target


def _force(monkeypatch, **want) -> None:
    """choose_blocking returns the best-scored transposed candidate whose fields equal ``want``."""
    orig = matmul_plan.choose_blocking

    def choose(s, t):
        best, scored = orig(s, t)
        pick = [c for c in scored if c.swap and all(getattr(c, k) == v for k, v in want.items())]
        assert pick, f"no transposed candidate with {want} for {s}"
        return pick[0], [pick[0]] + [c for c in scored if c is not pick[0]]
    monkeypatch.setattr(mm, "choose_blocking", choose)


def _chosen(low) -> str:
    """The blocking the matmul kernel chose (from its note in tir.txt)."""
    note = next(ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# ") and " chose " in ln)
    return note.split(" chose ", 1)[1].split(" est=")[0]


def _transposed(low) -> bool:
    return _chosen(low).startswith("resident=A (transposed: B stationary, A^T moving")


def _notes(low) -> str:
    return "\n".join(ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# "))


def _wrong(x, w, expected) -> None:
    """Known-wrong results fail the comparison: the output's 128-column n-tiles rotated by one
    (a cell stored at its neighbour's columns), and the first K tile dropped."""
    if expected.shape[-1] > 128:
        with pytest.raises(AssertionError):
            assert_close(expected.roll(128, dims=-1), (x @ w).to(expected.dtype))
    if x.shape[-1] > 128:
        dropped = (x[..., 128:].float() @ w[128:].float()).to(expected.dtype)
        with pytest.raises(AssertionError):
            assert_close(dropped, expected)


CASES = [  # (M, K, N, dtype, target, forced fields)
    (1, 300, 700, torch.bfloat16, "trn2", {"out": "pe"}),
    (1, 300, 700, torch.float32, "trn2", {"out": "dma"}),
    (8, 1000, 1300, torch.float32, "trn3", {"out": "dma"}),
    (8, 1000, 1300, torch.bfloat16, "trn3", {"out": "pe", "kb": 4}),      # a partial last chunk
    (33, 700, 600, torch.bfloat16, "trn2", {"out": "pe", "kb": 1}),
    (33, 2100, 300, torch.float32, "trn2", {"out": "dma", "kb": 2}),
    (8, 640, 1100, torch.bfloat16, "trn3", {"a_form": matmul_plan.PE_T}),  # x rows, TensorE transposes
    (8, 1024, 700, torch.bfloat16, "trn2", {"whole": True}),   # x^T by one DMA transpose of all of K
    (520, 300, 1024, torch.bfloat16, "trn2", {"out": "pe"}),   # two m-tiles of 512, one of 8 rows
    (520, 200, 1000, torch.float32, "trn3", {"out": "dma"}),
    (33, 257, 130, torch.float32, "trn1", {"out": "pe"}),      # trn1: no DMA transpose
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{str(c[3])[6:]}-{c[4]}-"
                         + "-".join(f"{k}={v}" for k, v in c[5].items()))
def test_transposed_matmul_matches_eager(monkeypatch, case):
    M, K, N, dt, target, want = case
    _force(monkeypatch, **want)
    x, w = rand(M, K, dtype=dt, seed=M + K), rand(K, N, dtype=dt, seed=N, low=-0.5, high=0.5)
    low = check(torch.mm, x, w, target=target)
    assert _transposed(low), _notes(low)
    assert "matmul(" in low.dumps["tir.txt"] and low.result.stats.instructions > 0
    _wrong(x, w, low.outputs[0])


LINEAR_CASES = [  # (M, K, N, dtype, target, out path)
    (8, 700, 600, torch.bfloat16, "trn2", "pe"),
    (8, 700, 600, torch.bfloat16, "trn2", "dma"),
    (33, 300, 1100, torch.float32, "trn3", "pe"),
    (1, 520, 200, torch.float32, "trn3", "dma"),
]


@pytest.mark.parametrize("case", LINEAR_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{str(c[3])[6:]}-{c[4]}-{c[5]}")
def test_transposed_linear_with_bias_and_gelu(monkeypatch, case):
    """``F.linear`` reads the weight as W^T (a DMA transpose per K tile on trn2/trn3, TensorE
    transposes in fp32); its bias is a row bias folded into the accumulation as a product of the
    bias row (stationary, [1, n]) with a ones row (moving, [1, m]); GELU runs in the epilogue."""
    M, K, N, dt, target, out = case
    _force(monkeypatch, out=out)
    x = rand(M, K, dtype=dt, seed=1)
    w, b = rand(N, K, dtype=dt, seed=2, low=-0.1, high=0.1), rand(N, dtype=dt, seed=3)
    low = check(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, target=target)
    assert _transposed(low) and f"out={out})" in _chosen(low)
    with pytest.raises(AssertionError):       # the bias left out
        assert_close(low.outputs[0], F.gelu(F.linear(x, w)))


@pytest.mark.parametrize("out", ["pe", "dma"])
def test_transposed_epilogue_reads_inputs_and_indices(monkeypatch, out):
    """A residual [M, N] and the output's row and column indices in the epilogue: with out="dma"
    they are read (and computed) in the transposed tile, N on partitions and M along the free
    dim; a residual read in the wrong layout (transposed) fails."""
    _force(monkeypatch, out=out)
    M, K, N = 33, 300, 260
    x, w = rand(M, K, seed=4), rand(K, N, seed=5, low=-0.2, high=0.2)
    r, bias = rand(M, N, seed=6), rand(N, seed=7)

    def fn(x, w, r, bias):
        rows = torch.arange(M, dtype=torch.float32)[:, None]
        cols = torch.arange(N, dtype=torch.float32)
        return torch.relu(x @ w + bias) + r * 0.5 + rows * 0.01 - cols * 0.001

    low = check(fn, x, w, r, bias, target="trn2")
    assert _transposed(low) and f"out={out})" in _chosen(low)
    rt = r.t().contiguous().reshape(M, N)      # the residual's elements in column order
    with pytest.raises(AssertionError):
        assert_close(low.outputs[0], fn(x, w, rt, bias))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_transposed_batched_matmul(monkeypatch, dt):
    """Batch axes loop outside the blocks; an fp32 result of bf16 operands is a bare cast."""
    _force(monkeypatch)
    a, b = rand(3, 8, 400, dtype=dt, seed=8), rand(3, 400, 700, dtype=dt, seed=9, low=-0.3, high=0.3)
    low = check(lambda a, b: torch.bmm(a, b).float(), a, b, target="trn3")
    assert _transposed(low)
    with pytest.raises(AssertionError):       # batches swapped
        assert_close(low.outputs[0], torch.bmm(a, b).float().roll(1, dims=0))


def test_transposed_matmul_with_folded_layer_norm(monkeypatch):
    """A layer norm's weight and bias folded into the A operand (passes/norm_fold.py) are
    applied where the transposed form makes its A^T tiles."""
    _force(monkeypatch)
    M, K, N = 8, 384, 300
    x, g, beta = rand(M, K, seed=10), rand(K, seed=11), rand(K, seed=12)
    w = rand(N, K, seed=13, low=-0.1, high=0.1)
    low = check(lambda x, g, beta, w: F.linear(F.layer_norm(x, (K,), g, beta), w), x, g, beta, w,
                target="trn2", scale=4.0)
    assert _transposed(low)


@pytest.mark.parametrize("case", [
    (8, 1000, 1300, torch.float32, "trn3"),
    (1, 300, 700, torch.float32, "trn2"),
    (33, 1000, 1300, torch.float32, "trn3"),
    (200, 1000, 1300, torch.float32, "trn2"),
], ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{str(c[3])[6:]}-{c[4]}")
def test_planner_chooses_the_transposed_form_where_it_saves_tensor_time(case):
    """fp32 products run at a quarter of the bf16 rate, so with few rows (or a partial last
    m-tile: 200 = 128 + 72) TensorE bounds the usual form; the planner's scores pick the
    transposed one by themselves (no forcing)."""
    M, K, N, dt, target = case
    x, w = rand(M, K, dtype=dt, seed=14), rand(K, N, dtype=dt, seed=15, low=-0.5, high=0.5)
    low = check(torch.mm, x, w, target=target)
    assert _transposed(low), _notes(low)
    _wrong(x, w, low.outputs[0])


def test_no_transposed_candidates_where_it_saves_no_tensor_time():
    """M a multiple of 128: the transposed products cost what the usual ones do (128 columns of
    moving data per 128 x 128 outputs either way), so only the transposes back would be added."""
    t = get_target("trn2")
    s = matmul_plan.MatmulShape(1, 256, 1024, 1024, DType.BF16, DType.BF16, matmul_plan.DMA_T,
                                matmul_plan.DIRECT, (), 1, cast_only=True)
    assert matmul_plan.transposed_candidates(s, t) == []
    assert matmul_plan.transposed_candidates(replace(s, M=8), t)


def test_products_are_priced_with_a_new_stationary_every_instruction():
    """Every transposed product loads a new stationary (a B tile); ``c_matmul`` prices it at
    ``max(min(64, 128), m)`` cycles, the 64-cycle minimum being the back-to-back LoadStationary
    (the simulator adds the exposed LoadStationary after an idle TensorE, ``TensorRamp``): M = 8
    costs 64 cycles per [128 x 128] weight tile, half of the usual form's 512 per [128 x 512]."""
    t = get_target("trn3")
    s = matmul_plan.MatmulShape(1, 8, 8192, 8192, DType.BF16, DType.BF16, matmul_plan.DMA_T,
                                matmul_plan.DIRECT, (), 1, cast_only=True)
    pr = matmul_plan._Probe(s, t)
    assert pr.matmul(128, 8) == pytest.approx(64 / t.tensor_clock_ghz)
    kt = 8192 // 128
    assert matmul_plan.products_ns(s, pr, True) == pytest.approx(kt * 64 * 64 / t.tensor_clock_ghz)
    assert matmul_plan.products_ns(s, pr, False) == pytest.approx(kt * 16 * 512 / t.tensor_clock_ghz)


def test_transposed_program_loads_a_new_stationary_every_product(monkeypatch):
    """In the emitted program, consecutive products never share a stationary operand, and each
    costs the instruction minimum in the cost table."""
    _force(monkeypatch, out="pe")
    x, w = rand(8, 384, dtype=torch.bfloat16, seed=16), rand(384, 384, dtype=torch.bfloat16, seed=17)
    low = lower_and_run(torch.mm, x, w, target="trn2")
    assert_close(low.outputs[0], x @ w)
    pe = next(s for q, s in low.compiled.program.streams.items() if q.engine is EngineKind.TENSOR)
    instrs = list(pe)
    products = [i for i in instrs if i.op is Op.MATMUL and i.srcs[0].partitions > 1]
    assert len(products) == 3 * 3                      # K tiles x n-tiles
    for a, b in zip(products, products[1:]):
        assert (a.srcs[0].buffer, a.srcs[0].byte_offset) != (b.srcs[0].buffer, b.srcs[0].byte_offset)
    t = get_target("trn2")
    for p in products:
        assert instr_cost(p, Queue(EngineKind.TENSOR), t).busy_ns == pytest.approx(64 / t.tensor_clock_ghz)


def test_fp8_double_row_refuses_the_transposed_form_with_a_reason():
    E4M3 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(18)
    a = (torch.randn(5, 257, generator=g) * 3).to(E4M3)
    b = (torch.randn(7, 257, generator=g) * 3).to(E4M3)
    s = torch.tensor(0.5)
    fn = (lambda a, b, s: torch._scaled_mm(a, b.t(), s, s, out_dtype=torch.bfloat16))
    low = lower_and_run(fn, a, b, s, target="trn2")
    assert_close(low.outputs[0], fn(a, b, s))
    assert "transposed form (B stationary) refused: fp8 double-row K tiles" in _notes(low)
    assert not _transposed(low)


def test_decode_step_x_transposed_in_one_dma():
    """A resident block of a few rows read by DMA transposes, rows back to back and K a multiple
    of 128, comes by one DMA transpose of all of K (``whole_block``: 64 transfers of [128, 8],
    each bound by its fixed phase, become one); the usual form, against eager."""
    x, w = rand(8, 1024, dtype=torch.bfloat16, seed=19), rand(1024, 640, dtype=torch.bfloat16, seed=20)
    low = check(torch.mm, x, w, target="trn2")
    assert "(K tiles in one DMA)" in _chosen(low), _notes(low)
    tir = low.dumps["tir.txt"]
    assert tir.count("dma_copy(transpose=True)") == 1, tir
    _wrong(x, w, low.outputs[0])
