"""``neuron-eval --html``: one self-contained file, no network resource, rendered in headless
Chromium (skipped where no Chromium is installed) and the screenshot is not blank."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib

import pytest
import torch

from neuron_compiler.eval.cli import main
from neuron_compiler.eval.html_report import render_html


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    torch._dynamo.reset()
    d = tmp_path_factory.mktemp("html")
    path = d / "report.html"
    assert main(["--quiet", "zoo:mlp", "--targets", "trn2,trn3", "--iters", "2",
                 "--html", str(path)]) == 0
    torch._dynamo.reset()
    return path


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
