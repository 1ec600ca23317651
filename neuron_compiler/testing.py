"""Helpers for tests of models compiled with the neuron backend.

The trap these avoid: a fallback (or Dynamo silently running eager after too many recompiles)
makes every numeric comparison pass. ``run_on_device`` therefore returns the profile, and
``assert_ran_on_device`` fails unless device partitions actually ran.

Invariants
- ``ensure_backends_registered`` only registers ``neuron``/``neuron_sim`` with Dynamo when they
  cannot already be resolved (e.g. running from a source checkout that is not pip-installed);
  it never replaces a registered backend.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from neuron_compiler.profile import Profile, profile


def ensure_backends_registered() -> None:
    """Make ``backend="neuron"`` / ``"neuron_sim"`` resolvable in this process."""
    from torch._dynamo.backends import registry
    from torch._dynamo.exc import InvalidBackend

    from neuron_compiler.backend import neuron_backend, neuron_sim_backend
    for name, fn in (("neuron", neuron_backend), ("neuron_sim", neuron_sim_backend)):
        try:
            registry.lookup_backend(name)
        except InvalidBackend:
            registry.register_backend(fn, name=name)


def compile_for_neuron(fn: Callable, options: Mapping[str, object] | None = None,
                       backend: str = "neuron", **compile_kwargs: object) -> Callable:
    """``torch.compile(fn, backend=backend, options=options)``."""
    ensure_backends_registered()
    return torch.compile(fn, backend=backend, options=dict(options) if options else None,
                         **compile_kwargs)


def run_on_device(compiled: Callable, *args: object, **kwargs: object) -> tuple[object, Profile]:
    """Call ``compiled`` inside a fresh ``profile()``; return (output, profile)."""
    with profile() as prof:
        out = compiled(*args, **kwargs)
    return out, prof


def assert_ran_on_device(prof: Profile, min_device_fraction: float = 1.0) -> dict:
    """Fail unless device partitions ran and at least ``min_device_fraction`` of the ATen
    compute nodes were on the device; returns ``prof.to_dict()``."""
    d = prof.to_dict()
    total = d["device_nodes"] + d["fallback_nodes"]
    if not d["graphs"]:
        raise AssertionError("no neuron-compiled graph ran (did Dynamo fall back to eager, e.g. "
                             "after hitting torch._dynamo.config.recompile_limit?)")
    if not d["partitions"]:
        raise AssertionError(f"no device partition ran; fallbacks: {d['fallbacks']}")
    frac = d["device_nodes"] / total if total else 0.0
    if frac < min_device_fraction:
        raise AssertionError(
            f"only {d['device_nodes']}/{total} ATen compute nodes ran on the device "
            f"({100 * frac:.1f}% < {100 * min_device_fraction:.1f}%); fallbacks: "
            + "; ".join(f"{f['op']} x{f['count']}: {f['reason']}" for f in d["fallbacks"]))
    return d
