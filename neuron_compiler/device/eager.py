"""Eager ops of ``neuron`` tensors: each op signature lowered once, by the backend's pipeline.

``run_op(func, args, kwargs)``:
1. The signature: the op overload, every tensor argument's shape, strides and dtype (and
   whether it is a device tensor or a CPU scalar tensor), every other argument's value, the
   device's target and fallback policy.
2. First call of a signature: ``make_fx`` traces the op over fake copies of the payloads into
   an ATen graph, with the backend's decomposition table (``backend.decomposition_table``:
   the graph holds the ops the lowering registry is keyed on), and
   ``backend.compile_aten_graph`` compiles it as the backend compiles any ATen graph
   (partition, device partitions lowered on their first call through the process-wide program
   cache, eager fallback nodes), named ``eager_<op>`` in reports, with every output kept on the
   device. The result is cached in ``_PROGRAMS``.
3. Every call runs that graph on the payloads: values from the simulator (functional mode), the
   simulated time, node counts and fallbacks in every open ``neuron_compiler.profile()``.

``run_on_cpu(func, args, kwargs, reason)``: an op that cannot be traced into an ATen graph of
tensors (data-dependent output shapes, non-tensor results, random generators, a mutating
variant): its device inputs are copied to the host, it runs eagerly, its tensor results (and
the arguments it wrote) are copied back; both copies are charged, the wall time is recorded as
a fallback of graph ``eager_<op>_cpu``.

Invariants
- An op the lowering does not take, wholly or partly, warns once per op
  (``NeuronDeviceFallbackWarning``, naming the op and the reason) under policy ``"allow"`` and
  raises ``NeuronDeviceFallbackError`` (naming the op and the reason) under ``"error"``; a
  signature whose compile raised is not cached.
- Outputs are fresh device tensors: an output that shares storage with an input's payload (a
  graph that only re-views its input) is cloned.
- A CPU tensor argument is allowed only as a 0-dim scalar (as CUDA allows); it is sent to the
  device as an input of the program. Any other CPU tensor is an error naming the op.
"""
from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from neuron_compiler.device.config import (NeuronDeviceFallbackError,
                                           NeuronDeviceFallbackWarning, eager_options)
from neuron_compiler.device.residency import RESIDENCY, tensor_bytes
from neuron_compiler.device.tensor import NeuronTensor, payload_of
from neuron_compiler.errors import NeuronFallbackError
from neuron_compiler.profile import (FallbackEntry, GraphRecord, active_profiles, graph_call,
                                     profile)


@dataclass
class _OpProgram:
    """One op signature: its compiled graph (``NeuronGraph``), or the reason it runs on the
    CPU."""

    op: str
    graph: Callable | None
    reason: str | None
    out_spec: TreeSpec | None = None
    checked: bool = False      # the first call was watched for fallbacks found at run time


_PROGRAMS: dict[tuple, _OpProgram] = {}
_WARNED: set[str] = set()


def program_count() -> int:
    """How many op signatures have been compiled for the device in this process."""
    return len(_PROGRAMS)


def _leaf_key(a: object) -> object:
    if isinstance(a, torch.Tensor):
        return ("T", tuple(a.shape), tuple(a.stride()), str(a.dtype),
                isinstance(a, NeuronTensor))
    if isinstance(a, float):
        return ("f", repr(a))
    if a is None or isinstance(a, (bool, int, str)):
        return (type(a).__name__, a)
    if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return ("o", str(a))
    return ("id", type(a).__name__, id(a))   # a generator, say: never the same signature


@lru_cache(maxsize=None)
def _decompositions(target: str) -> dict:
    from neuron_compiler.backend import decomposition_table
    return decomposition_table(target)


def _warn(op: str, rows: list[tuple[str, str]]) -> None:
    """Once per op: which of its ATen ops run on the CPU, and why."""
    if op in _WARNED:
        return
    _WARNED.add(op)
    detail = "; ".join(f"{o}: {r}" if o != op else r for o, r in rows)
    warnings.warn(f"neuron device: {op} runs on the CPU (copied over the host link): {detail}",
                  NeuronDeviceFallbackWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` of ``_warn``'s caller's first frame outside this package and torch
    (the user's line that called the op)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
            ("neuron_compiler.device", "torch")):
        frame, level = frame.f_back, level + 1
    return level


def _device_error(op: str, exc: NeuronFallbackError) -> NeuronDeviceFallbackError:
    return NeuronDeviceFallbackError(
        [(o, c, r if o == op else f"{r} (in {op})") for o, c, r in exc.entries])


def run_op(func: torch._ops.OpOverload, args: tuple, kwargs: dict,
           only: int | None = None) -> object:
    """Run ``func`` on the device (module docstring); returns device tensors. ``only``: just
    that output of a multi-output op (the others are not outputs of the program)."""
    op = str(func)
    flat, spec = tree_flatten((args, kwargs))
    inputs, positions = [], []
    for i, a in enumerate(flat):
        if isinstance(a, NeuronTensor):
            inputs.append(a.payload)
        elif isinstance(a, torch.Tensor):
            if a.dim() != 0:
                raise RuntimeError(
                    f"{op}: expected all tensors on the neuron device, but argument {i} is a "
                    f"{a.device.type} tensor of shape {tuple(a.shape)} (only 0-dim CPU tensors "
                    f"may be mixed with device tensors); move it with .to('neuron')")
            inputs.append(a.detach())
        else:
            continue
        positions.append(i)
    opts = eager_options()
    key = (func, opts.target, opts.fallback, only, repr(spec),
           tuple(_leaf_key(a) for a in flat))
    entry = _PROGRAMS.get(key)
    if entry is None:
        entry = _prepare(func, flat, spec, positions, inputs, only)
        _PROGRAMS[key] = entry
    if entry.graph is None:
        out = run_on_cpu(func, args, kwargs, entry.reason or "")
        return out if only is None else out[only]
    try:
        if entry.checked:
            outs = entry.graph(*inputs)
        else:
            with profile() as probe:
                outs = entry.graph(*inputs)
            entry.checked = True
            rows = [(f["op"], f["reason"]) for f in probe.to_dict()["fallbacks"]]
            if rows:
                _warn(op, rows)
    except NeuronFallbackError as exc:          # policy "error", refused at the first call
        del _PROGRAMS[key]
        raise _device_error(op, exc) from exc
    outs = _fresh(list(outs), inputs)
    return tree_unflatten([NeuronTensor(o) for o in outs], entry.out_spec)


def _prepare(func: torch._ops.OpOverload, flat: list, spec: TreeSpec, positions: list[int],
             inputs: list[torch.Tensor], only: int | None) -> _OpProgram:
    """Trace and compile one op signature (module docstring, step 2)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compiler.backend import compile_aten_graph
    op = str(func)
    opts = eager_options()
    leaves = [payload_of(a) for a in flat]
    out_spec: list[TreeSpec] = []

    def one_op(*tensors: torch.Tensor) -> tuple:
        vals = list(leaves)
        for i, t in zip(positions, tensors):
            vals[i] = t
        a, k = tree_unflatten(vals, spec)
        out = func(*a, **k)
        outs, ospec = tree_flatten(out if only is None else out[only])
        out_spec.append(ospec)
        return tuple(outs)

    if any(isinstance(a, torch.Generator) for a in flat):
        return _OpProgram(op, None, "an explicit random generator is not lowered")
    try:
        gm = make_fx(one_op, decomposition_table=_decompositions(opts.target),
                     tracing_mode="fake")(*inputs)
    except Exception as exc:   # no fake/meta kernel, data-dependent output shape, ...
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return _OpProgram(op, None, f"cannot be traced into an ATen graph "
                                    f"({type(exc).__name__}: {first})")
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = out_node.args[0]
    if any(not isinstance(getattr(r, "meta", {}).get("val"), torch.Tensor) for r in results):
        return _OpProgram(op, None, "returns a value that is not a tensor")
    name = "eager_" + op.replace("aten.", "").replace(".", "_")
    try:
        graph = compile_aten_graph(gm, "inference", opts, name=name, device_outputs=True)
    except NeuronFallbackError as exc:          # policy "error", refused by the partitioner
        raise _device_error(op, exc) from exc
    return _OpProgram(op, graph, None, out_spec[0])


def _fresh(outs: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``outs`` with every tensor sharing storage with an input cloned (module docstring)."""
    used = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    fresh = []
    for o in outs:
        if o.numel() and o.untyped_storage().data_ptr() in used:
            o = o.clone()
            RESIDENCY.own(o)
        fresh.append(o)
    return fresh


# ---- ops that run on the CPU -------------------------------------------------------------------
@lru_cache(maxsize=None)
def _cpu_record(op: str, reason: str, target: str) -> GraphRecord:
    from neuron_compiler.assumptions import host_assumptions
    return GraphRecord(name=f"eager_{op.replace('aten.', '').replace('.', '_')}_cpu",
                       kind="eager", target=target, device_nodes=0, fallback_nodes=1,
                       fallbacks=(FallbackEntry(op, 1, reason),), partitions=(),
                       assumptions=host_assumptions(eager_options()))


def _charge(record: GraphRecord, tensors: list[torch.Tensor], profs: tuple) -> None:
    """One copy over the host link per tensor (either way), unattributed to a partition."""
    from neuron_compiler.assumptions import assumptions_of
    for t in tensors:
        nbytes = tensor_bytes(t)
        ns = assumptions_of(record).transfer_ns(nbytes, transfers=1)
        for p in profs:
            p.note_transfer_out(None, ns, nbytes)


def run_on_cpu(func: torch._ops.OpOverload, args: tuple, kwargs: dict, reason: str) -> object:
    """Run ``func`` eagerly on the host (module docstring); raises under policy ``"error"``."""
    op = str(func)
    opts = eager_options()
    if opts.fallback == "error":
        raise NeuronDeviceFallbackError([(op, 1, reason)])
    _warn(op, [(op, reason)])
    flat, spec = tree_flatten((args, kwargs))
    devs = [a for a in flat if isinstance(a, NeuronTensor)]
    by_payload = {id(a.payload): a for a in devs}
    record = _cpu_record(op, reason, opts.target)
    with graph_call(record):
        profs = active_profiles()
        _charge(record, [a.payload for a in devs], profs)
        a, k = tree_unflatten([payload_of(x) for x in flat], spec)
        t0 = time.perf_counter_ns()
        out = func(*a, **k)
        dt = time.perf_counter_ns() - t0
        for p in profs:
            p.note_fallback_time(record, op, reason, dt)
        given = [args[i] if i < len(args) else kwargs.get(s.name)
                 for i, s in enumerate(func._schema.arguments)]
        written = [v.payload for v, s in zip(given, func._schema.arguments)
                   if s.alias_info is not None and s.alias_info.is_write
                   and isinstance(v, NeuronTensor)]
        outs, ospec = tree_flatten(out)
        fresh = [o for o in outs if isinstance(o, torch.Tensor) and id(o) not in by_payload]
        _charge(record, written + fresh, profs)
    for dev in devs:
        if tuple(dev.payload.shape) != tuple(dev.shape):
            raise RuntimeError(f"{op} resized a neuron device tensor in place (from "
                               f"{tuple(dev.shape)} to {tuple(dev.payload.shape)}): not "
                               f"supported; call the op without out=")

    def back(o: object) -> object:          # an argument written in place is returned as itself
        if not isinstance(o, torch.Tensor):
            return o
        return by_payload[id(o)] if id(o) in by_payload else NeuronTensor(o)

    return tree_unflatten([back(o) for o in outs], ospec)
