"""Lower a function traced WITHOUT the core decompositions (for rules whose ATen op the
decompositions never leave in a graph, e.g. ``nan_to_num``, ``select_scatter``,
``embedding_dense_backward``): every node must be supported and the program must execute."""
from __future__ import annotations

from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import TensorSpec, compile_graph, why_unsupported
from lowering_helpers import from_numpy, to_numpy


def lower_raw(fn, *inputs):
    """(device outputs, machine program) of ``fn`` traced as written."""
    gm = make_fx(fn)(*inputs)
    bad = [n.format_node() for n in gm.graph.nodes if n.op == "call_function" and why_unsupported(n)]
    assert not bad, bad
    cg = compile_graph(gm, [TensorSpec(tuple(x.shape), x.dtype) for x in inputs])
    outs, res = cg.run([to_numpy(x) for x in inputs], mode="functional")
    assert res.stats.instructions > 0, "the program executed no instruction"
    return [from_numpy(o, v.dtype).reshape(v.shape) for o, v in zip(outs, cg.outputs)], cg.program
