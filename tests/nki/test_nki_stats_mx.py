"""bn_stats / bn_aggr in NKI's layout (both API styles, rows and columns crossing the tile
edges) and the NeuronCore-v4 MX instructions with the project's own kernels, against numpy;
wrong kernels fail; MX on trn2 is refused naming the instruction and the rule."""
import ml_dtypes
import numpy as np
import pytest

from neuron_compiler import nki
import neuron_compiler.nki.language as nl
import nki_kernels_stats_mx as K

rng = np.random.default_rng(3)


@pytest.mark.parametrize("kernel", [K.mean_var_v1, K.mean_var_v2], ids=["v1", "v2"])
@pytest.mark.parametrize("shape", [(128, 512), (129, 513), (300, 1000), (5, 7), (200, 1)])
def test_bn_stats_mean_var(kernel, shape):
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    got = kernel(x)
    np.testing.assert_allclose(got[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 1], x.astype(np.float64).var(1), rtol=1e-4, atol=1e-6)


def _quantize(x: np.ndarray, dt) -> np.ndarray:
    """nki.isa.quantize_mx as documented, on [P, F, 4] groups of 8 partitions x 4 values:
    X = 2^(floor(log2 amax) - (E_max - 1)), values RNE to fp8 / X; returns the dequantized values."""
    emax = {ml_dtypes.float8_e4m3fn: 8, ml_dtypes.float8_e5m2: 15}[dt]
    p, f, _ = x.shape
    g = np.abs(x.reshape(p // 8, 8, f, 4)).max(axis=(1, 3))
    e = np.floor(np.log2(np.where(g == 0, 1.0, g))) - (emax - 1)
    s = np.repeat(np.where(g == 0, 2.0 ** -127, 2.0 ** e), 8, axis=0)[:, :, None]
    q = (x / s).astype(np.float32)
    if dt == ml_dtypes.float8_e4m3fn:
        q = np.clip(q, -448, 448)
    return q.astype(dt).astype(np.float64) * s


def _mx_ref(a, b, dt):
    k_major = lambda t: t.astype(np.float64).reshape(4, 128, -1).transpose(1, 2, 0)   # [p, F, j]
    return np.einsum("pmj,pnj->mn", _quantize(k_major(a), dt), _quantize(k_major(b), dt))


@pytest.mark.parametrize("dt,name", [(ml_dtypes.float8_e4m3fn, "float8_e4m3fn_x4"),
                                     (ml_dtypes.float8_e5m2, "float8_e5m2_x4")])
@pytest.mark.parametrize("mn", [(128, 512), (32, 100)])
def test_mx_matmul_own_kernel(dt, name, mn):
    M, N = mn
    a = rng.standard_normal((512, M)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((512, N)).astype(ml_dtypes.bfloat16)
    run = nki.simulate(K.mx_matmul, a, b, getattr(nl, name), target="trn3")
    ref = _mx_ref(a, b, dt)
    tol = 4 * 512 * 2.0 ** -24 * np.abs(ref).max()
    np.testing.assert_allclose(run.outputs[0], ref, rtol=0, atol=tol)
    exact = a.astype(np.float64).T @ b.astype(np.float64)             # quantization error: large
    assert not np.allclose(run.outputs[0], exact, rtol=0, atol=tol)
    wrong = nki.simulate(K.mx_matmul, a, b, getattr(nl, name), True, target="trn3").outputs[0]
    assert not np.allclose(wrong, ref, rtol=0, atol=100 * tol)


def test_mx_on_trn2_names_the_instruction_and_the_rule():
    a = np.ones((512, 32), ml_dtypes.bfloat16)
    with pytest.raises(Exception, match=r"(?s)quantize_mx.*not available on trn2 \(NeuronCore-v3\).*"
                                        r"nki_kernels_stats_mx.py:\d+"):
        nki.simulate(K.mx_matmul, a, a, nl.float8_e5m2_x4, target="trn2")


def test_ap_pattern_views_move_rows_to_quadrants_and_check_bounds():
    x = rng.integers(0, 255, (16, 24)).astype(np.uint8)
    for q in range(4):
        np.testing.assert_array_equal(K.scatter_rows(x, q), x[4 * q:4 * q + 4])
    with pytest.raises(IndexError, match=r"reaches element 479 of 384"):
        K.scatter_rows(x, 4)


def test_ap_reinterprets_bytes_and_checks_the_partition_step():
    @nki.jit
    def as_x4(w):                         # uint32 [128, 8] -> the same bytes as x4 fp8 and back
        out = nl.ndarray((128, 8), dtype=w.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        nki.isa.dma_copy(dst=t, src=w.ap(dtype=nl.float8_e5m2_x4, pattern=[[8, 128], [1, 8]], offset=0))
        nki.isa.dma_copy(dst=out.ap(dtype=nl.float8_e5m2_x4, pattern=[[8, 128], [1, 8]]), src=t)
        return out

    w = rng.integers(0, 2 ** 32, (128, 8), dtype=np.uint64).astype(np.uint32)
    np.testing.assert_array_equal(as_x4(w), w)

    @nki.jit
    def bad_step(w):
        t = nl.ndarray((128, 8), dtype=w.dtype, buffer=nl.sbuf)
        return t.ap(pattern=[[16, 64], [1, 8]])
    with pytest.raises(ValueError, match=r"partition dimension; its step must be one partition \(8 elements\), got 16"):
        bad_step(w)


@nki.jit
def _bn_stats_too_wide(x):
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    st = nki.isa.bn_stats(nl.load(x), dtype=nl.float32)
    nl.store(out, value=nki.isa.bn_aggr(st))
    return out


def test_bn_stats_over_512_elements_names_the_instruction_rule_and_value():
    with pytest.raises(Exception, match=r"(?s)bn_stats\(layout=nki6\).*\[1,600\].*bn_stats free size must be "
                                        r"<= 512, got 600"):
        _bn_stats_too_wide(np.ones((128, 600), np.float32))
