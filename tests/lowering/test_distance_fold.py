"""``_cdist_forward`` (both forms), ``_pdist_forward``, ``col2im`` and index / index_put with
several adjacent index tensors, against eager through the simulator over sizes that cross the
tile edges, fp32 and bf16 where eager supports them; ``torch.cdist`` / ``F.pdist`` / ``F.fold`` /
``x[:, i, j]`` through ``torch.compile`` with the ran-on-device assertion; a known-wrong result
for the tolerances used.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lowering_helpers import assert_close, check, compile_fn, rand, to_numpy
from neuron_compiler.testing import assert_matches_eager
from runtime_sim import BoundsError
from undecomposed import lower_raw

aten = torch.ops.aten
PS = [0.0, 1.0, 2.0, 3.0, math.inf]


@pytest.mark.parametrize("prm", [(5, 7, 3), (130, 129, 9), (20, 30, 513)])
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("mode", [None, 1, 2])
def test_cdist(prm, p, mode):
    P, R, M = prm
    a, b = rand(P, M, seed=1), rand(R, M, seed=2)
    check(lambda a, b: aten._cdist_forward(a, b, p, mode), a, b)


def test_cdist_through_torch_compile():
    a, b = rand(3, 130, 9, seed=3), rand(1, 129, 9, seed=4)
    # the matmul form reaches the backend already decomposed (aten::cdist calls
    # _euclidean_dist itself); the direct form as _cdist_forward
    assert assert_matches_eager(torch.cdist, a, b)["fallback_nodes"] == 0
    d = assert_matches_eager(lambda a, b: torch.cdist(a, b, p=1.0), a, b)
    assert d["fallback_nodes"] == 0
    assert any("aten._cdist_forward.default" in p["ops"] for p in d["partitions"])


@pytest.mark.parametrize("nm", [(2, 3), (5, 4), (129, 7), (40, 3)])
@pytest.mark.parametrize("p", PS + [1.5])
def test_pdist(nm, p):
    x = rand(*nm, seed=5)
    check(lambda x: aten._pdist_forward(x, p), x)


def test_pdist_through_torch_compile():
    assert assert_matches_eager(F.pdist, rand(30, 9, seed=6))["fallback_nodes"] == 0


FOLDS = [((1, 2, 5, 5), (2, 2), (1, 1), (0, 0), (1, 1)),
         ((2, 3, 9, 11), (3, 2), (2, 1), (1, 2), (2, 3)),
         ((2, 4, 13, 12), (3, 3), (1, 1), (1, 1), (1, 1))]


@pytest.mark.parametrize("case", FOLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_col2im(case, dtype):
    (N, C, H, W), k, d, p, s = case
    Lh = (H + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    Lw = (W + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    cols = rand(N, C * k[0] * k[1], Lh * Lw, seed=7, dtype=dtype)
    fn = lambda c: aten.col2im(c, [H, W], k, d, p, s)  # noqa: E731
    for c in (cols, cols[0]):                               # batched and unbatched
        outs, _ = lower_raw(fn, c)                          # core decompositions remove col2im
        assert_close(outs[0], fn(c), scale=2.0)


def test_fold_through_torch_compile_runs_on_the_device():
    # the backend keeps col2im whole (its kernel: tests/test_kernel_ops_kept.py)
    d = assert_matches_eager(lambda c: F.fold(c, (13, 12), 3, padding=1), rand(2, 36, 156, seed=8))
    assert d["fallback_nodes"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_and_index_put_with_adjacent_index_tensors(dtype):
    x = rand(2, 3, 9, 5, seed=9, dtype=dtype)
    g = torch.Generator().manual_seed(10)
    i, j = torch.randint(-9, 9, (129,), generator=g), torch.randint(0, 5, (129,), generator=g)
    check(lambda x, i, j: x[:, :, i, j], x, i, j)
    check(lambda x, i, j: x[:, i[:, None], j], rand(3, 9, 5, seed=9, dtype=dtype), i[:43], j[:7])
    v = rand(2, 3, 129, seed=11, dtype=dtype)
    check(lambda x, i, j, v: aten.index_put(x, [None, None, i, j], v, True), x, i, j, v, scale=2.0)


def test_an_index_out_of_its_own_dim_is_a_machine_error():
    """j = 5 would address x[i + 1, 0] in the merged dims: the flat index is -1 instead."""
    x = rand(9, 5, seed=12)
    i, j = torch.tensor([0, 1, 2]), torch.tensor([0, 4, 3])
    _, cg = compile_fn(lambda x, i, j: x[i, j], x, i, j)
    with pytest.raises(BoundsError, match="index value -1"):
        cg.run([to_numpy(a) for a in (x, i, torch.tensor([0, 5, 3]))], mode="functional")


def test_tolerances_can_fail():
    a, b = rand(130, 9, seed=13), rand(129, 9, seed=14)
    want = torch.cdist(a, b)
    for wrong in (want * 0.5, torch.cdist(a[:, :8], b[:, :8]), want.square()):
        with pytest.raises(AssertionError):
            assert_close(wrong, want)
