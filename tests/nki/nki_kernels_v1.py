"""The project's own NKI kernels in the SDK 2.26 (``neuronxcc.nki``) style: values returned
by ``nl.*`` / ``nisa.*``, ``nl.arange`` index grids with masks at the tile edges, SPMD grids.
Written for these tests; every shape may cross the 128-partition / 512-element tile edges."""
import itertools

import neuron_compiler.nki as nki
import neuron_compiler.nki.isa as nisa
import neuron_compiler.nki.language as nl
from nki_tiles import edges

P, F = 128, 512


@nki.jit
def add_scale(a, b):
    """``(a + b) * 2`` over a [rows/128, cols/512] SPMD grid; program (i, j) does tile (i, j)."""
    rows, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.program_id(0) * P + nl.arange(P)[:, None]
    i_f = nl.program_id(1) * F + nl.arange(F)[None, :]
    inside = (i_p < rows) & (i_f < cols)
    x = nl.load(a[i_p, i_f], mask=inside)
    y = nl.load(b[i_p, i_f], mask=inside)
    z = nl.multiply(nl.add(x, y), 2.0)
    nl.store(out[i_p, i_f], value=z, mask=inside)
    return out


@nki.jit
def transpose(a):
    """``a.T`` by 128 x 128 TensorE transposes (nisa.nc_transpose), edges sliced."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    for (i0, r), (j0, c) in itertools.product(edges(rows, P), edges(cols, P)):
        tt = nisa.nc_transpose(nl.load(a[i0:i0 + r, j0:j0 + c]))
        nl.store(out[j0:j0 + c, i0:i0 + r], value=nl.copy(tt))
    return out


@nki.jit
def matmul(lhsT, rhs):
    """``lhsT.T @ rhs``: for each [128, 512] output tile, ``psum += nl.matmul(...)`` over K tiles."""
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for (m0, mm), (n0, nn) in itertools.product(edges(M, P), edges(N, F)):
        acc = nl.zeros((mm, nn), nl.float32, buffer=nl.psum)
        for k0, kk in edges(K, P):
            acc += nl.matmul(nl.load(lhsT[k0:k0 + kk, m0:m0 + mm]),
                             nl.load(rhs[k0:k0 + kk, n0:n0 + nn]), transpose_x=True)
        nl.store(out[m0:m0 + mm, n0:n0 + nn], value=nl.copy(acc))
    return out


@nki.jit
def row_stats(a):
    """Per row: ``sum`` and ``max`` over the free axis, in tiles of 128 rows x 512 columns."""
    rows, cols = a.shape
    s_out = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    m_out = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    for i0, r in edges(rows, P):
        s = nl.zeros((r, 1), nl.float32)
        m = nl.full((r, 1), -3.0e38, nl.float32)
        for j0, c in edges(cols, F):
            t = nl.load(a[i0:i0 + r, j0:j0 + c])
            s[...] = nl.add(s, nl.sum(t, axis=1, keepdims=True))
            m[...] = nl.maximum(m, nl.max(t, axis=1, keepdims=True))
        nl.store(s_out[i0:i0 + r, :], value=s)
        nl.store(m_out[i0:i0 + r, :], value=m)
    return s_out, m_out


@nki.jit
def matmul_no_accumulate(lhsT, rhs):
    """WRONG on purpose: every K tile overwrites the PSUM tile (only the last K tile counts)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(K // P):
        x = nl.load(lhsT[k * P:(k + 1) * P, :])
        y = nl.load(rhs[k * P:(k + 1) * P, :])
        acc[...] = nisa.nc_matmul(x, y)
    nl.store(out, value=nl.copy(acc))
    return out
