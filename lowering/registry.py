"""The lowering registry: ATen ``OpOverload`` -> rule. Membership IS the support table.

A rule turns one FX node into kernel-level IR through a ``LowerCtx`` (see ``lower_ctx.py``).
``why_unsupported`` answers the partitioner: None when the node can be lowered, else a reason
naming the op, the constraint and the actual value.

Layers: the table (``registry_table.py``: ``REGISTRY``, ``register``, the dtype sets) sits below
the op families (``lowering/ops/<family>.py``), which register into it when imported; this
module sits above them: every lookup here (``get_rule``, ``why_unsupported``,
``supported_ops``) first loads all families (``_ensure_loaded``: ``import lowering.ops``).
Nothing under ``lowering/ops`` imports this module. The table's invariants (one rule per
overload; ``check`` sees only what is known before shapes are concrete) are in its docstring.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

# the table itself (rules register there; re-exported here for the registry's users)
from lowering.registry_table import (DECLINED, FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES,  # noqa: F401
                                     MASK_DTYPES, REGISTRY, CheckFn, LowerFn, Rule, op_name, register)


def _ensure_loaded() -> None:
    import lowering.ops  # noqa: F401  (registers every op family)


def _tensor_vals(node: fx.Node) -> list[torch.Tensor]:
    vals: list[torch.Tensor] = []

    def add(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            vals.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                add(x)

    for a in node.all_input_nodes:
        add(a.meta.get("val"))
    add(node.meta.get("val"))
    return vals


def why_unsupported(node: fx.Node) -> str | None:
    """None if ``node`` can run on the device, else the reason it falls back."""
    _ensure_loaded()
    if node.op != "call_function":
        return f"{node.op} nodes are not lowered"
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, fx.Node) and src.op == "call_function":
            return why_unsupported(src)
        return "getitem of a non-call value"
    rule = REGISTRY.get(node.target)
    name = op_name(node.target)
    if rule is None:
        if node.target in DECLINED:
            return f"{name}: {DECLINED[node.target]}"
        return f"{name}: no lowering registered for this op"
    if "val" not in node.meta:
        return f"{name}: node has no meta['val'] (no shape/dtype information)"
    for t in _tensor_vals(node):
        if t.dtype not in rule.dtypes:
            allowed = ", ".join(sorted(str(d).replace("torch.", "") for d in rule.dtypes))
            return f"{name}: dtype {str(t.dtype).replace('torch.', '')} is not supported (supported: {allowed})"
        if t.is_complex():
            return f"{name}: complex tensors are not supported"
    if rule.check is not None:
        reason = rule.check(node)
        if reason:
            return f"{name}: {reason}"
    return None


def get_rule(target: Any) -> Rule:
    _ensure_loaded()
    return REGISTRY[target]


# what runs a family's kernels (for the support table; the tilers decide per kernel)
FAMILY_ENGINES = {
    "elementwise": "VectorE/GpSimdE (arithmetic), ScalarE (transcendental); POINTWISE",
    "matmul": "TensorE, epilogue on PSUM evacuation; MATMUL (ATTENTION when fused)",
    "reduction": "VectorE/GpSimdE, TensorE for sums over leading rows; REDUCE",
    "normalization": "VectorE bn_stats/bn_aggr, ScalarE; LAYER_NORM / SOFTMAX",
    "indexing": "DMA (indirect gather by an index tile); GATHER",
    "views": "none: a new view of the same buffer",
    "shape": "DMA / engine copies; POINTWISE",
    "constants": "VectorE/GpSimdE memset, GpSimdE iota; POINTWISE",
    "convolution": "TensorE implicit GEMM, ScalarE bias on evacuation; CONV (pads: memset + DMA; POINTWISE)",
    "conv_backward": "TensorE: phase convolutions (CONV) for grad_input, transposes + PSUM accumulation "
                     "for grad_weight (CONV_WGRAD; VectorE when depthwise); REDUCE for grad_bias",
    "pooling": "VectorE/GpSimdE strided max/add per kernel tap, GpSimdE iota for indices; RESAMPLE "
               "(max-pool backward: VectorE index-equality masks; MAXPOOL_BWD)",
    "padding": "VectorE/GpSimdE/ScalarE strided copies (reflection: negative strides); RESAMPLE",
    "upsample": "VectorE/GpSimdE/ScalarE strided copies (nearest), multiply + add (bilinear); RESAMPLE",
    "scan": "VectorE/GpSimdE tensor_tensor_scan; SCAN",
    "selection": "VectorE max8 / nc_find_index8 / nc_match_replace8; SELECT",
    "random": "GpSimdE rand_philox (Philox4x32-10), ScalarE Box-Muller; RAND (+ POINTWISE)",
    "bags": "DMA (indirect gather of the rows, indirect accumulation into the bags), VectorE scan of the offsets; GATHER/SCATTER/SCAN",
    "distance": "VectorE (direct form: POINTWISE + REDUCE), TensorE (Euclidean matmul form), DMA scatter (pdist); POINTWISE/REDUCE/MATMUL",
    "fp8": "TensorE (fp8 operands, fp32 PSUM), scales and cast on PSUM evacuation; MATMUL",
    "attention": "TensorE (both products), ScalarE exp, VectorE row max/sum, online softmax over key "
                 "blocks; ATTENTION",
}


@dataclass(frozen=True)
class OpSupport:
    op: str                 # the ATen overload
    family: str             # lowering/ops/<family>.py
    dtypes: tuple[str, ...]
    engines: str
    limits: str             # the rule's check, as documented ("" when any shape goes)


def supported_ops() -> list[OpSupport]:
    """Every ATen overload the registry lowers, sorted by name (the support table)."""
    _ensure_loaded()
    out = []
    for t, r in REGISTRY.items():
        doc = (r.check.__doc__ or "").strip().split("\n\n")[0] if r.check else ""
        if r.check is not None and not doc:
            doc = f"checked by `{r.check.__module__}.{r.check.__name__}`"
        out.append(OpSupport(op_name(t), r.family,
                             tuple(sorted(str(d).replace("torch.", "") for d in r.dtypes)),
                             FAMILY_ENGINES.get(r.family, r.family), " ".join(doc.split())))
    return sorted(out, key=lambda o: o.op)


def ops_markdown() -> str:
    """``docs/ops.md``: the support table as Markdown (``python -m lowering.api > docs/ops.md``)."""
    ops = supported_ops()
    lines = ["# Supported ATen operators", "",
             f"Generated from `lowering.api.supported_ops()` ({len(ops)} overloads): regenerate "
             "with `python -m lowering.api > docs/ops.md` (a test checks that this file is current). "
             "An op not listed here, or outside its dtypes and limits, runs in eager PyTorch and "
             "the profile records why.", "",
             "| op | family | dtypes | engines; kernel | limits |", "|---|---|---|---|---|"]
    for o in ops:
        lines.append(f"| `{o.op}` | {o.family} | {', '.join(o.dtypes)} | {o.engines} | "
                     f"{o.limits.replace('|', '/') or '-'} |")
    return "\n".join(lines) + "\n"
