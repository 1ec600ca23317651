"""No import cycle inside a package (issue 26): the modules of each package in ``PACKAGES`` form
a DAG under "imports" (``import_graph.py`` says what counts: lazy imports do).
"""
from __future__ import annotations

import pytest

from import_graph import ROOT, find_cycle, import_graph

PACKAGES = ["lowering", "runtime_sim", "neuron_compiler"]


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
