"""Golden text: the kernel IR before/after fusion, the tile IR (and one memory plan) of small graphs.

The dumps ``compile_graph(..., dump=...)`` writes are compared with the files under
``tests/golden/lowering/<case>/``. After an intended change of the lowering, regenerate them and
review the diff like code:

    pytest tests/lowering/test_golden.py --update-golden      # option from tests/lowering/conftest.py
    UPDATE_GOLDEN=1 pytest tests/lowering/test_golden.py      # works from any rootdir/invocation

(``--update-golden`` is registered by tests/lowering/conftest.py, which pytest only consults for
options when the run is pointed at tests/lowering or below; the environment variable always works.)
Each graph is also checked against eager, so a golden file never records a wrong program.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import check, rand

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "lowering"
IR_FILES = ("ir_pre_fusion.txt", "ir_post_fusion.txt", "tir.txt")


def _mlp_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _ew_broadcast(x, row, col):
    return torch.sigmoid((x * row + 1.0).relu() - col) * 2.0


def _layer_norm(x, w, b):
    return F.layer_norm(x, (96,), w, b)


def _softmax(x):
    return torch.softmax(x * 0.125, dim=-1)


CASES = {
    # name: (fn, inputs, files, scale)
    "mlp_gelu": (_mlp_gelu, lambda: (rand(64, 96, seed=1), rand(160, 96, seed=2) * 0.1,
                                     rand(160, seed=3)),
                 IR_FILES + ("memory_plan.txt",), 10.0),
    "ew_broadcast": (_ew_broadcast, lambda: (rand(129, 200, seed=4), rand(200, seed=5),
                                             rand(129, 1, seed=6)), IR_FILES, 1.0),
    "layer_norm": (_layer_norm, lambda: (rand(130, 96, seed=7), rand(96, seed=8), rand(96, seed=9)),
                   IR_FILES, 1.0),
    "softmax": (_softmax, lambda: (rand(4, 33, 65, seed=10),), IR_FILES, 1.0),
}


def _update_requested(config) -> bool:
    return bool(config.getoption("--update-golden", default=False)) or \
        os.environ.get("UPDATE_GOLDEN") == "1"


def golden_failures(case: str, dumps: dict[str, str], files, config) -> list[str]:
    """Compare ``dumps[f]`` with ``GOLDEN/case/f`` for each file (or rewrite them when an update
    is requested); the unified diff of each difference, or the missing file."""
    update = _update_requested(config)
    failures = []
    for f in files:
        actual = dumps[f].rstrip("\n") + "\n"
        path = GOLDEN / case / f
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            continue
        if not path.exists():
            failures.append(f"{path} is missing; run with --update-golden or UPDATE_GOLDEN=1")
            continue
        expected = path.read_text()
        if expected != actual:
            diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                                f"golden/{case}/{f}", f"actual/{case}/{f}"))
            failures.append(diff)
    return failures


def assert_golden(case: str, dumps: dict[str, str], files, config) -> None:
    failures = golden_failures(case, dumps, files, config)
    assert not failures, "\n".join(failures) + \
        "\n(if the change is intended: rerun with --update-golden or UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("name", list(CASES))
def test_golden_dumps(name, request):
    fn, make_inputs, files, scale = CASES[name]
    low = check(fn, *make_inputs(), scale=scale)
    assert_golden(name, low.dumps, files, request.config)


def test_mlp_gelu_is_fused_into_the_matmul_epilogue():
    """Independent of the golden text: linear + GELU become one matmul kernel with the bias add
    and the GELU in its epilogue."""
    fn, make_inputs, _, scale = CASES["mlp_gelu"]
    low = check(fn, *make_inputs(), scale=scale)
    kernels = [ln for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]
    assert len(kernels) == 1, kernels
    assert "matmul[epilogue=gelu(add(acc" in kernels[0], kernels[0]
    pre = [ln for ln in low.dumps["ir_pre_fusion.txt"].splitlines() if " = " in ln]
    assert len(pre) == 2, pre


def test_elementwise_chain_is_one_kernel():
    fn, make_inputs, _, _ = CASES["ew_broadcast"]
    low = check(fn, *make_inputs())
    kernels = [ln for ln in low.dumps["ir_post_fusion.txt"].splitlines() if " = " in ln]
    assert len(kernels) == 1 and "pointwise[" in kernels[0], kernels
