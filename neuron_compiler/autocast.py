"""The ``auto_cast`` option: compute fp32 operations in bf16, as neuronx-cc's ``--auto-cast``.

A pass over an ATen graph, run before partitioning (``backend.compile_aten_graph``):
- ``"none"`` (default): the graph is not touched;
- ``"matmul"``: every ``mm`` / ``bmm`` / ``addmm`` whose floating operands are fp32 takes bf16
  copies of them (``_to_copy``) and its bf16 result is widened back to fp32. TensorE then runs
  at its bf16 rate (fp32 runs at a quarter of it, ``Target.fp32_matmul_slowdown``); PSUM still
  accumulates in fp32 and the result is rounded to bf16 once;
- ``"all"``: every compute op with an fp32 result and an fp32 tensor operand computes in bf16
  the same way (casts in, the op in bf16, a cast back to fp32). A cast back to bf16 of a value
  that was just widened from bf16 is the identity (bf16 -> fp32 -> bf16 is exact), so such
  pairs are removed: a chain of ops stays in bf16 and is widened only where an fp32 consumer
  (a graph output, a view, a skipped op) reads it.

Invariants
- The graph's inputs and outputs keep their dtypes and shapes (AOTAutograd's forward/backward
  contract); only interior values change dtype.
- Every inserted or retyped node gets ``meta['val']``, computed by running its op on the fake
  values of its arguments under the graph's own fake mode.
- View and shape ops, casts, ops without an fp32 result and ops whose kwargs name a dtype are
  never retyped.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from neuron_compiler.options import AUTO_CASTS

_aten = torch.ops.aten
MATMUL_OPS = frozenset({_aten.mm.default, _aten.bmm.default, _aten.addmm.default})
_KEEP_OPS = frozenset({
    _aten._to_copy.default, _aten.view.default, _aten._unsafe_view.default,
    _aten.reshape.default, _aten.permute.default, _aten.expand.default, _aten.slice.Tensor,
    _aten.select.int, _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims,
    _aten.t.default, _aten.transpose.int, _aten.alias.default, _aten.clone.default,
    _aten.as_strided.default, _aten.sym_size.int, _aten.sym_stride.int, _aten.sym_numel.default,
    _aten.copy_.default, _aten.copy.default, _aten.detach.default,
})


def _fp32(n: object) -> bool:
    v = n.meta.get("val") if isinstance(n, Node) else None
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32


def _fake_val(node: Node) -> object:
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
    vals = [v for v in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(v, torch.Tensor)]
    mode = torch._guards.detect_fake_mode(vals)
    if mode is None:
        return node.target(*args, **kwargs)
    with mode:
        return node.target(*args, **kwargs)


def _cast(graph: torch.fx.Graph, value: Node, dtype: torch.dtype) -> Node:
    c = graph.call_function(_aten._to_copy.default, (value,), {"dtype": dtype})
    c.meta["val"] = _fake_val(c)
    return c


def _selected(node: Node, mode: str) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if mode == "matmul":
        return node.target in MATMUL_OPS and _fp32(node)
    return (node.target not in _KEEP_OPS and "dtype" not in node.kwargs and _fp32(node)
            and any(_fp32(a) for a in node.all_input_nodes))


def apply_auto_cast(gm: GraphModule, mode: str) -> int:
    """Rewrite ``gm`` in place for ``mode`` (module docstring); returns the ops retyped."""
    if mode not in AUTO_CASTS:
        raise ValueError(f"auto_cast must be one of {AUTO_CASTS}, got {mode!r}")
    if mode == "none":
        return 0
    graph = gm.graph
    retyped = 0
    for node in list(graph.nodes):
        if not _selected(node, mode):
            continue
        with graph.inserting_before(node):
            low = {a: _cast(graph, a, torch.bfloat16) for a in node.all_input_nodes if _fp32(a)}
        node.args, node.kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda a: low.get(a, a))
        node.meta["val"] = _fake_val(node)
        with graph.inserting_after(node):
            wide = _cast(graph, node, torch.float32)
        node.replace_all_uses_with(wide, delete_user_cb=lambda user: user is not wide)
        retyped += 1
    _drop_round_trips(graph)
    graph.eliminate_dead_code()
    gm.recompile()
    return retyped


def _drop_round_trips(graph: torch.fx.Graph) -> None:
    """``_to_copy(_to_copy(x_bf16, fp32), bf16)`` -> ``x_bf16`` (exact)."""
    for node in list(graph.nodes):
        if node.target is not _aten._to_copy.default or node.kwargs.get("dtype") != torch.bfloat16:
            continue
        src = node.args[0]
        if (isinstance(src, Node) and src.target is _aten._to_copy.default
                and src.kwargs.get("dtype") == torch.float32 and len(node.kwargs) == 1
                and len(src.kwargs) == 1):
            inner = src.args[0]
            v = inner.meta.get("val") if isinstance(inner, Node) else None
            if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16:
                node.replace_all_uses_with(inner)
