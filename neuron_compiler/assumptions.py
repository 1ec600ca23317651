"""The host-side assumptions of the timing: host-link bandwidth and per-call runtime overhead.

Neither figure is published for Trainium (``shared/hardware-sources.md``, section 1):
- host link: no Neuron document gives the PCIe generation, width or bandwidth between the host
  and a Trainium chip; the only host figure is "~16 GB/sec" next to host DRAM in the NKI
  memory-hierarchy diagram (``nki/get-started/about/memory-hierarchy-overview.rst``), an order
  of magnitude. The targets' ``host_link_bytes_per_ns`` (``runtime_sim/targets.py``) are
  ASSUMED PCIe figures.
- per-call overhead: no document gives the runtime's launch cost of one NEFF execution
  (``nrt_execute``). The nearest figure, 437 us between invocations in synchronous mode
  (``vllm-neuron/docs/design/framework/async_execution.md``), includes vLLM's Python,
  dispatch and tensor-allocation overheads of one example, so it is not used: the default is 0.

Both are options (``host_link_gbps``, ``call_overhead_us``), and every report prints the
values in force with their source.

Invariants
- ``HostAssumptions`` is frozen and resolved from one ``NeuronOptions``: each value has a
  source, ``"option"`` (set by the user) or the default's reason (``"target default: ASSUMED
  ..."``, ``"default: ASSUMED 0: ..."``).
- Copies are timed by ``runtime_sim.costs.host_transfer_ns`` on the options' target with
  ``host_link_bytes_per_ns`` replaced (GB/s == bytes/ns); ``runtime_sim`` is not changed and
  the program (its key, its simulated time) does not depend on either value.
- The overhead is charged once per device-partition call (one program launch), never for a
  partition that runs in eager PyTorch; it is reported apart from the simulated program time.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from neuron_compiler.options import NeuronOptions
from runtime_sim.costs import host_transfer_ns
from runtime_sim.targets import Target, get_target

OPTION_SOURCE = "option"
HOST_LINK_DEFAULT_SOURCE = (
    "target default: ASSUMED ({target} host_link_bytes_per_ns in runtime_sim/targets.py; no "
    "published host-link bandwidth, the only figure is '~16 GB/sec' for host memory in the "
    "NKI memory-hierarchy diagram)")
CALL_OVERHEAD_DEFAULT_US = 0.0
CALL_OVERHEAD_DEFAULT_SOURCE = (
    "default: ASSUMED 0: no published figure (no Neuron document gives the runtime's "
    "per-call launch overhead)")


@dataclass(frozen=True)
class HostAssumptions:
    """The host link and per-call overhead in force for one compiled graph's target."""

    target: Target               # the options' target, host_link_bytes_per_ns replaced
    host_link_gbps: float
    host_link_source: str
    call_overhead_us: float
    call_overhead_source: str

    @property
    def call_overhead_ns(self) -> float:
        return self.call_overhead_us * 1e3

    def transfer_ns(self, nbytes: int, transfers: int = 1) -> float:
        """Time of ``transfers`` tensors, ``nbytes`` in all, over the host link."""
        return host_transfer_ns(nbytes, self.target, transfers=transfers)

    def to_dict(self) -> dict:
        """JSON-ready: ``{target, host_link_gbps: {value, source}, call_overhead_us: {...}}``."""
        return {"target": self.target.name,
                "host_link_gbps": {"value": self.host_link_gbps,
                                   "source": self.host_link_source},
                "call_overhead_us": {"value": self.call_overhead_us,
                                     "source": self.call_overhead_source}}


@lru_cache(maxsize=None)
def _resolve(target: str, host_link_gbps: float | None,
             call_overhead_us: float | None) -> HostAssumptions:
    base = get_target(target)
    if host_link_gbps is None:
        gbps, link_src = float(base.host_link_bytes_per_ns), HOST_LINK_DEFAULT_SOURCE.format(
            target=target)
    else:
        gbps, link_src = float(host_link_gbps), OPTION_SOURCE
    if call_overhead_us is None:
        us, us_src = CALL_OVERHEAD_DEFAULT_US, CALL_OVERHEAD_DEFAULT_SOURCE
    else:
        us, us_src = float(call_overhead_us), OPTION_SOURCE
    tgt = base if gbps == base.host_link_bytes_per_ns else replace(
        base, host_link_bytes_per_ns=gbps)
    return HostAssumptions(tgt, gbps, link_src, us, us_src)


def host_assumptions(options: NeuronOptions) -> HostAssumptions:
    """The assumptions ``options`` put in force (module docstring)."""
    return _resolve(options.target, options.host_link_gbps, options.call_overhead_us)


def assumptions_of(graph: object) -> HostAssumptions:
    """Those of a compiled graph's record (``profile.GraphRecord``); the target's defaults
    for a record made without them."""
    found = getattr(graph, "assumptions", None)
    return found if found is not None else _resolve(graph.target, None, None)  # type: ignore


def describe(d: dict) -> list[str]:
    """Report lines for one ``HostAssumptions.to_dict()``: value, unit and source of each."""
    link, over = d["host_link_gbps"], d["call_overhead_us"]
    return [f"host_link_gbps   = {link['value']:g} GB/s: {link['source']}",
            f"call_overhead_us = {over['value']:g} us per device-partition call: "
            f"{over['source']}"]
