"""Functional collectives in compiled graphs: device operations whose values come from
torch.distributed and whose time comes from the collective model (``runtime_sim.collectives``).

``torch.distributed._functional_collectives`` (all_reduce, all_gather_tensor, reduce_scatter_tensor,
all_to_all_single, broadcast) reach the ATen graph as ``_c10d_functional.<op>`` nodes, each followed
by a ``_c10d_functional.wait_tensor``. As Inductor does (``torch/_inductor/comm_lowering.py``: the
op becomes a ``_CollectiveKernel`` that calls the op itself, the wait a ``_WaitKernel``; its cost
model, ``comm_analysis.estimate_nccl_collective_runtime_from_fx_node``, sizes the group with
``_get_group_size_by_name``), the op is not lowered: ``CollectiveOp`` calls it, so the process
group (gloo on the CPU; ranks may be processes on one machine or many) computes the values, and
records the modelled time of that call on the target in the open profiles.

DTensor (``torch.distributed.tensor``, ``parallelize_module``, transformers' ``tp_plan``) reaches
the same ops: a redistribution under tracing calls funcol (Partial -> Replicate: all_reduce;
Shard -> Replicate: all_gather_into_tensor; Partial -> Shard: reduce_scatter_tensor; Shard(i) ->
Shard(j) on a CPU mesh: all_gather and a chunk), and the backward of each op is another
``_c10d_functional`` op (torch registers their autograd). torch's older differentiable variants,
``_c10d_functional_autograd.{all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single}``, are kept for code that calls them directly (docs/dtensor.md).

Invariants
- Partitioning (``partition.py``) keeps a collective node, and its wait, in the outer graph and
  counts both as device nodes, never as fallbacks; ``fallback="error"`` does not refuse them.
- A collective's time is ``collective_cost(kind, nbytes, ranks, target, lnc)``: ``nbytes`` is
  nccom-test's size (the larger of the op's input and output bytes, summed over a coalesced op's
  tensors), ``ranks`` the size of the op's process group, ``lnc`` the compiled graph's
  (``GraphRecord.lnc`` when the record has one) else the target's default. A wait records nothing:
  its time is its collective's. The profile files it under ``collectives`` and
  ``collective_time_us``, apart from the simulated partitions, the transfers and the fallbacks.
- Residency: the collective reads its input where it is (device data stays; host data is sent
  once, charged as an unattributed host->device copy) and writes its output to the target's HBM;
  a wait's output is where its input is.
"""
from __future__ import annotations

import time

import torch
from torch.fx import Node
from torch.profiler import record_function
from torch.utils._pytree import tree_leaves

from neuron_compiler.assumptions import assumptions_of
from neuron_compiler.device.residency import RESIDENCY, tensor_bytes
from neuron_compiler.profile import GraphRecord, active_profiles
from runtime_sim.collectives import collective_cost

COLLECTIVE_RANGE = "neuron collective: "   # prefix of the profiler range of a collective call

_c10d = torch.ops._c10d_functional
_c10d_autograd = torch.ops._c10d_functional_autograd   # torch's older differentiable variants
# op -> the kind of collective the model times ("wait": the completion of one)
COLLECTIVE_KINDS: dict[object, str] = {
    _c10d.all_reduce.default: "all_reduce",
    _c10d.all_reduce_.default: "all_reduce",
    _c10d.all_reduce_coalesced.default: "all_reduce",
    _c10d.all_reduce_coalesced_.default: "all_reduce",
    _c10d.all_gather_into_tensor.default: "all_gather",
    _c10d.all_gather_into_tensor_out.default: "all_gather",
    _c10d.all_gather_into_tensor_coalesced.default: "all_gather",
    _c10d.reduce_scatter_tensor.default: "reduce_scatter",
    _c10d.reduce_scatter_tensor_out.default: "reduce_scatter",
    _c10d.reduce_scatter_tensor_coalesced.default: "reduce_scatter",
    _c10d.all_to_all_single.default: "all_to_all",
    _c10d.broadcast.default: "broadcast",
    _c10d.broadcast_.default: "broadcast",
    _c10d.wait_tensor.default: "wait",
    _c10d_autograd.all_gather_into_tensor.default: "all_gather",
    _c10d_autograd.reduce_scatter_tensor.default: "reduce_scatter",
    _c10d_autograd.all_to_all_single.default: "all_to_all",
}


def collective_kind(node: Node) -> str | None:
    """The collective kind of ``node`` ("wait" for a wait_tensor), None if it is not one."""
    if node.op != "call_function":
        return None
    return COLLECTIVE_KINDS.get(node.target)


def group_size(op: object, args: tuple, kwargs: dict) -> int:
    """The number of ranks of the op's process group (its ``group_name`` argument)."""
    from torch.distributed.distributed_c10d import _get_group_size_by_name
    names = [a.name for a in op._schema.arguments]  # type: ignore[attr-defined]
    i = names.index("group_name")
    group = kwargs["group_name"] if "group_name" in kwargs else args[i]
    return int(_get_group_size_by_name(group))


def _bytes(value: object) -> int:
    return sum(tensor_bytes(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def record_collective(graph: GraphRecord, op_name: str, kind: str, nbytes: int, ranks: int,
                      host_ns: int) -> object:
    """Time one collective call with the model on ``graph``'s target (and its ``lnc`` when it
    has one), mark it in the torch profiler and note it in the open profiles; returns the
    ``CollectiveCost``. Used by ``CollectiveOp`` and by the DDP / FSDP2 comm hooks
    (``neuron_compiler.dp``), whose collectives run outside compiled graphs."""
    target = graph.target
    cost = collective_cost(kind, nbytes, ranks, target, getattr(graph, "lnc", None))
    if torch.autograd._profiler_enabled():
        with record_function(f"{COLLECTIVE_RANGE}{op_name} {cost.total_ns / 1e3:.3f} us "
                             f"modelled on {target} ({cost.algorithm})"):
            pass
    for p in active_profiles():
        p.note_collective(graph, op_name, cost, host_ns)
    return cost


class CollectiveOp(torch.nn.Module):
    """One collective (or wait) node of a compiled graph: runs the op through torch.distributed
    and records its modelled time (module docstring)."""

    def __init__(self, op: object, name: str, kind: str, graph: GraphRecord):
        super().__init__()
        self.op, self.op_name, self.kind, self.graph = op, name, kind, graph

    def forward(self, *args: object, **kwargs: object) -> object:
        profs = active_profiles()
        if self.kind == "wait":
            out = self.op(*args, **kwargs)
            if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
                RESIDENCY.alias(out, args[0])
            return out
        target = self.graph.target
        self._inputs_to_device((args, kwargs), target, profs)
        t0 = time.perf_counter_ns()
        out = self.op(*args, **kwargs)
        host_ns = time.perf_counter_ns() - t0
        nbytes = max(_bytes((args, kwargs)), _bytes(out))
        record_collective(self.graph, self.op_name, self.kind, nbytes,
                          group_size(self.op, args, kwargs), host_ns)
        producer = (self.graph, f"collective {self.op_name}", ())
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor):
                RESIDENCY.produced(o, target, producer)
        return out

    def _inputs_to_device(self, value: object, target: str, profs: tuple) -> None:
        """Host data a collective reads is sent to the device first (an unattributed copy)."""
        for t in tree_leaves(value):
            if not isinstance(t, torch.Tensor):
                continue
            send, producer, fetch = RESIDENCY.to_device(t, target)
            if (send or fetch) and profs:
                nbytes = tensor_bytes(t)
                ns = assumptions_of(self.graph).transfer_ns(nbytes, transfers=1)
                for p in profs:
                    p.note_transfer_out(None, ns, nbytes)
