"""The project's own NKI kernels in the newer ``nki`` style: destinations first
(``nisa.dma_copy(dst=, src=)``, ``nisa.nc_matmul(dst=, stationary=, moving=)``,
``nisa.tensor_tensor(dst=...)``), tiles declared with ``nl.ndarray(..., buffer=...)``. Written
for these tests; shapes may cross the tile edges."""
import neuron_compiler.nki as nki
import neuron_compiler.nki.isa as nisa
import neuron_compiler.nki.language as nl
from nki_tiles import edges

P, F = 128, 512


@nki.jit
def add_scale(a, b):
    """``(a + b) * 2`` over a [rows/128, cols/512] SPMD grid, edge tiles sliced."""
    rows, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i0, j0 = nl.program_id(0) * P, nl.program_id(1) * F
    r, c = min(P, rows - i0), min(F, cols - j0)
    x = nl.ndarray((r, c), dtype=a.dtype, buffer=nl.sbuf)
    y = nl.ndarray((r, c), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a[i0:i0 + r, j0:j0 + c])
    nisa.dma_copy(dst=y, src=b[i0:i0 + r, j0:j0 + c])
    z = nl.ndarray((r, c), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
    nisa.tensor_scalar(dst=z, data=z, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out[i0:i0 + r, j0:j0 + c], src=z)
    return out


@nki.jit
def transpose(a):
    """``a.T`` through access patterns: each [<=128, <=128] block is read from HBM with its
    axes swapped (a strided DMA), no compute engine involved."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    for j0, c in edges(cols, P):
        t = nl.ndarray((c, rows), dtype=a.dtype, buffer=nl.sbuf)
        i_p = nl.arange(c)[:, None]
        i_f = nl.arange(rows)[None, :]
        nisa.dma_copy(dst=t[i_p, i_f], src=a[i_f, j0 + i_p])
        nisa.dma_copy(dst=out[j0:j0 + c, :], src=t)
    return out


@nki.jit
def transpose_pe(a):
    """``a.T`` by TensorE transposes into PSUM (nisa.nc_transpose(dst=...)), edges sliced."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    for i0, r in edges(rows, P):
        for j0, c in edges(cols, P):
            t = nl.ndarray((r, c), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i0:i0 + r, j0:j0 + c])
            tp = nl.ndarray((c, r), dtype=a.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp, data=t)
            ts = nl.ndarray((c, r), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=ts, src=tp)
            nisa.dma_copy(dst=out[j0:j0 + c, i0:i0 + r], src=ts)
    return out


@nki.jit
def matmul(lhsT, rhs):
    """``lhsT.T @ rhs``: nc_matmul(dst=psum) accumulates over K tiles (accumulate inferred)."""
    (K, M), N = lhsT.shape, rhs.shape[1]
    out = nl.ndarray(shape=(M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m0, mm in edges(M, P):
        for n0, nn in edges(N, F):
            acc = nl.ndarray((mm, nn), dtype=nl.float32, buffer=nl.psum)
            for k0, kk in edges(K, P):
                x = nl.ndarray((kk, mm), dtype=lhsT.dtype, buffer=nl.sbuf)
                y = nl.ndarray((kk, nn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=x, src=lhsT[k0:k0 + kk, m0:m0 + mm])
                nisa.dma_copy(dst=y, src=rhs[k0:k0 + kk, n0:n0 + nn])
                nisa.nc_matmul(dst=acc, stationary=x, moving=y)
            res = nl.ndarray((mm, nn), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m0:m0 + mm, n0:n0 + nn], src=res)
    return out


@nki.jit
def row_sum_exp(a):
    """Per row: ``sum(exp(a))`` -- ScalarE exp with its row reduction (activation reduce_res)
    per 512-column tile, partial sums added on VectorE, and the same via tensor_reduce."""
    rows, cols = a.shape
    out = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    for i0, r in edges(rows, P):
        acc = nl.ndarray((r, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for j0, c in edges(cols, F):
            t = nl.ndarray((r, c), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i0:i0 + r, j0:j0 + c])
            e = nl.ndarray((r, c), dtype=nl.float32, buffer=nl.sbuf)
            part = nl.ndarray((r, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=e, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=part)
            red = nl.ndarray((r, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=red, op=nl.add, data=e, axis=1)
            nisa.tensor_tensor(dst=acc[:, 0:1], data1=acc[:, 0:1], data2=part, op=nl.add)
            nisa.tensor_tensor(dst=acc[:, 1:2], data1=acc[:, 1:2], data2=red, op=nl.add)
        nisa.dma_copy(dst=out[i0:i0 + r, :], src=acc)
    return out
