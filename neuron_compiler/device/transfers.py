"""Copies between the host and the ``neuron`` device that the user asked for.

``.to("neuron")`` / ``nn.Module.to("neuron")`` (host -> device), ``.cpu()``, ``.to("cpu")``,
``.item()``, ``.tolist()``, ``.numpy()`` through ``.cpu()``, and printing (device -> host) each
copy one tensor over the host link. Each is timed as the compiled graphs time theirs
(``neuron_compiler.assumptions``: one DMA fixed latency plus bytes over the host link of the
device's current target) and lands in every open profile as a user copy
(``Profile.note_user_copy``: ``to_dict()["user_copies"]``, part of ``transfer_time_us``).

Invariants
- Nothing is charged while no profile is open, and nothing here reads or moves values: the
  caller does the copy.
"""
from __future__ import annotations

from neuron_compiler.assumptions import host_assumptions
from neuron_compiler.device.config import eager_options
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
