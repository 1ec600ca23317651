"""``install(package)`` (``neuron_compiler.nki.install_aliases()``): let unchanged NKI kernel
files import this front end.

After it, ``import nki``, ``import nki.language as nl``, ``import nki.isa as nisa``,
``from neuronxcc import nki``, ``import neuronxcc.nki.language as nl`` (and ``.isa``,
``.typing``) resolve to ``neuron_compiler.nki`` -- but only for a top-level name (``nki``,
``neuronxcc``) that no installed package provides: a real Neuron SDK is never shadowed (a
directory of that name without ``__init__.py``, a namespace package, does not count).

Invariants
- The aliases are ``sys.modules`` entries and nothing else; ``uninstall()`` removes exactly the
  entries ``install()`` added.
- The package to alias is an argument: this module imports nothing of the front end (the
  package's ``__init__`` imports it and passes itself).
"""
from __future__ import annotations

import importlib.util
import sys
import types

_SUBMODULES = ("language", "isa", "typing")
_ADDED: list[str] = []


def _real(top: str) -> bool:
    """Is ``top`` provided by something other than these aliases?"""
    m = sys.modules.get(top)
    if m is not None:
        return not getattr(m, "__neuron_nki_alias__", False)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    # a bare directory of that name (a namespace package, e.g. a tests/nki folder) is no install
    return spec is not None and spec.origin not in (None, "namespace")


def install(pkg: types.ModuleType) -> dict[str, str]:
    """Install the aliases of ``pkg`` (``neuron_compiler.nki``; module docstring); return
    ``{module name: what it resolves to}`` for every name now served by this front end (empty
    when a real install owns both)."""
    mods = {f"nki.{s}": getattr(pkg, s) for s in _SUBMODULES}
    done: dict[str, str] = {}

    def put(name: str, module) -> None:
        if name not in sys.modules:
            sys.modules[name] = module
            _ADDED.append(name)
        done[name] = module.__name__

    if not _real("nki"):
        put("nki", pkg)
        for name, m in mods.items():
            put(name, m)
    if not _real("neuronxcc"):
        top = sys.modules.get("neuronxcc")
        if top is None:
            top = types.ModuleType("neuronxcc", "Alias package: neuronxcc.nki is neuron_compiler.nki")
            top.__neuron_nki_alias__ = True
            top.__path__ = []
        top.nki = pkg
        put("neuronxcc", top)
        put("neuronxcc.nki", pkg)
        for name, m in mods.items():
            put("neuronxcc." + name, m)
    return done


def uninstall() -> None:
    """Remove every ``sys.modules`` entry ``install`` added."""
    while _ADDED:
        sys.modules.pop(_ADDED.pop(), None)
