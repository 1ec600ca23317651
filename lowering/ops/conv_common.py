"""Convolution geometry shared by the convolution families (``convolution.py``,
``conv_backward.py``, ``conv_transpose.py``): node values, stride/padding/dilation pairs, the
concrete 4-d shapes of a convolution node, and the SBUF fit check of a CONV kernel's blocking.

A leaf under those families: it imports none of them.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.registry_table import op_name
from lowering.tiling.conv_plan import plan_conv
from runtime_sim.targets import TARGETS


def node_val(a: object):
    """``a``'s ``meta['val']`` when ``a`` is an FX node, else None."""
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def conv_pairs(v, n: int, unit: int) -> tuple[int, int]:
    """(h, w) of a stride/padding/dilation list; a 1-d conv gets ``unit`` for its H axis."""
    v = [int(e) for e in (v if isinstance(v, (list, tuple)) else [v])]
    if len(v) == 1:
        v = v * n
    return (unit, v[0]) if n == 1 else (v[0], v[1])


def conv_shapes(node: fx.Node, x, w) -> tuple[tuple[int, ...], ...] | None:
    """The concrete 4-d (a 1-d conv with H = 1) shapes of a convolution node's input, weight and
    output, or None when one is missing, symbolic or empty (the tiler checks those)."""
    y = node.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (x, w, y)):
        return None
    try:
        shapes = [tuple(int(d) for d in t.shape) for t in (x, w, y)]
    except (TypeError, ValueError):
        return None
    if x.dim() == 3:
        shapes = [s[:2] + (1,) + s[2:] for s in shapes]
    return None if any(0 in s for s in shapes) else tuple(shapes)


def plan_reason(node: fx.Node, itemsize: int, **sizes) -> str | None:
    """Why ``tiling/conv_plan.plan_conv(**sizes)`` finds no blocking within the SBUF of the
    smallest target, or None: checked here so that such a node falls back before its
    partition is tiled."""
    part = min(t.sbuf_bytes_per_partition for t in TARGETS.values())
    try:
        plan_conv(op_name(node.target), part, itemsize, **sizes)
    except Unsupported as e:
        return e.reason
    return None
