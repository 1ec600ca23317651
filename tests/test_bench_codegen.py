"""Smoke test of bench/bench_codegen.py on one tiny case (the full sizes live in the bench only)."""
from __future__ import annotations

import os

import pytest
import torch

from script_loader import load_script

ROOT = os.path.join(os.path.dirname(__file__), "..")


bench = load_script("bench_codegen", os.path.join(ROOT, "bench", "bench_codegen.py"))


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_tiny_mm_row():
    args = (bench.bf16(128, 256), bench.bf16(256, 128))
    row = bench.measure("tiny mm", torch.mm, args, "trn2", {"flops": 2 * 128 * 256 * 128}, False)
    assert "error" not in row, row
    assert row["floor_us"] == pytest.approx(2 * 128 * 256 * 128 / (128 * 128 * 2 * 2.4e9) * 1e6)
    assert row["steady_us"] == row["device_us"] > 0 and row["transfer_us"] == 0.0
    assert row["instructions"] > 0 and row["fallbacks"] == [] and row["compile_s"] > 0
    assert row["of_floor"] == pytest.approx(row["floor_us"] / row["steady_us"])
    assert "tiny mm" in bench.format_row(row)


def test_crash_is_a_failed_row():
    def boom(x):
        raise RuntimeError("kaboom")
    row = bench.measure("boom", boom, (torch.ones(4),), "trn1", {}, False)
    assert row["error"].startswith("RuntimeError: kaboom")
    assert "FAILED RuntimeError: kaboom" in bench.format_row(row)


def test_peaks_agree_with_floors_py():
    path = os.path.join(ROOT, "..", "shared", "tools", "floors.py")
    if not os.path.exists(path):
        pytest.skip("../shared/tools/floors.py not present")
    floors = load_script("floors", path)
    assert bench.PEAK == floors.PEAK
    for t in bench.PEAK:
        for work in ({"flops": 1e12}, {"nbytes": 1e9}, {"transcendentals": 1e9},
                     {"flops": 3e11, "nbytes": 4e8, "transcendentals": 2e8}):
            assert bench.floor_s(t, **work) == floors.floor_s(t, **work)


def test_first_call_times_the_compile_and_later_calls():
    res = bench.first_call(lambda x: torch.relu(x) + 1, (torch.ones(4, 8),),
                           {"backend": "neuron", "options": {"sim_mode": "timing"}}, later=3)
    assert set(res) == {"first_call_s", "later_s"}
    # the first call compiles (Dynamo, AOTAutograd, the lowering): far slower than a cached call
    assert res["first_call_s"] > res["later_s"] > 0


def test_cold_row_keeps_the_fastest_round_with_its_fields():
    rounds = {"neuron": iter([{"compile_s": 3.0, "first_call_s": 3.0, "later_s": 0.5},
                              {"compile_s": 2.0, "first_call_s": 2.0, "later_s": 0.9}]),
              "inductor": iter([{"compile_s": 10.0, "first_call_s": 10.0, "later_s": 0.1},
                                {"compile_s": 12.0, "first_call_s": 12.0, "later_s": 0.2}])}
    row = bench.cold_row("first_gpt2", ("neuron", "inductor"), 2,
                         run=lambda k, b: next(rounds[b]))
    assert row["neuron_rounds_s"] == [3.0, 2.0] and row["inductor_rounds_s"] == [10.0, 12.0]
    assert row["neuron_compile_s"] == 2.0 and row["neuron_later_s"] == 0.9   # the same round
    assert row["inductor_compile_s"] == 10.0 and row["inductor_later_s"] == 0.1
    assert row["ratio"] == pytest.approx(0.2) and row["goal"] == 0.3
    text = bench.format_cold_row("x", row, ("neuron", "inductor"))
    assert " ok " in text and "later calls s: neuron 0.90, inductor 0.10" in text
    over = dict(row, ratio=0.4)
    assert " OVER " in bench.format_cold_row("x", over, ("neuron", "inductor"))


def test_cold_row_reports_a_failed_backend():
    row = bench.cold_row("first_swin_t", ("neuron", "inductor"), 2,
                         run=lambda k, b: ({"error": "child exit 1: boom"} if b == "inductor"
                                           else {"compile_s": 1.5, "first_call_s": 1.5}))
    assert row["ratio"] is None and row["inductor_error"] == "child exit 1: boom"
    assert row["neuron_rounds_s"] == [1.5, 1.5]
    assert "inductor FAILED child exit 1: boom" in bench.format_cold_row("x", row,
                                                                         ("neuron", "inductor"))


def test_the_import_clock_starts_before_torch():
    """first_gpt2 counts imports from ``_STARTED``: it must be set before ``import torch``."""
    src = open(os.path.join(ROOT, "bench", "bench_codegen.py")).read().splitlines()
    started = next(i for i, line in enumerate(src) if line.startswith("_STARTED ="))
    first_torch = next(i for i, line in enumerate(src) if line.startswith("import torch"))
    assert started < first_torch


def test_vision_model_is_the_issues_case():
    try:
        model, x = bench.vision_model("mobilenet_v3_small")
    except Exception as exc:  # torchvision not installed for bench/zoo_vision.py (docs/zoo.md)
        if type(exc).__name__ != "Unavailable":
            raise
        pytest.skip(str(exc))
    assert x.shape == (1, 3, 64, 64) and x.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters()) and not model.training
    with torch.no_grad():
        assert model(x).shape == (1, 1000)
