"""Timing mode's returned values, computed at CPU speed: a partition's graph run in fp32.

In ``sim_mode="timing"`` the program is only timed; the values a partition returns come from
running its ATen graph eagerly. On a CPU, eager bf16/fp16 arithmetic is slow (a bf16 matmul runs
at about 1% of fp32's rate here: 0.8 against 92 GFLOP/s), so a bf16 model would spend most of its
timing-mode call there. ``upcast_graph`` makes a copy of the graph that computes in fp32 instead,
and ``run_upcast`` rounds its outputs back to the graph's dtypes.

Invariants
- Every low-precision float dtype (bf16, fp16, fp8 kinds) in the graph is replaced by fp32:
  low-precision inputs and ``get_attr`` constants are upcast (exactly: fp32 holds every value of
  these types), ``dtype`` arguments (``_to_copy``, ``full``, ``convert_element_type``, ...) name
  fp32, and the result of every node whose value has a low-precision type in the original graph
  (views excepted: they compute nothing) is rounded to that type (round-to-nearest-even,
  torch's cast) and held in fp32 for its users; the outputs are returned in their dtypes.
  Shapes, integer and fp32 arithmetic are unchanged.
- Difference from eager low-precision PyTorch, and its bound: the returned values differ only by
  rounding inside an op. Every tensor between ops holds the same rounded values as in eager
  (the casts of the graph, a ``.to(torch.bfloat16)`` included, round as written); within one
  op, the arithmetic is fp32 and rounded once at its end, where eager's low-precision kernels may
  round partial results (a matmul's or a reduction's accumulation in blocks): so an output can
  differ from eager's by a few ulps of its dtype, compounding through the following ops, never
  by a different computation.
- A graph that reinterprets the bits of a low-precision tensor (``aten.view.dtype``) cannot be
  upcast: ``upcast_graph`` returns None and the graph runs as written.
- Only where it is faster: ``slow_dtypes()`` are the low-precision types this CPU has no native
  kernels for, as PyTorch's oneDNN reports it (``torch.ops.mkldnn._is_mkldnn_bf16_supported``,
  ``_fp16_supported``: AVX512-BF16/AMX/AVX512-FP16 CPUs run bf16/fp16 matmuls at least as fast
  as fp32; measured here, avx512_bf16: eager bf16 gpt2-small 0.5 s, its fp32 copy slower), plus
  every fp8 type (no CPU kernels). A graph is upcast when some value of it has one of those
  types; otherwise it runs as written.
- Upcast copies of ``nn.Parameter`` inputs are kept while the parameter lives and its
  ``_version`` is unchanged (weights are sent once, as on the device; an optimizer step makes a
  new copy); other inputs are upcast on every call.
"""
from __future__ import annotations

import functools
import operator
import weakref

import torch
from torch.fx import GraphModule
from torch.fx.node import map_aggregate

LOW_PRECISION = frozenset({torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
                           torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})
_BIT_VIEWS = frozenset({torch.ops.aten.view.dtype})
# ops defined only on low-precision operands (fp8 products with scales): a graph holding one
# keeps its types and runs natively
_LOW_PRECISION_ONLY = frozenset({torch.ops.aten._scaled_mm.default})
_TO_COPY = torch.ops.aten._to_copy.default


def _up(value: object) -> object:
    if isinstance(value, torch.dtype) and value in LOW_PRECISION:
        return torch.float32
    return value


def _low(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION


@functools.lru_cache(maxsize=1)
def slow_dtypes() -> frozenset[torch.dtype]:
    """The low-precision float types without native CPU kernels here (module docstring)."""
    slow = set(LOW_PRECISION) - {torch.bfloat16, torch.float16}
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        slow.add(torch.bfloat16)
    if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        slow.add(torch.float16)
    return frozenset(slow)


def needs_upcast(gm: GraphModule) -> bool:
    """True when some value of ``gm`` (its ``meta['val']``) is a tensor of a slow type."""
    slow = slow_dtypes()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if any(isinstance(v, torch.Tensor) and v.dtype in slow
               for v in (val if isinstance(val, (tuple, list)) else (val,))):
            return True
    return False


_PARAMS: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def _upcast_input(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32; a parameter's copy is kept while it lives unchanged (docstring)."""
    if not isinstance(t, torch.nn.Parameter):
        return t.float()
    key, version = id(t), t._version
    kept = _PARAMS.get(key)
    if kept is not None and kept[0]() is t and kept[1] == version:
        return kept[2]
    copy = t.detach().float()
    _PARAMS[key] = (weakref.ref(t, lambda ref, key=key: _PARAMS.get(key, (None,))[0] is ref
                                and _PARAMS.pop(key)), version, copy)
    return copy


def upcast_graph(gm: GraphModule) -> GraphModule | None:
    """A copy of ``gm`` computing in fp32 wherever ``gm`` computes in a low-precision float
    type (module docstring); None when it reinterprets low-precision bits or calls an op that
    takes only low-precision operands (``_scaled_mm``)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    new = GraphModule(gm, graph)
    for n in list(new.graph.nodes):
        if n.op == "call_function":
            if n.target in _BIT_VIEWS or n.target in _LOW_PRECISION_ONLY:
                return None
            n.args = map_aggregate(n.args, _up)
            n.kwargs = map_aggregate(n.kwargs, _up)
            val = n.meta.get("val")
            if _low(val) and not getattr(n.target, "is_view", False):
                _round_after(new.graph, n, val.dtype)
        elif n.op == "get_attr":
            value = operator.attrgetter(str(n.target))(new)
            if _low(value):
                owner, _, attr = str(n.target).rpartition(".")
                module = new.get_submodule(owner) if owner else new
                setattr(module, attr, value.float())
    new.recompile()
    return new


def _round_after(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype) -> None:
    """Make every user of ``node`` read its value rounded to ``dtype`` (and held in fp32)."""
    with graph.inserting_after(node):
        low = graph.call_function(_TO_COPY, (node,), {"dtype": dtype})
    with graph.inserting_after(low):
        back = graph.call_function(_TO_COPY, (low,), {"dtype": torch.float32})
    node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not low)


def run_upcast(gm32: GraphModule, args: tuple, out_dtypes: list[torch.dtype | None],
               returns_tuple: bool) -> object:
    """Run the upcast graph on ``args`` (low-precision tensors upcast) and round each output to
    ``out_dtypes[i]`` (None: not a tensor)."""
    out = gm32(*[_upcast_input(a) if _low(a) else a for a in args])
    outs = list(out) if returns_tuple else [out]
    rounded = [o.to(dt) if isinstance(o, torch.Tensor) and dt is not None and o.dtype != dt
               else o for o, dt in zip(outs, out_dtypes)]
    return tuple(rounded) if returns_tuple else rounded[0]
