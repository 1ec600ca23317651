"""Smoke test of bench/bench_codegen.py on one tiny case (the full sizes live in the bench only)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


bench = _load("bench_codegen", os.path.join(ROOT, "bench", "bench_codegen.py"))


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
    floors = _load("floors", path)
    assert bench.PEAK == floors.PEAK
    for t in bench.PEAK:
        for work in ({"flops": 1e12}, {"nbytes": 1e9}, {"transcendentals": 1e9},
                     {"flops": 3e11, "nbytes": 4e8, "transcendentals": 2e8}):
            assert bench.floor_s(t, **work) == floors.floor_s(t, **work)
