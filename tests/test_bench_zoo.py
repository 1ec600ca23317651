"""The machinery of bench/bench_zoo.py (the sweep itself lives in the bench, not in the suite):
its registry, its comparison (which must fail on wrong values), its error classification, the
per-row subprocess (a row end to end, a timeout, a row that cannot be built) and its reports."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from script_loader import load_script

ROOT = os.path.join(os.path.dirname(__file__), "..")
BENCH = os.path.join(ROOT, "bench")


zoo = load_script("bench_zoo", os.path.join(BENCH, "bench_zoo.py"))


def _arch(name: str):
    return next(a for a in zoo.registry() if a.name == name)


def test_registry_has_40_architectures_of_every_family():
    rows = zoo.registry()
    names = [a.name for a in rows]
    assert len(names) == len(set(names))
    assert len({a.base for a in rows}) >= 40
    families = {a.family for a in rows}
    assert {"decoder", "encoder", "encoder-decoder", "vision", "audio", "two-tower",
            "cnn"} <= families
    assert {a.source for a in rows} == {"transformers", "torchvision", "timm"}
    # both attention implementations of the decoders that offer sdpa
    for base in ("llama", "mistral", "qwen2", "gemma", "falcon", "gpt2", "mixtral"):
        assert {base, f"{base}@eager"} <= set(names)
        assert _arch(base).modes == ("fp32", "bf16")


def test_list_prints_every_row(capsys):
    assert zoo.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "llama@eager" in out and "tv_resnet18" in out and "timm_mixer_s16_224" in out
    assert f"{len({a.base for a in zoo.registry()})} architectures" in out


def test_unknown_row_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        zoo.main(["--only", "no_such_model", "--mode", "fp32"])
    assert exc.value.code == 2


def test_compare_fails_on_wrong_values():
    torch.manual_seed(0)
    ref = {"logits": torch.randn(2, 16, 8), "hidden": (torch.randn(3, 4),)}
    same = {"logits": ref["logits"].clone(), "hidden": (ref["hidden"][0] + 1e-6,)}
    good = zoo.compare(same, ref, "fp32")
    assert good["match"] is True and good["ref_max_abs"] == float(ref["logits"].abs().max())
    halved = {"logits": ref["logits"] / 2, "hidden": ref["hidden"]}
    r = zoo.compare(halved, ref, "fp32")
    assert r["match"] is False and r["detail"] == "out.logits" and r["max_abs_err"] > 0.01
    one = ref["logits"].clone()
    one[1, 3, 5] += 0.01                      # a single element off by 1e-2 must fail
    assert zoo.compare({"logits": one, "hidden": ref["hidden"]}, ref, "fp32")["match"] is False
    nan = ref["logits"].clone()
    nan[0, 0, 0] = float("nan")
    assert zoo.compare({"logits": nan, "hidden": ref["hidden"]}, ref, "fp32")["match"] is False
    short = {"logits": ref["logits"][:, :8], "hidden": ref["hidden"]}
    assert zoo.compare(short, ref, "fp32")["match"] is False
    assert zoo.compare({"logits": ref["logits"]}, ref, "fp32")["match"] is False
    zeros = {"logits": torch.zeros(2, 3)}       # an output that any program matches is flagged
    row = {"mode": "fp32", "status": "ok", **zoo.compare(zeros, zeros, "fp32")}
    assert zoo._match(row) == "pass 0.0e+00 (eager output ~0)"


def test_classify_tells_compiler_bugs_from_torch_errors():
    from lowering.errors import LoweringError
    from neuron_compiler.errors import NeuronInternalError
    cause = LoweringError("cannot fold EOp.AND")
    try:
        raise NeuronInternalError("g", "fused_0", "(f32[2])", ["aten.bitwise_and"],
                                  ["aten.bitwise_and"], cause) from cause
    except NeuronInternalError as exc:
        row = zoo.classify(exc)
    assert row["status"] == "internal error"
    assert row["error"] == "LoweringError: cannot fold EOp.AND"
    assert row["context"].startswith("NeuronInternalError: internal error compiling")
    try:
        raise ValueError("Dynamo could not trace this\nsecond line")
    except ValueError as exc:
        row = zoo.classify(exc)
    assert row["status"] == "torch error" and row["error"] == "ValueError: Dynamo could not trace this"


def test_one_row_end_to_end(tmp_path):
    """A tiny Llama (fp32, functional) in its own subprocess: compiled, on the device, compared."""
    row = zoo.run_one(_arch("llama"), "fp32", timeout=300)
    assert row["status"] == "ok", row
    assert row["match"] is True and row["max_abs_err"] < 1e-3
    assert row["device_nodes"] > 0 and 0 < row["device_share"] <= 1
    assert row["first_call_s"] > 0 and row["simulated_time_us"] > 0
    assert not zoo.failed(row)
    line = zoo.text_line(row)
    assert line.startswith("llama") and "pass" in line


def test_timeout_and_build_error_are_rows():
    row = zoo.run_one(_arch("llama"), "fp32", timeout=0.5)
    assert row["status"] == "timeout" and not zoo.failed(row)
    fake = zoo.Arch("no_such_model", "cnn", "torchvision", ("fp32",), "")
    row = zoo.run_one(fake, "fp32", timeout=120)
    assert row["status"] == "build error" and "KeyError" in row["error"] and zoo.failed(row)


def test_reports_list_failures_with_their_command(tmp_path):
    rows = [
        {"name": "bert", "mode": "fp32", "status": "ok", "match": False, "max_abs_err": 0.5,
         "detail": "out.last_hidden_state", "device_nodes": 9, "fallback_nodes": 1,
         "device_share": 0.9, "fallbacks": [{"op": "aten.cumsum.default", "count": 1,
                                             "reason": "dtype bool"}],
         "first_call_s": 3.0, "simulated_time_us": 12.5},
        {"name": "gpt2", "mode": "bf16", "status": "internal error", "error": "RaceError: x",
         "context": "NeuronRunError: partition fused_0"},
        {"name": "vit", "mode": "bf16", "status": "ok", "device_nodes": 5, "fallback_nodes": 0,
         "device_share": 1.0, "fallbacks": [], "first_call_s": 1.0, "simulated_time_us": 3.0},
    ]
    md = zoo.markdown(rows, "header")
    assert "| bert | fp32 | ok | FAIL 5.0e-01 | 90% (9/10) | cumsum: dtype bool |" in md
    assert "`python bench/bench_zoo.py --only gpt2 --mode bf16`" in md
    assert "`python bench/bench_zoo.py --only bert --mode fp32`" in md
    assert "vit` bf16" not in md                      # rows that passed are not failures
    assert "| vit | bf16 | ok | n/a |" in md
    assert "1 mismatched" in zoo.summary(rows) and "1 internal errors" in zoo.summary(rows)
    assert [zoo.failed(r) for r in rows] == [True, True, False]
    json.dumps(rows)


def test_render_merges_saved_runs(tmp_path, capsys):
    ok = {"name": "vit", "mode": "fp32", "status": "ok", "match": True, "max_abs_err": 0.0,
          "ref_max_abs": 1.0, "device_nodes": 5, "fallback_nodes": 0, "device_share": 1.0,
          "fallbacks": [], "first_call_s": 1.0, "simulated_time_us": 3.0}
    first = {"commit": "aaa", "date": "d1", "timeout_s": 120, "rows": [
        {"name": "vit", "mode": "fp32", "status": "timeout", "error": "no result"},
        {"name": "bert", "mode": "fp32", **{k: v for k, v in ok.items() if k not in ("name",)}}]}
    second = {"commit": "bbb", "date": "d2", "timeout_s": 300, "rows": [ok]}
    paths = []
    for i, run in enumerate((first, second)):
        paths.append(str(tmp_path / f"run{i}.json"))
        with open(paths[-1], "w") as f:
            json.dump(run, f)
    md = tmp_path / "zoo.md"
    assert zoo.main(["--render", ",".join(paths), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "commit `aaa`" in text and "commit `bbb`" in text
    assert "| vit | fp32 | ok | pass" in text and "| vit | fp32 | timeout" not in text
    assert text.index("| bert |") < text.index("| vit |")    # the registry's order
    first["rows"][1]["match"] = False
    with open(paths[0], "w") as f:
        json.dump(first, f)
    assert zoo.main(["--render", ",".join(paths)]) == 1     # a mismatch left in a saved run
