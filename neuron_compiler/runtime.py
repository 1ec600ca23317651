"""Run a partitioned ATen graph: device partitions on the simulator, the rest in eager PyTorch.

- ``DevicePartition`` replaces each fused submodule. Per input signature (tensor shapes and
  dtypes, values of SymInt inputs) it specialises the partition on concrete shapes, lowers it
  once with ``lowering.api.compile_graph`` and caches the result. ``sim_mode="functional"``:
  output values come from the simulator; ``"timing"``: from running the partition eagerly, while
  the (data-independent, cached) simulated timing is recorded.
- ``FallbackOp`` replaces each eager fallback node and measures its host wall time.
- ``NeuronGraph`` is the callable handed back to AOTAutograd; on every call it tells the open
  profiles which compiled graph ran (they de-duplicate).

Invariants
- Inputs reach the simulator as C-contiguous numpy copies (bf16/fp8 via ``ml_dtypes``); outputs
  come back as fresh torch tensors with the graph's dtype, shape and (when dense) strides.
- A partition whose lowering raised ``Unsupported`` for a signature runs eagerly for that
  signature (each node timed as a fallback), the reason recorded; under ``fallback="error"`` the
  first call raises instead. Any other exception from the lowering propagates (a bug).
- Host<->device transfer time = ``runtime_sim.costs.host_transfer_ns``: one DMA fixed latency
  per tensor plus (input + output bytes) / ``target.host_link_bytes_per_ns``, an
  ASSUMED host-link figure (see ``runtime_sim.targets``), charged on every partition call.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from neuron_compiler.errors import NeuronFallbackError
from runtime_sim.costs import host_transfer_ns
from runtime_sim.targets import get_target
from neuron_compiler.options import NeuronOptions
from neuron_compiler.partition import is_compute_node, lowering_api, op_name
from neuron_compiler.profile import (FallbackEntry, GraphRecord, PartitionFailure,
                                     active_profiles)

Signature = tuple

_BITCAST: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
}


# ---- torch <-> numpy ---------------------------------------------------------------------------
def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy copy of ``t`` (bf16/fp8 as ``ml_dtypes`` arrays)."""
    t = t.detach().resolve_conj().resolve_neg().cpu().contiguous()
    if t.dtype in _BITCAST:
        carrier, npdt = _BITCAST[t.dtype]
        return np.array(t.view(carrier).numpy().view(npdt), copy=True, order="C")
    return np.array(t.numpy(), copy=True, order="C")


def from_numpy(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``like``'s shape, dtype and (if dense) strides holding ``a``'s values."""
    a = np.ascontiguousarray(a)
    if like.dtype in _BITCAST:
        carrier, npdt = _BITCAST[like.dtype]
        if a.dtype != npdt:
            a = a.astype(npdt)
        t = torch.from_numpy(a.view(np.dtype(str(carrier).removeprefix("torch.")))).view(
            like.dtype)
    else:
        t = torch.from_numpy(a)
        if t.dtype != like.dtype:
            t = t.to(like.dtype)
    shape = tuple(int(s) for s in like.shape)
    if tuple(t.shape) != shape:
        if t.numel() != like.numel():
            raise RuntimeError(f"device output has {t.numel()} elements {tuple(t.shape)}, "
                               f"expected shape {shape}")
        t = t.reshape(shape)
    strides = tuple(int(s) for s in like.stride())
    if t.stride() != strides and _is_dense_permutation(shape, strides):
        t = torch.empty_strided(shape, strides, dtype=t.dtype).copy_(t)
    return t


def _is_dense_permutation(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when ``strides`` lay ``shape`` out densely, without overlap, in some dim order."""
    expected = 1
    for size, stride in sorted(zip(shape, strides), key=lambda d: (d[1], d[0])):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def signature(args: tuple) -> Signature:
    """What a compiled program is specialised on: tensor shapes/dtypes and SymInt values."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append(("T", tuple(int(s) for s in a.shape), str(a.dtype).removeprefix("torch.")))
        elif isinstance(a, (int, float, bool, torch.SymInt)):
            sig.append(("S", int(a) if isinstance(a, (torch.SymInt, int)) else a))
        else:
            sig.append(("O", type(a).__name__))
    return tuple(sig)


def describe_signature(sig: Signature) -> str:
    parts = []
    for kind, *rest in sig:
        parts.append(f"{rest[1]}{list(rest[0])}" if kind == "T" else f"{rest[0]!r}")
    return "(" + ", ".join(parts) + ")"


# ---- graph surgery -----------------------------------------------------------------------------
def clone_graph_module(gm: GraphModule) -> GraphModule:
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return GraphModule(gm, g)


def _needs_specialisation(gm: GraphModule, args: tuple) -> bool:
    if any(not isinstance(a, torch.Tensor) for a in args):
        return True
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        for v in vals:
            if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape):
                return True
            if v is None and n.op not in ("output",):
                return True
    return False


def specialise(gm: GraphModule, args: tuple) -> GraphModule:
    """``gm`` with SymInt inputs replaced by their values and ``meta['val']`` re-propagated on
    concrete shapes (``gm`` itself when it is already static)."""
    if not _needs_specialisation(gm, args):
        return gm
    new = clone_graph_module(gm)
    placeholders = [n for n in new.graph.nodes if n.op == "placeholder"]
    tensors = []
    for ph, a in zip(placeholders, args):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            continue
        value = int(a) if isinstance(a, (torch.SymInt, int)) else a
        for user in list(ph.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n, ph=ph, v=value:
                                              v if n is ph else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, ph=ph, v=value:
                                                v if n is ph else n)
        new.graph.erase_node(ph)
    new.recompile()
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # get_attr constants stay real
    fakes = [mode.from_tensor(t.detach()) for t in tensors]
    FakeTensorProp(new, mode).propagate(*fakes)
    return new


class FallbackOp(torch.nn.Module):
    """One eager fallback node; measures its wall time into the open profiles."""

    def __init__(self, op: object, name: str, reason: str, graph: GraphRecord):
        super().__init__()
        self.op, self.op_name, self.reason, self.graph = op, name, reason, graph

    def forward(self, *args: object, **kwargs: object) -> object:
        profs = active_profiles()
        if not profs:
            return self.op(*args, **kwargs)
        t0 = time.perf_counter_ns()
        out = self.op(*args, **kwargs)
        dt = time.perf_counter_ns() - t0
        for p in profs:
            p.note_fallback_time(self.graph, self.op_name, self.reason, dt)
        return out


def wrap_fallback_nodes(gm: GraphModule, reasons: dict[str, str], graph: GraphRecord,
                        default_reason: str) -> GraphModule:
    """Replace every compute ``call_function`` node of ``gm`` with a timed ``FallbackOp``."""
    for i, node in enumerate(list(gm.graph.nodes)):
        if not is_compute_node(node):
            continue
        name = f"eager_{i}_{node.name}"
        gm.add_submodule(name, FallbackOp(node.target, op_name(node),
                                          reasons.get(node.name, default_reason), graph))
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


# ---- device partitions -------------------------------------------------------------------------
@dataclass
class _Compiled:
    """One specialisation of a partition: a lowered program, or the reason it could not be."""

    signature: Signature
    compiled: object | None = None          # lowering CompiledGraph
    out_meta: list[torch.Tensor] = field(default_factory=list)
    transfer_ns: float = 0.0
    failure: PartitionFailure | None = None
    eager: GraphModule | None = None
    stats_dumped: bool = False


class DevicePartition(torch.nn.Module):
    """Stands in for one fused submodule; see the module docstring."""

    def __init__(self, sub: GraphModule, name: str, graph: GraphRecord, options: NeuronOptions,
                 dump: object | None, ops: Counter):
        super().__init__()
        self.sub, self.name, self.graph, self.options, self.dump = sub, name, graph, options, dump
        self.ops = ops
        self.target = get_target(options.target)
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        self.returns_tuple = isinstance(out, (tuple, list))
        self._cache: dict[Signature, _Compiled] = {}

    def forward(self, *args: object) -> object:
        sig = signature(args)
        entry = self._cache.get(sig)
        if entry is None:
            entry = self._compile(sig, args)
            self._cache[sig] = entry
        profs = active_profiles()
        if entry.failure is not None:
            for p in profs:
                p.note_failure(entry.failure)
            assert entry.eager is not None
            return entry.eager(*args)
        compiled = entry.compiled
        if self.options.sim_mode == "timing":
            out = self.sub(*args)
            _, result = compiled.run(None, mode="timing")  # type: ignore[union-attr]
        else:
            tensors = [to_numpy(a) for a in args if isinstance(a, torch.Tensor)]
            outs_np, result = compiled.run(tensors, mode="functional")  # type: ignore[union-attr]
            if len(outs_np) != len(entry.out_meta):
                raise RuntimeError(f"{self.graph.name}/{self.name}: program returned "
                                   f"{len(outs_np)} outputs, graph has {len(entry.out_meta)}")
            outs = [from_numpy(a, m) for a, m in zip(outs_np, entry.out_meta)]
            out = tuple(outs) if self.returns_tuple else outs[0]
        if self.dump is not None and not entry.stats_dumped:
            entry.stats_dumped = True
            self.dump.write_partition_stats(self.name, sig, result.stats)  # type: ignore
        shapes = [list(s[1]) for s in sig if s[0] == "T"]
        for p in profs:
            p.note_partition_call(self.graph, self.name, sig, shapes, compiled, result,
                                  entry.transfer_ns)
        return out

    def _compile(self, sig: Signature, args: tuple) -> _Compiled:
        api = lowering_api()
        t0 = time.perf_counter()
        gm = specialise(self.sub, args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        specs = [api.TensorSpec(tuple(int(s) for s in t.shape), t.dtype) for t in tensors]
        out_node = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        out_nodes = list(out_node) if isinstance(out_node, (tuple, list)) else [out_node]
        out_meta = [n.meta["val"] for n in out_nodes]
        writer = (self.dump.partition_writer(self.name, sig, gm)  # type: ignore[union-attr]
                  if self.dump is not None else None)
        entry = _Compiled(sig, out_meta=out_meta)
        try:
            entry.compiled = api.compile_graph(gm, specs, self.options.target, dump=writer,
                                                     name=self.name)
        except api.Unsupported as exc:
            if writer is not None:
                writer("unsupported.txt", f"{exc}\n")
            entries = self._failure_entries(exc, sig)
            if self.options.fallback == "error":
                raise NeuronFallbackError([(e.op, e.count, e.reason) for e in entries]) from exc
            entry.failure = PartitionFailure(self.graph, self.name, entries)
            reasons = {n.name: self._node_reason(n, exc, sig) for n in self.sub.graph.nodes
                       if is_compute_node(n)}
            entry.eager = wrap_fallback_nodes(clone_graph_module(self.sub), reasons, self.graph,
                                              str(exc))
        if entry.compiled is not None:
            if self.dump is not None:
                self.dump.write_compiled(self.name, sig, entry.compiled)  # type: ignore
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            nbytes += sum(m.numel() * m.element_size() for m in out_meta)
            entry.transfer_ns = host_transfer_ns(nbytes, self.target,
                                                 transfers=len(tensors) + len(out_meta))
        dt = time.perf_counter() - t0
        for p in active_profiles():
            p.note_compile(dt)
        return entry


    def _node_reason(self, node: Node, exc: Exception, sig: Signature) -> str:
        if op_name(node) == str(getattr(exc, "op", "")):
            return str(exc)
        return f"in device partition {self.name}, which could not be lowered: {exc}"

    def _failure_entries(self, exc: Exception, sig: Signature) -> tuple[FallbackEntry, ...]:
        counts: Counter = Counter((op_name(n), self._node_reason(n, exc, sig))
                                  for n in self.sub.graph.nodes if is_compute_node(n))
        return tuple(FallbackEntry(op, c, r) for (op, r), c in sorted(counts.items()))


class NeuronGraph:
    """The compiled ATen graph: the outer GraphModule plus its compile-time record."""

    def __init__(self, gm: GraphModule, record: GraphRecord):
        self.gm, self.record = gm, record

    def __call__(self, *args: object) -> object:
        for p in active_profiles():
            p.note_graph_call(self.record)
        return self.gm(*args)
