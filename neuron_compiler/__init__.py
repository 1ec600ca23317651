"""neuron_compiler: the torch face of the neuron backend (Trainium2/3, simulated on the CPU).

``torch.compile(model, backend="neuron")`` works without importing this package (entry points
``neuron`` / ``neuron_sim`` in the ``torch_dynamo_backends`` group). Import it for:

- ``profile()``: a context manager recording what ran on the device and what fell back, with
  simulated, transfer and fallback times (``.summary()``, ``.to_dict()``,
  ``.export_chrome_trace(path)``);
- ``NeuronOptions`` / ``validate_options``: the ``options=`` accepted by the backend;
- ``neuron_backend``: the backend callable itself.

The ``neuron-eval`` command (``python -m neuron_compiler.eval``) lives in ``neuron_compiler.eval``.

Invariants
- Importing this package imports neither ``lowering`` nor the simulator's heavy parts; the
  lowering is imported when the first graph is compiled.
"""
from __future__ import annotations

from neuron_compiler.errors import NeuronFallbackError, NeuronOptionError
from neuron_compiler.options import NeuronOptions, validate_options
from neuron_compiler.profile import Profile, profile

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name in ("neuron_backend", "neuron_sim_backend"):
        from neuron_compiler import backend
        return getattr(backend, name)
    raise AttributeError(f"module 'neuron_compiler' has no attribute {name!r}")


__all__ = ["profile", "Profile", "NeuronOptions", "validate_options", "NeuronOptionError",
           "NeuronFallbackError", "neuron_backend", "neuron_sim_backend", "__version__"]
