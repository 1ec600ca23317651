"""The project's own kernels for NKI's bn_stats / bn_aggr (both API styles) and the NeuronCore-v4
MX instructions (quantize_mx, nc_matmul_mx, x4 types, ``.ap(pattern=...)`` views). Written for
these tests; shapes may cross the tile edges."""
import neuron_compiler.nki as nki
import neuron_compiler.nki.isa as nisa
import neuron_compiler.nki.language as nl
from nki_tiles import edges

P, BN = 128, 512


@nki.jit
def mean_var_v1(x):
    """Row mean and variance [R, 2] (SDK 2.26 style): index grids, masks at both edges, the
    bn_stats of each <= 512-column piece side by side in one tile, one bn_aggr."""
    rows, cols = x.shape
    out = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    n = (cols + BN - 1) // BN
    ip, jf = nl.arange(P)[:, None], nl.arange(cols)[None, :]
    for t in nl.affine_range((rows + P - 1) // P):
        xt = nl.load(x[t * P + ip, jf], mask=t * P + ip < rows)
        stats = nl.ndarray((P, 6 * n), dtype=nl.float32)
        for j in nl.affine_range(n):
            f = nl.arange(BN)[None, :]
            stats[ip, j * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(
                xt[ip, j * BN + f], mask=j * BN + f < cols, dtype=nl.float32)
        mv = nisa.bn_aggr(stats[ip, nl.arange(6 * n)[None, :]])
        nl.store(out[t * P + ip, nl.arange(2)[None, :]], value=mv, mask=t * P + ip < rows)
    return out


@nki.jit
def mean_var_v2(x):
    """The same in the newer style: destinations first, edge tiles sliced."""
    rows, cols = x.shape
    out = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    n = (cols + BN - 1) // BN
    for r0, r in edges(rows, P):
        xt = nl.ndarray((r, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + r, :])
        stats = nl.ndarray((r, 6 * n), dtype=nl.float32, buffer=nl.sbuf)
        for k, (c0, c) in enumerate(edges(cols, BN)):
            nisa.bn_stats(dst=stats[:, 6 * k:6 * k + 6], data=xt[:, c0:c0 + c])
        mv = nl.ndarray((r, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        nisa.dma_copy(dst=out[r0:r0 + r, :], src=mv)
    return out


def _load_k_major(src, cols, wrong=False):
    """``src`` [512, cols] bf16 in HBM -> SBUF [128, cols, 4]: K row 128 j + p at (p, :, j) (a
    strided DMA); ``wrong`` puts row 4 p + j there instead (another K order than the other
    operand's: a wrong kernel)."""
    t = nl.ndarray((P, cols, 4), dtype=src.dtype, buffer=nl.sbuf)
    pat = [[4 * cols, P], [1, cols], [cols, 4]] if wrong else [[cols, P], [1, cols], [P * cols, 4]]
    nisa.dma_copy(dst=t, src=src.ap(pattern=pat, offset=0))
    return t.reshape((P, 4 * cols))


@nki.jit
def mx_matmul(a, b, mx_dtype, wrong=False):
    """``a.T @ b`` for bf16 a [512, M], b [512, N] (M <= 128 even, N <= 512) through MXFP8:
    both quantized on VectorE (quantize_mx), one MX matmul (K = 4 x 128) into fp32 PSUM."""
    M, N = a.shape[1], b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    aq = nl.ndarray((P, M), dtype=mx_dtype, buffer=nl.sbuf)
    bq = nl.ndarray((P, N), dtype=mx_dtype, buffer=nl.sbuf)
    a_s = nl.ndarray((P, M), dtype=nl.uint8, buffer=nl.sbuf)
    b_s = nl.ndarray((P, N), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    nisa.quantize_mx(dst=aq, src=_load_k_major(a, M), dst_scale=a_s)
    nisa.quantize_mx(dst=bq, src=_load_k_major(b, N, wrong), dst_scale=b_s)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=aq, moving=bq, stationary_scale=a_s, moving_scale=b_s)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def scatter_rows(x, q):
    """Rows 4q..4q+3 of x [16, F] (uint8) to partitions 32q.. of a tile and back to out[4, F]
    through ``.ap(pattern=, offset=)`` on both sides (the MX scale layout)."""
    f = x.shape[1]
    out = nl.ndarray((4, f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=x.ap(pattern=[[f, 4], [1, f]], offset=4 * q * f),
                  dst=t.ap(pattern=[[f, 4], [1, f]], offset=32 * q * f))
    nisa.dma_copy(dst=out, src=t[32 * q:32 * q + 4, :])
    return out
