"""Residency: where the current data of each live tensor is, host or simulated HBM.

The rules of charging copies are in ``neuron_compiler.runtime`` ("Residency"); this module is the
record they read and write, and the device's share of it:

- ``Residency`` (one process-wide instance, ``RESIDENCY``) tracks a tensor by its Python object
  (weakly referenced) and its data by its ``_version``: a new version is new host data.
- The payload of a ``neuron`` device tensor (``neuron_compiler.device``; the attribute
  ``DEVICE_PAYLOAD_ATTR`` of the tensor) is *owned* by the device (``own``): its data is in HBM
  whatever its version (only device code writes it), for every target, and never on the host.
  A device partition reads it without a copy; a host consumer reads it through a copy each time.

Invariants
- Imports nothing of ``neuron_compiler`` but torch: the runtime and the device both import it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

# The attribute holding a ``neuron`` device tensor's payload: AOTAutograd names it in the
# descriptors of the graph inputs and outputs it unwraps (``SubclassGetAttrAOT*``).
DEVICE_PAYLOAD_ATTR = "_neuron_hbm"


def _version(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors do not track a version counter
        return None


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


Producer = tuple  # (GraphRecord, partition name, signature): the device partition that wrote it


@dataclass(eq=False)
class _Where:
    """Where the data of one tensor at ``version`` is: on the host and/or in some targets' HBM."""

    ref: weakref.ref
    version: int
    host: bool
    devices: set[str]
    producer: Producer | None


class Residency:
    """The process-wide record of where each live tensor's current data is (module docstring)."""

    def __init__(self) -> None:
        self._where: dict[int, _Where] = {}
        self._owned: dict[int, weakref.ref] = {}   # payloads of ``neuron`` device tensors
        self._params: set[int] = set()             # ... of which payloads of parameters

    def own(self, t: torch.Tensor) -> None:
        """``t`` is the payload of a ``neuron`` device tensor: its data lives in HBM whatever
        its version (only device code writes it), on every target, and never on the host."""
        table, key = self._owned, id(t)

        params = self._params

        def forget(ref: weakref.ref) -> None:
            if table.get(key) is ref:
                del table[key]
                params.discard(key)

        if self.owned(t):
            return
        self._params.discard(key)
        table[key] = weakref.ref(t, forget)
        self._where.pop(key, None)

    def mark_parameter(self, t: torch.Tensor) -> None:
        """The owned payload ``t`` holds an ``nn.Parameter`` (the runtime treats it as one: an
        inference program may keep it in a layout of its own)."""
        if self.owned(t):
            self._params.add(id(t))

    def is_parameter(self, t: torch.Tensor) -> bool:
        """True for ``nn.Parameter`` objects and for payloads of device parameters."""
        return isinstance(t, torch.nn.Parameter) or (self.owned(t) and id(t) in self._params)

    def owned(self, t: torch.Tensor) -> bool:
        """True when ``t`` is the payload of a live ``neuron`` device tensor."""
        ref = self._owned.get(id(t))
        return ref is not None and ref() is t

    def _lookup(self, t: torch.Tensor) -> _Where | None:
        w = self._where.get(id(t))
        if w is None or w.ref() is not t or w.version != _version(t):
            return None
        return w

    def _track(self, t: torch.Tensor, host: bool, devices: set[str],
               producer: Producer | None) -> _Where | None:
        v = _version(t)
        if v is None:
            return None
        table, key = self._where, id(t)

        def forget(ref: weakref.ref) -> None:
            w = table.get(key)
            if w is not None and w.ref is ref:
                del table[key]

        w = _Where(weakref.ref(t, forget), v, host, set(devices), producer)
        table[key] = w
        return w

    def to_device(self, t: torch.Tensor, target: str) -> tuple[bool, Producer | None, bool]:
        """A device partition of ``target`` reads ``t``. Returns (send: a host->device copy is
        needed, producer, fetch: the data first comes back from ``producer``'s device)."""
        if self.owned(t):
            return False, None, False
        w = self._lookup(t)
        if w is not None and target in w.devices:
            return False, None, False
        if w is None:
            w = self._track(t, True, set(), None)
            if w is not None:
                w.devices.add(target)
            return True, None, False
        fetch = not w.host
        w.host = True
        w.devices.add(target)
        return True, w.producer, fetch

    def to_host(self, t: torch.Tensor) -> tuple[bool, Producer | None]:
        """A host consumer reads ``t``: (a device->host copy is needed, who produced it)."""
        w = self._lookup(t)
        if w is None or w.host:
            return False, None
        w.host = True
        return True, w.producer

    def produced(self, t: torch.Tensor, target: str, producer: Producer) -> bool:
        """``t`` was written by a device partition: its data is in ``target``'s HBM only. False
        when ``t`` cannot be tracked (no version counter): the caller copies it out at once."""
        return self._track(t, False, {target}, producer) is not None

    def device_only(self, t: torch.Tensor) -> bool:
        """True when ``t``'s current data is in some HBM and not on the host (a device
        partition wrote it, or it is a device tensor's payload)."""
        if self.owned(t):
            return True
        w = self._lookup(t)
        return w is not None and not w.host and bool(w.devices)

    def alias(self, out: torch.Tensor, base: torch.Tensor) -> None:
        """``out`` is a view of ``base`` made without reading data: it is where ``base`` is."""
        if self.owned(base):
            self.own(out)
            return
        w = self._lookup(base)
        if w is not None:
            self._track(out, w.host, w.devices, w.producer)


RESIDENCY = Residency()
