"""Constant folding: input-independent subgraphs of an ATen graph are evaluated once, at compile
time, and enter the graph as constants.

A transformers decoder builds its attention mask from ``arange``, ``full``, ``cumsum``,
``index`` and comparisons of them when the caller passes no mask: none of it reads an input, so
every call computes the same tensor. Run on the device, that chain of small kernels is pure
latency ahead of the first layer (GPT-2 small: about 20 kernels, tens of microseconds). A
compiler evaluates such a subgraph when it compiles (neuronx-cc folds constants in its HLO
passes; Inductor's ``freezing`` does the same through ``torch._inductor.constant_folding``,
whose ``ConstantFolder`` this pass uses). The folded value enters the graph as a ``get_attr``
constant: the device reads it from HBM like a parameter (sent once, resident afterwards).

What is folded (``fold_constants``): the maximal subgraphs whose every leaf is a constructor
(``arange``, ``full``, ``zeros``, ...) or a literal, never a placeholder (an input, a parameter,
a buffer, a symbolic size); from each, only the values other nodes read (the frontier).

What is not:
- a subgraph of constructors, views and elementwise ops only (``arange`` -> ``unsqueeze`` ->
  ``ge`` -> ``where``): the lowering inlines those into their readers as expressions of
  indices (an iota, a memset), cheaper than reading bytes, as Inductor's ``skip_constructors``
  reasons; a fold needs at least one op that runs as a kernel of its own (a ``cumsum``,
  ``index``, ``cat``, a reduction);
- a value of more than ``MAX_FOLDED_BYTES``: its HBM bytes would cost more than the ops;
- random ops (``nondeterministic_seeded``), higher-order ops, and whatever ``ConstantFolder``
  refuses (its ``is_impure``).

Invariants
- The graph computes the same values: a folded node's users read the tensor the node's own
  ATen op returned, with its ``meta`` (fake value, strides) unchanged.
- No placeholder is removed and no node that reads a placeholder is folded.
"""
from __future__ import annotations

import logging

import torch
from torch.fx import GraphModule, Node

log = logging.getLogger(__name__)

MAX_FOLDED_BYTES = 16 * 2 ** 20

# views, copies and *_like constructors: never a kernel of their own
_NOT_KERNELS = {"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "permute",
                "transpose", "t", "slice", "select", "alias", "as_strided", "clone", "_to_copy",
                "lift_fresh_copy", "copy", "full_like", "zeros_like", "ones_like", "empty_like"}


def _is_compute(node: Node) -> bool:
    """An op that is not a constructor, a view, a copy or an elementwise op: the lowering
    inlines a chain of those into its readers as expressions of indices (a causal mask from
    ``arange`` and a comparison costs no kernel and no load), so folding it would only add a
    load; a scan, gather, concatenation or reduction runs as kernels of its own."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    name = node.target._schema.name.split("::")[-1]
    if name in _NOT_KERNELS or torch.Tag.pointwise in node.target.tags:
        return False
    # constructors: no tensor argument
    return any(isinstance(a, Node) for a in torch.utils._pytree.arg_tree_leaves(*node.args, **node.kwargs))


def _computes(node: Node) -> bool:
    """Whether the subgraph ending in ``node`` (all of it constant when ``node`` is) holds an
    op that runs as a kernel of its own (``_is_compute``)."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if _is_compute(n):
            return True
        stack.extend(n.all_input_nodes)
    return False


def _reads_no_input(gm: GraphModule) -> bool:
    """Whether some op that runs as a kernel of its own (``_is_compute``) reads no placeholder,
    directly or through other nodes: else there is nothing to fold and the interpreter is not
    run (a graph of one eager device op, most model graphs' every matmul)."""
    dependent: set[Node] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder" or any(a in dependent for a in n.all_input_nodes):
            dependent.add(n)
        elif _is_compute(n):
            return True
    return False


def fold_constants(gm: GraphModule) -> list[str]:
    """Fold ``gm``'s input-independent subgraphs in place (see the module docstring). Returns
    the names of the nodes replaced by constants."""
    from torch._inductor.constant_folding import ConstantFolder, replace_node_with_constant
    from torch.utils._python_dispatch import _disable_current_modes

    if not _reads_no_input(gm):
        return []
    with _disable_current_modes():
        cf = ConstantFolder(gm, skip_constructors=False)
        try:
            cf.run()
        except Exception as e:       # a graph the interpreter cannot run: leave it whole
            log.debug("constant folding skipped: %s", e)
            return []
    values = cf.node_replacements
    folded = []
    for node, value in list(values.items()):
        if not isinstance(value, torch.Tensor) or node.op != "call_function":
            continue
        if value.untyped_storage().nbytes() > MAX_FOLDED_BYTES or not _computes(node):
            continue
        # a view of a folded value keeps its strides; its storage is the value's own
        replace_node_with_constant(gm, node, value)
        folded.append(node.name)
    if folded:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        log.info("constant folding: %d node(s) replaced by constants: %s", len(folded),
                 ", ".join(folded))
    return folded
