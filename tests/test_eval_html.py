"""``neuron-eval --html``: one self-contained file, no network resource, rendered in headless
Chromium (skipped where no Chromium is installed) and the screenshot is not blank; regressions
at the top of the page, equal percentiles said in words instead of three equal bars, sizes in
human units."""
from __future__ import annotations

import copy
import html
import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest
import torch

from neuron_compiler.eval.baseline import Limits, compare
from neuron_compiler.eval.cli import main
from neuron_compiler.eval.html_report import render_html


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    torch._dynamo.reset()
    d = tmp_path_factory.mktemp("html")
    path = d / "report.html"
    assert main(["--quiet", "zoo:mlp", "--targets", "trn2,trn3", "--iters", "2",
                 "--html", str(path), "--json", str(d / "report.json")]) == 0
    torch._dynamo.reset()
    return path


@pytest.fixture
def report(page):
    return json.loads((page.parent / "report.json").read_text())


def _bar_titles(text: str) -> list[str]:
    return re.findall(r"<rect [^>]*><title>([^<:]+):", text)


def test_equal_percentiles_are_said_not_drawn_as_three_bars(page, report):
    text = page.read_text()
    for t in ("trn2", "trn3"):   # no fallback: every call has the same simulated time
        lat = report["targets"][t]["latency_us"]
        assert lat["p50"] == lat["p90"] == lat["p99"]
        assert f"{t} {lat['p50']:,.2f} us" in text and f"{lat['p50']:,.2f} (all three equal)" \
            in text
    assert "p50 = p90 = p99 (trn2 " in text and "2 measured call(s)): every measured call" in text
    titles = _bar_titles(text)
    assert titles.count("p50 = p90 = p99") == 2 and "p90" not in titles and "p99" not in titles
    spread = copy.deepcopy(report)   # a target with a spread keeps its three bars
    spread["targets"]["trn3"]["latency_us"].update(p90=2e3, p99=3e3)
    titles = _bar_titles(render_html(spread, 0))
    assert titles.count("p50 = p90 = p99") == 1
    assert {"p50", "p90", "p99"} <= set(titles)


def test_regressions_are_at_the_top_of_the_page(report):
    hbm = report["targets"]["trn2"]["memory"]["hbm_bytes"]
    report["regressions"] = [{"target": "trn2", "metric": "memory.hbm_bytes",
                              "baseline": hbm // 2, "current": hbm, "change": 1.0,
                              "threshold": 0.1, "message": "HBM grew (test)"}]
    report["baseline"] = {"path": "ci/base.json", "metrics_compared": 9, "targets": ["trn2"],
                          "limits": {"max_slowdown": 0.1, "max_memory_growth": 0.1,
                                     "max_share_drop": 0.0, "max_compile_slowdown": None},
                          "regressions": 1, "versions": {"torch": "2.13.0"}}
    text = render_html(report, 1)
    top = text.index('<div class="alert">')
    assert top < text.index("Regressions against the baseline (1)") < text.index("<svg")
    assert text.index("HBM grew (test)") < text.index("<svg")
    assert text.index("Baseline: compared with ci/base.json") < text.index("<svg")
    assert "regression against the baseline" in text[:top]   # the verdict says why


def test_html_prints_sizes_in_human_units(report):
    """The page, with the regressions a baseline of half the HBM and latency gives."""
    baseline = copy.deepcopy(report)
    for t in baseline["targets"].values():
        t["memory"]["hbm_bytes"] //= 2
        t["latency_us"]["p50"] /= 2
    report["regressions"] = compare(report, baseline, Limits())
    assert {r["metric"] for r in report["regressions"]} >= {"memory.hbm_bytes"}
    text = html.unescape(re.sub(r"<[^>]+>", " ", render_html(report, 1)))
    assert not re.search(r"\d\.?\d*e\+\d\d", text)
    assert re.search(r"HBM \d+\.\d\d KB -> \d+\.\d\d KB", text)
    assert re.search(r"p50 latency \d+\.\d\d us -> \d+\.\d\d us", text)
    assert re.search(r"\d+\.\d\d [KMG]B / \d+\.\d\d GB", text)   # HBM used / core capacity


def test_html_is_self_contained(page):
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") >= 5
    for title in ("Steady-state latency per target", "Where the p50 latency goes",
                  "Time per device partition", "Engine utilisation", "Memory plan"):
        assert title in text
    # nothing that a browser would fetch: no scripts, links, images, imports or url()
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"\b(src|href)\s*=", text, re.I)
    assert "@import" not in text and "url(" not in text
    assert "trn2" in text and "trn3" in text and "pass" in text


def test_html_escapes_report_strings():
    report = {"model": {}, "compile": {"ok": False, "error": "<script>x</script>",
                                       "failed_target": "trn2"},
              "accuracy": {}, "targets": {}, "regressions": [],
              "versions": {"torch": "t", "target_descriptions": {}}}
    text = render_html(report, 3)
    assert "<script>" not in text and "&lt;script&gt;" in text


def _png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered pixel rows) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    w = h = bpp = 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    out, prev = bytearray(), bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, bpp, bytes(out)


def test_html_renders_in_headless_chromium(page, tmp_path):
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(n)), None)
    if exe is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    shot = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=900,1200", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    w, h, bpp, px = _png_pixels(shot.read_bytes())
    assert (w, h) == (900, 1200)
    pixels = [px[i:i + 3] for i in range(0, len(px), bpp * 7)]   # a sample of the pixels
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    colours = len(set(pixels))
    assert non_white > 0.03 * len(pixels), "the screenshot is (almost) blank"
    # the chart palette's first colour (#3b6fb6) is on the page: the SVG bars were drawn
    assert any(abs(p[0] - 0x3b) < 8 and abs(p[1] - 0x6f) < 8 and abs(p[2] - 0xb6) < 8
               for p in pixels), f"no chart bar colour among {colours} colours"
