"""Matmuls of one row (a decode step's projections: x [1, K] @ W [K, N] + bias): the row bias
loaded once (``matmul.fold_row_bias``: with one output row no other row can differ, so the
bias view's row stride does not matter), and the streamed x^T of a resident-B blocking loaded
by one DMA of all its K tiles (``matmul.plan.stream_whole``) instead of one [128, 1] transfer
per K tile.

Against eager through the simulator on shapes crossing tile edges (K a multiple of 128 and
not, N past 512 with a partial last n-tile), bf16 and fp32, on trn2 and trn3; a dropped K tile,
a left-out bias and a shifted n-tile must each fail the comparison."""
from __future__ import annotations

import pytest
import torch

import lowering.tiling.matmul.kernel as mm
from lowering.tiling.matmul import plan as matmul_plan
from lowering_helpers import assert_close, check, rand
from runtime_sim.isa import DType
from runtime_sim.targets import get_target


def _notes(low) -> str:
    return "\n".join(ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# "))


def _per_tile_bias_loads(low) -> int:
    """Loads of the bias (the kernel's input 2) into per-output-tile epilogue tiles
    (``_epilogue``'s ``epi2`` tiles)."""
    return sum(1 for ln in low.dumps["tir.txt"].splitlines()
               if "dma_copy" in ln and ".epi2" in ln.split("<-")[0])


def _force_resident_b(monkeypatch) -> None:
    """choose_blocking returns the best-scored usual resident-B candidate (the form whose
    streamed side is x^T)."""
    orig = matmul_plan.choose_blocking

    def choose(s, t):
        best, scored = orig(s, t)
        pick = [c for c in scored if c.resident == "B" and not c.swap and not c.stream]
        assert pick, f"no resident-B candidate for {s}"
        return pick[0], [pick[0]] + [c for c in scored if c is not pick[0]]
    monkeypatch.setattr(mm, "choose_blocking", choose)


CASES = [  # (K, N, dtype, target)
    (768, 2304, torch.bfloat16, "trn3"),
    (768, 640, torch.bfloat16, "trn2"),
    (384, 513, torch.float32, "trn3"),
    (300, 700, torch.bfloat16, "trn2"),     # K not a multiple of 128: x^T per K tile
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{str(c[2])[6:]}-{c[3]}")
def test_one_row_addmm_matches_eager(monkeypatch, case):
    K, N, dt, target = case
    _force_resident_b(monkeypatch)
    x = rand(1, K, dtype=dt, seed=K)
    w = rand(K, N, dtype=dt, seed=N, low=-0.3, high=0.3)
    b = rand(N, dtype=dt, seed=3)
    low = check(lambda b, x, w: torch.addmm(b, x, w), b, x, w, target=target)
    assert "matmul(" in low.dumps["tir.txt"] and low.result.stats.instructions > 0
    notes = _notes(low)
    assert "resident=B" in notes, notes
    # the bias row once for the kernel, not one [1, 512] load per output tile
    assert _per_tile_bias_loads(low) == 0, notes
    whole = "(stream_whole)" in notes
    assert whole == (K % 128 == 0), notes
    out = low.outputs[0]
    with pytest.raises(AssertionError):       # the bias left out
        assert_close(out, (x.float() @ w.float()).to(dt))
    with pytest.raises(AssertionError):       # the first K tile dropped
        assert_close(out, (x[:, 128:].float() @ w[128:].float() + b.float()).to(dt))
    with pytest.raises(AssertionError):       # n-tiles shifted by one
        assert_close(out.roll(512, dims=-1), torch.addmm(b, x, w))


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_one_row_projection_with_residual(target):
    """GPT-2's attention projection: ``residual + (x @ W + bias)`` with one row, the bias
    folded or added from one row tile, the residual read in the epilogue."""
    K, N = 768, 768
    x, w = rand(1, K, dtype=torch.bfloat16, seed=1), rand(K, N, dtype=torch.bfloat16, seed=2,
                                                          low=-0.2, high=0.2)
    b, r = rand(N, dtype=torch.bfloat16, seed=3), rand(1, N, dtype=torch.bfloat16, seed=4)

    def fn(x, w, b, r):
        return r + torch.addmm(b, x, w)

    low = check(fn, x, w, b, r, target=target)
    assert _per_tile_bias_loads(low) == 0, _notes(low)
    with pytest.raises(AssertionError):
        assert_close(low.outputs[0], r + x @ w)


def test_stream_whole_only_for_a_few_direct_columns_bound_by_the_fixed_phase():
    t = get_target("trn3")
    s = matmul_plan.MatmulShape(1, 1, 2304, 768, DType.BF16, DType.BF16, matmul_plan.DIRECT,
                                matmul_plan.DIRECT, (), 1, cast_only=True)
    res_b = matmul_plan.Blocking("B", 5, 1, 2, 1)
    assert matmul_plan.stream_whole(s, res_b, t)
    # the streamed side of a resident-A blocking is the weight: never by one DMA
    assert not matmul_plan.stream_whole(s, matmul_plan.Blocking("A", 1, 3, 2, 2), t)
    # a partial K tile, a TensorE-transposed x, streamed per K tile, transposed form: no
    from dataclasses import replace
    assert not matmul_plan.stream_whole(replace(s, K=700), res_b, t)
    assert not matmul_plan.stream_whole(replace(s, a_form=matmul_plan.PE_T), res_b, t)
    assert not matmul_plan.stream_whole(s, replace(res_b, stream=True), t)
    assert not matmul_plan.stream_whole(s, replace(res_b, swap=True), t)
    # rows past one group: the streamed side is refilled per group, not loaded once
    assert not matmul_plan.stream_whole(replace(s, M=300), res_b, t)


ROW_CASES = [  # (K, N, dtype, target)
    (768, 2304, torch.bfloat16, "trn3"),
    (768, 640, torch.bfloat16, "trn2"),
    (384, 513, torch.float32, "trn1"),
    (300, 700, torch.bfloat16, "trn3"),     # K not a multiple of 128: no whole-row load
]


@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{str(c[2])[6:]}-{c[3]}")
def test_resident_row_by_transposes(case):
    """A layer-normed row resident in SBUF feeding a one-row matmul (GPT-2's QKV projection,
    the norm's affine folded into the A side): its K tiles reach [128, K/128] by TensorE
    transposes and one copy out of PSUM (``_Side._transpose_row``) rather than an SBUF -> SBUF
    DMA, the folded affine applied after; then a second one-row matmul on the first one's
    GELU (its row resident too)."""
    K, N, dt, target = case
    x = rand(1, K, dtype=dt, seed=K + 1)
    g, beta = rand(K, dtype=dt, seed=2), rand(K, dtype=dt, seed=3)
    w1 = rand(K, N, dtype=dt, seed=4, low=-0.1, high=0.1)
    b1 = rand(N, dtype=dt, seed=5)
    w2 = rand(N, 256, dtype=dt, seed=6, low=-0.1, high=0.1)

    def fn(x, g, beta, w1, b1, w2):
        h = torch.addmm(b1, torch.nn.functional.layer_norm(x, (K,), g, beta), w1)
        return torch.nn.functional.gelu(h) @ w2

    low = check(fn, x, g, beta, w1, b1, w2, target=target, scale=2.0)
    tir = low.dumps["tir.txt"]
    assert "matmul(" in tir and low.result.stats.instructions > 0
    by_pe = ".rowT[" in tir
    assert by_pe == (K % 128 == 0 and mm.row_by_transposes(get_target(target), K // 128)), _notes(low)
    out = low.outputs[0]
    with pytest.raises(AssertionError):       # the norm's affine left out
        xn = torch.nn.functional.layer_norm(x, (K,))
        assert_close(out, torch.nn.functional.gelu(torch.addmm(b1, xn, w1)) @ w2, scale=2.0)
    with pytest.raises(AssertionError):       # the first K tile of the first matmul dropped
        xn = torch.nn.functional.layer_norm(x, (K,), g, beta)
        h = (xn[:, 128:].float() @ w1[128:].float() + b1.float()).to(dt)
        assert_close(out, torch.nn.functional.gelu(h) @ w2, scale=2.0)


def test_row_by_transposes_only_where_cheaper_than_a_dma():
    t3, t2, t1 = get_target("trn3"), get_target("trn2"), get_target("trn1")
    assert mm.row_by_transposes(t3, 6)          # GPT-2's 768: 6 transposes
    # 3072 (its MLP's second matmul): on trn3 the transposes run two at a time (the background
    # lane) and beat the DMA's fixed phase plus its 3072 two-byte runs; trn2 runs them one by one
    assert mm.row_by_transposes(t3, 24)
    assert not mm.row_by_transposes(t2, 24)
    assert not mm.row_by_transposes(t2, 32)
    assert mm.row_by_transposes(t1, 24)         # trn1: a 1.3 us fixed phase, no power ramp


AHEAD_CASES = [  # (K, N, dtype, target): GPT-2's MLP shapes and ones crossing tile edges
    (768, 3072, torch.bfloat16, "trn3"),     # resident x^T, the weight streamed in groups
    (3072, 768, torch.bfloat16, "trn2"),     # the transposed form's weight chunks
    (640, 1536, torch.float32, "trn3"),
    (768, 1000, torch.bfloat16, "trn2"),     # a partial group: slots as chosen
]


@pytest.mark.parametrize("case", AHEAD_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{str(c[2])[6:]}-{c[3]}")
def test_one_row_weights_streamed_ahead(case):
    """A one-row matmul after another kernel (so its weights load ahead, ``_ahead``) whose
    streamed side is the weight: every load of its full groups in a slot of its own
    (``_stream_ahead``), as many as fit (a partial last group: its loads reuse the full
    groups' slots, ``stream.stream_loads``); the values match eager whatever the slots."""
    K, N, dt, target = case
    x = rand(1, K, dtype=dt, seed=K + 7)
    w, bias = rand(K, N, dtype=dt, seed=8, low=-0.1, high=0.1), rand(N, dtype=dt, seed=9)

    def fn(x, w, bias):
        return torch.nn.functional.gelu(torch.addmm(bias, torch.relu(x) * 0.5, w))

    low = check(fn, x, w, bias, target=target)
    notes = _notes(low)
    if N % 512 == 0:      # full groups only: the slots cover every load
        assert "_stream_ahead" in notes, notes
    out = low.outputs[0]
    with pytest.raises(AssertionError):       # the first K tile dropped
        xr = torch.relu(x) * 0.5
        assert_close(out, torch.nn.functional.gelu(
            (xr[:, 128:].float() @ w[128:].float() + bias.float()).to(dt)))


def test_stream_loads_counts_full_groups_only():
    s = matmul_plan.MatmulShape(1, 1, 3072, 768, DType.BF16, DType.BF16, matmul_plan.DIRECT,
                                matmul_plan.DIRECT, (), 1, cast_only=True)
    assert mm.stream_loads(s, matmul_plan.Blocking("A", 1, 3, 2, 2)) == 2 * 6   # 2 groups x 6 K
    from dataclasses import replace
    # a partial last group (N = 3000: one full group of 1536 and a partial one) is left out
    assert mm.stream_loads(replace(s, N=3000), matmul_plan.Blocking("A", 1, 3, 2, 2)) == 1 * 6
    # the transposed form's partial group: none counted
    assert mm.stream_loads(replace(s, N=700, K=3072), matmul_plan.Blocking("A", 1, 3, 2, 2, swap=True,
                                                                            kb=4)) == 0
    t2 = replace(s, N=768, K=3072)
    assert mm.stream_loads(t2, matmul_plan.Blocking("A", 1, 3, 2, 2, swap=True, kb=4)) == 2 * 6


@pytest.mark.parametrize("case", [(3072, 768, "trn3", "res"), (768, 700, "trn2", "gelu"),
                                  (1000, 300, "trn3", "gelu")],
                         ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}")
def test_transposed_cells_leave_psum_in_the_output_type(case):
    """The transposed form (decode: GPT-2's second MLP matmul) with an epilogue that reads the
    accumulator only as ``cast(acc)`` to the output type once the bias is folded (``residual +
    cast(acc)``, ``gelu(cast(acc))``): its cells leave PSUM rounded to bf16, the rounding the
    cast does anyway (``matmul.plan.ev_dtype``), and the values match eager."""
    K, N, target, epi = case
    x = rand(1, K, dtype=torch.bfloat16, seed=K)
    w = rand(K, N, dtype=torch.bfloat16, seed=N, low=-0.1, high=0.1)
    b, r = rand(N, dtype=torch.bfloat16, seed=11), rand(1, N, dtype=torch.bfloat16, seed=12)

    def fn(x, w, b, r):
        h = torch.addmm(b, torch.relu(x), w)
        return r + h if epi == "res" else torch.nn.functional.gelu(h)

    orig = matmul_plan.choose_blocking

    def choose(s, t):
        best, scored = orig(s, t)
        pick = [c for c in scored if c.swap and c.out == "pe"]
        return pick[0], [pick[0]] + [c for c in scored if c is not pick[0]]
    mp = pytest.MonkeyPatch()
    mp.setattr(mm, "choose_blocking", choose)
    try:
        low = check(fn, x, w, b, r, target=target)
    finally:
        mp.undo()
    tir = low.dumps["tir.txt"]
    assert "transposed: B stationary" in _notes(low), _notes(low)
    evt = [ln for ln in tir.splitlines() if "sbuf " in ln and ".evT" in ln and "bufs=" in ln]
    assert evt and all("bfloat16" in ln for ln in evt), evt
    out = low.outputs[0]
    with pytest.raises(AssertionError):       # the bias left out
        h = torch.relu(x) @ w
        assert_close(out, r + h if epi == "res" else torch.nn.functional.gelu(h))
