"""Kernels that break a machine rule get the machine's own error (runtime_sim.errors), naming
the instruction or tile, the rule and the value, with a note pointing at the kernel's line."""
import numpy as np
import pytest

import neuron_compiler.nki.isa as nisa
import neuron_compiler.nki.language as nl
from neuron_compiler import nki
from runtime_sim.errors import CapacityError, OperandError, UninitializedReadError

A = np.ones((256, 1024), np.float32)


@nki.jit
def too_many_partitions(a):
    t = nl.load(a[0:256, 0:4])                         # 256 partitions: more than a tile has
    out = nl.ndarray((256, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@nki.jit
def psum_bigger_than_bank(a):
    acc = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)   # 4 KiB > one 2 KiB bank
    nisa.memset(dst=acc, value=0.0)
    return a


@nki.jit
def stationary_too_wide(a):
    x = nl.load(a[0:128, 0:256])
    acc = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=x, moving=x)    # M = 256 > 128 columns of the PE array
    return a


@nki.jit
def reads_unwritten(a):
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)     # never written
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.exp(t))
    return out


def _note(e) -> str:
    return "\n".join(getattr(e, "__notes__", []))


def test_partition_limit():
    with pytest.raises(CapacityError) as ei:
        too_many_partitions(A)
    msg = str(ei.value)
    assert "capacity" in msg and "256" in msg and "1 to 128 partitions" in msg
    assert "test_nki_errors.py:" in _note(ei.value) and "too_many_partitions" in _note(ei.value)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_psum_tile_larger_than_a_bank(target):
    if target == "trn3":       # NeuronCore-v4 matmuls span up to 8 banks: the tile is legal there
        nki.simulate(psum_bigger_than_bank, A, target=target)
        return
    with pytest.raises(CapacityError) as ei:
        nki.simulate(psum_bigger_than_bank, A, target=target)
    msg = str(ei.value)
    assert "4096 B per partition" in msg and "2048 B bank" in msg


def test_matmul_rule_names_the_instruction():
    with pytest.raises(OperandError) as ei:
        stationary_too_wide(A)
    msg = str(ei.value)
    assert msg.startswith("pe #0: matmul(")          # the instruction, as the compiler's errors
    assert "operands" in msg and "M=256 > 128" in msg
    assert "test_nki_errors.py:" in msg             # the instruction's tag is the kernel's line


def test_uninitialised_read_is_caught_by_the_simulator():
    with pytest.raises(UninitializedReadError) as ei:
        reads_unwritten(A)
    assert "activation" in str(ei.value) and "test_nki_errors.py:" in str(ei.value)


def test_unmasked_out_of_range_index():
    @nki.jit
    def oob(a):
        i_p = nl.arange(128)[:, None] + 200                # rows 200..327 of a 256-row tensor
        t = nl.load(a[i_p, nl.arange(4)[None, :]])
        return a

    with pytest.raises(IndexError, match=r"dimension 0 \(size 256\) indexed over \[200, 328\)"):
        oob(A)
