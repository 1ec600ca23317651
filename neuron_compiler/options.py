"""Backend options: parsed once per compile, validated strictly, frozen afterwards.

Invariants
- ``NeuronOptions`` is frozen; every field holds a validated value (no "maybe valid" state).
- An unknown key is an error that lists every valid key; a bad value is an error naming the
  key, the allowed values and the value that was given.
- ``dump_dir`` comes from ``options["dump_dir"]`` when that key is given (even as ``None``, which
  disables dumping), else from the ``NEURON_DUMP_DIR`` environment variable, else ``None``.
  ``cache_dir`` likewise, from ``NEURON_CACHE_DIR``.
- ``host_link_gbps`` and ``call_overhead_us`` are ``None`` (not set: the default of
  ``neuron_compiler.assumptions`` is in force, and the reports say so) or a finite float:
  ``host_link_gbps > 0``, ``call_overhead_us >= 0``. They change only the host side of the
  timing (copies over the host link, the per-call launch overhead), never the program.
"""
from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from neuron_compiler.errors import NeuronOptionError
from runtime_sim import targets as _machine

# the targets runtime_sim describes: the default first, then the others newest first
DEFAULT_TARGET: str = _machine.DEFAULT_TARGET
TARGETS: tuple[str, ...] = (DEFAULT_TARGET, *sorted(
    (name for name in _machine.TARGETS if name != DEFAULT_TARGET), reverse=True))
SIM_MODES: tuple[str, ...] = ("functional", "timing")
FALLBACK_POLICIES: tuple[str, ...] = ("allow", "error")
AUTO_CASTS: tuple[str, ...] = ("none", "matmul", "all")   # as neuron_compiler.autocast
# LNC degrees per target: trn1 1 only (compiler error EARG001: "On trn1, only lnc=1 is
# supported"), trn2/trn3 1 or 2 (nki/get-started/about/lnc.rst: "either 1 or 2")
LNC_DEGREES: dict[str, tuple[int, ...]] = {"trn1": (1,), "trn2": (1, 2), "trn3": (1, 2)}
DUMP_DIR_ENV = "NEURON_DUMP_DIR"
CACHE_DIR_ENV = "NEURON_CACHE_DIR"   # as neuron_compiler.cache
_DIR_OPTIONS = (("dump_dir", DUMP_DIR_ENV), ("cache_dir", CACHE_DIR_ENV))
# (key, must be > 0 (else >= 0), unit): see neuron_compiler.assumptions
_NUMBER_OPTIONS = (("host_link_gbps", True, "GB/s"), ("call_overhead_us", False, "microseconds"))


@dataclass(frozen=True)
class NeuronOptions:
    """The ``options=`` of ``torch.compile(..., backend="neuron", options={...})``.

    - ``target``: ``"trn2"`` (default), ``"trn3"`` or ``"trn1"``: the NeuronCore generation
      whose program is built and timed.
    - ``sim_mode``: ``"functional"`` (default; output values come from executing the tiled
      program) or ``"timing"`` (the program is built, checked and timed, values come from eager
      PyTorch).
    - ``fallback``: ``"allow"`` (default; unsupported ops run in eager PyTorch) or ``"error"``
      (compiling raises, naming every op that cannot run on the device).
    - ``dump_dir``: directory for per-compile dumps, or ``None`` (default: ``$NEURON_DUMP_DIR``).
    - ``auto_cast``: ``"none"`` (default), ``"matmul"`` or ``"all"``: compute fp32 matmuls (or
      all fp32 ops) in bf16, as neuronx-cc's ``--auto-cast`` (see ``neuron_compiler.autocast``).
    - ``cache_dir``: directory of the on-disk compile cache shared between processes, or
      ``None`` (default: ``$NEURON_CACHE_DIR``); see ``neuron_compiler.cache``.
    - ``host_link_gbps``: host <-> device link bandwidth in GB/s used to time the copies of
      inputs and outputs, or ``None`` (default: the target's ``host_link_bytes_per_ns``, an
      ASSUMED figure); see ``neuron_compiler.assumptions``.
    - ``call_overhead_us``: runtime launch overhead added to every device-partition call, in
      microseconds, or ``None`` (default: 0, ASSUMED: no published figure).
    - ``lnc``: physical NeuronCores per logical core, ``1`` (default) or ``2`` (trn2/trn3 only:
      "On trn1, only lnc=1 is supported", compiler error code EARG001; "an LNC degree ... of
      either 1 or 2", nki/get-started/about/lnc.rst). With 2, each device partition is split
      over the two physical cores that share an HBM stack (``lowering.lnc``, docs/lnc.md).
      AWS ships 2 on trn2/trn3; the default here stays 1 so that existing figures keep their
      meaning (docs/lnc.md says what flipping it takes).
    """

    target: str = DEFAULT_TARGET
    sim_mode: str = "functional"
    fallback: str = "allow"
    dump_dir: str | None = None
    auto_cast: str = "none"
    cache_dir: str | None = None
    host_link_gbps: float | None = None
    call_overhead_us: float | None = None
    lnc: int = 1

    def __post_init__(self) -> None:
        _check_choice("target", self.target, TARGETS)
        _check_choice("sim_mode", self.sim_mode, SIM_MODES)
        _check_choice("fallback", self.fallback, FALLBACK_POLICIES)
        _check_choice("auto_cast", self.auto_cast, AUTO_CASTS)
        for key, _ in _DIR_OPTIONS:
            value = getattr(self, key)
            if value is None:
                continue
            if not isinstance(value, (str, os.PathLike)):
                raise NeuronOptionError(
                    f"option {key!r} must be a directory path (str or os.PathLike) or None, "
                    f"got {value!r} of type {type(value).__name__}")
            object.__setattr__(self, key, os.fspath(value) or None)   # "" means none
        for key, positive, unit in _NUMBER_OPTIONS:
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, _check_number(key, value, positive, unit))
        allowed = LNC_DEGREES[self.target]
        if isinstance(self.lnc, bool) or self.lnc not in allowed:
            raise NeuronOptionError(
                f"option 'lnc' must be {' or '.join(map(str, allowed))} on target "
                f"{self.target!r} (physical NeuronCores per logical core"
                + ("; on trn1 only lnc=1 is supported" if self.target == "trn1" else "")
                + f"); got {self.lnc!r}")
        object.__setattr__(self, "lnc", int(self.lnc))

    @classmethod
    def valid_keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_user(cls, options: Mapping[str, object] | None = None) -> "NeuronOptions":
        """Validate a user's ``options=`` mapping (``None`` means all defaults)."""
        if options is None:
            options = {}
        if isinstance(options, NeuronOptions):
            return options
        if not isinstance(options, Mapping):
            raise NeuronOptionError(
                f"options must be a dict with keys from {list(cls.valid_keys())}, "
                f"got {type(options).__name__}: {options!r}")
        valid = cls.valid_keys()
        unknown = [k for k in options if k not in valid]
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            raise NeuronOptionError(
                f"unknown neuron option{'s' if len(unknown) > 1 else ''} {names}; "
                f"valid options are: {', '.join(valid)}")
        kwargs = dict(options)
        for key, env in _DIR_OPTIONS:
            if key not in kwargs:
                kwargs[key] = os.environ.get(env) or None
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, str | float | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise NeuronOptionError(
            f"option {key!r} must be one of {', '.join(repr(a) for a in allowed)}; "
            f"got {value!r}")


def _check_number(key: str, value: object, positive: bool, unit: str) -> float:
    """``value`` as a float when it is a finite real number, > 0 (``positive``) or >= 0."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    number = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not (math.isfinite(number) and (number > 0 if positive else number >= 0)):
        rule = "a positive" if positive else "a non-negative"
        raise NeuronOptionError(
            f"option {key!r} must be {rule} finite number ({unit}) or None for the default; "
            f"got {value!r}" + ("" if ok else f" of type {type(value).__name__}"))
    return number


def validate_options(options: Mapping[str, object] | None = None) -> NeuronOptions:
    """Validate ``options`` as ``torch.compile(..., options=...)`` would; returns the frozen form."""
    return NeuronOptions.from_user(options)
