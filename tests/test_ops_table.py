"""The support table: ``lowering.api.supported_ops()`` lists every registered overload, and
``docs/ops.md`` is generated from it (regenerate with ``python -m lowering.api > docs/ops.md``)."""
from __future__ import annotations

from pathlib import Path

from lowering.api import ops_markdown, supported_ops
from lowering.registry import REGISTRY, op_name


def test_supported_ops_is_the_registry():
    ops = supported_ops()
    assert {o.op for o in ops} == {op_name(t) for t in REGISTRY}
    mm = next(o for o in ops if o.op == "aten.mm.default")
    assert mm.family == "matmul" and "TensorE" in mm.engines and "bfloat16" in mm.dtypes


def test_docs_ops_md_is_current():
    path = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
    assert path.read_text() == ops_markdown(), "regenerate: python -m lowering.api > docs/ops.md"
