"""The module import graph of a package, read from the source text (no import runs); shared by
``test_import_cycles.py`` and ``test_import_seams.py``.

What counts as an edge: every ``import`` / ``from ... import`` statement, wherever it is
(module level, inside a function: a lazy import is still a dependency, under
``if TYPE_CHECKING:``), and ``importlib.import_module("X")`` with a constant string. An import
names the deepest module of the package it reaches: ``from P import a`` is an edge to ``P`` and,
when ``P.a`` is a module, to ``P.a`` too (so ``from . import x`` in a submodule of ``P`` reaches
``P``'s ``__init__``). The implicit import of a module's parent package (importing ``a.b.c``
first runs ``a/b/__init__.py``) is not an edge.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file under ``root/package``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """Every dotted name an import statement of ``path`` names, with its line: for
    ``from P import a, b``: ``P``, ``P.a``, ``P.b`` (relative imports resolved from ``module``);
    for ``importlib.import_module("X")`` with a constant string: ``X``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append((base, node.lineno))
            names += [(f"{base}.{a.name}", node.lineno) for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.append((node.args[0].value, node.lineno))
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of package it imports}`` (module docstring for what counts)."""
    mods = module_files(root, package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in mods.items():
        graph[module]
        for name, _ in imported_names(module, path):
            target = resolve(name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}            # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None
