"""The ``neuron`` device's settings: which NeuronCore generation it simulates, and what an op the
lowering does not take does.

- ``set_target(name)`` / ``get_target()``: ``"trn2"`` (default), ``"trn3"`` or ``"trn1"``; the
  environment variable ``NEURON_DEVICE_TARGET`` sets the default.
- ``set_fallback(policy)`` / ``get_fallback()``: ``"allow"`` (default: the op runs on the CPU,
  its data copied over the host link, with a warning once per op) or ``"error"`` (raise
  ``NeuronDeviceFallbackError`` naming the op and the reason); environment variable
  ``NEURON_DEVICE_FALLBACK``.

Invariants
- Both are process-wide (like ``torch.set_default_dtype``) and always hold a valid value: a bad
  value (argument or environment) raises ``NeuronOptionError`` naming the allowed values.
- Data already on the device stays there when the target changes: the device is one NeuronCore
  whose generation decides how later ops are compiled and timed (a comparison of machines, not a
  migration).
- ``eager_options()`` is the ``NeuronOptions`` of an eager device op: this target and policy,
  functional simulation (values from the simulator), no dump directory.
"""
from __future__ import annotations

import os
from functools import lru_cache

from neuron_compiler.errors import NeuronFallbackError, NeuronOptionError
from neuron_compiler.options import DEFAULT_TARGET, FALLBACK_POLICIES, TARGETS, NeuronOptions

TARGET_ENV = "NEURON_DEVICE_TARGET"
FALLBACK_ENV = "NEURON_DEVICE_FALLBACK"


class NeuronDeviceFallbackError(NeuronFallbackError):
    """An op on ``neuron`` tensors cannot run on the device and the policy is ``"error"``."""

    def __init__(self, entries: list[tuple[str, int, str]]):
        super().__init__(entries)
        lines = [f"  {op} (x{count}): {reason}" for op, count, reason in self.entries]
        self.args = ("neuron device fallback policy 'error': these ops cannot run on the "
                     "device:\n" + "\n".join(lines) + "\n(neuron_compiler.device.set_fallback"
                     "('allow') or NEURON_DEVICE_FALLBACK=allow runs them on the CPU)",)


class NeuronDeviceFallbackWarning(UserWarning):
    """An op on ``neuron`` tensors runs on the CPU (the lowering does not take it); once per op."""


def _check(key: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise NeuronOptionError(f"neuron device {key} must be one of "
                                f"{', '.join(repr(a) for a in allowed)}; got {value!r}")
    return value


_STATE = {
    "target": _check(f"target (${TARGET_ENV})", os.environ.get(TARGET_ENV) or DEFAULT_TARGET,
                     TARGETS),
    "fallback": _check(f"fallback (${FALLBACK_ENV})", os.environ.get(FALLBACK_ENV) or "allow",
                       FALLBACK_POLICIES),
}


def set_target(name: str) -> None:
    """Simulate NeuronCore generation ``name`` (``"trn2"``, ``"trn3"``, ``"trn1"``) for the
    device ops that follow."""
    _STATE["target"] = _check("target", name, TARGETS)


def get_target() -> str:
    return _STATE["target"]


def set_fallback(policy: str) -> None:
    """``"allow"``: an op the lowering does not take runs on the CPU (warning once per op);
    ``"error"``: it raises ``NeuronDeviceFallbackError``."""
    _STATE["fallback"] = _check("fallback", policy, FALLBACK_POLICIES)


def get_fallback() -> str:
    return _STATE["fallback"]


@lru_cache(maxsize=None)
def _options(target: str, fallback: str) -> NeuronOptions:
    return NeuronOptions.from_user({"target": target, "fallback": fallback, "dump_dir": None})


def eager_options() -> NeuronOptions:
    """The options an eager device op is compiled with (module docstring)."""
    return _options(_STATE["target"], _STATE["fallback"])
