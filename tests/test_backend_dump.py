"""Dump directories and the neuron-dump CLI that reads them."""
from __future__ import annotations

import json
import os

import pytest
import torch

from neuron_compiler.inspect import main as neuron_dump
from neuron_compiler.testing import compile_for_neuron


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def model(x, w):
    h = torch.relu(x @ w)
    return torch.fft.rfft(h, dim=-1), h.sum(dim=0)


def _compile_into(dump_dir, monkeypatch=None, via_env=False):
    if via_env:
        monkeypatch.setenv("NEURON_DUMP_DIR", str(dump_dir))
        f = compile_for_neuron(model)
    else:
        f = compile_for_neuron(model, options={"dump_dir": str(dump_dir)})
    with torch.no_grad():
        f(torch.randn(8, 16), torch.randn(16, 32))


def test_dump_files(tmp_path):
    _compile_into(tmp_path)
    compiles = sorted(d for d in os.listdir(tmp_path) if d != "index.md")
    assert len(compiles) == 1 and compiles[0].startswith("000_inference_")
    cdir = tmp_path / compiles[0]
    for name in ("fx_graph_readable.py", "fx_graph_partitioned.py", "partitions.txt",
                 "compile.json"):
        assert (cdir / name).is_file(), name
    assert "torch.ops.aten.mm.default" in (cdir / "fx_graph_readable.py").read_text()
    parts = (cdir / "partitions.txt").read_text()
    assert "aten._fft_r2c.default x1" in parts and "device partitions (1)" in parts
    meta = json.loads((cdir / "compile.json").read_text())
    assert meta["kind"] == "inference" and meta["target"] == "trn2"
    assert meta["fallbacks"][0]["op"] == "aten._fft_r2c.default"
    pdir = cdir / "fused_0.s0"
    assert (pdir / "signature.txt").read_text() == "arg0: float32[8, 16]\narg1: float32[16, 32]\n"
    assert (pdir / "compiled.json").is_file() and (pdir / "stats.json").is_file()
    assert (pdir / "program.txt").is_file()
    stage_files = set(os.listdir(pdir)) - {"signature.txt", "fx_graph_readable.py",
                                           "compiled.json", "stats.json"}
    assert stage_files, "the lowering wrote no stage files"
    compiled = json.loads((pdir / "compiled.json").read_text())
    assert sum(compiled["instructions_per_queue"].values()) > 0


def test_dump_dir_from_environment_and_numbering(tmp_path, monkeypatch):
    _compile_into(tmp_path, monkeypatch, via_env=True)
    torch._dynamo.reset()
    _compile_into(tmp_path, monkeypatch, via_env=True)
    names = sorted(d for d in os.listdir(tmp_path) if d != "index.md")
    assert [n[:4] for n in names] == ["000_", "001_"]


def test_inspect_cli(tmp_path, capsys):
    _compile_into(tmp_path)
    assert neuron_dump([str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "000_inference_" in listing and "trn2" in listing

    assert neuron_dump([str(tmp_path), "0"]) == 0
    summary = capsys.readouterr().out
    assert "aten._fft_r2c.default" in summary and "fused_0.s0" in summary
    assert "per queue" in summary and "device" in summary

    assert neuron_dump([str(tmp_path), "0", "partitions.txt"]) == 0
    assert "device partitions" in capsys.readouterr().out

    assert neuron_dump([str(tmp_path), "0", "fused_0/program.txt"]) == 0
    assert capsys.readouterr().out.strip()

    assert neuron_dump([str(tmp_path), "7"]) == 2
    assert "no compile '7'" in capsys.readouterr().err
    assert neuron_dump([str(tmp_path), "0", "nope.txt"]) == 2
    assert neuron_dump([str(tmp_path / "missing")]) == 2
