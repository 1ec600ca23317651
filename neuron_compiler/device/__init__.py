"""The ``neuron`` device: tensors whose data lives in the simulated HBM of one NeuronCore.

Available once ``neuron_compiler`` is imported (PrivateUse1 renamed ``neuron``, as AWS's
TorchNeuron does; this module is also ``torch.neuron``)::

    import torch, neuron_compiler
    x = torch.randn(128, 256).to("neuron")          # a user copy over the host link
    w = torch.randn(256, 64, device="neuron")
    with neuron_compiler.profile() as prof:
        y = torch.relu(x @ w) + 1                   # three ops, each a simulated program
    y.cpu()                                          # the values the simulator computed

- Eager ops on device tensors are lowered one by one with the backend's own pipeline (a
  one-node ATen graph per op signature, compiled once and cached: ``neuron_compiler.device
  .eager``), run on the simulator, and timed in ``neuron_compiler.profile()``.
- An op the lowering does not take runs on the CPU (its data copied over the host link both
  ways) with a warning once per op; ``set_fallback("error")`` (or ``NEURON_DEVICE_FALLBACK=error``)
  makes it raise ``NeuronDeviceFallbackError`` instead.
- ``set_target("trn3")`` (or ``NEURON_DEVICE_TARGET``) picks the generation simulated; trn2 by
  default.
- Autograd works (backward ops are ATen ops on device tensors), and ``torch.compile(model,
  backend="neuron")`` over device tensors keeps inputs, outputs, parameters and buffers on the
  device: see ``docs/device.md``.

Invariants
- Importing this package imports neither ``lowering`` nor the simulator: the first eager op
  does.
- ``is_available()`` is False, with ``why_unavailable()``, when PrivateUse1 already belongs to
  another backend.
"""
from __future__ import annotations

import sys

from neuron_compiler.device.config import (NeuronDeviceFallbackError, get_fallback,
                                           get_target, set_fallback, set_target)
from neuron_compiler.device.registration import register, why_unavailable
from neuron_compiler.device.tensor import NeuronTensor


# ---- the device module torch expects (torch.neuron) -------------------------------------------
def is_available() -> bool:
    """True when the ``neuron`` device is registered (``why_unavailable()`` otherwise)."""
    return why_unavailable() is None


def is_initialized() -> bool:
    return is_available()


def device_count() -> int:
    """One simulated NeuronCore."""
    return 1 if is_available() else 0


def current_device() -> int:
    return 0


def _is_in_bad_fork() -> bool:
    return False


def manual_seed_all(seed: int) -> None:
    """Random factories draw from torch's CPU generator (``torch.manual_seed`` seeds it)."""


def synchronize(device: object = None) -> None:
    """Device ops complete before they return (the simulator runs them to completion)."""


def register_device() -> bool:
    """Register the ``neuron`` device (idempotent; ``import neuron_compiler`` calls it)."""
    return register(sys.modules[__name__])


__all__ = ["NeuronTensor", "NeuronDeviceFallbackError", "set_target", "get_target",
           "set_fallback", "get_fallback", "is_available", "why_unavailable", "device_count",
           "current_device", "synchronize", "register_device"]
