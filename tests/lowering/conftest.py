"""Lowering tests: make the repository importable and offer ``--update-golden``.

No ``__init__.py`` in this folder on purpose: a package named ``lowering`` under tests/ would
shadow the real ``lowering`` package (pytest's default "prepend" import mode puts tests/ on
sys.path). The test modules are rootless; the helpers live in ``lowering_helpers.py``.

``--update-golden`` is registered here, which works when pytest is pointed at this folder
(``pytest tests/lowering --update-golden``); ``UPDATE_GOLDEN=1`` works from anywhere.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current lowering output")
