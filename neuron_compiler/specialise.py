"""Graph surgery for a partition's specialisation: a partition traced with symbolic sizes is
lowered per concrete signature (``runtime.DevicePartition``).

Invariants
- ``specialise`` never mutates its argument: a graph that needs specialising is cloned first;
  an already static graph is returned as it is.
- In the result every SymInt placeholder is replaced by its value and every node's
  ``meta['val']`` is re-propagated on the concrete shapes (fake tensors).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule
from torch.fx.passes.fake_tensor_prop import FakeTensorProp


def clone_graph_module(gm: GraphModule) -> GraphModule:
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return GraphModule(gm, g)


def _needs_specialisation(gm: GraphModule, args: tuple) -> bool:
    if any(not isinstance(a, torch.Tensor) for a in args):
        return True
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        for v in vals:
            if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape):
                return True
            if v is None and n.op not in ("output",):
                return True
    return False


def specialise(gm: GraphModule, args: tuple) -> GraphModule:
    """``gm`` with SymInt inputs replaced by their values and ``meta['val']`` re-propagated on
    concrete shapes (``gm`` itself when it is already static)."""
    if not _needs_specialisation(gm, args):
        return gm
    new = clone_graph_module(gm)
    placeholders = [n for n in new.graph.nodes if n.op == "placeholder"]
    tensors = []
    for ph, a in zip(placeholders, args):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            continue
        value = int(a) if isinstance(a, (torch.SymInt, int)) else a
        for user in list(ph.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n, ph=ph, v=value:
                                              v if n is ph else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, ph=ph, v=value:
                                                v if n is ph else n)
        new.graph.erase_node(ph)
    new.recompile()
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # get_attr constants stay real
    fakes = [mode.from_tensor(t.detach()) for t in tensors]
    FakeTensorProp(new, mode).propagate(*fakes)
    return new
