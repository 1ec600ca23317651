"""``neuron-eval`` exit codes, one test per path of docs/eval.md (and cli.py's docstring):

    0 everything holds                      1 accuracy failure / regression (test_eval_cli.py)
    2 usage error: MODEL does not resolve   3 the model fails: its factory or module raises,
      to a factory (no module, no file,       it raises in eager PyTorch, it does not compile
      no attribute, wrong return type)        (``--fallback error``)
    4 a bug of neuron-eval itself

Every failure message is one paragraph on stderr, with no raw traceback (except exit 4, which
is a bug and prints one), and names the exit code; exits 3 still write ``--json``.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from neuron_compiler.eval import zoo
from neuron_compiler.eval.baseline import TOP_LEVEL_KEYS
from neuron_compiler.eval.cli import EXIT_COMPILE, EXIT_INTERNAL, EXIT_USAGE, main

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

SRC = """
import torch
from torch import nn


def make_raises():
    raise FileNotFoundError("weights.pt is missing")


def make_eager_raises():
    def f(x):
        raise ValueError("shape mismatch in forward")
    return f, (torch.randn(4, 8),)


class Classify(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).argmax(-1)     # trainable, but no float output to build a loss


def make_int_output():
    torch.manual_seed(0)
    return Classify().eval(), (torch.randn(4, 8),)


def make_cumsum():
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)
    return (lambda x: torch.logcumsumexp(lin(x), dim=-1)), (torch.randn(8, 16),)
"""


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "exitmodels.py"
    path.write_text(textwrap.dedent(SRC))
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--quiet", "--iters", "1", "--targets", "trn2", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_paragraph(err: str) -> None:
    assert "Traceback" not in err, err
    assert err.strip().count("\n\n") == 0, err


def test_factory_that_raises_exits_3_naming_factory_and_exception(models, tmp_path, capsys):
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    code, out, err = _run(capsys, f"{models}:make_raises", "--json", str(report), "--html",
                          str(page))
    assert code == EXIT_COMPILE == 3, err
    _one_paragraph(err)
    assert "make_raises()" in err and "FileNotFoundError: weights.pt is missing" in err
    assert "exitmodels.py:7 in make_raises" in err and "(exit 3)" in err
    data = json.loads(report.read_text())           # written on exit 3, with every key
    assert tuple(data) == TOP_LEVEL_KEYS
    assert data["compile"]["failed_stage"] == "build" and not data["compile"]["ok"]
    assert "could not be built" in out
    text = page.read_text()   # the failure in the red box at the top; no empty chart sections
    assert text.index('<div class="alert">') < text.index("weights.pt is missing")
    assert "<svg" not in text and "<h2>Charts</h2>" not in text and "None" not in text


def test_zoo_model_that_fails_to_build_exits_3_not_1(monkeypatch, capsys):
    def _mlp():
        raise RuntimeError("out of memory while building")
    monkeypatch.setitem(zoo.ZOO, "mlp", (_mlp, "broken"))
    code, _, err = _run(capsys, "zoo:mlp")
    assert code == 3, err
    _one_paragraph(err)
    assert "zoo:mlp" in err and "the built-in factory _mlp()" in err
    assert "RuntimeError: out of memory while building" in err


def test_module_that_raises_on_import_exits_3(tmp_path, capsys, monkeypatch):
    (tmp_path / "bad_import_mod.py").write_text("raise ImportError('needs a GPU build')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = _run(capsys, "bad_import_mod:make")
    assert code == 3, err
    _one_paragraph(err)
    assert "bad_import_mod" in err and "ImportError: needs a GPU build" in err


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_for_neuron_eval:make", "no module named"),
    ("/nonexistent/dir/model.py:make", "does not exist"),
    ("{models}:no_such_factory", "no callable"),
])
def test_model_spec_that_does_not_resolve_exits_2(spec, words, models, capsys):
    code, _, err = _run(capsys, spec.format(models=models))
    assert code == EXIT_USAGE == 2, err
    _one_paragraph(err)
    assert words in err and "usage error" in err and "(exit 2)" in err


def test_train_on_a_model_without_float_output_exits_2(models, capsys):
    code, _, err = _run(capsys, f"{models}:make_int_output", "--train")
    assert code == 2, err
    _one_paragraph(err)
    assert "no floating-point tensor" in err and "usage error" in err


def test_model_that_raises_in_eager_exits_3(models, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, out, err = _run(capsys, f"{models}:make_eager_raises", "--json", str(report))
    assert code == 3, err
    _one_paragraph(err)
    assert "does not run" in err and "shape mismatch in forward" in err
    assert json.loads(report.read_text())["compile"]["failed_stage"] == "eager"
    assert "does not run in eager PyTorch" in out


def test_fallback_error_exits_3_and_names_the_cli_flag(models, tmp_path, capsys):
    report, base = tmp_path / "r.json", tmp_path / "base.json"
    base.write_text(json.dumps(dict.fromkeys(TOP_LEVEL_KEYS[:-1], {})))
    code, out, err = _run(capsys, f"{models}:make_cumsum", "--fallback", "error",
                          "--json", str(report), "--baseline", str(base))
    assert code == 3, err
    for text in (out, err, json.loads(report.read_text())["compile"]["error"]):
        assert "aten.logcumsumexp.default" in text
        assert "--fallback allow" in text
        assert "options=" not in text, text      # the Python API's hint, not the CLI's
    assert "does not compile or run on trn2" in out
    assert "Baseline: not compared: the model failed before the comparison" in out


def test_a_bug_of_neuron_eval_exits_4_with_its_traceback(monkeypatch, capsys):
    import neuron_compiler.eval.measure as measure

    def broken(loaded, cfg):
        raise KeyError("a bug")
    monkeypatch.setattr(measure, "evaluate", broken)
    code, _, err = _run(capsys, "zoo:mlp")
    assert code == EXIT_INTERNAL == 4
    assert "internal error" in err and "Traceback" in err and "KeyError" in err
