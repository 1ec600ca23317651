"""The Dynamo backends ``neuron`` and ``neuron_sim`` (entry points; no import needed).

    torch.compile(model, backend="neuron", options={"target": "trn3"})

Path of a graph: Dynamo FX graph -> ``aot_autograd`` with the lowering's decomposition table
(``decomposition_table``: core ATen's, adjusted by ``lowering.policy`` for the target) ->
forward / backward / inference ATen graphs -> ``compile_aten_graph``: the ``auto_cast`` pass
(when asked), partition (device regions vs eager fallback), optional dump, wrap -> boxed
callable.

Invariants
- Options are validated here, once per Dynamo graph, before anything else happens (``options=``
  reaches the backend only when the user sets it; ``aot_autograd`` would drop it, so it is bound
  into the compilers before ``aot_autograd`` is built).
- The compilers return boxed callables (``make_boxed_func``), as AOTAutograd requires.
- ``fallback="error"`` raises ``NeuronFallbackError`` from the compiler, naming every op that
  cannot run on the device with its reason (after the dump, so it can be inspected).
"""
from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence

import torch
from torch.fx import GraphModule

from neuron_compiler.errors import NeuronFallbackError, NeuronOptionError
from neuron_compiler.options import DEFAULT_TARGET, NeuronOptions
from neuron_compiler.profile import GraphRecord

OUR_ENTRY_POINT_PREFIX = "neuron_compiler."


def decomposition_table(target: str = DEFAULT_TARGET) -> dict:
    """The table AOTAutograd traces with for ``target``: the lowering's decomposition policy
    (``lowering.policy``, reached through ``lowering.api``; imported at the first compile)."""
    from neuron_compiler.partition import lowering_api
    return lowering_api().decomposition_table(target)


def _warn_if_shadowed() -> None:
    """AWS's torch-neuronx also registers a backend named ``neuron``: say so if it is here."""
    others: list[str] = []
    try:
        from importlib.metadata import entry_points
        for ep in entry_points(group="torch_dynamo_backends"):
            if ep.name == "neuron" and not ep.value.startswith(OUR_ENTRY_POINT_PREFIX):
                others.append(f"entry point {ep.value}")
    except Exception:  # a broken distribution must not break compilation
        pass
    from torch._dynamo.backends import registry
    fn = registry._COMPILER_FNS.get("neuron")
    if fn is not None and getattr(fn, "__module__", "") != __name__:
        others.append(f"registered function {getattr(fn, '__module__', '?')}."
                      f"{getattr(fn, '__qualname__', fn)}")
    if others:
        warnings.warn(
            "another torch.compile backend named 'neuron' is installed (" + "; ".join(others)
            + "), probably AWS torch-neuronx; backend='neuron' may resolve to it. Use "
            "backend='neuron_sim' to select this simulator backend unambiguously.",
            stacklevel=3)


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                   options: dict | None = None, mode: str | None = None,
                   **unexpected: object) -> Callable:
    """Dynamo backend: compile ``gm`` for a simulated Trainium NeuronCore."""
    if unexpected:
        raise NeuronOptionError(
            f"the neuron backend takes options=... (keys: "
            f"{', '.join(NeuronOptions.valid_keys())}); got unexpected keyword argument(s) "
            f"{sorted(unexpected)}")
    opts = NeuronOptions.from_user(options)
    if mode not in (None, "default"):
        warnings.warn(f"torch.compile mode={mode!r} has no effect on the neuron backend",
                      stacklevel=2)
    _warn_if_shadowed()
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable:
        def compile_fn(aten_gm: GraphModule, aten_inputs: Sequence[object]) -> Callable:
            if kind == "inference":
                _mark_mutated_inputs(aten_gm)
            runner = compile_aten_graph(aten_gm, kind, opts)
            return make_boxed_func(runner)
        return compile_fn

    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           inference_compiler=compiler("inference"),
                           decompositions=decomposition_table(opts.target))
    return backend(gm, example_inputs)


MUTATED = "neuron_mutated_input"


def _mark_mutated_inputs(gm: GraphModule) -> None:
    """Flag (``node.meta[MUTATED]``) the placeholders of an inference graph whose data the
    caller overwrites with one of the graph's outputs: AOTAutograd's input mutations (its
    runtime wrapper copies the updated value back; ``fw_metadata.input_info[i].mutates_data``).
    Nothing is flagged when the metadata is missing or does not match the placeholders one to
    one (then no output is ever computed in an input's buffer: the safe side)."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    info = getattr(getattr(ctx, "fw_metadata", None), "input_info", None)
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not info or len(info) != len(places):
        return
    for node, inp in zip(places, info):
        if getattr(inp, "mutates_data", False) and not getattr(inp, "mutates_metadata", False):
            node.meta[MUTATED] = True


def mutated_partition_inputs(outer: GraphModule, pname: str) -> tuple[bool, ...]:
    """Per input of partition ``pname``: a mutated graph input (``_mark_mutated_inputs``)
    whose only reader is this partition, so its old value is dead once the partition runs."""
    call = next(n for n in outer.graph.nodes if n.op == "call_module" and n.target == pname)
    return tuple(isinstance(a, torch.fx.Node) and a.op == "placeholder"
                 and bool(a.meta.get(MUTATED)) and len(a.users) == 1 for a in call.args)


def neuron_sim_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                       options: dict | None = None, mode: str | None = None,
                       **unexpected: object) -> Callable:
    """The same backend under the unambiguous name ``neuron_sim``."""
    return neuron_backend(gm, example_inputs, options=options, mode=mode, **unexpected)


def _factories_on_host(gm: GraphModule) -> None:
    """``device=neuron`` arguments (a factory traced over ``neuron`` device tensors, e.g.
    ``torch.arange(n, device=x.device)``) become ``device=cpu``: a compiled graph computes on
    the payloads of device tensors, which are CPU tensors (``neuron_compiler.device``)."""
    changed = False
    for node in gm.graph.nodes:
        dev = node.kwargs.get("device") if node.op == "call_function" else None
        if isinstance(dev, torch.device) and dev.type == "neuron":
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
            changed = True
    if changed:
        gm.recompile()


def compile_aten_graph(gm: GraphModule, kind: str, opts: NeuronOptions, name: str | None = None,
                       device_outputs: bool = False) -> Callable:
    """Partition one ATen graph and return the callable that runs it (device + fallback).
    ``name`` prefixes the graph's name in reports (default: ``kind``); ``device_outputs``: every
    output stays on the ``neuron`` device (an eager op of device tensors,
    ``neuron_compiler.device``), see ``runtime.NeuronGraph``."""
    from neuron_compiler.assumptions import host_assumptions
    from neuron_compiler.dump import CompileDump, readable
    from neuron_compiler.fold import fold_constants
    from neuron_compiler.partition import format_plan, log_plan, partition_graph, plan_table
    from neuron_compiler.runtime import DevicePartition, NeuronGraph, wrap_fallback_nodes

    _factories_on_host(gm)
    original_code = readable(gm)
    folded = fold_constants(gm)
    name = f"{name or kind}_{hashlib.sha1(original_code.encode()).hexdigest()[:8]}"
    dump = CompileDump.create(opts.dump_dir, name) if opts.dump_dir else None
    if dump is not None:
        dump.write("fx_graph_readable.py", original_code)
        if folded:
            dump.write("fx_graph_folded.py", readable(gm))
    if opts.auto_cast != "none":
        from neuron_compiler.autocast import apply_auto_cast
        apply_auto_cast(gm, opts.auto_cast)
        if dump is not None:
            dump.write("fx_graph_auto_cast.py", readable(gm))
    plan = partition_graph(gm)
    log_plan(name, opts.target, plan)
    record = GraphRecord(name=name, kind=kind, target=opts.target,
                         device_nodes=plan.device_nodes, fallback_nodes=plan.fallback_nodes,
                         fallbacks=plan.fallbacks, partitions=plan.device_partitions,
                         dump_dir=dump.path if dump is not None else None,
                         assumptions=host_assumptions(opts), lnc=opts.lnc)
    if dump is not None:
        dump.write("fx_graph_partitioned.py", readable(plan.gm))
        dump.write("partitions.txt", format_plan(plan, title=f"{name} (target {opts.target})"))
        dump.write_json("compile.json", {
            "name": name, "kind": kind, "target": opts.target, "options": opts.to_dict(),
            **plan_table(plan),
        })
        dump.update_index()
    if opts.fallback == "error" and plan.fallbacks:
        raise NeuronFallbackError([(e.op, e.count, e.reason) for e in plan.fallbacks])
    outer = plan.gm
    for pname in plan.device_partitions:
        sub = getattr(outer, pname)
        setattr(outer, pname, DevicePartition(sub, pname, record, opts, dump,
                                              plan.partition_ops[pname],
                                              mutated_partition_inputs(outer, pname)))
    wrap_fallback_nodes(outer, plan.node_reasons, record, default_reason="unknown")
    return NeuronGraph(outer, record, device_outputs=device_outputs)
