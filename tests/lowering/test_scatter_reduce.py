"""scatter_reduce (sum/prod/mean/amax/amin, include_self either way), the legacy
scatter(reduce=...), masked_scatter, index_put with a bool mask and native_group_norm_backward
against eager through the simulator, over sizes that cross the 128-partition and 512-element
tile edges, fp32 and bf16; through ``torch.compile`` with the ran-on-device assertion; the
fallback reasons of the variants that are not lowered; and a known-wrong result for each
tolerance used.
"""
from __future__ import annotations

import pytest
import torch

from lowering.api import why_unsupported
from lowering_helpers import assert_close as lh_assert_close
from lowering_helpers import check, compile_fn, lower_and_run, rand, to_numpy, trace
from undecomposed import lower_raw
from neuron_compiler.testing import assert_close, assert_matches_eager
from runtime_sim import BoundsError

aten = torch.ops.aten
F32, BF16 = torch.float32, torch.bfloat16
REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _index(shape, bound, seed):
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(0, bound, shape, generator=g)
    i.view(-1)[0] = bound - 1                  # the last target, and a repeat of it
    if i.numel() > 1:
        i.view(-1)[1] = bound - 1
    return i


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_scatter_reduce_rows(reduce, include_self, dtype):
    # 130 targets x 5 columns, 129 lookups per column (crosses 128 partitions), src wider than
    # the index on the non-scattered dim (torch reads only the index's extent)
    x, src = rand(130, 5, dtype=dtype, seed=1), rand(200, 6, dtype=dtype, seed=2, low=0.5, high=1.5)
    idx = _index((129, 4), 130, seed=3)
    fn = lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self)  # noqa: E731
    check(fn, x, idx, src, scale=4.0 if dtype is BF16 else 1.0)


@pytest.mark.parametrize("reduce", ["sum", "amax", "mean"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_scatter_reduce_last_dim_and_nan(reduce, dtype):
    x = rand(3, 513, dtype=dtype, seed=4)
    src = rand(3, 600, dtype=dtype, seed=5)
    src[1, 7] = float("nan")
    idx = _index((3, 600), 513, seed=6)
    check(lambda x, i, s: torch.scatter_reduce(x, 1, i, s, reduce), x, idx, src, scale=4.0)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_legacy_scatter_reduce(reduce):
    x, src = rand(129, 7, seed=7), rand(129, 7, seed=8)
    idx = _index((129, 7), 129, seed=9)
    check(lambda x, i, s: x.scatter(0, i, s, reduce=reduce), x, idx, src)
    check(lambda x, i: x.scatter(0, i, 1.5, reduce=reduce), x, idx)


def test_scatter_reduce_out_of_range_index_is_a_machine_error():
    """Traced with valid indices, run with one out of range (eager raises)."""
    x, src = rand(10, 3, seed=10), rand(4, 3, seed=11)
    idx = torch.tensor([[0, 1, 2], [3, 9, 4], [5, 6, 7], [8, 9, 0]])
    bad = idx.clone()
    bad[1, 1] = 10
    for reduce in ("amax", "sum"):
        _, cg = compile_fn(lambda x, i, s: x.scatter_reduce(0, i, s, reduce), x, idx, src)
        with pytest.raises(BoundsError, match="index value 10 .* bound \\[0, 10\\)"):
            cg.run([to_numpy(a) for a in (x, bad, src)], mode="functional")


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("mask_shape", [(129, 130), (130,), (129, 1)])
def test_masked_scatter(dtype, mask_shape):
    x = rand(129, 130, dtype=dtype, seed=12)
    g = torch.Generator().manual_seed(13)
    mask = torch.rand(mask_shape, generator=g) > 0.4
    src = rand(200, 130, dtype=dtype, seed=14)
    check(lambda x, m, s: x.masked_scatter(m, s), x, mask, src)


def test_masked_scatter_with_too_few_source_elements_is_a_machine_error():
    x, mask = rand(4, 4, seed=15), torch.ones(4, 4, dtype=torch.bool)
    few = mask.clone()
    few[0, 0] = False
    _, cg = compile_fn(lambda x, m, s: x.masked_scatter(m, s), x, few, rand(15, seed=16))
    with pytest.raises(BoundsError, match="index value 15 .* bound \\[0, 15\\)"):
        cg.run([to_numpy(a) for a in (x, mask, rand(15, seed=16))], mode="functional")


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("values", ["row", "rows", "scalar"])
def test_index_put_with_a_bool_mask(dtype, accumulate, values):
    x = rand(130, 513, dtype=dtype, seed=17)
    g = torch.Generator().manual_seed(18)
    mask = torch.rand(130, generator=g) > 0.5
    v = {"row": rand(513, dtype=dtype, seed=19),
         "rows": rand(int(mask.sum()), 513, dtype=dtype, seed=20),
         "scalar": torch.tensor(2.5, dtype=dtype)}[values]
    check(lambda x, m, v: torch.index_put(x, [m], v, accumulate), x, mask, v)


def test_index_put_with_a_full_mask_and_a_mask_after_a_slice():
    x = rand(129, 130, seed=21)
    g = torch.Generator().manual_seed(22)
    full, cols = torch.rand(129, 130, generator=g) > 0.5, torch.rand(130, generator=g) > 0.5
    check(lambda x, m, v: torch.index_put(x, [m], v), x, full, torch.tensor(-1.0))

    def put_cols(x, m, v):
        x = x.clone()
        x[:, m] = v
        return x
    assert_matches_eager(put_cols, x, cols, rand(129, 1, seed=23))


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("dims", [(2, 8, 5, 5, 4), (3, 6, 13, 11, 3), (130, 4, 3, 1, 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_backward(dtype, dims, affine):
    N, C, H, W, G = dims
    x, dy = rand(N, C, H, W, dtype=dtype, seed=24) * 2, rand(N, C, H, W, dtype=dtype, seed=25)
    wb = (rand(C, dtype=dtype, seed=26), rand(C, dtype=dtype, seed=27)) if affine else ()

    def fn(dy, x, *wb):
        w, b = wb if wb else (None, None)
        _, m, r = aten.native_group_norm(x, w, b, N, C, H * W, G, 1e-5)
        outs = aten.native_group_norm_backward(dy, x, m, r, w, N, C, H * W, G, [True, affine, affine])
        return tuple(o for o in outs if o is not None)

    # traced as written: the core decompositions (and the backend) would decompose the op
    args = (dy, x) + wb
    outs, prog = lower_raw(fn, *args)
    want = fn(*args)
    assert len(outs) == len(want)
    # grad_weight / grad_bias sum over N x HxW: bf16 at 4x the atol (as the layer norm test)
    for i, (o, e) in enumerate(zip(outs, want)):
        lh_assert_close(o, e, what=f"output {i}", scale=4.0 if dtype is BF16 and i else 1.0)
    tags = {ins.tag for q in prog.streams.values() for ins in q if ins.tag}
    assert any(t.split(":")[1] == "layer_norm_bwd" and "native_group_norm_backward" in t for t in tags)


def test_through_torch_compile_everything_runs_on_the_device():
    x, src = rand(130, 5, seed=28), rand(129, 5, seed=29)
    idx = _index((129, 5), 130, seed=30)
    for reduce in REDUCES:
        d = assert_matches_eager(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=False),
                                 x, idx, src)
        assert d["fallback_nodes"] == 0
    mask = torch.rand(130, 5) > 0.5
    assert_matches_eager(lambda x, m, s: x.masked_scatter(m, s), x, mask, rand(700, seed=31))

    def put(x, m, v):
        x = x.clone()
        x[m] = v
        return x
    assert_matches_eager(put, x, mask[:, 0], rand(5, seed=32))


def test_unsupported_variants_fall_back_with_a_reason():
    x, idx = torch.randn(10, 3), torch.zeros(4, 3, dtype=torch.int64)
    gm = trace(lambda x, i: x.to(torch.int64).scatter_reduce(0, i, i, "amax"), x, idx)
    node = next(n for n in gm.graph.nodes if n.target is aten.scatter_reduce.two)
    assert "torch.int64 result: the reductions run in fp32" in why_unsupported(node)
    gm = trace(lambda x, m: x[m], x, x > 0)
    node = next(n for n in gm.graph.nodes if n.target is aten.index.Tensor)
    assert "data-dependent number of elements" in why_unsupported(node)
    big_x, big_i = torch.randn(4096, 2), torch.zeros(2048, 2, dtype=torch.int64)
    with pytest.raises(Exception, match="dense .* tensor of .* elements"):
        lower_and_run(lambda x, i: x.scatter_reduce(0, i, x[:2048], "amin"), big_x, big_i)


def test_tolerances_can_fail():
    x, src = rand(130, 5, seed=33), rand(129, 5, seed=34, low=0.5, high=1.5)
    idx = _index((129, 5), 130, seed=35)
    want = x.scatter_reduce(0, idx, src, "sum", include_self=False)
    for wrong in (want * 0.5, torch.zeros_like(want), -want,
                  x.scatter_reduce(0, idx[:128], src, "sum", include_self=False)):  # a dropped tile
        with pytest.raises(AssertionError):
            assert_close(wrong, want)
        with pytest.raises(AssertionError):
            assert_close(wrong.to(BF16), want.to(BF16))
