"""``neuron-eval``: run in-process on zoo:mlp and tiny factory modules written to tmp_path.

Covers the contract of DESIGN.md: the JSON's top-level keys, exit codes 0/1/2/3, a baseline
run of the same model (0) and of a four-times-wider model (1, with regressions listed), and
checks that can fail (an accuracy threshold of zero, a halved output, a wrong shape).
"""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from neuron_compiler.eval import prices
from neuron_compiler.eval.accuracy import DEFAULT_THRESHOLDS, compare, parse_threshold_flags
from neuron_compiler.eval.baseline import TOP_LEVEL_KEYS, Limits
from neuron_compiler.eval.baseline import compare as compare_reports
from neuron_compiler.eval.cli import main

TARGET_KEYS = {"latency_us", "throughput_per_s", "device_share", "fallbacks", "memory", "cost"}

MODEL_SRC = """
import torch
from torch import nn

WIDTH = {width}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x, scale=1.0):
        y = self.down(torch.relu(self.up(x))) * scale
        return {{"y": y, "parts": (y.sum(-1),)}}


def make():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(64, WIDTH),)


def make_kwargs():
    torch.manual_seed(0)
    return Net().eval(), {{"x": torch.randn(64, WIDTH), "scale": 0.5}}


def make_cumsum():
    torch.manual_seed(0)
    lin = nn.Linear(WIDTH, WIDTH)
    return (lambda x: torch.logcumsumexp(lin(x), dim=-1)), (torch.randn(8, WIDTH),)


def make_bad():
    return "not a model", 3


def make_break():
    torch.manual_seed(0)
    lin = nn.Linear(WIDTH, WIDTH)

    def f(x):
        y = lin(x)
        torch._dynamo.graph_break()
        return torch.relu(y)
    return f, (torch.randn(8, WIDTH),)
"""


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model_file(tmp_path, name: str, width: int) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(MODEL_SRC.format(width=width)))
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--quiet", "--iters", "2", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_mlp_report_keys_and_values(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    code, out, _ = _run(capsys, "zoo:mlp", "--targets", "trn2", "--json", str(path))
    assert code == 0, out
    report = json.loads(path.read_text())
    assert tuple(report) == TOP_LEVEL_KEYS
    t = report["targets"]["trn2"]
    assert TARGET_KEYS <= set(t)
    lat = t["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] and len(lat["samples"]) == 2
    assert lat["simulated_us"] > 0 and t["throughput_per_s"] == pytest.approx(1e6 / lat["p50"])
    assert t["device_share"]["by_nodes"] == 1.0 and t["fallbacks"] == []
    assert 0 < t["device_share"]["by_time"] <= 1
    assert t["memory"]["weights_bytes"] == sum(4 * p for p in (64 * 256 + 256, 256 * 64 + 64,
                                                               64 + 64))
    assert 0 < t["memory"]["sbuf_peak_bytes"] <= t["memory"]["sbuf_capacity_bytes"]
    # trn2.48xlarge has no published on-demand price: no cost unless --price gives one
    assert t["cost"]["usd_per_million_inferences"] is None and t["cost"]["price_source"]
    assert t["cost"]["price_status"] == "not published"
    assert t["device_share"]["by_flops"] == 1.0 and t["device_share"]["host_flops"] == 0
    assert set(t["engines"]) >= {"TensorE", "VectorE", "ScalarE", "GpSimdE"}
    acc = report["accuracy"]
    assert acc["passed"] and [r["name"] for r in acc["outputs"]] == ["out"]
    assert 0 < acc["outputs"][0]["max_abs"] < 1e-4 and acc["outputs"][0]["cosine"] > 0.9999
    comp = report["compile"]
    assert comp["ok"] and comp["graphs"] == 1 and comp["graph_breaks"] == 0
    assert comp["targets"]["trn2"]["partitions"] >= 1 and comp["targets"]["trn2"]["recompiles"] == 0
    v = report["versions"]
    assert v["torch"] == torch.__version__ and v["python"] and v["numpy"] and v["ml_dtypes"]
    assert len(v["target_descriptions"]["trn2"]) == 16
    assert report["regressions"] == []
    assert "latency p50 us" in out and "result: PASS" in out
    assert "trn2.48xlarge: no published on-demand price" in out


def test_price_override_gives_a_cost(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    code, out, _ = _run(capsys, "zoo:mlp", "--targets", "trn2,trn1", "--json", str(path),
                        "--price", "trn2.48xlarge=36")
    assert code == 0, out
    t = json.loads(path.read_text())["targets"]
    c2, c1 = t["trn2"]["cost"], t["trn1"]["cost"]
    assert c2["price_status"] == "user" and c2["usd_per_hour"] == 36.0
    assert c2["usd_per_million_inferences"] == pytest.approx(
        36.0 / 3600 / (128 * 1e6 / t["trn2"]["latency_us"]["p50"]) * 1e6)
    assert c1["price_status"] == "published" and c1["usd_per_hour"] == 21.50
    assert "foxl-ai/kiln" in c1["price_source"] and c1["price_region"].startswith("us-east-2")
    assert "trn2.48xlarge: $36/h (user" in out


def test_factory_file_baseline_same_passes_wider_regresses(tmp_path, capsys):
    narrow = _model_file(tmp_path, "narrow", 32)
    wide = _model_file(tmp_path, "wide", 128)
    base = tmp_path / "base.json"
    code, out, _ = _run(capsys, f"{narrow}:make", "--targets", "trn2", "--json", str(base))
    assert code == 0, out
    report = json.loads(base.read_text())
    assert [r["name"] for r in report["accuracy"]["outputs"]] == ["out.y", "out.parts[0]"]

    code, out, _ = _run(capsys, f"{narrow}:make", "--targets", "trn2", "--baseline", str(base))
    assert code == 0, out

    cur = tmp_path / "wide.json"
    code, out, _ = _run(capsys, f"{wide}:make", "--targets", "trn2", "--baseline", str(base),
                        "--json", str(cur))
    assert code == 1, out
    regs = json.loads(cur.read_text())["regressions"]
    metrics = {r["metric"] for r in regs}
    assert {"latency_us.p50", "memory.hbm_bytes"} <= metrics, regs
    assert all(r["target"] == "trn2" and r["current"] > r["baseline"] for r in regs
               if r["metric"] != "throughput_per_s")
    assert "Regressions against the baseline" in out


def test_module_factory_with_kwargs(tmp_path, capsys, monkeypatch):
    _model_file(tmp_path, "evalmod_kw", 32)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = _run(capsys, "evalmod_kw:make_kwargs", "--targets", "trn3", "--sim-mode",
                        "timing", "--warmup", "0")
    assert code == 0, out
    assert "x float32[64, 32]" in out


def test_accuracy_failure_exits_1(tmp_path, capsys):
    path = tmp_path / "strict.json"
    code, out, _ = _run(capsys, "zoo:mlp", "--targets", "trn2", "--atol", "0", "--rtol",
                        "float32=0", "--json", str(path))
    assert code == 1, out
    row = json.loads(path.read_text())["accuracy"]["outputs"][0]
    assert not row["passed"] and row["mismatched"] > 0 and "outside atol 0" in row["problem"]
    assert "FAIL" in out


def test_fallbacks_listed_and_fallback_error_exits_3(tmp_path, capsys):
    model = _model_file(tmp_path, "cums", 16)
    path = tmp_path / "fb.json"
    code, out, _ = _run(capsys, f"{model}:make_cumsum", "--targets", "trn2", "--json", str(path))
    assert code == 0, out
    t = json.loads(path.read_text())["targets"]["trn2"]
    fb = [f for f in t["fallbacks"] if f["op"] == "aten.logcumsumexp.default"]
    assert fb and fb[0]["count"] == 1 and fb[0]["reason"]
    assert t["device_share"]["by_nodes"] < 1 and t["latency_us"]["fallback_us"] > 0

    code, out, err = _run(capsys, f"{model}:make_cumsum", "--targets", "trn2", "--fallback",
                          "error", "--json", str(path))
    assert code == 3, out + err
    report = json.loads(path.read_text())
    assert tuple(report) == TOP_LEVEL_KEYS
    assert not report["compile"]["ok"] and "logcumsumexp" in report["compile"]["error"]
    assert report["compile"]["failed_target"] == "trn2"


@pytest.mark.parametrize("argv", [
    ["zoo:mlp", "--targets", "trn9"],
    ["zoo:nope"],
    ["no_colon_here"],
    ["zoo:mlp", "--iters", "0"],
    ["zoo:mlp", "--price", "trn2.48xlarge=abc"],
    ["zoo:mlp", "--atol", "float99=1"],
    ["zoo:mlp", "--baseline", "/nonexistent/base.json"],
    ["zoo:mlp", "--max-slowdown", "-1"],
    ["zoo:mlp", "--no-such-flag"],
    ["json:nothing_here"],
])
def test_usage_errors_exit_2(argv, capsys):
    assert main(["--quiet", *argv]) == 2
    assert capsys.readouterr().err


def test_bad_factory_exit_2(tmp_path, capsys):
    model = _model_file(tmp_path, "bad", 8)
    assert main([f"{model}:make_bad"]) == 2
    assert "not callable" in capsys.readouterr().err
    assert main([f"{model}:missing"]) == 2
    assert main([f"{model}:make_cumsum", "--train"]) == 2     # a lambda: nothing to train
    assert "trainable parameters" in capsys.readouterr().err


# ---- pure parts --------------------------------------------------------------------------
def test_compare_can_fail():
    th = DEFAULT_THRESHOLDS
    x = torch.randn(300)
    assert compare("o", x.clone(), x, th)["passed"]
    assert not compare("o", x / 2, x, th)["passed"]                    # a halved output
    assert not compare("o", x[:-1], x, th)["passed"]                   # a wrong shape
    y = x.clone()
    y[7] += 1e-2
    row = compare("o", y, x, th)
    assert not row["passed"] and row["mismatched"] == 1 and row["max_abs"] == pytest.approx(1e-2,
                                                                                            rel=1e-3)
    nan = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare("o", nan.clone(), nan, th)["passed"]
    assert not compare("o", torch.tensor([1.0, 0.0, float("inf")]), nan, th)["passed"]
    loose = parse_threshold_flags(["float32=0.1"], ["0.5"], ["float32=0.99"])
    assert loose["float32"].atol == 0.1 and loose["bfloat16"].rtol == 0.5
    assert loose["float32"].min_cosine == 0.99 and loose["bfloat16"].min_cosine < 1
    assert compare("o", x + 0.05, x, loose)["passed"]


def test_cosine_is_not_judged_on_rounding_noise_around_zero():
    """A gradient that is 0 in exact arithmetic (BERT's key bias) is rounding noise on both
    sides: within atol everywhere, its direction is not judged; the same pattern above atol
    is (a sign flip fails)."""
    th = DEFAULT_THRESHOLDS
    g = torch.Generator().manual_seed(1)
    a, e = torch.randn(64, generator=g) * 1e-12, torch.randn(64, generator=g) * 1e-12
    row = compare("o", a, e, th)
    assert row["passed"] and row["cosine"] < 0.9, row
    x = torch.randn(64, generator=g)
    assert not compare("o", -x, x, th)["passed"]
    assert not compare("o", a * 1e9, e * 1e9, th)["passed"]       # same directions, above atol


def test_baseline_compare_is_pure_and_thresholded():
    def report(p50, hbm, fallbacks=(), passed=True):
        return {"targets": {"trn2": {"latency_us": {"p50": p50, "simulated_us": p50},
                                     "throughput_per_s": 1e6 / p50, "memory": {"hbm_bytes": hbm},
                                     "device_share": {"by_nodes": 1.0},
                                     "cost": {"usd_per_million_inferences": p50},
                                     "fallbacks": list(fallbacks)}},
                "accuracy": {"outputs": [{"name": "out", "target": "trn2", "passed": passed,
                                          "max_abs": 0.0, "thresholds": {}, "problem": "x"}]}}
    base = report(100.0, 1000)
    assert compare_reports(report(109.0, 1090), base, Limits(0.10, 0.10)) == []
    regs = compare_reports(report(120.0, 1000), base, Limits(0.10, 0.10))
    assert {r["metric"] for r in regs} == {"latency_us.p50", "latency_us.simulated_us",
                                           "throughput_per_s", "cost.usd_per_million_inferences"}
    fb = [{"op": "aten.cumsum.default", "count": 1, "reason": "r"}]
    regs = compare_reports(report(100.0, 1000, fb, passed=False), base, Limits())
    assert {r["metric"] for r in regs} == {"fallbacks.aten.cumsum.default", "accuracy.out"}
    assert compare_reports({"targets": {}, "accuracy": {}}, base, Limits())[0]["metric"] == \
        "targets"
    other = report(100.0, 1000)
    other["targets"]["trn2"]["options"] = {"auto_cast": "all"}
    assert [r["metric"] for r in compare_reports(other, base, Limits())] == ["options"]
    other = {**report(100.0, 1000), "model": {"train": {"flops": 1}}}
    assert [r["metric"] for r in compare_reports(other, base, Limits())] == ["options"]


def test_cost_per_million():
    table = prices.instances_with({"trn2.48xlarge": 36.0})
    c = prices.cost("trn2", 100.0, table)     # 128 cores x 10,000 calls/s each
    assert c["usd_per_million_inferences"] == pytest.approx(36.0 / 3600 / 1.28e6 * 1e6)
    assert c["price_source"] == "--price (user)" and c["price_status"] == "user"
    assert set(prices.TARGET_INSTANCE) == {"trn1", "trn2", "trn3"}


def test_unpublished_prices_print_no_number():
    """trn2/trn3 have no published on-demand price: no USD figure, and the way to give one."""
    for target in ("trn2", "trn3"):
        c = prices.cost(target, 100.0, prices.INSTANCES)
        assert c["price_status"] == "not published"
        assert c["usd_per_hour"] is None and c["usd_per_million_inferences"] is None
        text = prices.price_text(c)
        assert "no published on-demand price" in text and "--price" in text
        assert "$" not in text.split("(")[0]
    for inst in prices.INSTANCES.values():   # every entry has a source and a date
        assert inst.source and inst.date and inst.region
        assert (inst.usd_per_hour is None) == (inst.status == "not published")
    with pytest.raises(ValueError, match="does not agree"):
        prices.Instance("x", "trn2", 1, 1, 3.0, "not published", "s", "d", "r")


def test_entry_point_and_help(capsys):
    import os
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["neuron-eval"] == "neuron_compiler.eval.cli:main"
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--targets", "--warmup", "--iters", "--train", "--json", "--html", "--baseline",
                 "--max-slowdown"):
        assert flag in out


def test_graph_break_reported(tmp_path, capsys):
    model = _model_file(tmp_path, "brk", 16)
    path = tmp_path / "brk.json"
    code, out, _ = _run(capsys, f"{model}:make_break", "--targets", "trn2", "--json", str(path))
    assert code == 0, out
    comp = json.loads(path.read_text())["compile"]
    assert comp["graphs"] == 2 and comp["graph_breaks"] == 1 and comp["break_reasons"]
    assert comp["targets"]["trn2"]["dynamo_graphs"] == 2
    assert comp["targets"]["trn2"]["recompiles"] == 0
    assert "break:" in out


def test_zoo_without_transformers_is_a_usage_error(monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "transformers", None)   # import raises ImportError
    assert main(["--quiet", "zoo:bert"]) == 2
    assert "'transformers' package is not installed" in capsys.readouterr().err


def test_train_step_measured_and_compared(tmp_path, capsys):
    path = tmp_path / "train.json"
    code, out, _ = _run(capsys, "zoo:mlp", "--train", "--targets", "trn2", "--json", str(path))
    assert code == 0, out
    report = json.loads(path.read_text())
    names = [r["name"] for r in report["accuracy"]["outputs"]]
    assert names[0] == "out.loss" and "out.grad.0.weight" in names and "out.param.3.bias" in names
    assert report["accuracy"]["passed"]
    train = report["model"]["train"]
    assert train["flops"] > 2 * report["model"]["flops"] and train["steps"] == 3
    comp = report["compile"]["targets"]["trn2"]
    kinds = {g["kind"] for g in comp["aten_graphs"]}
    assert {"forward", "backward"} <= kinds and comp["dynamo_graphs"] == 2   # loss, SGD step
    t = report["targets"]["trn2"]
    assert t["latency_us"]["p50"] > 0 and t["memory"]["gradients_bytes"] == \
        report["model"]["weight_bytes"]
    assert "USD / 1M steps" in out


def test_auto_cast_shows_its_accuracy_cost(tmp_path, capsys):
    path = tmp_path / "ac.json"
    code, out, _ = _run(capsys, "zoo:mlp", "--auto-cast", "matmul", "--targets", "trn2",
                        "--json", str(path))
    assert code == 0, out
    report = json.loads(path.read_text())
    acc = report["accuracy"]
    assert acc["auto_cast"] == "matmul" and report["targets"]["trn2"]["options"]["auto_cast"] == \
        "matmul"
    assert acc["outputs"][0]["thresholds"] == DEFAULT_THRESHOLDS["bfloat16"].to_dict()
    assert acc["outputs"][0]["max_abs"] > 1e-4      # bf16 matmuls: far above the fp32 error
    assert "auto_cast=matmul" in out


def test_python_dash_m_exit_code(tmp_path):
    """``python -m neuron_compiler.eval`` is the CLI, and its exit code reaches the shell."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "neuron_compiler.eval", "zoo:mlp", "--targets",
                           "trn9"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "unknown target" in proc.stderr
