"""The error sites of a verifier module, read from its source with ``ast``, for the negative tests.

A *site* is one ``raise X(message)`` or ``assert`` in the module. Its template is the message
with every formatted value replaced by ``{}`` (``f"{where}: unknown buffer %{r.buffer}"`` ->
``"{}: unknown buffer %{}"``); an ``assert`` is ``"assert <condition source>"``. A raise whose
message cannot be read this way is ``"<unreadable raise at line N>"``, which no test covers, so
the coverage test fails until the reader learns the new form.

``regex(template)`` matches exactly the messages a site can produce (anchored, ``{}`` -> ``.*``);
``sites_matching(message, templates)`` lists the sites that could have produced a message, so a
test can assert that its message came from one site only.
"""
from __future__ import annotations

import ast
import inspect
import re
from types import ModuleType


def _text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def error_sites(module: ModuleType) -> list[str]:
    """Templates of every raise/assert site of ``module``, in source order."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Raise):
            exc = node.exc
            text = _text(exc.args[0]) if isinstance(exc, ast.Call) and exc.args else None
            out.append((node.lineno, text if text is not None
                        else f"<unreadable raise at line {node.lineno}>"))
        elif isinstance(node, ast.Assert):
            out.append((node.lineno, f"assert {ast.unparse(node.test)}"))
    return [t for _, t in sorted(out)]


def regex(template: str) -> str:
    return "^" + ".*".join(re.escape(p) for p in template.split("{}")) + "$"


def sites_matching(message: str, templates) -> list[str]:
    return [t for t in templates if re.fullmatch(regex(t), message, re.DOTALL)]


def assert_covered(covered, sites: list[str]) -> None:
    """The templates the tests cover are exactly the sites, and no two sites share one."""
    assert sorted(covered) == sorted(set(sites)), (
        f"sites without a test: {sorted(set(sites) - set(covered))}; "
        f"tests of no site: {sorted(set(covered) - set(sites))}")
    assert len(sites) == len(set(sites)), "two sites share a message; make them distinguishable"
