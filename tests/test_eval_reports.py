"""``neuron-eval`` figures that must not mislead (issue 21, item 5):

- a fallback's ``share_of_latency`` comes from the same calls as its time and is in [0, 1],
  even when one measured call is far slower than the others (it was one call's op time over
  another call's median: 331.8%);
- the eager baseline is the p50 of warm calls, not one cold call;
- the terminal says whether a baseline was compared (file, metrics, thresholds, regressions);
- sizes are printed in human units, never as ``1.282e+07``.
"""
from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch import nn

from neuron_compiler.eval.cli import main
from neuron_compiler.eval.measure import EvalConfig, evaluate
from neuron_compiler.eval.report import render
from neuron_compiler.eval.zoo import LoadedModel

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

SLOW = {"on": False}
SLEEP_S = 0.2   # well above a loaded host's p50 of the fast calls (4 ms seen with the zoo running)


@torch.library.custom_op("neuron_eval_test::slow_when_flagged", mutates_args=())
def slow_when_flagged(x: torch.Tensor) -> torch.Tensor:
    """No lowering exists for it (an eager fallback); sleeps while ``SLOW['on']``."""
    if SLOW["on"]:
        time.sleep(SLEEP_S)
    return x + 1


@slow_when_flagged.register_fake
def _(x):
    return torch.empty_like(x)


def test_fallback_share_comes_from_the_same_calls_and_stays_within_100_percent():
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)
    loaded = LoadedModel("test:slow_last", lambda x: slow_when_flagged(lin(x)),
                         (torch.randn(4, 16),))

    def progress(msg: str) -> None:   # the op is slow only in the last measured call
        SLOW["on"] = msg.endswith("iter 3/3")
    try:
        report = evaluate(loaded, EvalConfig(targets=["trn2"], warmup=1, iters=3,
                                             progress=progress))
    finally:
        SLOW["on"] = False
    t = report["targets"]["trn2"]
    lat = t["latency_us"]
    assert lat["samples"][-1] > SLEEP_S * 1e6 > 10 * lat["p50"], lat   # one slow call
    (row,) = [f for f in t["fallbacks"] if f["op"] == "neuron_eval_test.slow_when_flagged.default"]
    # time_us: mean over the 3 measured calls; share: summed op time / summed latency
    assert row["time_us"] > SLEEP_S * 1e6 / 3
    assert row["share_of_latency"] == pytest.approx(row["time_us"] * 3 / sum(lat["samples"]))
    assert 0.5 < row["share_of_latency"] <= 1.0
    assert sum(f["share_of_latency"] for f in t["fallbacks"]) <= 1.0
    shares = [float(s) for s in re.findall(r"(\d+\.\d)%\s+neuron_eval_test", render(report, 0))]
    assert shares and all(s <= 100.0 for s in shares)


def test_eager_baseline_is_a_warm_p50_not_one_cold_call():
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)
    calls = {"n": 0}

    def f(x):
        if not torch.compiler.is_compiling():
            calls["n"] += 1
            if calls["n"] == 1:        # a cold first eager call (lazy init, caches)
                time.sleep(0.3)
        return lin(x)
    report = evaluate(LoadedModel("test:cold", f, (torch.randn(4, 16),)),
                      EvalConfig(targets=["trn2"], warmup=1, iters=3))
    m = report["model"]
    assert m["eager_time_ms"] < 100, m
    assert len(m["eager_samples_ms"]) == 3 and m["eager_warmup"] == 1
    assert m["eager_first_call_ms"] >= 300
    assert m["eager_time_ms"] == pytest.approx(sorted(m["eager_samples_ms"])[1])
    out = render(report, 0)
    assert "eager PyTorch: p50" in out and "over 3 call(s) after 1 warm-up" in out


def _doctored(src, dst, scale: float) -> None:
    """A baseline whose trn2 p50 and HBM bytes are ``scale`` times the measured ones."""
    data = json.loads(src.read_text())
    t = data["targets"]["trn2"]
    t["latency_us"]["p50"] *= scale
    t["memory"]["hbm_bytes"] = int(t["memory"]["hbm_bytes"] * scale)
    dst.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def base_report(tmp_path_factory):
    """zoo:mlp on trn2, 2 calls, as JSON (``Baseline: none compared`` in its terminal)."""
    torch._dynamo.reset()
    path = tmp_path_factory.mktemp("base") / "base.json"
    assert main(["--quiet", "zoo:mlp", "--targets", "trn2", "--iters", "2", "--json",
                 str(path)]) == 0
    return path


def _against(capsys, baseline, cur) -> tuple[int, str, dict]:
    code = main(["--quiet", "zoo:mlp", "--targets", "trn2", "--iters", "2", "--baseline",
                 str(baseline), "--json", str(cur)])
    return code, capsys.readouterr().out, json.loads(cur.read_text())


def test_terminal_says_whether_a_baseline_was_compared(base_report, tmp_path, capsys):
    assert "Baseline: none compared" in render(json.loads(base_report.read_text()), 0)
    code, out, report = _against(capsys, base_report, tmp_path / "cur.json")
    assert code == 0, out
    entry = report["baseline"]
    assert entry["path"] == str(base_report) and entry["targets"] == ["trn2"]
    assert entry["metrics_compared"] >= 6 and entry["regressions"] == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("Baseline:"))
    assert f"compared with {base_report}" in line, line
    assert f"{entry['metrics_compared']} metrics on trn2" in line and "slowdown +10%" in line
    assert line.endswith("regressions: none"), line

    worse = tmp_path / "worse.json"
    _doctored(base_report, worse, 0.5)
    code, out, report = _against(capsys, worse, tmp_path / "cur.json")
    assert code == 1 and report["regressions"]
    assert f"regressions: {len(report['regressions'])} (listed under 'Regressions')" in out


def test_regression_messages_print_sizes_in_human_units(base_report, tmp_path, capsys):
    worse = tmp_path / "worse.json"
    _doctored(base_report, worse, 0.5)
    code, out, report = _against(capsys, worse, tmp_path / "cur.json")
    regs = report["regressions"]
    assert code == 1 and {"latency_us.p50", "memory.hbm_bytes"} <= {r["metric"] for r in regs}
    (hbm,) = [r["message"] for r in regs if r["metric"] == "memory.hbm_bytes"]
    assert re.fullmatch(r"HBM [\d.]+ [KMG]?B -> [\d.]+ [KMG]?B \(\+\d+\.\d%, allowed \+10\.0%\)",
                        hbm), hbm
    assert not re.search(r"\de[+-]\d\d", "\n".join(r["message"] for r in regs))
    assert hbm in out
