"""ATen FX graph -> kernel-level IR (``kir.KProgram``), one registry rule per node (looked up
through ``registry.get_rule``, which loads every op family; the rules get a ``lower_ctx.LowerCtx``).

The partition is specialised on concrete input shapes: node values are the graph's own
``meta['val']`` when those are static and were traced on C-contiguous inputs of the
``input_specs``, and are otherwise recomputed with fake tensors from the specs (a symbolic
``meta['val']`` is left untouched).

Invariants
- Every placeholder becomes an INPUT buffer holding the C-contiguous input.
- Every value a rule returns is a ``TensorRef``, a tuple/list of them, or a Python scalar.
- A rule may raise ``Unsupported`` (-> the whole partition falls back, with that reason) but
  never returns a wrong value silently.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from lowering.compiled import TensorSpec
from lowering.errors import LoweringError, Unsupported
from lowering.kir import HbmTensor, KProgram, Role, TensorRef, contiguous_strides
from lowering.lower_ctx import LowerCtx
from lowering.registry import get_rule


def _static(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return all(type(s) is int for s in (*v.shape, *v.stride(), v.storage_offset()))
    if isinstance(v, (tuple, list)):
        return all(_static(x) for x in v)
    return isinstance(v, (int, float, bool)) or v is None


def _meta_values(gm: fx.GraphModule, placeholders: list[fx.Node],
                 input_specs: list[TensorSpec]) -> dict[fx.Node, Any] | None:
    """The graph's own ``meta['val']`` when it is what ``fake_values`` would compute: every
    placeholder's value is a C-contiguous tensor of its spec's shape and dtype and every value
    is static (fake propagation is a function of the inputs' sizes, strides and dtypes)."""
    for n, spec in zip(placeholders, input_specs):
        v = n.meta.get("val")
        if (not isinstance(v, torch.Tensor) or not _static(v) or v.storage_offset() != 0
                or tuple(v.shape) != tuple(spec.shape) or v.dtype != spec.dtype
                or tuple(v.stride()) != contiguous_strides(tuple(v.shape))):
            return None
    vals: dict[fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        if "val" not in n.meta or not _static(n.meta["val"]):
            return None
        vals[n] = n.meta["val"]
    return vals


def fake_values(gm: fx.GraphModule, input_specs: list[TensorSpec]) -> dict[fx.Node, Any]:
    """Every node's value on fake tensors of the concrete input specs: the graph's own
    ``meta['val']`` when that is static and traced on these inputs, else the graph run on
    fake tensors of the specs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(input_specs):
        raise LoweringError(f"graph has {len(placeholders)} inputs, got {len(input_specs)} specs")
    known = _meta_values(gm, placeholders, input_specs)
    if known is not None:
        return known
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    vals: dict[fx.Node, Any] = {}
    with mode:
        for n, spec in zip(placeholders, input_specs):
            vals[n] = torch.empty(spec.shape, dtype=spec.dtype)
        for n in gm.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            if n.op != "call_function":
                raise LoweringError(f"unexpected {n.op} node {n.name} in a device partition")
            args = fx.node.map_arg(n.args, lambda a: vals[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: vals[a])
            try:
                vals[n] = n.target(*args, **kwargs)
            except (RuntimeError, ValueError):
                # a view of an input whose traced strides made it viewable (a tangent laid out
                # like its permuted forward output): the inputs here are contiguous, so take the
                # same elements as a reshape (the lowering copies where a view cannot express it)
                if n.target not in _VIEWS:
                    raise
                vals[n] = torch.ops.aten.reshape.default(*args, **kwargs)
    return vals


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def build_kir(gm: fx.GraphModule, input_specs: list[TensorSpec]) -> KProgram:
    vals = fake_values(gm, input_specs)
    ctx = LowerCtx(vals)
    env: dict[fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = vals[n]
            ref = ctx.new_tensor(tuple(v.shape), v.dtype, Role.INPUT, hint="in")
            ctx.kp.inputs.append(ref.buffer)
            env[n] = ref
        elif n.op == "call_function":
            ctx.node = n
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            rule = get_rule(n.target)
            try:
                env[n] = rule.lower(ctx, n, *args, **kwargs)
            except Unsupported as e:
                e.nodes = e.nodes or (n.name,)
                raise
            except Exception as e:  # an internal bug: crash with the node as context
                raise LoweringError(f"lowering {n.format_node()} failed: {e}") from e
        elif n.op == "output":
            ctx.node = None
            outs = n.args[0]
            flat = outs if isinstance(outs, (list, tuple)) else (outs,)
            for o in flat:
                ref = env[o] if isinstance(o, fx.Node) else o
                if not isinstance(ref, TensorRef):
                    raise Unsupported("output", f"graph output of type {type(ref).__name__} is not a tensor")
                buf = ctx.kp.buffers[ref.buffer]
                if buf.role is Role.TEMP:
                    ctx.kp.buffers[ref.buffer] = HbmTensor(buf.name, buf.numel, buf.dtype, Role.OUTPUT)
                ctx.kp.outputs.append(ref)
    return ctx.kp
