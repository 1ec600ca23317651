"""Visible assumptions (issue 22, item 6): the host-link bandwidth and the per-call runtime
overhead are options, they change the reported times, and every report shows the values in
force with their source ("option", or the default's "ASSUMED ..." reason).

Every expected time is computed from the transfers and bytes the profile recorded, so a
runtime that ignored an option would be off by far more than the tolerance.
"""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

import neuron_compiler
from neuron_compiler import NeuronOptionError, validate_options
from neuron_compiler.eval.cli import main
from neuron_compiler.eval.html_report import render_html
from neuron_compiler.eval.measure import EvalConfig, evaluate
from neuron_compiler.eval.report import render
from neuron_compiler.eval.zoo import LoadedModel
from neuron_compiler.testing import compile_for_neuron
from runtime_sim.targets import get_target

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

LINK_DEFAULT = "target default: ASSUMED"
OVERHEAD_DEFAULT = "default: ASSUMED 0: no published figure"


@torch.library.custom_op("neuron_assumptions_test::on_host", mutates_args=())
def on_host(x: torch.Tensor) -> torch.Tensor:
    """No lowering exists for it: an eager fallback between two device partitions."""
    return x + 1


@on_host.register_fake
def _(x):
    return torch.empty_like(x)


def one_part(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)


def two_parts(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(on_host(torch.relu(x @ w)) @ w.t())


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh tensors (never resident): every run sends them; large enough that the bytes
    term of a copy dominates its fixed DMA latency."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(128, 512, generator=g), torch.randn(512, 256, generator=g)


def _profile(fn, options: dict, calls: int = 1) -> neuron_compiler.Profile:
    """``calls`` calls of ``fn`` compiled with ``options`` (timing mode), all in one profile."""
    compiled = compile_for_neuron(fn, {"sim_mode": "timing", **options})
    x, w = _inputs()
    with neuron_compiler.profile() as prof, torch.no_grad():
        for _ in range(calls):
            compiled(x, w)
    return prof


def _expected_transfer_us(d: dict, gbps: float, target: str = "trn2") -> float:
    """host_transfer_ns summed: a DMA fixed latency per tensor, bytes over the link."""
    fixed = get_target(target).dma_transfer_ns
    return (d["transfers"] * fixed + d["transfer_bytes"] / gbps) / 1e3


def test_host_link_option_sets_the_transfer_time_and_not_the_program():
    default = _profile(one_part, {}).to_dict()
    slow = _profile(one_part, {"host_link_gbps": 4}).to_dict()
    link = get_target("trn2").host_link_bytes_per_ns
    assert default["transfers"] == slow["transfers"] == 3          # x, w in; the output out
    assert default["transfer_bytes"] == slow["transfer_bytes"] == (128 * 512 + 512 * 256
                                                                   + 128 * 256) * 4
    assert default["transfer_time_us"] == pytest.approx(_expected_transfer_us(default, link),
                                                        rel=1e-9)
    assert slow["transfer_time_us"] == pytest.approx(_expected_transfer_us(slow, 4.0), rel=1e-9)
    # ignoring the option would leave the default time: off by far more than the tolerance
    assert slow["transfer_time_us"] > 5 * default["transfer_time_us"]
    # the option times the host link only: the program and its simulated time are the same
    assert slow["simulated_time_us"] == pytest.approx(default["simulated_time_us"], rel=1e-12)
    assert slow["program_cache"]["hits"] == 1 and slow["program_cache"]["misses"] == 0
    assert slow["call_overhead_time_us"] == default["call_overhead_time_us"] == 0.0


def test_call_overhead_is_charged_once_per_device_partition_call():
    d = _profile(two_parts, {"host_link_gbps": 8, "call_overhead_us": 7}, calls=3).to_dict()
    plain = _profile(two_parts, {}, calls=3).to_dict()
    assert len(d["partitions"]) == 2 and d["fallback_nodes"] >= 1
    assert d["call_overhead_time_us"] == pytest.approx(2 * 3 * 7.0)
    assert [p["call_overhead_time_us"] for p in d["partitions"]] == pytest.approx([21.0, 21.0])
    assert d["warmup"]["call_overhead_time_us"] == pytest.approx(14.0)        # one graph call
    assert d["steady_state"]["call_overhead_time_us"] == pytest.approx(14.0)  # per graph call
    # apart from the simulated program time, which the overhead does not change
    assert d["simulated_time_us"] == pytest.approx(plain["simulated_time_us"], rel=1e-12)
    assert plain["call_overhead_time_us"] == 0.0
    # every copy, both directions (a fallback reading device data too), uses the option
    assert d["transfer_time_us"] == pytest.approx(_expected_transfer_us(d, 8.0), rel=1e-9)


@pytest.mark.parametrize("key,value", [
    ("host_link_gbps", 0), ("host_link_gbps", -16.0), ("host_link_gbps", float("nan")),
    ("host_link_gbps", float("inf")), ("host_link_gbps", "16"), ("host_link_gbps", True),
    ("call_overhead_us", -1), ("call_overhead_us", float("inf")), ("call_overhead_us", "5us"),
])
def test_bad_values_raise_naming_the_option_and_the_value(key, value):
    with pytest.raises(NeuronOptionError) as info:
        validate_options({key: value})
    msg = str(info.value)
    assert f"option {key!r}" in msg and repr(value) in msg
    assert ("positive" if key == "host_link_gbps" else "non-negative") in msg


def test_good_values_are_kept_as_floats():
    opts = validate_options({"host_link_gbps": 16, "call_overhead_us": 0})
    assert opts.host_link_gbps == 16.0 and isinstance(opts.host_link_gbps, float)
    assert opts.call_overhead_us == 0.0
    assert validate_options(None).host_link_gbps is None   # not set: the default is in force


def test_bad_value_through_torch_compile():
    f = compile_for_neuron(lambda x: x + 1, options={"call_overhead_us": -3})
    with pytest.raises(Exception, match="option 'call_overhead_us' must be a non-negative"):
        f(torch.randn(4))


def test_summary_and_to_dict_show_values_and_sources():
    default = _profile(one_part, {"target": "trn3"})
    d = default.to_dict()
    link = get_target("trn3").host_link_bytes_per_ns
    (a,) = d["assumptions"]
    assert a["target"] == "trn3"
    assert a["host_link_gbps"]["value"] == link
    assert a["host_link_gbps"]["source"].startswith(LINK_DEFAULT)
    assert a["call_overhead_us"] == {"value": 0.0, "source": a["call_overhead_us"]["source"]}
    assert a["call_overhead_us"]["source"].startswith(OVERHEAD_DEFAULT)
    text = default.summary()
    assert f"trn3: host_link_gbps   = {link:g} GB/s: {LINK_DEFAULT}" in text
    assert f"trn3: call_overhead_us = 0 us per device-partition call: {OVERHEAD_DEFAULT}" in text
    assert "runtime call overhead" in text

    d = _profile(one_part, {"host_link_gbps": 4, "call_overhead_us": 2.5}).to_dict()
    assert d["assumptions"] == [{"target": "trn2",
                                 "host_link_gbps": {"value": 4.0, "source": "option"},
                                 "call_overhead_us": {"value": 2.5, "source": "option"}}]
    json.dumps(d)
    text = _profile(one_part, {"host_link_gbps": 4, "call_overhead_us": 2.5}).summary()
    assert "trn2: host_link_gbps   = 4 GB/s: option" in text
    assert "trn2: call_overhead_us = 2.5 us per device-partition call: option" in text
    assert "(host link: 4 GB/s" in text


MODEL_SRC = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()).eval(), \\
        (torch.randn(64, 256),)
"""


def _loaded() -> LoadedModel:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()).eval()
    return LoadedModel("test:linear", model, (torch.randn(64, 256),))


def test_eval_json_terminal_and_html_show_values_and_sources(tmp_path, capsys):
    model = tmp_path / "tiny.py"
    model.write_text(textwrap.dedent(MODEL_SRC))
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["--quiet", "--targets", "trn2", "--warmup", "1", "--iters", "2",
                 "--sim-mode", "timing", "--host-link-gbps", "4", "--call-overhead-us", "5",
                 "--json", str(js), "--html", str(page), f"{model}:make"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(js.read_text())
    t = report["targets"]["trn2"]
    assert t["assumptions"] == {"host_link_gbps": {"value": 4.0, "source": "option"},
                                "call_overhead_us": {"value": 5.0, "source": "option"}}
    assert t["options"]["host_link_gbps"] == 4.0 and t["options"]["call_overhead_us"] == 5.0
    lat = t["latency_us"]
    assert lat["call_overhead_us"] == pytest.approx(5.0 * len(t["partitions"]))
    assert lat["p50"] == pytest.approx(lat["simulated_us"] + lat["transfer_us"]
                                       + lat["fallback_us"] + lat["call_overhead_us"])
    for text in (out, render(report, 0)):
        assert "trn2: host_link_gbps   = 4 GB/s: option" in text
        assert "trn2: call_overhead_us = 5 us per device-partition call: option" in text
        assert "call overhead us" in text
    html = page.read_text()
    assert "<h2>Assumptions</h2>" in html and "host link (host_link_gbps)" in html
    assert "call overhead (call_overhead_us)" in html and ">option<" in html
    assert ">4 GB/s<" in html and ">5 us per device-partition call<" in html
    assert html == render_html(report, 0)

    # the defaults: sources say ASSUMED; options keep their old keys (old baselines compare)
    default = evaluate(_loaded(), EvalConfig(targets=["trn2"], warmup=1, iters=1,
                                             sim_mode="timing"))
    d = default["targets"]["trn2"]
    assert "host_link_gbps" not in d["options"] and "call_overhead_us" not in d["options"]
    assert d["assumptions"]["host_link_gbps"]["value"] == get_target("trn2").host_link_bytes_per_ns
    assert d["assumptions"]["host_link_gbps"]["source"].startswith(LINK_DEFAULT)
    assert d["assumptions"]["call_overhead_us"]["source"].startswith(OVERHEAD_DEFAULT)
    assert d["latency_us"]["call_overhead_us"] == 0.0
    # steady state: the fresh input goes in, the output comes out (weights stay resident)
    moved = (64 * 256 + 64 * 256) * 4
    link = get_target("trn2").host_link_bytes_per_ns
    assert lat["transfer_us"] - d["latency_us"]["transfer_us"] == pytest.approx(
        moved * (1 / 4.0 - 1 / link) / 1e3, rel=1e-6)
    text = render(default, 0)
    assert f"trn2: host_link_gbps   = {link:g} GB/s: {LINK_DEFAULT}" in text
    assert f"trn2: call_overhead_us = 0 us per device-partition call: {OVERHEAD_DEFAULT}" in text
    assert OVERHEAD_DEFAULT in render_html(default, 0)


@pytest.mark.parametrize("flag,value", [("--host-link-gbps", "0"), ("--call-overhead-us", "-1"),
                                        ("--host-link-gbps", "nan")])
def test_eval_bad_flag_is_a_usage_error(flag, value, capsys):
    code = main(["--quiet", flag, value, "zoo:mlp"])
    _, err = capsys.readouterr()
    assert code == 2
    assert f"{flag}: option '{flag[2:].replace('-', '_')}' must be" in err


def test_reports_without_assumptions_still_render():
    """A report written before these keys existed (a baseline) renders without them."""
    report = evaluate(_loaded(), EvalConfig(targets=["trn2"], warmup=0, iters=1,
                                            sim_mode="timing"))
    t = report["targets"]["trn2"]
    del t["assumptions"], t["latency_us"]["call_overhead_us"]
    text = render(report, 0)
    assert "host_link_gbps" not in text and "Assumptions (values" not in text
    assert "<h2>Assumptions</h2>" not in render_html(report, 0)
