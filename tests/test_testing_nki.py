"""``neuron_compiler.testing.check_kernel``: an NKI kernel against its numpy reference over
hypothesis-drawn shapes that cross the tile edges. Correct kernels pass and are timed; kernels
that are wrong only past a tile edge (a dropped partial tile, a matmul that overwrites its PSUM
accumulator instead of accumulating over K) fail, with the shapes that show it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from neuron_compiler import nki
from neuron_compiler.nki import isa as nisa
from neuron_compiler.nki import language as nl
from neuron_compiler.testing import TILE_EDGES, check_kernel, kernel_shapes


@nki.jit
def add_scale(a, b):                     # SPMD over 128 x 512 tiles, masked at the edges
    rows, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    i_f = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    inside = (i_p < rows) & (i_f < cols)
    x = nl.load(a[i_p, i_f], mask=inside)
    y = nl.load(b[i_p, i_f], mask=inside)
    nl.store(out[i_p, i_f], value=(x + y) * 2.0, mask=inside)
    return out


def _grid(sa, sb):
    return (-(-sa[0] // 128), -(-sa[1] // 512))


def _grid_floor(sa, sb):                 # the bug: drops the last partial row tile
    return (max(1, sa[0] // 128), -(-sa[1] // 512))


def _edges(n, t):
    return [(i, min(t, n - i)) for i in range(0, n, t)]


def _matmul(accumulate: bool):
    @nki.jit
    def matmul(lhsT, rhs):                # [K, M] x [K, N], any sizes: partial tiles at the edges
        K, M = lhsT.shape
        N = rhs.shape[1]
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        for m0, mm in _edges(M, 128):
            for n0, nn in _edges(N, 512):
                acc = nl.zeros((mm, nn), nl.float32, buffer=nl.psum)
                for k0, kk in _edges(K, 128):
                    p = nl.matmul(nl.load(lhsT[k0:k0 + kk, m0:m0 + mm]),
                                  nl.load(rhs[k0:k0 + kk, n0:n0 + nn]), transpose_x=True)
                    if accumulate:
                        acc += p
                    else:                 # the bug: each K tile overwrites the accumulator
                        acc[...] = p
                nl.store(out[m0:m0 + mm, n0:n0 + nn], value=nl.copy(acc))
        return out
    return matmul


def _mm_ref(lhsT, rhs):
    return lhsT.T.astype(np.float64) @ rhs


def test_a_correct_spmd_kernel_passes_and_is_timed():
    runs = check_kernel(add_scale, lambda a, b: (a.astype(np.float64) + b) * 2,
                        [("P", "F"), ("P", "F")], grid=_grid, max_examples=8,
                        dims={"P": [1, 127, 128, 129, 257], "F": [1, 511, 512, 513]})
    assert len(runs) >= 4
    assert all(r["time_us"] > 0 for r in runs)
    assert any(r["shapes"][0][0] > 128 for r in runs)      # past the partition edge


def test_a_kernel_wrong_past_a_tile_edge_fails():
    with pytest.raises(AssertionError, match=r"kernel add_scale on shapes \[\(129, "):
        check_kernel(add_scale, lambda a, b: (a.astype(np.float64) + b) * 2,
                     [("P", "F"), ("P", "F")], grid=_grid_floor, max_examples=20,
                     dims={"P": [1, 128, 129, 257], "F": [1, 512]})


def test_matmul_over_tile_edges_and_a_non_accumulating_one_fails():
    shapes = kernel_shapes(("K", "M"), ("K", "N"), dims={"K": [1, 128, 129], "M": [1, 129],
                                                          "N": [1, 513]})
    runs = check_kernel(_matmul(True), _mm_ref, shapes, max_examples=6, rtol=1e-4, atol=1e-4)
    assert any(r["shapes"][0][0] == 129 for r in runs)
    with pytest.raises(AssertionError, match="out of tolerance"):
        check_kernel(_matmul(False), _mm_ref, shapes, max_examples=10, rtol=1e-4, atol=1e-4)


def test_explicit_shapes_dtypes_and_out_args():
    @nki.jit
    def scale_into(x, out):               # older style: the output is a parameter
        rows, cols = x.shape
        for i in nl.affine_range((rows + 127) // 128):
            ip = i * 128 + nl.arange(128)[:, None]
            jf = nl.arange(cols)[None, :]
            t = nl.load(x[ip, jf], mask=ip < rows)
            nl.store(out[ip, jf], value=nl.multiply(t, 3.0), mask=ip < rows)

    runs = check_kernel(scale_into, lambda x, out: x.astype(np.float64) * 3,
                        [((200, 64), (200, 64)), ((1, 3), (1, 3))],
                        dtypes=[(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)],
                        out_args=(1,), max_examples=6)
    assert {r["dtypes"][0] for r in runs} <= {"torch.float32", "torch.bfloat16"}
    with pytest.raises(AssertionError, match="out of tolerance"):
        check_kernel(scale_into, lambda x, out: x.astype(np.float64) * 2, [((200, 64), (200, 64))],
                     out_args=(1,), max_examples=3)


def test_kernel_shapes_draws_shared_dims_on_the_tile_edges():
    from hypothesis import given, settings

    seen = []

    @settings(max_examples=30, derandomize=True, deadline=None)
    @given(kernel_shapes(("K", "M"), ("K", 7)))
    def draw(shp):
        (k1, m), (k2, seven) = shp
        assert k1 == k2 and seven == 7
        seen.append(k1)

    draw()
    assert any(k in TILE_EDGES for k in seen)


def test_isa_style_kernel():
    @nki.jit
    def exp_rows(x):                      # newer API: destinations first; one tile of rows
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.exp, data=t)
        nisa.dma_copy(dst=out, src=r)
        return out

    check_kernel(exp_rows, lambda x: np.exp(x.astype(np.float64)),
                 kernel_shapes(("P", "F"), dims={"P": [1, 127, 128], "F": [1, 512, 513]}),
                 max_examples=5, rtol=1e-5)
