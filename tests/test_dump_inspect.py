"""The inspection tool: index.md, per-partition decisions (fusion, matmul blocking) and the
memory-plan SVG, failed partitions dumped with their error, dumps on cache hits,
``neuron-dump DIR --html`` (self-contained, rendered in headless Chromium) and
``neuron-dump diff``."""
from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from neuron_compiler.errors import NeuronInternalError
from neuron_compiler.inspect import main as neuron_dump
from neuron_compiler.runtime import PROGRAM_CACHE
from test_eval_html import test_html_renders_in_headless_chromium as chromium_check


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model(width: int):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(96, width), torch.nn.GELU(),
                            torch.nn.Linear(width, 80), torch.nn.LayerNorm(80)).eval()

    def f(x):
        return torch.fft.rfft(m(x), dim=-1).real        # the fft falls back
    return f


def _compile_into(dump_dir, width=160, reset=True, **options):
    if reset:
        torch._dynamo.reset()
    f = torch.compile(_model(width), backend="neuron",
                      options={"dump_dir": str(dump_dir), **options})
    with torch.no_grad():
        f(torch.randn(40, 96))
    return f          # keeps its programs alive (the process-wide cache holds them weakly)


def _only_compile(root) -> str:
    dirs = [d for d in sorted(os.listdir(root)) if re.match(r"\d{3}_", d)]
    assert len(dirs) == 1, dirs
    return os.path.join(root, dirs[0])


def _device_partition(cdir) -> str:
    for d in sorted(os.listdir(cdir)):
        p = os.path.join(cdir, d)
        if os.path.isdir(p) and "mm" in open(os.path.join(p, "fx_graph_readable.py")).read():
            return p
    raise AssertionError(f"no matmul partition in {cdir}")


def test_index_links_every_compile_and_its_files(tmp_path):
    _compile_into(tmp_path)
    _compile_into(tmp_path, width=200)
    index = (tmp_path / "index.md").read_text()
    rows = [line for line in index.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 2
    links = re.findall(r"\]\(([^)]+)\)", index)
    assert links and all(os.path.exists(tmp_path / link) for link in links), links
    for row, d in zip(rows, sorted(x for x in os.listdir(tmp_path) if x[:3].isdigit())):
        assert f"[{d}]({d}/)" in row and "decisions.md" in row and "memory_plan.svg" in row
        assert "**fused_" in row and " device " in row


def test_decisions_and_memory_plan_picture(tmp_path):
    _compile_into(tmp_path)
    pdir = _device_partition(_only_compile(tmp_path))
    text = open(os.path.join(pdir, "decisions.md")).read()
    fusion = text.split("## Fusion")[1].split("## Matmul blocking")[0]
    assert "k0 matmul (addmm, gelu)" in fusion                  # the epilogue was fused
    assert re.search(r"%t\d+: written by k\d matmul .*, (stays in SBUF \(resident\)|goes "
                     r"through HBM); read by k\d (matmul|layer_norm) .*; why not fused: ", fusion)
    blocking = text.split("## Matmul blocking")[1].split("## Other")[0]
    assert blocking.count("- chosen: resident=") == 2
    assert re.search(r"why: lowest of \d+ fitting candidates; next best ", blocking)
    tir = open(os.path.join(pdir, "tir.txt")).read()
    chosen = re.findall(r"chose (.*?) est=", tir)
    assert chosen and all(f"chosen: {c}," in blocking for c in chosen)
    svg = ET.parse(os.path.join(pdir, "memory_plan.svg")).getroot()
    rects = [e for e in svg.iter() if e.tag.endswith("rect") and e.find("{*}title") is not None]
    plan = open(os.path.join(pdir, "memory_plan.txt")).read()
    planned = [ln for ln in plan.splitlines() if re.match(r"\s+(sbuf|psum) ", ln)
               and "(in " not in ln]
    assert len(rects) == len(planned) > 0
    titles = {r.find("{*}title").text.split(":")[0] for r in rects}
    assert titles == {ln.split()[1] for ln in planned}


def test_failed_partition_is_dumped_with_its_error(tmp_path, monkeypatch):
    import lowering.api

    def broken(*args, **kwargs):
        raise RuntimeError("injected lowering bug")
    monkeypatch.setattr(lowering.api, "compile_graph", broken)
    with pytest.raises(Exception) as info:
        _compile_into(tmp_path)
    assert "injected lowering bug" in str(info.value)
    cdir = _only_compile(tmp_path)
    errors = [os.path.join(cdir, d, "error.txt") for d in os.listdir(cdir)
              if os.path.isfile(os.path.join(cdir, d, "error.txt"))]
    assert len(errors) == 1
    err = open(errors[0]).read()
    assert "injected lowering bug" in err and "Traceback" in err
    assert isinstance(info.value, NeuronInternalError) or "NeuronInternalError" in err
    assert "error: " in (tmp_path / "index.md").read_text()
    assert neuron_dump([str(tmp_path), "0"]) == 0


def _stage_files(pdir) -> set[str]:
    return {f for f in os.listdir(pdir) if f.endswith(".txt") and f != "cache_hit.txt"}


def test_dumps_are_complete_on_cache_hits(tmp_path):
    keep = _compile_into(tmp_path / "a", cache_dir=str(tmp_path / "cache"))
    first = _device_partition(_only_compile(tmp_path / "a"))
    _compile_into(tmp_path / "b", reset=False)                 # process-wide program cache
    second = _device_partition(_only_compile(tmp_path / "b"))
    assert "process-wide program cache" in open(os.path.join(second, "cache_hit.txt")).read()
    del keep
    PROGRAM_CACHE.clear()                                      # as a new process would start
    _compile_into(tmp_path / "c", cache_dir=str(tmp_path / "cache"))
    third = _device_partition(_only_compile(tmp_path / "c"))
    assert "on-disk compile cache" in open(os.path.join(third, "cache_hit.txt")).read()
    for pdir in (second, third):
        assert _stage_files(pdir) == _stage_files(first)
        for f in ("decisions.md", "memory_plan.svg", "compiled.json", "stats.json"):
            assert open(os.path.join(pdir, f)).read() == open(os.path.join(first, f)).read(), f
    assert "device (cache hit)" in (tmp_path / "c" / "index.md").read_text()


@pytest.fixture
def html_page(tmp_path):
    _compile_into(tmp_path / "dump")
    path = tmp_path / "dump.html"
    assert neuron_dump([str(tmp_path / "dump"), "--html", str(path)]) == 0
    return path


def test_html_is_self_contained(html_page):
    text = html_page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for part in ("Fallbacks (run in eager PyTorch)", "Device partitions", "Compiler decisions",
                 "Matmul blocking", "Memory plan", "ir_post_fusion.txt", "program.txt",
                 "aten._fft_r2c.default"):
        assert part in text, part
    assert text.count("<svg") >= 3
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"\b(src|href)\s*=", text, re.I)
    assert "@import" not in text and "url(" not in text


def test_html_renders_in_headless_chromium(html_page, tmp_path):
    # the eval report's check: a headless Chromium screenshot that is not blank and shows the
    # first chart colour (here the time-per-program bars); skipped where Chromium is absent
    chromium_check(html_page, tmp_path)


def test_diff(tmp_path, capsys):
    keep = _compile_into(tmp_path / "a")
    _compile_into(tmp_path / "same", reset=False)      # its programs are program-cache hits
    assert "cache hit" in (tmp_path / "same" / "index.md").read_text()
    del keep
    _compile_into(tmp_path / "wide", width=640)
    assert neuron_dump(["diff", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("same")
    assert neuron_dump(["diff", str(tmp_path / "a"), str(tmp_path / "wide")]) == 1
    out = capsys.readouterr().out
    changed = {line.split("  ")[0].lstrip("* ").strip() for line in out.splitlines()
               if line.startswith("* ")}
    assert "" not in changed                                   # the header row is not marked
    assert "graph" in changed
    assert any(c.endswith(" instructions") for c in changed), changed
    assert any(c.endswith(" simulated us") for c in changed), changed
    assert "fallback aten._fft_r2c.default" not in changed      # the same fallbacks
    assert out.rstrip().endswith("different (rows marked *)")
    (tmp_path / "empty").mkdir()
    assert neuron_dump(["diff", str(tmp_path / "a"), str(tmp_path / "empty")]) == 1
    assert "only in A" in capsys.readouterr().out


def test_cli_usage_errors(tmp_path, capsys):
    _compile_into(tmp_path / "a")
    assert neuron_dump(["diff", str(tmp_path / "a"), str(tmp_path / "missing")]) == 2
    assert neuron_dump(["diff", str(tmp_path / "a")]) == 2
    assert neuron_dump([str(tmp_path / "a"), "0", "--html", str(tmp_path / "x.html")]) == 2
    assert neuron_dump([str(tmp_path / "a"), "--html",
                        str(tmp_path / "no" / "such" / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and "drop COMPILE" in err and "cannot write" in err
