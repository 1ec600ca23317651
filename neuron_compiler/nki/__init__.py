"""An NKI-compatible front end: NKI kernels traced into the machine program, checked by the
machine's rules and run on the simulator (values and time), on trn1, trn2 or trn3.

    from neuron_compiler import nki
    import neuron_compiler.nki.language as nl
    import neuron_compiler.nki.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a[0:128, 0:512]) + nl.load(b[0:128, 0:512])
        nl.store(out[0:128, 0:512], value=t)
        return out

    c = add(a, b)                                # numpy in, numpy out (torch in, torch out)
    run = nki.simulate(add, a, b, target="trn3")  # values + time: run.time_us, run.summary()

Both API generations are accepted (language.py, isa.py); ``install_aliases()`` lets unchanged
kernel files ``import nki`` / ``neuronxcc.nki``. Modules: ``index`` (arange/mgrid/masks),
``tensor`` (storages and views, ``.ap`` pattern views), ``operators`` (``NkiTensor``'s Python
operators, installed on it here), ``tracer`` (allocation, synchronisation, checks), ``ops`` (the
instructions), ``language``/``isa``/``typing`` (the API), ``kernel`` (jit, calls, profile),
``aliases``, ``op`` (``nki_op``: kernels as torch custom ops, device operations in compiled
graphs). docs/nki.md is the guide.

Imports: runtime_sim (the machine), neuron_compiler.profile, and (op.py) the device's residency
and transfer accounting; never lowering. No submodule imports this package's ``__init__``: the
steps that join the pieces (``operators.install()``; ``install_aliases()``, which passes this
package to ``aliases.install``) run from here.
"""
import sys

from . import aliases, compiler, isa, language, operators, typing  # noqa: F401
from .kernel import Kernel, KernelRun, jit, simulate, simulate_kernel, target
from .op import nki_op

operators.install()


def install_aliases() -> dict[str, str]:
    """Let unchanged kernel files ``import nki`` / ``neuronxcc.nki`` (and ``.language``,
    ``.isa``, ``.typing``): ``aliases.install`` of this package (``aliases`` module docstring);
    returns ``{module name: what it resolves to}``."""
    return aliases.install(sys.modules[__name__])


def uninstall_aliases() -> None:
    """Remove every ``sys.modules`` entry ``install_aliases`` added."""
    aliases.uninstall()


baremetal = jit
benchmark = jit
trace = jit

__all__ = ["jit", "simulate", "simulate_kernel", "target", "install_aliases", "uninstall_aliases",
           "Kernel", "KernelRun", "nki_op", "language", "isa", "typing", "baremetal", "benchmark", "trace"]
