"""Load a script that is not a package module (bench/*.py, ../shared/tools/*.py) by its path."""
from __future__ import annotations

import importlib.util
import sys


def load_script(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
