"""No import cycle inside a package (issue 26): the modules of each package in ``PACKAGES`` form
a DAG under "imports".

Every ``import`` statement counts, wherever it is: module level, inside a function (a lazy
import is still a dependency, only a later one), or under ``if TYPE_CHECKING:``. An import
names the deepest module of the package it reaches: ``from a.b import c`` is ``a.b.c`` when
that is a module, else ``a.b``. The implicit import of a parent package (importing ``a.b.c``
first runs ``a/b/__init__.py``) is not an edge; an explicit ``from a.b import c`` is one to
``a.b.c`` when ``c`` is a module, but also one to ``a.b`` itself.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["lowering", "runtime_sim"]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``package`` under ``root``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def imported_names(tree: ast.AST, package_of_file: str) -> list[str]:
    """Every dotted name an import statement anywhere in ``tree`` may refer to (absolute)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                      # relative: from .x / from .. import y
                up = package_of_file.split(".")[:len(package_of_file.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    mods = module_files(root, package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets = {resolve(n) for n in imported_names(ast.parse(path.read_text()), pkg)}
        graph[mod] = {t for t in targets if t is not None and t != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[m0, m1, ..., m0]``, or None (depth-first search, white/grey/black)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "grey"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "grey":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = "black"
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    cycle = find_cycle(import_graph(ROOT, package))
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle)}"


def test_a_cycle_is_found_and_named(tmp_path):
    """The finder itself: a lazy import closing a cycle through a package ``__init__`` is found;
    once the shared piece comes from a module of its own instead, there is none."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import x\n")
    (pkg / "sub" / "a.py").write_text("from .b import y\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg.sub import helper\n")   # lazy
    (pkg / "c.py").write_text("from .sub.a import x\n")            # into the cycle, not part of it
    (pkg / "util.py").write_text("")
    cycle = find_cycle(import_graph(tmp_path, "pkg"))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"pkg.sub", "pkg.sub.a", "pkg.sub.b"} and len(cycle) == 4
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg.util import helper\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
