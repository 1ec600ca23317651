"""The Dynamo backends ``neuron`` and ``neuron_sim`` (entry points; no import needed).

    torch.compile(model, backend="neuron", options={"target": "trn3"})

Path of a graph: Dynamo FX graph -> ``aot_autograd`` with the core-ATen decompositions ->
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
from neuron_compiler.options import NeuronOptions
from neuron_compiler.profile import GraphRecord

OUR_ENTRY_POINT_PREFIX = "neuron_compiler."


# Ops that core ATen keeps whole but that decompose into ops the lowering has (batch norm in
# training and inference, and its backward, become var_mean + elementwise + reductions;
# linalg_vector_norm, F.normalize's and weight norm's, becomes abs/pow, a sum or max and a
# root, in fp32 for 16-bit inputs as eager accumulates).
EXTRA_DECOMPOSITIONS = (
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit",
    "native_batch_norm_backward",
    "linalg_vector_norm",
)


# Ops that core ATen decomposes (into index gathers and where chains) but that the lowering
# registry lowers whole, as one kernel (lowering/ops/padding.py): kept out of the table.
KEEP_WHOLE = tuple(f"{kind}_pad{n}d{bw}" for kind in ("reflection", "replication")
                   for n in (1, 2, 3) for bw in ("", "_backward"))


def _group_norm_backward_fits(target: str):
    def keep(grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask) -> bool:
        from lowering.tiling.norm_backward import row_fits_always
        from runtime_sim import get_target
        if not x.dtype.is_floating_point:
            return False
        row = int(C) // int(group) * int(HxW)
        isz = x.dtype.itemsize
        return row_fits_always(row, 4, isz, isz, get_target(target))   # dy * w is fp32
    return keep


def _layer_norm_backward_fits(target: str):
    def keep(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask) -> bool:
        from lowering.tiling.norm_backward import row_fits_always
        from runtime_sim import get_target
        if not x.dtype.is_floating_point:
            return False
        row = 1
        for n in normalized_shape:
            row *= int(n)
        isz = x.dtype.itemsize
        return row_fits_always(row, grad_out.dtype.itemsize, isz, isz, get_target(target))
    return keep


def _col2im_fits(target: str):
    def keep(cols, output_size, *args) -> bool:
        from lowering.ops.indexing import WRAP_LIMIT
        return cols.dtype.is_floating_point and int(output_size[0]) * int(output_size[1]) < WRAP_LIMIT
    return keep


# Ops that core ATen decomposes but whose kernel the registry has (Inductor's rule: an op with a
# lowering of its own is kept out of the decomposition table, ``decomps_to_exclude``): kept
# whole when the kernel takes the call (the test on the arguments), decomposed otherwise (the
# decomposition returns NotImplemented to keep the op, as Inductor's conditional ones do).
KERNEL_OPS = {
    "native_group_norm_backward": _group_norm_backward_fits,   # LAYER_NORM_BWD over group rows
    "native_layer_norm_backward": _layer_norm_backward_fits,   # LAYER_NORM_BWD over the rows
    "col2im": _col2im_fits,                                     # indirect-DMA accumulation
}


def _keep_when(decomposition: Callable, keep: Callable) -> Callable:
    def decomp(*args, **kwargs):
        if keep(*args, **kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decomp


def decomposition_table(target: str = "trn2") -> dict:
    """Core-ATen decompositions (what the lowering registry is keyed on) plus
    ``EXTRA_DECOMPOSITIONS``, minus ``KEEP_WHOLE``; ``KERNEL_OPS`` stay whole when their
    registry kernel takes the call on ``target``."""
    import torch
    from torch._decomp import core_aten_decompositions, get_decompositions

    from lowering.registry import REGISTRY, _ensure_loaded
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([getattr(torch.ops.aten, n) for n in EXTRA_DECOMPOSITIONS]))
    for n in KEEP_WHOLE:
        table.pop(getattr(torch.ops.aten, n).default, None)
    _ensure_loaded()
    for n, fits in KERNEL_OPS.items():
        op = getattr(torch.ops.aten, n).default
        if op in table and op in REGISTRY:
            table[op] = _keep_when(table[op], fits(target))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    table[op] = _flash_attention_for_cpu(table[op])
    table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = \
        _flash_attention_for_cpu_backward
    return table


def sdpa_kernel_fits(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                     scale=None) -> bool:
    """``_scaled_dot_product_flash_attention_for_cpu`` stays whole (``lowering/ops/attention.py``
    lowers it to one ATTENTION kernel) when nothing can read its logsumexp, i.e. it is traced
    with grad mode off (no backward records it; inside AOTAutograd's joint trace the inputs'
    ``requires_grad`` is not a reliable sign, grad mode is), and the rule takes the call
    (``whole_refusal``: no dropout, ``attn_mask`` or grouped-query heads)."""
    import torch

    from lowering.ops.attention import whole_refusal
    return (not torch.is_grad_enabled()
            and whole_refusal(query, key, value, dropout_p, attn_mask) is None)


def _flash_attention_for_cpu(inference_decomposition):
    """Kept whole when ``sdpa_kernel_fits``. Otherwise: torch's decomposition of
    ``_scaled_dot_product_flash_attention_for_cpu`` returns the attention probabilities as its
    second output, where the op returns the row logsumexp that its backward
    (``..._for_cpu_backward``) reads: in a training graph the gradients would be silently
    wrong. This one returns the op's output (from torch's decomposition) and the true
    logsumexp [N, H, L] (fp32, laid out as the op lays it out); with dropout it does not
    decompose (the backward regenerates the op's own dropout mask)."""
    import torch

    def decomp(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        if dropout_p or sdpa_kernel_fits(query, key, value, dropout_p, is_causal,
                                         attn_mask=attn_mask, scale=scale):
            return NotImplemented
        out, _ = inference_decomposition(query, key, value, dropout_p, is_causal,
                                         attn_mask=attn_mask, scale=scale)
        scores = _scores(query.float(), key.float(), is_causal, attn_mask, scale)
        lse = torch.logsumexp(scores, dim=-1)
        return out, lse.transpose(1, 2).contiguous().transpose(1, 2)

    return decomp


def _scores(q, k, is_causal: bool, attn_mask, scale):
    """The attention scores ``scale * q k^T`` (default scale 1/sqrt(E)) with the op's causal
    mask (top-left aligned) and ``attn_mask`` (boolean: keep where True; else added)."""
    import math
    import torch
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if k.dim() == 4 and k.shape[1] != q.shape[1]:      # grouped-query: each key head serves a group
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * s
    L, S = scores.shape[-2:]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    return scores


def _flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
                                      is_causal, *, attn_mask=None, scale=None):
    """``_scaled_dot_product_flash_attention_for_cpu_backward`` (which has no decomposition in
    torch) as matmuls and pointwise ops, in fp32 as the CPU kernel accumulates, from the
    forward's logsumexp (``_flash_attention_for_cpu`` returns the true one):
    P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = s dS K,
    dK = s dS^T Q, where S = s Q K^T with the causal and ``attn_mask`` masks of the forward.
    With dropout or grouped-query heads it does not decompose (the op regenerates its own
    dropout mask; the key/value gradients of a head group would need summing)."""
    import math
    import torch
    if dropout_p or key.shape[1] != query.shape[1]:    # grouped-query heads: not decomposed
        return NotImplemented
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    q, k, v, o, do = (t.float() for t in (query, key, value, out, grad_out))
    p = torch.exp(_scores(q, k, is_causal, attn_mask, scale) - logsumexp.float().unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), do)
    ds = p * (torch.matmul(do, v.transpose(-2, -1)) - (do * o).sum(-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-2, -1), q) * s
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


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
                         assumptions=host_assumptions(opts))
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
