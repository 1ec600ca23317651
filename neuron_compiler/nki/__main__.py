"""``python -m neuron_compiler.nki FILE [ARGS...]``: run an unchanged NKI kernel script (its
``__main__`` block) on the simulator, with ``install_aliases()`` in force. ``--target trn3``
(before FILE) selects the target of every kernel call."""
from __future__ import annotations

import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    target = "trn2"
    if argv[:1] == ["--target"]:
        target, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from neuron_compiler import nki
    nki.install_aliases()
    sys.argv = argv
    with nki.target(target):
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
