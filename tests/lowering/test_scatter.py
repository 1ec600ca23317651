"""Advanced indexing and scatters on the device: ``index.Tensor``, ``index_put`` (with and
without accumulate), ``scatter`` (src and value), ``scatter_add``, ``slice_scatter``,
``select_scatter`` and ``embedding_dense_backward`` against eager through the simulator, over
tables of 300 x 513 (lookups cross the 128-partition tile edge, rows the 512-column edge), fp32
and bf16 tables, int32 and int64 indices passed in as graph inputs.

Copies and overwrites are exact (``_exact``); accumulations use the per-dtype tolerances, and
``test_tolerances_can_fail`` feeds them a known-wrong result. Every case asserts that every node
ran on the device (``lower_and_run``, or ``undecomposed.lower_raw`` for rules the core decompositions never leave
in a graph) and that the SCATTER kernel's indirect DMA ran.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import why_unsupported
from lowering_helpers import assert_close, compile_fn, lower_and_run, to_numpy, trace
from undecomposed import lower_raw
from runtime_sim import BoundsError, Op

aten = torch.ops.aten
V, D, N = 300, 513, 130
G = torch.Generator().manual_seed(0)


def _exact(actual, expected, what=""):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    bad = actual != expected
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} of {expected.numel()} elements differ"


def _ran_scatter(program) -> int:
    return sum(1 for q in program.streams.values() for ins in q if ins.op is Op.DMA_SCATTER)


def table(dtype=torch.float32, rows=V):
    return (torch.randn(rows, D, generator=G) * 3).to(dtype)


def unique(n, bound, idt=torch.int64):
    return torch.randperm(bound, generator=G)[:n].to(idt)


def repeated(n, bound, idt=torch.int64):
    i = torch.randint(0, bound, (n,), generator=G)
    i[:3] = torch.tensor([0, bound - 1, 0])
    return i.to(idt)


DTYPES = [torch.float32, torch.bfloat16]
IDTS = [torch.int64, torch.int32]


# ---- index.Tensor ----------------------------------------------------------------------------
@pytest.mark.parametrize("idt", IDTS)
@pytest.mark.parametrize("case", ["rows", "columns", "2d_index", "negative"])
def test_index_tensor(case, idt):
    x = table()
    i = repeated(N, V, idt)
    if case == "negative":                       # -V .. -1 and 0 .. V-1 mixed
        i[::2] -= V
    fn = {"rows": lambda x, i: x[i], "columns": lambda x, i: x[:, i],
          "2d_index": lambda x, i: x[i.reshape(10, 13)], "negative": lambda x, i: x[i]}[case]
    low = lower_and_run(fn, x, i)
    _exact(low.outputs[0], fn(x, i), case)


# ---- index_put -------------------------------------------------------------------------------
@pytest.mark.parametrize("idt", IDTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put_overwrite(dtype, idt):
    x, v, i = table(dtype), table(dtype, N), unique(N, V, idt)
    fn = lambda x, i, v: x.index_put((i,), v)
    low = lower_and_run(fn, x, i, v)
    _exact(low.outputs[0], fn(x, i, v), "index_put")
    assert _ran_scatter(low.compiled.program) == -(-N // 128)   # one per tile of 128 lookups


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put_accumulate_with_duplicates(dtype):
    x, v, i = table(dtype), table(dtype, N), repeated(N, V)
    i[5:9] = 7                                               # the same row four times
    fn = lambda x, i, v: x.index_put((i,), v, accumulate=True)
    low = lower_and_run(fn, x, i, v)
    assert_close(low.outputs[0], fn(x, i, v), what="index_put accumulate")
    assert _ran_scatter(low.compiled.program) >= 1


def test_index_put_broadcast_values_negative_indices_and_a_column_index():
    x = table()
    fns = [(lambda x, i, v: x.index_put((i,), v[0], accumulate=True), repeated(N, V) - V),
           (lambda x, i, v: aten.index_put.default(x, [None, i], v[0, :N]), unique(N, D))]
    v = table(rows=N)
    for fn, i in fns:
        low = lower_and_run(fn, x, i, v)
        assert_close(low.outputs[0], fn(x, i, v))


# ---- scatter / scatter_add -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_rows_and_values(dtype):
    x, v = table(dtype), table(dtype, N)
    rows = unique(N, V).reshape(N, 1).expand(N, D).contiguous()
    cols = torch.stack([unique(40, D) for _ in range(N)])
    fns = [(lambda x, i, v: x.scatter(0, i, v), rows),
           (lambda x, i, v: x.scatter(1, i[:, :7], 3.5), cols),
           (lambda x, i, v: x.scatter(1, i, v[:, :40]), cols)]
    for k, (fn, i) in enumerate(fns):
        low = lower_and_run(fn, x, i, v)
        _exact(low.outputs[0], fn(x, i, v), f"scatter {k}")
        assert _ran_scatter(low.compiled.program) >= 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add(dtype):
    x, v = table(dtype), table(dtype, N)
    i = repeated(N * D, V).reshape(N, D)
    fn = lambda x, i, v: x.scatter_add(0, i, v)
    low = lower_and_run(fn, x, i, v)
    assert_close(low.outputs[0], fn(x, i, v), what="scatter_add")


# ---- slice / select scatter ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_and_select_scatter(dtype):
    x, v = table(dtype), table(dtype)
    fns = [lambda x, v: torch.slice_scatter(x, v[:, :200], 1, 5, 405, 2),
           lambda x, v: torch.slice_scatter(x, v[:170], 0, 130, 300),
           lambda x, v: aten.select_scatter(x, v[3], 0, -2),
           lambda x, v: aten.select_scatter(x, v[:, 3], 1, 512)]
    for k, fn in enumerate(fns):
        out, _ = lower_raw(fn, x, v)
        _exact(out[0], fn(x, v), f"view scatter {k}")
    low = lower_and_run(fns[0], x, v)                       # through the decompositions too
    _exact(low.outputs[0], fns[0](x, v), "slice_scatter")


# ---- embedding backward ----------------------------------------------------------------------
@pytest.mark.parametrize("padding_idx", [-1, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_dense_backward(dtype, padding_idx):
    g = table(dtype, N * 2).reshape(2, N, D)
    i = repeated(2 * N, V).reshape(2, N)
    i[0, :4] = 7
    fn = lambda g, i: aten.embedding_dense_backward(g, i, V, padding_idx, False)
    out, prog = lower_raw(fn, g, i)
    assert_close(out[0], fn(g, i), what="embedding_dense_backward")
    assert _ran_scatter(prog) >= 1


# ---- errors, fallbacks, tolerances -----------------------------------------------------------
def test_out_of_range_index_is_a_machine_error():
    """Traced with valid indices, run with one out of range (eager raises IndexError)."""
    x, v = table(), table(rows=N)
    i = unique(N, V)
    bad = i.clone()
    bad[100] = V + 5
    for fn, args in ((lambda x, i, v: x.index_put((i,), v, accumulate=True), (x, i, v)),
                     (lambda x, i, v: x.scatter_add(0, i.reshape(N, 1).expand(N, D), v), (x, i, v))):
        _, cg = compile_fn(fn, *args)
        with pytest.raises(BoundsError, match=f"index value {V + 5} .* bound \\[0, {V}\\)"):
            cg.run([to_numpy(a) for a in (x, bad, v)], mode="functional")


def _node(fn, *inputs, target):
    gm = trace(fn, *inputs)
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def test_unsupported_variants_fall_back_with_a_reason():
    x, i = table(), unique(N, V)
    x3 = torch.zeros(V, 3, V)
    r = why_unsupported(_node(lambda x, i: x[i, :, i], x3, i, target=aten.index.Tensor))
    assert "are not adjacent" in r
    r = why_unsupported(_node(lambda x, m: x[m], x, x[:, 0] > 0, target=aten.index.Tensor))
    assert "data-dependent number of elements" in r
    xi = torch.zeros(V, 4, dtype=torch.int64)
    r = why_unsupported(_node(lambda x, i: x.index_put((i,), torch.ones(N, 4, dtype=torch.int64),
                                                       accumulate=True), xi, i, target=aten.index_put.default))
    assert "accumulate into torch.int64" in r
    gm = make_fx(lambda g, i: aten.embedding_dense_backward(g, i, V, -1, True))(table(rows=N), i)
    n = next(n for n in gm.graph.nodes if n.target is aten.embedding_dense_backward.default)
    assert "scale_grad_by_freq=True" in why_unsupported(n)


def test_tolerances_can_fail():
    x, v, i = table(), table(rows=N), repeated(N, V)
    fn = lambda x, i, v: x.index_put((i,), v, accumulate=True)
    low = lower_and_run(fn, x, i, v)
    want = fn(x, i, v)
    assert_close(low.outputs[0], want)
    dropped = low.outputs[0].clone()
    dropped[i[-1]] -= v[-1]                                  # one lookup's contribution lost
    with pytest.raises(AssertionError):
        assert_close(dropped, want)
    xb, vb = x.bfloat16(), v.bfloat16()
    lowb = lower_and_run(fn, xb, i, vb)
    assert_close(lowb.outputs[0], fn(xb, i, vb))
    bad = lowb.outputs[0].clone()
    bad[i[-1]] = (bad[i[-1]].float() - vb[-1].float()).bfloat16()
    with pytest.raises(AssertionError):
        assert_close(bad, fn(xb, i, vb))


def test_user_indices_through_torch_compile_with_fallback_error():
    """Token ids passed in by the user feed index, index_put(accumulate) and scatter_add on the
    device; fallback='error' makes any fallback raise."""
    import neuron_compiler  # noqa: F401
    torch._dynamo.reset()

    def f(x, i, v):
        y = x.index_put((i,), v, accumulate=True)
        return y[i] * 2, y.scatter_add(0, i.reshape(N, 1).expand(N, D), v)

    x, v, i = table(), table(rows=N), repeated(N, V)
    cf = torch.compile(f, backend="neuron", options={"fallback": "error"})
    with neuron_compiler.profile() as prof:
        got = cf(x, i, v)
    for a, b in zip(got, f(x, i, v)):
        assert_close(a, b)
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 0, d
