"""Gathers on the device: ``aten.embedding`` and ``aten.gather`` against eager through the
simulator (functional mode), over lookup counts and row lengths that cross tile edges, both
table dtypes and both index dtypes, repeated and out-of-order indices; out-of-range indices raise
the machine's BoundsError; integer graph inputs feed indices and exact integer arithmetic.

Gathers copy bytes, so every comparison is exact (``_exact``): there is no tolerance to widen.
``test_a_wrong_lowering_fails`` proves the comparison catches a lowering that reads the
neighbouring row.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lowering.ops.indexing as indexing
from lowering.api import why_unsupported
from lowering.kir import TensorRef
from lowering_helpers import compile_fn, lower_and_run, to_numpy, trace, unsupported_nodes
from neuron_compiler.testing import assert_ran_on_device, compile_for_neuron, run_on_device
from runtime_sim import BoundsError

aten = torch.ops.aten
ROWS = (1, 127, 128, 129, 513)
DS = (1, 64, 768, 2049)


def _exact(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
        f"{what}: {actual.dtype}{tuple(actual.shape)} != {expected.dtype}{tuple(expected.shape)}"
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
    a, e = actual, expected
    if e.dtype in bits:
        a, e = a.view(bits[e.dtype]), e.view(bits[e.dtype])
    bad = a != e
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {e.numel()} elements differ, first at "
                                 f"{bad.nonzero()[0].tolist()}")


def run(fn, *inputs):
    """Lower ``fn`` (every node must be supported), run it on the simulator, compare exactly."""
    low = lower_and_run(fn, *inputs)
    want = fn(*inputs)
    _exact(low.outputs[0], want, "output")
    return low


def indices(n: int, V: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """``n`` lookups into ``[0, V)``: random with repeats, then the first ones again in reverse
    order, always including 0 and V-1."""
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(0, V, (n,), generator=g)
    if n >= 4:
        i[: n // 2] = i[: n // 2].flip(0)
        i[1], i[2], i[-1] = 0, V - 1, i[0]      # extremes and a repeat
    return i.to(dtype)


def table(V: int, D: int, dtype=torch.float32, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, D, generator=g) * 3).to(dtype)


def embed(w, i):
    return F.embedding(i, w)


# ---- embedding ------------------------------------------------------------------------------
@pytest.mark.parametrize("D", DS)
@pytest.mark.parametrize("n", ROWS)
def test_embedding_tile_edges(n, D):
    low = run(embed, table(300, D), indices(n, 300, torch.int64, seed=n))
    ops = [ins for q in low.compiled.program.streams.values() for ins in q]
    gathers = [i for i in ops if i.op.value == "dma_gather"]
    assert len(gathers) == -(-n // 128) * -(-D * 4 // indexing_chunk_bytes()), len(gathers)


def indexing_chunk_bytes() -> int:
    from lowering.tiling.gather import ROW_CHUNK_BYTES
    return ROW_CHUNK_BYTES


@pytest.mark.parametrize("tdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_embedding_dtypes(tdt, idt):
    run(embed, table(1000, 768, tdt), indices(129, 1000, idt))


def test_embedding_long_rows_in_chunks_and_any_index_shape():
    run(embed, table(50, 4097), indices(130, 50, torch.int64).reshape(2, 65))     # 2 row chunks
    run(embed, table(70, 33, torch.bfloat16), indices(2 * 3 * 43, 70, torch.int32).reshape(2, 3, 43))
    # a strided (transposed) index view and a 0-d index
    run(lambda w, i: F.embedding(i.t(), w), table(40, 16), indices(258, 40, torch.int64).reshape(129, 2))
    run(embed, table(9, 5), torch.tensor(7))


def test_embedding_integer_and_bool_tables_and_padding_idx():
    t = torch.randint(-2 ** 40, 2 ** 40, (20, 3))
    run(embed, t, indices(129, 20, torch.int64))
    run(embed, torch.rand(20, 3) > 0.5, indices(5, 20, torch.int64))
    # padding_idx only changes the backward: the forward still returns the padding row
    run(lambda w, i: F.embedding(i, w, padding_idx=3), table(10, 4), torch.tensor([3, 1, 3]))


def test_embedding_then_arithmetic_fuses_nothing_wrong():
    """GPT-2's prologue: token + position embeddings, then a scale."""
    def f(wte, wpe, ids):
        pos = torch.arange(ids.shape[-1]).unsqueeze(0)
        return (F.embedding(ids, wte) + F.embedding(pos, wpe)) * 0.5
    wte, wpe = table(500, 64, torch.bfloat16), table(200, 64, torch.bfloat16, seed=2)
    ids = indices(129, 500, torch.int64).reshape(1, 129)
    low = lower_and_run(f, wte, wpe, ids)
    want = f(wte, wpe, ids)
    _exact(low.outputs[0], want)


# ---- gather ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", (1, 127, 128, 129, 513))
def test_gather_last_dim(rows):
    x = table(rows, 70)
    g = torch.Generator().manual_seed(rows)
    idx = torch.randint(0, 70, (rows, 5), generator=g)
    idx[0, 0], idx[-1, -1] = 69, 0
    run(lambda x, i: torch.gather(x, 1, i), x, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_gather_dims_and_dtypes(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(300, 7, generator=g) * 100).to(dtype)
    run(lambda x, i: torch.gather(x, 0, i), x, torch.randint(0, 300, (513, 7), generator=g))
    y = (torch.randn(3, 129, 9, generator=g) * 100).to(dtype)
    run(lambda x, i: torch.gather(x, -1, i), y, torch.randint(0, 9, (3, 129, 4), generator=g))
    # index smaller than the input along the other dims
    run(lambda x, i: torch.gather(x, 1, i), y, torch.randint(0, 129, (2, 50, 3), generator=g))


def _index_select_on(dim):
    return lambda x, i: torch.index_select(x, dim, i)


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_index_select(idt):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 129, 10, generator=g).to(torch.bfloat16)
    for dim, k in ((0, 5), (1, 513), (-1, 7)):
        i = torch.randint(0, x.shape[dim], (k,), generator=g).to(idt)
        i[0] = x.shape[dim] - 1
        run(_index_select_on(dim), x, i)
    run(lambda x, i: torch.index_select(x.t(), 0, i), table(50, 129), torch.tensor([128, 0, 5, 5]).to(idt))


def test_bert_token_type_pattern():
    """transformers' BertEmbeddings: gather(expand(int64 buffer), 1, position ids slice), then the
    result indexes an embedding table (an index computed on the device feeding another gather)."""
    def f(tt_buf, pos_buf, w):
        tt = torch.gather(tt_buf.expand(1, -1), 1, pos_buf[:, :128])
        return F.embedding(tt.expand(1, 128), w)
    tt_buf = torch.randint(0, 2, (1, 512))
    pos_buf = torch.arange(512).flip(0).unsqueeze(0)
    run(f, tt_buf, pos_buf, table(2, 768))


# ---- errors ---------------------------------------------------------------------------------
def run_with(fn, compile_inputs, run_inputs):
    """Compile ``fn`` for ``compile_inputs`` (eager must accept them), run other values."""
    _, cg = compile_fn(fn, *compile_inputs)
    return cg.run([to_numpy(x) for x in run_inputs], mode="functional")


@pytest.mark.parametrize("bad", [300, -1, 2 ** 33])
def test_out_of_range_index_is_a_machine_error(bad):
    w, i = table(300, 64), indices(129, 300, torch.int64)
    j = i.clone()
    j[77] = bad
    with pytest.raises(BoundsError) as e:
        run_with(embed, (w, i), (w, j))
    msg = str(e.value)
    assert "dma_gather" in msg and "embedding" in msg, msg        # the instruction and its ATen op
    assert f"index value {bad}" in msg and "[0, 300)" in msg, msg   # the value and the bound
    run_with(embed, (w, i), (w, i))                                   # in range: runs
    with pytest.raises(BoundsError, match=r"index value 10 .*\[0, 10\)"):
        run_with(lambda x, i: torch.index_select(x, 1, i), (table(4, 10), torch.tensor([9, 1])),
                 (table(4, 10), torch.tensor([10, 1])))
    x, k = table(4, 9), torch.tensor([[0], [8], [1], [2]])
    with pytest.raises(BoundsError, match=r"index value 9 .*\[0, 9\)"):
        run_with(lambda x, k: torch.gather(x, 1, k), (x, k), (x, torch.tensor([[0], [9], [1], [2]])))


def test_a_wrong_lowering_fails(monkeypatch):
    """The exact comparison catches a lowering that reads the neighbouring row, for float,
    bf16 and integer tables (run once with a deliberately wrong table view)."""
    real = indexing.emit_gather

    def off_by_one_row(ctx, t: TensorRef, index, out_shape):
        a = index.rank
        shape = t.shape[:a] + (t.shape[a] - 1,) + t.shape[a + 1:]
        return real(ctx, TensorRef(t.buffer, t.dtype, shape, t.strides, t.offset + t.strides[a]), index, out_shape)
    monkeypatch.setattr(indexing, "emit_gather", off_by_one_row)
    i = torch.tensor([0, 3, 1, 3])
    for w in (table(10, 8), table(10, 8, torch.bfloat16), torch.randint(0, 1000, (10, 8))):
        with pytest.raises(AssertionError, match="elements differ"):
            run(embed, w, i)
    with pytest.raises(AssertionError, match="elements differ"):
        run(lambda x, j: torch.gather(x, 1, j), table(4, 9), torch.tensor([[0], [5], [1], [2]]))
    with pytest.raises(AssertionError, match="elements differ"):
        run(lambda x, j: torch.index_select(x, 0, j), table(9, 4), torch.tensor([0, 5, 1]))


# ---- integer graph inputs -------------------------------------------------------------------
def test_integer_graph_inputs_feed_indices_and_arithmetic():
    gm = trace(lambda w, i: F.embedding(i, w), table(10, 4), torch.tensor([1, 2]))
    assert not unsupported_nodes(gm)
    # arithmetic on a user integer, or on a value gathered from one: exact on the integer ALU
    run(lambda w, i: F.embedding(i + 1, w), table(10, 4), torch.tensor([1, 0, 8, 3]))
    i = torch.tensor([1, 0, 3, 2])
    run(lambda i: torch.gather(i.unsqueeze(0), 1, i.unsqueeze(0)) * 2, i)


def test_gather_and_embedding_reasons_name_the_constraint():
    gm = trace(lambda x, i: torch.gather(x, 0, i), table(4, 4), torch.tensor([[0, 1, 2, 3]]))
    node = next(n for n in gm.graph.nodes if n.target is aten.gather.default)
    assert why_unsupported(node) is None
    x64 = torch.ones(4, 4, dtype=torch.float64)
    gm = trace(lambda w, i: F.embedding(i, w), x64, torch.tensor([1]))
    node = next(n for n in gm.graph.nodes if n.target is aten.embedding.default)
    r = why_unsupported(node)
    assert r and "aten.embedding.default" in r and "float64" in r, r


def test_on_device_through_torch_compile_with_user_token_ids():
    """torch.compile with int32 and int64 token ids passed in by the user: no fallback."""
    wte, wpe = table(1000, 64), table(256, 64, seed=5)

    def f(ids, pos, x):
        return F.embedding(ids, wte) + F.embedding(pos, wpe) + torch.gather(x, 1, pos.long()).unsqueeze(-1)
    for idt in (torch.int64, torch.int32):
        torch._dynamo.reset()
        c = compile_for_neuron(f, options={"fallback": "error"})
        ids = indices(2 * 129, 1000, idt).reshape(2, 129)
        pos = torch.arange(129, dtype=idt).flip(0).expand(2, 129)
        x = table(2, 200)
        out, prof = run_on_device(c, ids, pos, x)
        d = assert_ran_on_device(prof)
        assert d["fallback_nodes"] == 0 and not d["fallbacks"], d["fallbacks"]
        ops = {op for p in d["partitions"] for op in p["ops"]}
        assert {"aten.embedding.default", "aten.gather.default"} <= ops, ops
        _exact(out, f(ids, pos, x))


# ---- golden text ----------------------------------------------------------------------------
def test_golden_kernel_and_tile_ir(request):
    """The GATHER kernel and its tile IR print stably (``tests/golden/lowering/gather/``; update
    with ``UPDATE_GOLDEN=1`` or ``--update-golden`` as test_golden.py explains)."""
    from test_golden import GOLDEN, _update_requested

    def f(w, ids, x, i):
        return F.embedding(ids, w), torch.gather(x, 1, i)
    g = torch.Generator().manual_seed(7)
    low = lower_and_run(f, table(300, 48, torch.bfloat16), indices(130, 300, torch.int32).reshape(2, 65),
                        table(3, 9), torch.randint(0, 9, (3, 4), generator=g))
    update = _update_requested(request.config)
    for name in ("ir_post_fusion.txt", "tir.txt"):
        actual = low.dumps[name].rstrip("\n") + "\n"
        path = GOLDEN / "gather" / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
        assert path.exists(), f"{path} is missing; run with UPDATE_GOLDEN=1"
        assert path.read_text() == actual, f"{path} differs from the current lowering"
