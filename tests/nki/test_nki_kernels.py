"""The project's NKI kernels (kernels_v1: SDK 2.26 style, kernels_v2: newer style) against
numpy over shapes that cross the 128-partition and 512-element tile edges, on the simulator."""
import numpy as np
import pytest

from neuron_compiler import nki

import nki_kernels_v1 as v1
import nki_kernels_v2 as v2

STYLES = [pytest.param(v1, id="v1"), pytest.param(v2, id="v2")]
rng = np.random.default_rng(0)


def _rand(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize("k", STYLES)
@pytest.mark.parametrize("shape", [(128, 512), (129, 513), (200, 1100), (1, 7)])
def test_add_scale_spmd(k, shape):
    a, b = _rand(*shape), _rand(*shape)
    grid = (-(-shape[0] // 128), -(-shape[1] // 512))
    out = k.add_scale[grid](a, b)
    np.testing.assert_allclose(out, (a + b) * 2, rtol=1e-6)


@pytest.mark.parametrize("k", STYLES)
@pytest.mark.parametrize("shape", [(128, 128), (129, 300), (5, 12)])
def test_transpose(k, shape):
    a = _rand(*shape)
    np.testing.assert_array_equal(k.transpose(a), a.T)


@pytest.mark.parametrize("shape", [(128, 256), (200, 129)])
def test_transpose_tensor_engine(shape):
    a = _rand(*shape)
    np.testing.assert_array_equal(v2.transpose_pe(a), a.T)


@pytest.mark.parametrize("k", STYLES)
@pytest.mark.parametrize("kmn", [(128, 128, 512), (300, 200, 600), (129, 1, 513)])
def test_tiled_matmul(k, kmn):
    K, M, N = kmn
    lhsT, rhs = _rand(K, M), _rand(K, N)
    np.testing.assert_allclose(k.matmul(lhsT, rhs), lhsT.T.astype(np.float64) @ rhs, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("shape", [(128, 512), (130, 1030)])
def test_row_reductions(shape):
    a = _rand(*shape)
    s, m = v1.row_stats(a)
    np.testing.assert_allclose(s[:, 0], a.sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(m[:, 0], a.max(1))
    e = np.exp(a.astype(np.float64)).sum(1)
    out = v2.row_sum_exp(a)
    np.testing.assert_allclose(out[:, 0], e, rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], e, rtol=1e-5)


def test_wrong_kernel_fails():
    """A kernel that overwrites PSUM instead of accumulating runs, and the comparison with
    numpy catches it (the values come from executing the program, not from a reference)."""
    lhsT, rhs = _rand(256, 128), _rand(256, 512)
    out = v1.matmul_no_accumulate(lhsT, rhs)
    np.testing.assert_allclose(out, lhsT[128:].T @ rhs[128:], rtol=2e-4, atol=2e-4)  # what it does
    assert not np.allclose(out, lhsT.T @ rhs, rtol=1e-2, atol=1e-2)


def test_bf16_inputs_round_like_the_machine():
    a = _rand(128, 512).astype(nki.language.bfloat16)
    b = _rand(128, 512).astype(nki.language.bfloat16)
    out = v2.add_scale[1, 1](a, b)
    assert out.dtype == nki.language.bfloat16
    ref = ((a.astype(np.float32) + b.astype(np.float32)).astype(nki.language.bfloat16).astype(np.float32) * 2)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2)
