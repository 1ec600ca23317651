"""tensor_scalar_reduce, nc_matmul(is_transpose=True), and block placement: NKI's direct
allocation (ncc.sbuf/psum.mod_alloc, alloc(fn)) honoured, and the front end's modulo placement
of a PSUM tensor whose blocks do not fit."""
import numpy as np
import pytest

import neuron_compiler.nki.compiler as ncc
import neuron_compiler.nki.isa as nisa
import neuron_compiler.nki.language as nl
from neuron_compiler import nki
from neuron_compiler.nki.placement import StaleBlockError
from runtime_sim.errors import CapacityError

rng = np.random.default_rng(3)


@nki.jit
def scale_and_rowmax(x):
    """y = 3 x and m = max over each row of y (old API, returns a tile)."""
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    m = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    r = nisa.tensor_scalar_reduce(data=t, op0=nl.multiply, operand0=3.0, reduce_op=nl.max,
                                  reduce_res=mx)
    nl.store(y, value=r)
    nl.store(m, value=mx)
    return y, m


def test_tensor_scalar_reduce():
    x = rng.standard_normal((128, 300), dtype=np.float32)
    y, m = scale_and_rowmax(x)
    np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
    np.testing.assert_allclose(m[:, 0], (3 * x).max(axis=1), rtol=1e-6)


@nki.jit
def transpose_by_pe(a):
    """a [128, 128] transposed on TensorE: nc_matmul(a, identity, is_transpose=True)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ident = nl.shared_constant(np.identity(128, dtype=np.float32), dtype=a.dtype)
    i_sb = nl.load(ident)
    a_sb = nl.load(a)
    t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=t, stationary=a_sb, moving=i_sb, is_transpose=True)
    nl.store(out, value=nl.copy(t))
    return out


def test_transpose_mode_is_bit_accurate_on_v3_and_a_matmul_on_v2():
    a = rng.standard_normal((128, 128), dtype=np.float32)
    a[5, 9] = np.nan
    run = nki.simulate(transpose_by_pe, a, target="trn2")
    out = run.outputs[0]
    assert "transpose" in run.ops and "matmul" not in run.ops
    np.testing.assert_array_equal(np.isnan(out), np.isnan(a.T))       # only [9, 5] is NaN
    np.testing.assert_array_equal(np.nan_to_num(out), np.nan_to_num(a.T))
    run1 = nki.simulate(transpose_by_pe, a, target="trn1")             # no transpose mode
    assert "matmul" in run1.ops
    assert np.isnan(run1.outputs[0][9]).all()                          # NaN * 0 spreads


def _blocked_matmul(place_psum, place_sbuf=None, nblocks=4, slots_read_late=False, reread=False):
    @nki.jit
    def k(lhsT, rhs):
        """out[i] = lhsT.T @ rhs[:, i*512:(i+1)*512], one PSUM block per i."""
        out = nl.ndarray((128, nblocks * 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((nl.par_dim(128), 128), dtype=nl.float32, buffer=place_sbuf or nl.sbuf)
        x[...] = nl.load(lhsT)
        acc = nl.ndarray((nblocks, nl.par_dim(128), 512), dtype=nl.float32, buffer=place_psum)
        for i in nl.affine_range(nblocks):
            y = nl.load(rhs[:, i * 512:(i + 1) * 512])
            acc[i] = nisa.nc_matmul(x, y)
            if not slots_read_late:
                nl.store(out[:, i * 512:(i + 1) * 512], value=nl.copy(acc[i]))
        if slots_read_late:        # every block read after all were written
            for i in nl.affine_range(nblocks):
                nl.store(out[:, i * 512:(i + 1) * 512], value=nl.copy(acc[i]))
        if reread:                 # block 0 read a second time, long after its first read
            nl.store(out[:, 0:512], value=nl.copy(acc[0]))
        return out
    return k


def _operands(nblocks=4):
    lhsT = rng.standard_normal((128, 128), dtype=np.float32)
    rhs = rng.standard_normal((128, nblocks * 512), dtype=np.float32)
    return lhsT, rhs, lhsT.T @ rhs


def test_psum_and_sbuf_mod_alloc_are_honoured():
    lhsT, rhs, ref = _operands()
    k = _blocked_matmul(ncc.psum.mod_alloc(base_bank=5, num_bank_tiles=(2,)),
                        ncc.sbuf.mod_alloc(base_addr=4096))
    run = nki.simulate(k, lhsT, rhs)
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-4, atol=1e-4)
    placed = {(b.memory.value, b.offset, b.bytes_per_partition) for b in run.program.buffers}
    assert ("psum", 5 * 2048, 2 * 2048) in placed        # banks 5 and 6, blocks i % 2
    assert ("sbuf", 4096, 512) in placed


def test_alloc_with_a_function():
    lhsT, rhs, ref = _operands()

    def two_banks_reversed(idx, pdim_size, fdim_size):
        return (7 - idx[0] % 2, 0, 0)          # (bank, partition, byte in bank)

    out = _blocked_matmul(ncc.psum.alloc(two_banks_reversed))(lhsT, rhs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_placement_errors_name_the_tile_rule_and_value():
    lhsT, rhs, _ = _operands()
    with pytest.raises(CapacityError, match=r"block \[0\] at bank 8.*within one of the 8 banks"):
        _blocked_matmul(ncc.psum.mod_alloc(base_bank=8, num_bank_tiles=(2,)))(lhsT, rhs)
    with pytest.raises(CapacityError, match=r"byte 229000, 512 B per partition, beyond SBUF.s 229376 B"):
        _blocked_matmul(nl.psum, ncc.sbuf.mod_alloc(base_addr=229000))(lhsT, rhs)


def test_reading_a_block_whose_slot_was_reused_fails():
    lhsT, rhs, _ = _operands()
    k = _blocked_matmul(ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(2,)), slots_read_late=True)
    with pytest.raises(StaleBlockError, match=r"block \[0\] read after block \[2\] overwrote"):
        k(lhsT, rhs)


def test_psum_blocks_beyond_the_banks_are_placed_modulo():
    lhsT, rhs, ref = _operands(nblocks=12)      # 12 full banks > 8
    run = nki.simulate(_blocked_matmul(nl.psum, nblocks=12), lhsT, rhs)
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-4, atol=1e-4)
    assert not any(b.name.endswith(".spill") for b in run.program.buffers)   # read in time


def _spill_copies(run):
    spill = {b.name for b in run.program.buffers if b.name.endswith(".spill")}
    return [i for s in run.program.streams.values() for i in s
            if (i.dst is not None and i.dst.buffer in spill) or any(a.buffer in spill for a in i.srcs)]


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_front_end_placed_blocks_read_late_are_spilled_and_refilled(target):
    """Every block read after all 12 were written: the front end's slots are a cache, each
    evicted block is copied to SBUF and back (never a stale value, never an error)."""
    lhsT, rhs, ref = _operands(nblocks=12)
    run = nki.simulate(_blocked_matmul(nl.psum, nblocks=12, slots_read_late=True), lhsT, rhs,
                       target=target)
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-4, atol=1e-4)
    copies = _spill_copies(run)
    assert copies and all(i.op.value == "tensor_copy" for i in copies)


def test_a_block_read_again_after_its_slot_was_reused_fails():
    """A block already read is not kept when evicted: a second read is the StaleBlockError."""
    lhsT, rhs, _ = _operands(nblocks=12)
    with pytest.raises(StaleBlockError, match=r"block \[0\] read after block \[\d+\] overwrote"):
        _blocked_matmul(nl.psum, nblocks=12, reread=True)(lhsT, rhs)


def test_spilled_blocks_go_to_hbm_when_sbuf_would_be_crowded():
    """48 full-bank blocks (96 KiB per partition, over a quarter of SBUF): spilled through an
    SBUF staging tile to an HBM tensor, values intact."""
    lhsT, rhs, ref = _operands(nblocks=48)
    run = nki.simulate(_blocked_matmul(nl.psum, nblocks=48, slots_read_late=True), lhsT, rhs)
    np.testing.assert_allclose(run.outputs[0], ref, rtol=1e-4, atol=1e-4)
    spill = [b for b in run.program.buffers if b.name.endswith(".spill")]
    assert spill and spill[0].memory.value == "hbm"
    assert any(i.op.value == "dma_copy" for i in _spill_copies(run))


def _per_iteration_psum(keep_first: bool):
    @nki.jit
    def k(lhsT, rhs):
        """Each iteration declares a 5-bank PSUM tensor (two do not fit in 8 banks)."""
        out = nl.ndarray((128, 3 * 5 * 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(lhsT)
        first = None
        for it in nl.sequential_range(3):
            acc = nl.ndarray((5, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
            first = acc if first is None and keep_first else first
            for i in nl.affine_range(5):
                c = (it * 5 + i) * 512
                acc[i] = nisa.nc_matmul(x, nl.load(rhs[:, c:c + 512]))
                src = first[i] if first is not None and it == 1 else acc[i]
                nl.store(out[:, c:c + 512], value=nl.copy(src))
        return out
    return k


def test_tiles_of_earlier_iterations_are_reclaimed_when_memory_is_short():
    lhsT, rhs, ref = _operands(nblocks=15)
    np.testing.assert_allclose(_per_iteration_psum(False)(lhsT, rhs), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(CapacityError, match=r"used after a later declaration at that line"):
        _per_iteration_psum(True)(lhsT, rhs)


@nki.jit
def _psum_hog(a, b):
    """A PSUM tensor of 32 [128, 128] fp32 blocks (all 8 banks), then two more bank-sized
    matmul results: attn_fwd_v8a / v11's shape at s4096."""
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    tot = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    t = nl.ndarray((32, nl.par_dim(128), 128), dtype=nl.float32, buffer=nl.psum)
    acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(32):
        t[i] = nisa.nc_matmul(x, x)
        acc[...] = nl.add(acc, t[i])
    big = nl.ndarray((2, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for j in nl.affine_range(2):
        big[j] = nisa.nc_matmul(x, y)
    nl.store(out, value=nl.add(big[0], big[1]))
    nl.store(tot, value=acc)
    return out, tot


def test_psum_tensor_of_blocks_never_takes_every_free_bank():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((128, 128), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
    out, tot = nki.simulate(_psum_hog, a, b).outputs
    np.testing.assert_allclose(out, 2 * a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tot, 32 * a.T.astype(np.float64) @ a, rtol=1e-4, atol=1e-2)
