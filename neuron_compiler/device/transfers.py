"""Copies between the host and the ``neuron`` device that the user asked for.

``.to("neuron")`` / ``nn.Module.to("neuron")`` (host -> device), ``.cpu()``, ``.to("cpu")``,
``.item()``, ``.tolist()``, ``.numpy()`` through ``.cpu()``, and printing (device -> host) each
copy one tensor over the host link. Each is timed as the compiled graphs time theirs
(``neuron_compiler.assumptions``: one DMA fixed latency plus bytes over the host link of the
device's current target) and lands in every open profile as a user copy
(``Profile.note_user_copy``: ``to_dict()["user_copies"]``, part of ``transfer_time_us``).

``charge_transfer_out(producer, t, profs)``: the copy out of device-only data that a host
consumer reads (a fallback node of a compiled graph, an ``nki_op`` call), on the host link of the
graph that produced it (``Profile.note_transfer_out``).

Invariants
- Nothing is charged while no profile is open, and nothing here reads or moves values: the
  caller does the copy.
"""
from __future__ import annotations

import torch

from neuron_compiler.assumptions import assumptions_of, host_assumptions
from neuron_compiler.device.config import eager_options
from neuron_compiler.device.residency import Producer, tensor_bytes
from neuron_compiler.profile import active_profiles

DIRECTIONS = ("to_device", "to_host")


def charge_user_copy(direction: str, nbytes: int) -> None:
    """One user copy of ``nbytes`` in ``direction`` (``"to_device"`` or ``"to_host"``)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"copy direction must be one of {DIRECTIONS}, got {direction!r}")
    profs = active_profiles()
    if not profs:
        return
    ns = host_assumptions(eager_options()).transfer_ns(nbytes, transfers=1)
    for p in profs:
        p.note_user_copy(direction, nbytes, ns)


def charge_transfer_out(producer: Producer | None, t: torch.Tensor, profs: tuple) -> None:
    """Device -> host copy of ``t`` (on the host link of its producer's target) in ``profs``."""
    if not profs:
        return
    if producer is None:
        raise AssertionError("device-only data without a producing partition")
    nbytes = tensor_bytes(t)
    ns = assumptions_of(producer[0]).transfer_ns(nbytes, transfers=1)
    for p in profs:
        p.note_transfer_out(producer, ns, nbytes)
