"""LNC=2: one device partition split over the two physical cores of a logical NeuronCore.

``compile_lnc(gm, input_specs, target, lnc, dump=None, name=None) -> LncCompiledGraph``

How a partition is split
- One axis of the work is cut in two halves, ``[0, h)`` for core 0 and ``[h, S)`` for core 1
  (``h = ceil(S / 2)``). Candidate axes are the outputs' dims of size >= 2: the largest first
  (ties: the earlier output, then the lower dim), those that cut unevenly (the larger half over
  ``UNEVEN`` of the axis: 3 heads as 2 + 1) after all others. So a matmul is split along M (rows
  of A, the first dim of its output) or N (columns of B), a batched op along its batch or heads, a
  row-wise op along its rows. The other outputs are cut along their first dim of that size, or
  computed whole on both cores when they have none (a weight's transpose in a training graph).
  The first axis whose propagation succeeds is taken.
- Propagation runs backwards from the outputs: each node that must be computed in halves gets
  the dim of its value that is cut (``need``); each rule (``_RULES``) says, for an op and the
  cut dim of its output, which dim of each tensor argument is cut, or ``None`` when the
  argument is needed whole (B of an M-split matmul, a broadcast bias). A node needed whole by
  every user is computed whole on both cores (its inputs too). A split is refused (the reason
  is kept) when an op has no rule, when a rule cannot cut that dim (a reduced dim, a
  contraction), when a node is needed cut along two different dims, or cut by one user and
  whole by another, or when a cut value's dim is not of the axis' size.
- A cut is ``(dim, scale)``: the node covers ``[lo * scale, hi * scale)`` of that dim when the
  core has ``[lo, hi)`` of the axis. Scale is 1 except across reshapes that merge the cut dim
  with inner ones (``[B*L, D]`` under ``[B, L, D]``: L) or the reverse (1/L); the halves are
  rounded to the coarsest step so every range is whole elements.
- Each core gets a copy of the graph on its half: cut placeholders take the slice of their
  input, size arguments of view/reshape/expand take the half's size, and ``meta['val']`` is
  propagated again on the new shapes (fake tensors). Each copy is lowered by the ordinary
  pipeline (``lowering.pipeline.compile_graph``): one machine program per physical core.
- When no axis splits, the partition is lowered once and runs on core 0 of the logical core (its
  partner idle, so it has the HBM stack to itself); ``LncCompiledGraph.note`` says why.

Running (``LncCompiledGraph.run``, defined in ``lowering.compiled`` so that the on-disk compile
cache may hold it): functional mode feeds each core its inputs' slices, runs
both programs together (``runtime_sim.multicore.simulate_cores``: one HBM stack shared) and
concatenates each output's halves along its cut dim; timing mode runs them together without
values. The result is a ``MultiCoreResult``: the logical core's statistics plus each core's.

Invariants
- Values are the same as on one core: each output element is computed by exactly one core,
  with the same ops on the same operands (a split never cuts a contraction or a reduction).
- ``program`` is core 0's (what a caller that reads one program sees); ``cores`` has them all.
"""
from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Callable

import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from lowering.compiled import CompiledGraph, LncCompiledGraph, SplitPlan, TensorSpec
from lowering.errors import Unsupported

aten = torch.ops.aten
Dump = Callable[[str, str], None]
UNEVEN = 0.55   # a cut whose larger part exceeds this share of the axis is tried after the even ones
Cuts = list  # [(argument, its cut dim or None: whole[, scale factor])], one item per use
Cut = tuple   # a node's cut: (dim, scale): its range on a core is [lo * scale, hi * scale)


class NoSplit(Exception):
    """This axis cannot be cut here (the message says which op and why)."""


def compile_lnc(gm: fx.GraphModule, input_specs: list[TensorSpec], target: str, lnc: int,
                dump: Dump | None = None, name: str | None = None) -> LncCompiledGraph:
    from lowering.pipeline import compile_graph
    plan, need, why = _plan(gm, lnc)
    if plan is None:
        one = compile_graph(gm, input_specs, target, dump=dump, name=name)
        note = f"runs on one physical core of the LNC={lnc} logical core: {why}"
        if dump is not None:
            dump("lnc.txt", note + "\n")
        return _wrap(one, (one,), None, note, lnc)
    try:
        cores = _compile_cores(gm, plan, need, input_specs, target, dump, name)
    except Unsupported as e:   # a half the tilers refuse: the whole partition on one core
        one = compile_graph(gm, input_specs, target, dump=dump, name=name)
        note = (f"runs on one physical core of the LNC={lnc} logical core: its half for "
                f"one core was refused by the lowering ({e})")
        if dump is not None:
            dump("lnc.txt", plan.text + "# " + note + "\n")
        return _wrap(one, (one,), None, note, lnc)
    if dump is not None:
        dump("lnc.txt", plan.text)
    whole = CompiledGraph(name or "partition", cores[0].program, tuple(input_specs),
                          cores[0].outputs, cores[0].ops,
                          spill_bytes=sum(c.spill_bytes for c in cores))
    return _wrap(whole, tuple(cores), plan, "", lnc)


def _compile_cores(gm: fx.GraphModule, plan: SplitPlan, need: dict,
                   input_specs: list[TensorSpec], target: str, dump: Dump | None,
                   name: str | None) -> list[CompiledGraph]:
    """One program per physical core, each on its half (``core_graph``)."""
    from lowering.pipeline import compile_graph
    cores = []
    for k, (lo, hi) in enumerate(plan.bounds):
        sub = core_graph(gm, need, lo, hi)
        specs = [s if b is None else TensorSpec(_cut(s.shape, d, b[k][1] - b[k][0]), s.dtype,
                                                s.resident, s.mutated)
                 for s, d, b in zip(input_specs, plan.inputs, plan.input_bounds)]
        cdump = None if dump is None else (
            dump if k == 0 else (lambda f, t, k=k: dump(f"core{k}.{f}", t)))
        cores.append(compile_graph(sub, specs, target, dump=cdump, name=f"{name}.core{k}"))
    return cores


def _wrap(c: CompiledGraph, cores: tuple[CompiledGraph, ...], plan: SplitPlan | None,
          note: str, lnc: int) -> LncCompiledGraph:
    # input_layouts/copies stay () for a split partition: each core lays out its own slice
    return LncCompiledGraph(c.name, c.program, c.input_specs, c.outputs, c.ops, c.spill_bytes,
                            c.input_layouts if plan is None else (),
                            input_copies=c.input_copies if plan is None else (), lnc=lnc, cores=cores,
                            plan=plan, note=note)


# ---- the split plan ----------------------------------------------------------------------------
def plan_split(gm: fx.GraphModule, lnc: int) -> tuple[SplitPlan | None, str]:
    """The first axis that splits (module docstring), or (None, why none does)."""
    plan, _, why = _plan(gm, lnc)
    return plan, why


def _plan(gm: fx.GraphModule, lnc: int) -> tuple[SplitPlan | None, dict, str]:
    outs = _outputs(gm)
    if not outs or not all(isinstance(_val(o), torch.Tensor) for o in outs):
        return None, {}, "an output is not a tensor"
    cands = sorted(((j, d, int(s)) for j, o in enumerate(outs)
                    for d, s in enumerate(_val(o).shape) if s >= lnc),
                   key=lambda c: (-(-c[2] // lnc) / c[2] > UNEVEN, -c[2], c[0], c[1]))
    if not cands:
        return None, {}, f"no output has a dim of size >= {lnc} (shapes " + ", ".join(
            str(list(_val(o).shape)) for o in outs) + ")"
    reasons = []
    for j, d, size in cands:
        try:
            need = _propagate(gm, outs, j, d, size)
            # every cut node's range [lo * scale, hi * scale) must be whole elements
            gran = math.lcm(*(c[1].denominator for c in need.values() if c is not None))
            h = -(-(-(-size // lnc)) // gran) * gran
            if h >= size:
                raise NoSplit(f"a reshape cuts it in steps of {gran}, too coarse for {size}")
        except NoSplit as e:
            reasons.append(f"dim {d} of output {j} ({size}): {e}")
            continue
        bounds = tuple((min(k * h, size), min((k + 1) * h, size)) for k in range(lnc))
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        plan = SplitPlan(size, bounds, tuple(_dim(need.get(p)) for p in phs),
                         tuple(_dim(need[o]) for o in outs),
                         {n.name: _dim(c) for n, c in need.items()},
                         input_bounds=tuple(_ranges(need.get(p), bounds) for p in phs))
        plan.text = _plan_text(gm, plan, need, j, d, reasons)
        return plan, need, ""
    return None, {}, "; ".join(reasons[:4]) + (
        f"; and {len(reasons) - 4} more" if len(reasons) > 4 else "")


def _dim(c: Cut | None) -> int | None:
    return None if c is None else c[0]


def _ranges(c: Cut | None, bounds: tuple) -> tuple | None:
    """Per core, the range a node with cut ``c`` covers (None: whole)."""
    if c is None:
        return None
    return tuple((int(lo * c[1]), int(hi * c[1])) for lo, hi in bounds)


def _propagate(gm: fx.GraphModule, outs: list[fx.Node], j0: int, d0: int, size: int) -> dict:
    need: dict[fx.Node, Cut | None] = {}
    whole: set[fx.Node] = set()
    one = Fraction(1)

    def require(n: fx.Node, d: int | None, by: str, scale: Fraction = one) -> None:
        if d is None:
            if n in need and need[n] is not None:
                raise NoSplit(f"{n.name} is needed whole by {by} and cut by another user")
            whole.add(n)
            need.setdefault(n, None)
            return
        if n in whole or (n in need and need[n] != (d, scale)):
            raise NoSplit(f"{n.name} is needed cut along dim {d} by {by} and differently "
                          f"by another user")
        v = _val(n)
        if isinstance(v, (tuple, list)) and v:   # a multi-output op: its first value decides
            v = v[0]                             # (each rule cuts all its values alike)
        if not isinstance(v, torch.Tensor) or d >= v.dim() or int(v.shape[d]) != size * scale:
            raise NoSplit(f"{n.name} ({_describe(v)}) has no dim {d} of size {size * scale}")
        need[n] = (d, scale)

    require(outs[j0], d0, "the output")
    for o in outs:      # other outputs: cut along their first dim of the axis' size, else whole
        if o not in need:
            dims = [d for d, s in enumerate(_val(o).shape) if s == size]
            require(o, dims[0] if dims else None, "the output")
    for n in reversed(list(gm.graph.nodes)):
        if n.op != "call_function" or n not in need:
            continue
        c = need[n]
        args = [a for a in n.all_input_nodes]
        if c is None:
            for a in args:
                require(a, None, n.name)
            continue
        rule = _rule_of(n)
        if rule is None:
            raise NoSplit(f"{_op(n)} (node {n.name}) has no LNC split rule")
        cuts = rule(n, c[0])       # one item per use: mm(x, x) needs x cut AND whole
        for a, ad, *f in cuts:
            require(a, ad, n.name, c[1] * (f[0] if f else 1))
        named = {a for a, *_ in cuts}
        for a in args:                       # tensor arguments the rule does not name
            if a not in named:
                require(a, None, n.name)
    for n in need:
        if n.op == "get_attr" and need[n] is not None:
            raise NoSplit(f"constant {n.name} would have to be cut")
    return need


# ---- rules: the output's cut dim -> each tensor argument's cut dim (or None: whole) -----------
def _pointwise(n: fx.Node, d: int) -> Cuts:
    rank = _val(n).dim()
    out: Cuts = []
    for a in n.all_input_nodes:
        v = _val(a)
        if not isinstance(v, torch.Tensor):
            continue
        ad = d - (rank - v.dim())
        out.append((a, None if ad < 0 or int(v.shape[ad]) == 1 else ad))
    return out


def _mm(n: fx.Node, d: int) -> Cuts:
    a, b = n.args[-2], n.args[-1]
    res: Cuts = [(a, 0 if d == 0 else None), (b, 1 if d == 1 else None)]
    if n.target is aten.addmm.default:      # the bias broadcasts like a pointwise operand
        bias = n.args[0]
        bv = _val(bias)
        bd = d - (2 - bv.dim())
        res.append((bias, None if bd < 0 or int(bv.shape[bd]) == 1 else bd))
    return res


def _bmm(n: fx.Node, d: int) -> Cuts:
    a, b = n.args[0], n.args[1]
    if d == 0:
        return [(a, 0), (b, 0)]
    return [(a, 1 if d == 1 else None), (b, 2 if d == 2 else None)]


def _rowwise(n: fx.Node, d: int) -> Cuts:
    x, dim = n.args[0], n.args[1]
    if d == dim % _val(n).dim():
        raise NoSplit(f"{_op(n)} (node {n.name}) normalises along dim {d}")
    return [(x, d)]


def _reduce(n: fx.Node, d: int) -> Cuts:
    x = n.args[0]
    rank = _val(x).dim()
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if dims is None:
        raise NoSplit(f"{_op(n)} (node {n.name}) reduces every dim")
    dims = {int(k) % rank for k in ((dims,) if isinstance(dims, int) else dims)}
    keep = (n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    kept = list(range(rank)) if keep else [k for k in range(rank) if k not in dims]
    xd = kept[d]
    if xd in dims:
        raise NoSplit(f"{_op(n)} (node {n.name}) reduces dim {xd}")
    return [(x, xd)]


def _permute(n: fx.Node, d: int) -> Cuts:
    x = n.args[0]
    if n.target is aten.t.default:
        return [(x, 1 - d if _val(x).dim() == 2 else d)]
    if n.target is aten.transpose.int:
        rank = _val(x).dim()
        a, b = n.args[1] % rank, n.args[2] % rank
        return [(x, b if d == a else a if d == b else d)]
    perm = [p % _val(x).dim() for p in n.args[1]]
    return [(x, perm[d])]


def _view(n: fx.Node, d: int) -> Cuts:
    """A reshape where the cut dim ``d`` starts at an input dim ``xd`` (the same number of
    elements before both), so a range of it is a contiguous range of the input: the same size
    (scale 1); the outermost of the output dims the input dim ``xd`` is split into (the input
    range is ``inner`` times longer); or an output dim that merges input dims ``xd..`` (the
    input range is ``inner`` times shorter: whole elements only when the cut falls on a
    multiple of ``inner``, checked by the plan)."""
    x = n.args[0]
    xs, os_ = list(_val(x).shape), list(_val(n).shape)
    if n.target is aten.expand.default:
        xd = d - (len(os_) - len(xs))
        if xd < 0 or xs[xd] == 1:
            return [(x, None)]
        return [(x, xd)]
    before = math.prod(os_[:d])
    for xd in range(len(xs)):
        if math.prod(xs[:xd]) != before or xs[xd] == 1 != os_[d]:
            continue
        if xs[xd] == os_[d]:
            return [(x, xd)]
        for k in range(d + 2, len(os_) + 1):          # input dim xd = output dims d..k-1
            if math.prod(os_[d:k]) == xs[xd]:
                return [(x, xd, Fraction(math.prod(os_[d + 1:k])))]
        for k in range(xd + 2, len(xs) + 1):          # output dim d = input dims xd..k-1
            if math.prod(xs[xd:k]) == os_[d]:
                return [(x, xd, Fraction(1, math.prod(xs[xd + 1:k])))]
    raise NoSplit(f"{_op(n)} (node {n.name}) cuts dim {d} of {os_} inside a merged dim of "
                  f"{xs}")


def _layer_norm(n: fx.Node, d: int) -> Cuts:
    """native_layer_norm: (out, mean, rstd) all keep the leading dims of x."""
    x, normalized = n.args[0], n.args[1]
    if d >= _val(x).dim() - len(normalized):
        raise NoSplit(f"{_op(n)} (node {n.name}) normalises along dim {d}")
    return [(x, d)]


def _sdpa(n: fx.Node, d: int) -> Cuts:
    """``_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, ...)`` ->
    (out [B, H, L, E], logsumexp [B, H, L]): batch and heads cut q, k and v alike; query rows
    cut q only (k and v whole), unless causal (the mask is relative to the row's index)."""
    q, k, v = n.args[0], n.args[1], n.args[2]
    causal = n.args[4] if len(n.args) > 4 else n.kwargs.get("is_causal", False)
    if n.kwargs.get("attn_mask") is not None or (len(n.args) > 5 and n.args[5] is not None):
        raise NoSplit(f"{_op(n)} (node {n.name}) with an attn_mask")
    if d in (0, 1):
        return [(q, d)] + [(t, None if int(_val(t).shape[d]) == 1 else d) for t in (k, v)]
    if d == 2 and not causal:
        return [(q, 2), (k, None), (v, None)]
    raise NoSplit(f"{_op(n)} (node {n.name}) cannot cut dim {d}"
                  + (" of a causal attention" if d == 2 else ""))


def _embedding(n: fx.Node, d: int) -> Cuts:
    """``embedding(weight [V, D], indices)`` -> indices.shape + [D]: a dim of the indices cuts
    the indices (the table whole); the last dim cuts the table's columns."""
    w, idx = n.args[0], n.args[1]
    if d < _val(idx).dim():
        return [(idx, d), (w, None)]
    return [(w, 1), (idx, None)]


def _cat(n: fx.Node, d: int) -> Cuts:
    """``cat(tensors, dim)``: any dim but ``dim`` cuts every piece alike (a legacy empty 1-D
    piece, which cat skips, stays whole)."""
    dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % _val(n).dim()
    if d == dim:
        raise NoSplit(f"{_op(n)} (node {n.name}) concatenates along dim {d}")
    return [(t, None if _val(t).dim() == 1 and _val(t).numel() == 0 else d) for t in n.args[0]]


def _split(n: fx.Node, d: int) -> Cuts:
    """``split``/``split_with_sizes(x, sizes, dim)`` -> pieces: any dim but ``dim``."""
    x = n.args[0]
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % _val(x).dim()
    if d == dim:
        raise NoSplit(f"{_op(n)} (node {n.name}) splits along dim {d}")
    return [(x, d)]


def _index(n: fx.Node, d: int) -> Cuts:
    """``index.Tensor(x, [i0, .., ik-1])`` (every index given) -> broadcast(i).shape +
    x.shape[k:]: a broadcast dim cuts the index tensors (x whole), a later dim cuts x."""
    x, idx = n.args[0], list(n.args[1])
    if any(i is None for i in idx):
        raise NoSplit(f"{_op(n)} (node {n.name}) with a sliced (None) index")
    nb = _val(n).dim() - (_val(x).dim() - len(idx))
    if d >= nb:
        return [(x, len(idx) + d - nb)] + [(i, None) for i in idx]
    out: Cuts = [(x, None)]
    for i in idx:
        v = _val(i)
        ad = d - (nb - v.dim())
        out.append((i, None if ad < 0 or int(v.shape[ad]) == 1 else ad))
    return out


def _unsqueeze(n: fx.Node, d: int) -> Cuts:
    """``unsqueeze``/``squeeze``: the output dim's place among the input's dims."""
    x = n.args[0]
    xs = list(_val(x).shape)
    if n.target is aten.unsqueeze.default:
        at = n.args[1] % (len(xs) + 1)
        return [(x, d if d < at else d - 1)]
    dims = n.args[1] if len(n.args) > 1 else None
    dims = (range(len(xs)) if dims is None else
            [k % len(xs) for k in ((dims,) if isinstance(dims, int) else dims)])
    kept = [k for k in range(len(xs)) if k not in dims or xs[k] != 1]
    return [(x, kept[d])]


def _arange(n: fx.Node, d: int) -> Cuts:
    """``arange``: no tensor argument; ``core_graph`` gives each core its part of the range."""
    return []


def _getitem(n: fx.Node, d: int) -> Cuts:
    return [(n.args[0], d)]


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.expand.default)
_RULES: dict = {
    aten.mm.default: _mm, aten.addmm.default: _mm, aten.bmm.default: _bmm,
    aten._softmax.default: _rowwise, aten._log_softmax.default: _rowwise,
    aten.sum.dim_IntList: _reduce, aten.mean.dim: _reduce, aten.amax.default: _reduce,
    aten.amin.default: _reduce, aten.any.dim: _reduce, aten.all.dim: _reduce,
    aten.any.dims: _reduce, aten.prod.dim_int: _reduce, aten.var.correction: _reduce,
    aten.t.default: _permute, aten.permute.default: _permute, aten.transpose.int: _permute,
    aten.native_layer_norm.default: _layer_norm,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa,
    aten.embedding.default: _embedding, aten.cat.default: _cat, aten.index.Tensor: _index,
    aten.unsqueeze.default: _unsqueeze, aten.squeeze.dim: _unsqueeze,
    aten.squeeze.dims: _unsqueeze, aten.squeeze.default: _unsqueeze,
    **{a: _arange for a in (aten.arange.default, aten.arange.start, aten.arange.start_step)},
    aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.clone.default: _pointwise, aten._to_copy.default: _pointwise,
    aten.alias.default: _pointwise,
    # *_like: the shape of the argument (its values are not read)
    aten.full_like.default: _pointwise, aten.zeros_like.default: _pointwise,
    aten.ones_like.default: _pointwise, aten.empty_like.default: _pointwise,
    **{v: _view for v in _VIEWS},
}


def _rule_of(n: fx.Node):
    if n.target is operator.getitem:
        return _getitem
    rule = _RULES.get(n.target)
    if rule is not None:
        return rule
    tags = getattr(n.target, "tags", ())
    if torch.Tag.pointwise in tags:
        return _pointwise
    return None


# ---- one core's graph --------------------------------------------------------------------------
def core_graph(gm: fx.GraphModule, need: dict, lo: int, hi: int) -> fx.GraphModule:
    """``gm`` on the part ``[lo, hi)`` of the cut axis (module docstring); ``need``: each node's
    cut ``(dim, scale)`` or None."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in gm.graph.nodes:
        c = need.get(n)
        if n.op == "call_function" and n.target in _VIEWS and c is not None:
            size = list(n.args[1])
            size[c[0]] = int((hi - lo) * c[1])
            new = g.call_function(n.target, (env[n.args[0]], size) + tuple(n.args[2:]),
                                  dict(n.kwargs))
            new.name = n.name
            env[n] = new
        elif n.op == "call_function" and _RULES.get(n.target) is _arange and c is not None:
            args = list(n.args)
            start, end, step = ((0, args[0], 1) if n.target is aten.arange.default else
                                (args[0], args[1], args[2] if len(args) > 2 else 1))
            a0, a1 = int(lo * c[1]), int(hi * c[1])
            new = g.call_function(aten.arange.start_step,
                                  (start + a0 * step, start + a1 * step, step), dict(n.kwargs))
            new.name = n.name
            env[n] = new
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    sub = fx.GraphModule(gm, g)
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v, c = _val(n), need.get(n)
        shape = tuple(v.shape) if c is None else _cut(tuple(v.shape), c[0], int((hi - lo) * c[1]))
        fakes.append(mode.from_tensor(torch.empty(shape, dtype=v.dtype)))
    FakeTensorProp(sub, mode).propagate(*fakes)
    return sub


# ---- helpers -----------------------------------------------------------------------------------
def _cut(shape: tuple[int, ...], d: int, n: int) -> tuple[int, ...]:
    return shape[:d] + (n,) + shape[d + 1:]


def _outputs(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, fx.Node)] if all(
        isinstance(o, fx.Node) for o in outs) else []


def _val(n: object) -> object:
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _op(n: fx.Node) -> str:
    from lowering.registry import op_name
    return op_name(n.target)


def _describe(v: object) -> str:
    return f"shape {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__


def _plan_text(gm: fx.GraphModule, plan: SplitPlan, need: dict, j: int, d: int,
               refused: list[str]) -> str:
    lines = [f"# LNC={len(plan.bounds)}: dim {d} of output {j} ({plan.size}) cut into "
             + ", ".join(f"core{k} [{lo}, {hi})" for k, (lo, hi) in enumerate(plan.bounds))]
    lines += [f"# not taken: {r}" for r in refused]
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "call_function"):
            c = need.get(n, None)
            lines.append(f"{n.name}: " + ("whole on every core" if c is None else
                                          f"cut dim {c[0]}" + ("" if c[1] == 1 else
                                                               f" (x {c[1]} of the axis)")))
    return "\n".join(lines) + "\n"

