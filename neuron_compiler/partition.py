"""Split an ATen graph into device partitions and eager fallback nodes.

The lowering registry decides (``lowering.api.why_unsupported``); ``CapabilityBasedPartitioner``
fuses connected supported regions into submodules ``fused_0``, ``fused_1``, ... (single-node
partitions allowed: every supported node runs on the device). Everything else stays in the outer
graph and runs in eager PyTorch.

What is counted ("ATen compute nodes")
- A ``call_function`` node whose target is an ATen/prims ``OpOverload`` (or a higher-order op)
  and that produces at least one tensor. Views (view, permute, expand, ...) count: they are ATen
  ops that must run somewhere.
- Not counted: placeholders, outputs, ``get_attr``, ``operator.getitem`` (it only unpacks a
  multi-output node; it follows its producer), shape queries (``aten.sym_size`` & co.) and
  Python arithmetic on SymInts. Those never go into a device partition and are never asked
  about: they run on the host as part of the outer graph at no recorded cost.

Collectives (``neuron_compiler.collectives``): a ``_c10d_functional`` collective or wait node is a
device operation that the lowering does not compile: it stays in the outer graph (run by
torch.distributed, timed by the collective model), is counted as a device node and listed in
``PartitionPlan.collectives``, never as a fallback.

NKI ops (``neuron_compiler.nki.op``): a node of an op registered by ``nki_op`` (or the
``auto_functionalized`` node of a mutating one) is a device operation of its own, as a
collective is: it stays in the outer graph (``NkiOpCall`` runs its kernels on the simulator and
records them as partitions of the graph), is counted as a device node and listed in
``PartitionPlan.nki_ops``, never as a fallback. (Not yet spliced into a neighbouring
partition's program.)

Invariants
- Every node that ``why_unsupported`` accepted ends up in a device partition; every counted
  node outside the partitions has a reason in ``PartitionPlan.fallbacks``.
- ``device_nodes + fallback_nodes`` equals the number of counted nodes of the input graph;
  ``device_nodes`` includes the collective and NKI op nodes.
"""
from __future__ import annotations

import importlib
import logging
import operator
import sys
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from neuron_compiler.collectives import collective_kind
from neuron_compiler.profile import FallbackEntry

DEVICE_PREFIX = "fused_"
NOT_PARTITIONED = "supported by the lowering, but left outside every device partition"
COLLECTIVE = "a collective: run by torch.distributed, timed by the collective model"
NKI_OP = "an nki_op: its NKI kernels run on the simulator as programs of their own"

_aten = torch.ops.aten
SHAPE_QUERY_OPS = frozenset({
    _aten.sym_size.int, _aten.sym_stride.int, _aten.sym_numel.default,
    _aten.sym_storage_offset.default,
})


def lowering_api() -> ModuleType:
    """The lowering's public face, imported lazily (so ``import neuron_compiler`` stays light)."""
    return importlib.import_module("lowering.api")


def op_name(node: Node) -> str:
    """How an op is named in reports: ``aten.add.Tensor`` (as in the printed graph)."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    return getattr(t, "__name__", str(t))


def is_nki_op_node(node: Node) -> bool:
    """True for a node of an op registered by ``neuron_compiler.nki.nki_op`` (no such op can
    exist unless ``neuron_compiler.nki.op`` was imported, so nothing is imported here)."""
    mod = sys.modules.get("neuron_compiler.nki.op")
    return (mod is not None and node.op == "call_function"
            and mod.is_nki_op(node.target, tuple(node.args)))


def _has_tensor(val: object) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, (tuple, list)):
        return any(_has_tensor(v) for v in val)
    return False


def is_compute_node(node: Node) -> bool:
    """True for the nodes counted as ATen compute nodes (see the module docstring)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if node.target in SHAPE_QUERY_OPS:
        return False
    if "val" in node.meta:
        return _has_tensor(node.meta["val"])
    return isinstance(node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))


class NeuronOperatorSupport(OperatorSupport):
    """Asks the lowering registry about each compute node once and remembers the reason."""

    def __init__(self) -> None:
        super().__init__()
        self._why = lowering_api().why_unsupported
        self._unsupported_exc = lowering_api().Unsupported
        self.reasons: dict[Node, str | None] = {}

    def reason(self, node: Node) -> str | None:
        """None if ``node`` can run on the device, else why not."""
        if node in self.reasons:
            return self.reasons[node]
        if node.op == "call_function" and node.target is operator.getitem:
            src = node.args[0]
            r = self.reason(src) if isinstance(src, Node) else "getitem of a non-node"
        elif collective_kind(node) is not None:
            r = COLLECTIVE
        elif is_nki_op_node(node):
            r = NKI_OP
        elif not is_compute_node(node):
            r = "not an ATen compute node (runs on the host)"
        else:
            try:
                r = self._why(node)
            except self._unsupported_exc as exc:  # a lowering may raise instead of returning
                r = str(exc)
        self.reasons[node] = r
        return r

    def is_node_supported(self, submodules: dict, node: Node) -> bool:
        return node.op == "call_function" and self.reason(node) is None


@dataclass
class PartitionPlan:
    """The outer graph after fusion, and the accounting of where each compute node runs."""

    gm: GraphModule                         # outer graph; device partitions are submodules
    device_partitions: tuple[str, ...]      # submodule names, in graph order
    partition_ops: dict[str, Counter]       # per device partition: op -> compute-node count
    device_nodes: int
    fallback_nodes: int
    fallbacks: tuple[FallbackEntry, ...]
    node_reasons: dict[str, str]            # outer-graph fallback node name -> reason
    collectives: dict[str, str] = field(default_factory=dict)  # node name -> op (collective, wait)
    nki_ops: dict[str, str] = field(default_factory=dict)      # node name -> op (nki_op)


def partition_graph(gm: GraphModule) -> PartitionPlan:
    """Fuse the device-supported regions of ``gm`` (modified in place) into submodules."""
    support = NeuronOperatorSupport()
    n_compute = sum(1 for n in gm.graph.nodes if is_compute_node(n))
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    # Drop partitions without a compute node (e.g. only getitems): nothing to run on the device.
    partitions = [p for p in partitions if any(is_compute_node(n) for n in p.nodes)]
    reasons_by_name = {n.name: r for n, r in support.reasons.items() if r is not None}
    fused = partitioner.fuse_partitions(partitions, prefix=DEVICE_PREFIX)

    device: list[str] = []
    partition_ops: dict[str, Counter] = {}
    fallback_count: Counter = Counter()
    node_reasons: dict[str, str] = {}
    collectives: dict[str, str] = {}
    nki_ops: dict[str, str] = {}
    for node in fused.graph.nodes:
        if collective_kind(node) is not None:
            collectives[node.name] = op_name(node)
        elif is_nki_op_node(node):
            nki_ops[node.name] = sys.modules["neuron_compiler.nki.op"].nki_op_name(
                node.target, tuple(node.args))
        elif node.op == "call_module" and str(node.target).startswith(DEVICE_PREFIX):
            sub = getattr(fused, str(node.target))
            device.append(str(node.target))
            partition_ops[str(node.target)] = Counter(
                op_name(n) for n in sub.graph.nodes if is_compute_node(n))
        elif is_compute_node(node):
            reason = reasons_by_name.get(node.name, NOT_PARTITIONED)
            node_reasons[node.name] = reason
            fallback_count[(op_name(node), reason)] += 1
    device_nodes = (sum(sum(c.values()) for c in partition_ops.values()) + len(collectives)
                    + len(nki_ops))
    fallback_nodes = sum(fallback_count.values())
    if device_nodes + fallback_nodes != n_compute:
        raise AssertionError(
            f"partitioning lost compute nodes: {device_nodes} device + {fallback_nodes} "
            f"fallback != {n_compute} in the input graph")
    fallbacks = tuple(FallbackEntry(op, c, r) for (op, r), c in
                      sorted(fallback_count.items(), key=lambda kv: (-kv[1], kv[0])))
    return PartitionPlan(fused, tuple(device), partition_ops, device_nodes, fallback_nodes,
                         fallbacks, node_reasons, collectives, nki_ops)


def plan_table(plan: PartitionPlan) -> dict:
    """The plan as JSON-able data: node counts, the fallback table and each partition's ops
    (written to ``compile.json`` and to the ``neuron_compiler_graph`` tlparse artifact)."""
    return {
        "device_nodes": plan.device_nodes, "fallback_nodes": plan.fallback_nodes,
        "fallbacks": [{"op": e.op, "count": e.count, "reason": e.reason} for e in plan.fallbacks],
        "partitions": {p: dict(sorted(plan.partition_ops[p].items()))
                       for p in plan.device_partitions},
        "collectives": dict(plan.collectives),
        "nki_ops": dict(plan.nki_ops),
    }


def log_plan(name: str, target: str, plan: PartitionPlan) -> None:
    """Log the partitioning decisions of graph ``name`` (see ``neuron_compiler.logs``)."""
    from neuron_compiler.logs import artifact, log
    log.info("%s (target %s): %d device partition(s), %d device nodes, %d fallback nodes",
             name, target, len(plan.device_partitions), plan.device_nodes, plan.fallback_nodes)
    for e in plan.fallbacks:
        log.info("%s: fallback %s x%d: %s", name, e.op, e.count, e.reason)
    if log.isEnabledFor(logging.DEBUG):
        for p in plan.device_partitions:
            ops = ", ".join(f"{op} x{c}" for op, c in sorted(plan.partition_ops[p].items()))
            log.debug("%s/%s: %s", name, p, ops)
        for node, reason in plan.node_reasons.items():
            log.debug("%s: fallback node %s: %s", name, node, reason)
    artifact("neuron_compiler_graph", lambda: {"name": name, "target": target, **plan_table(plan)})


def format_plan(plan: PartitionPlan, title: str = "") -> str:
    """The readable ``partitions.txt``: device partitions with their ops, then the fallbacks."""
    lines = [title] if title else []
    total = plan.device_nodes + plan.fallback_nodes
    lines.append(f"ATen compute nodes: {total}  device: {plan.device_nodes}  "
                 f"fallback: {plan.fallback_nodes}")
    lines.append("")
    lines.append(f"device partitions ({len(plan.device_partitions)}):")
    for name in plan.device_partitions:
        ops = plan.partition_ops[name]
        lines.append(f"  {name}: {sum(ops.values())} nodes")
        for op, c in sorted(ops.items()):
            lines.append(f"    {op} x{c}")
    if plan.collectives:
        lines.append("")
        lines.append(f"collectives ({len(plan.collectives)} nodes, torch.distributed, timed by "
                     f"the collective model):")
        lines += [f"  {name}: {op}" for name, op in plan.collectives.items()]
    if plan.nki_ops:
        lines.append("")
        lines.append(f"nki ops ({len(plan.nki_ops)} nodes, NKI kernels on the simulator):")
        lines += [f"  {name}: {op}" for name, op in plan.nki_ops.items()]
    lines.append("")
    lines.append(f"fallback ops ({plan.fallback_nodes} nodes, eager PyTorch):")
    for e in plan.fallbacks:
        lines.append(f"  {e.op} x{e.count}: {e.reason}")
    lines.append("")
    lines.append("fallback nodes:")
    for name, reason in plan.node_reasons.items():
        lines.append(f"  {name}: {reason}")
    return "\n".join(lines) + "\n"


class _AllBut(OperatorSupport):
    """Every node of a device partition except ``bad`` (and the getitems of those)."""

    def __init__(self, bad: frozenset[str]) -> None:
        super().__init__()
        self.bad = bad

    def is_node_supported(self, submodules: dict, node: Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            return node.args[0].name not in self.bad
        return node.name not in self.bad


def split_out(gm: GraphModule, bad: frozenset[str], prefix: str) -> tuple[GraphModule, dict[str, Counter]]:
    """``gm`` (a device partition's graph, modified in place) with the nodes named in ``bad``
    left in the outer graph and every connected region of the others fused into a submodule
    ``<prefix><i>``: (the graph, per submodule its op counts). The nodes' order and data flow
    are kept (the partitioner never fuses across a left-out node into a cycle)."""
    partitioner = CapabilityBasedPartitioner(gm, _AllBut(bad), allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions()
                  if any(is_compute_node(n) for n in p.nodes)]
    fused = partitioner.fuse_partitions(partitions, prefix=prefix)
    parts = {str(n.target): Counter(op_name(x) for x in getattr(fused, str(n.target)).graph.nodes
                                    if is_compute_node(x))
             for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith(prefix)}
    return fused, parts
