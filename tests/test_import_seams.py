"""The seams of ``neuron_compiler`` (issue 26), checked on the source text (no import runs).

- No import cycle inside ``neuron_compiler/``: every ``import`` / ``from ... import`` counts,
  at module level or inside a function (a lazy import is still an edge), as
  ``/tmp/cycles.py`` counts them: ``from P import x`` is an edge to ``P`` and, when ``P.x`` is a
  module, to ``P.x`` too (so ``from . import x`` in a submodule of ``P`` reaches ``P``'s
  ``__init__``). The implicit import of a module's parent package is not an edge. A failure
  names one cycle, ``a -> b -> ... -> a``.
- ``neuron_compiler`` reaches the lowering through ``lowering.api`` only (DESIGN.md: the torch
  face asks the lowering's public face; the decomposition policy lives in ``lowering.policy``,
  exported by ``lowering.api``), ``importlib.import_module("lowering...")`` included.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "neuron_compiler"
LOWERING_FACE = "lowering.api"


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


def test_no_import_cycle_inside_neuron_compiler():
    cycle = find_cycle(import_graph(ROOT, PACKAGE))
    assert cycle is None, ("import cycle inside neuron_compiler/ (lazy imports count): "
                           + " -> ".join(cycle))


def test_the_cycle_finder_sees_a_lazy_cycle_and_a_package_init(tmp_path):
    """The check can fail: a cycle closed by an import inside a function, and one through a
    package's ``__init__`` (``from . import x`` in a submodule), are both found and named."""
    pkg = tmp_path / "fake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from fake.a import f\n")
    (pkg / "a.py").write_text("from fake.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from fake import a\n    return a\n")
    (pkg / "sub" / "__init__.py").write_text("from .x import h\n")
    (pkg / "sub" / "x.py").write_text("from . import y\n\ndef h():\n    return y\n")
    (pkg / "sub" / "y.py").write_text("")
    graph = import_graph(tmp_path, "fake")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1], cycle
    assert {"fake.a", "fake.b"} <= set(cycle), cycle
    assert "fake.sub.x" in graph["fake.sub"] and "fake.sub" in graph["fake.sub.x"]
    assert find_cycle({"p": {"q"}, "q": set()}) is None


def test_neuron_compiler_reaches_the_lowering_through_lowering_api_only():
    found: dict[str, str] = {}        # one line per import statement: its module
    for module, path in module_files(ROOT, PACKAGE).items():
        for name, line in imported_names(module, path):
            if (name == "lowering" or name.startswith("lowering.")) and name != LOWERING_FACE \
                    and not name.startswith(LOWERING_FACE + "."):
                found.setdefault(f"{path.relative_to(ROOT)}:{line}", name)
    bad = [f"{where}: {name}" for where, name in found.items()]
    assert not bad, ("neuron_compiler/ may import from the lowering only lowering.api "
                     "(lowering.policy and the rest are reached through it):\n" + "\n".join(bad))
