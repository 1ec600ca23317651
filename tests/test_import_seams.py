"""The seams of ``neuron_compiler`` (issue 26), checked on the source text (no import runs).

- No import cycle inside ``neuron_compiler/``: ``test_import_cycles.py`` (``PACKAGES``); here,
  that the finder (``import_graph.py``) sees a cycle closed lazily or through a package's
  ``__init__``.
- ``neuron_compiler`` reaches the lowering through ``lowering.api`` only (DESIGN.md: the torch
  face asks the lowering's public face; the decomposition policy lives in ``lowering.policy``,
  exported by ``lowering.api``), ``importlib.import_module("lowering...")`` included.
"""
from __future__ import annotations

from import_graph import ROOT, find_cycle, import_graph, imported_names, module_files

PACKAGE = "neuron_compiler"
LOWERING_FACE = "lowering.api"


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
