"""Language details public kernels rely on: ``nl.spmd_dim`` sizes, ``nl.mgrid``'s ``.p``/``.x``,
a jitted kernel called from inside another (inlined), and a masked partial row tile computed
against a whole 128-partition tile (NKI computes all partitions; the masked ones are never
stored)."""
import numpy as np

from neuron_compiler import nki
import neuron_compiler.nki.language as nl

rng = np.random.default_rng(3)


def test_spmd_dim_is_the_product_of_its_dims():
    assert int(nl.spmd_dim(2, nl.nc(2))) == 4
    assert int(nl.spmd_dim(nl.nc(2), 3)) == 6

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ip = nl.program_id(0) * 128 + nl.arange(128)[:, None]
        jf = nl.program_id(1) * 512 + nl.arange(512)[None, :]
        nl.store(out[ip, jf], value=nl.load(a[ip, jf]) + nl.load(b[ip, jf]))
        return out

    a, b = rng.random((512, 1024), dtype=np.float32), rng.random((512, 1024), dtype=np.float32)
    np.testing.assert_array_equal(add[nl.spmd_dim(2, nl.nc(2)), 2](a, b), a + b)


def test_mgrid_names_its_axes():
    @nki.jit
    def copy(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        g = nl.mgrid[0:128, 0:64]
        ip, jf = g
        assert ip is g.p and jf is g.x
        nl.store(out[g.p, g.x], value=nl.load(a[g.p, g.x]))
        return out

    a = rng.random((128, 64), dtype=np.float32)
    np.testing.assert_array_equal(copy(a), a)


@nki.jit
def _scale_tile(t, out_tile):              # a sub-kernel: tiles in, writes its output tile
    out_tile[...] = nl.multiply(t, 3.0)


def test_a_jitted_kernel_called_from_a_kernel_is_inlined():
    @nki.jit
    def outer(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        _scale_tile(t, r)
        nl.store(out, value=r)
        return out

    a = rng.random((128, 32), dtype=np.float32)
    run = nki.simulate(outer, a)
    np.testing.assert_allclose(run.outputs[0], a * 3, rtol=1e-6)
    assert len(run.program.inputs) == 1              # one program: the sub-kernel was inlined


def test_a_masked_partial_tile_against_a_whole_tile():
    @nki.jit
    def scale_rows(a, w):                  # out = a * w (w one row, broadcast to 128 partitions)
        rows, cols = a.shape
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        jf = nl.arange(cols)[None, :]
        wb = nl.load(w.reshape((1, cols))[nl.arange(1)[:, None], jf]).broadcast_to((128, cols))
        for i in nl.affine_range((rows + 127) // 128):
            t = nl.load(a[i * 128 + ip, jf], mask=(i * 128 + ip < rows))
            y = nl.exp(t) * wb             # no mask here: t has 44 rows in the last tile, wb 128
            nl.store(out[i * 128 + ip, jf], value=y, mask=(i * 128 + ip < rows))
        return out

    a, w = rng.random((300, 96), dtype=np.float32), rng.random(96, dtype=np.float32)
    np.testing.assert_allclose(scale_rows(a, w), np.exp(a) * w, rtol=1e-5)
