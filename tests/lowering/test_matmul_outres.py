"""Matmuls whose output block stays in SBUF (``resident="C"``, tiling/matmul/outres.py): both
operands stream in chunks of K, every cell adds its chunk's PSUM partial into an fp32
accumulator. Forced onto shapes that cross every tile edge (M, N, K not multiples of 128 / 512,
a partial last chunk), with each operand form, against eager."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import lowering.tiling.matmul.kernel as mm
from lowering.tiling.matmul import plan as matmul_plan
from lowering_helpers import assert_close, lower_and_run


def _force_outres(monkeypatch, block: int, group: int, kacc: int) -> None:
    """choose_blocking returns the resident="C" candidate (block, group, kacc)."""
    orig = matmul_plan.choose_blocking

    def choose(s, t):
        best, scored = orig(s, t)
        c = matmul_plan.Blocking("C", block, group, 1, 4, kacc=kacc)
        est, det = matmul_plan.estimate(s, c, t, matmul_plan._Probe(s, t))
        return replace(c, est_ns=est, detail=det), [c] + scored
    monkeypatch.setattr(mm, "choose_blocking", choose)


def _notes(low) -> str:
    return "\n".join(ln for ln in low.dumps["tir.txt"].splitlines() if ln.startswith("# "))


CASES = [  # (M, K, N, dtype, target, block, group, kacc)
    (300, 600, 700, torch.bfloat16, "trn2", 3, 2, 4),    # A by DMA transpose; partial everything
    (300, 600, 700, torch.float32, "trn2", 2, 2, 2),     # fp32: A by TensorE transposes
    (257, 1100, 520, torch.bfloat16, "trn1", 2, 1, 4),   # trn1: TensorE transposes, staged rows
    (200, 2200, 600, torch.bfloat16, "trn1", 2, 2, 4),   # 5 chunks: first, a pair loop, last
    (130, 1700, 1100, torch.float32, "trn2", 2, 3, 2),   # 7 chunks: pairs, a single, partial last
    (129, 1025, 600, torch.bfloat16, "trn1", 2, 2, 4),   # a 1-row m-tile, a last chunk of 1 column
    # rows of four n-blocks (a pair loop, a partial one): the chunk order alternates, each block
    # starting from its predecessor's A^T (four chunks, the first of a reversed block partial)
    (300, 1900, 2000, torch.bfloat16, "trn1", 2, 1, 4),
    (300, 1900, 2000, torch.bfloat16, "trn2", 2, 1, 4),  # the same with A by DMA transposes
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{str(c[3])[6:]}-{c[4]}")
def test_output_resident_matmul_matches_eager(monkeypatch, case):
    M, K, N, dt, target, block, group, kacc = case
    _force_outres(monkeypatch, block, group, kacc)
    g = torch.Generator().manual_seed(M + K + N)
    a, b = torch.randn(M, K, generator=g).to(dt), torch.randn(K, N, generator=g).to(dt)
    low = lower_and_run(torch.mm, a, b, target=target)
    assert "resident=C" in _notes(low), _notes(low)
    # (scale 1: a dropped chunk of 512 products, ~sqrt(512) per element, must fail)
    assert_close(low.outputs[0], torch.mm(a, b))


EPILOGUE_CASES = [  # (M, K, N, target, block, group, seed, scale)
    (200, 640, 600, "trn2", 2, 2, 5, 640 ** 0.5),
    # the alternating chunk order: four chunks, rows of three n-blocks, A by TensorE transposes
    (260, 1900, 1400, "trn1", 2, 1, 11, 1.0),
]


@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}")
def test_output_resident_linear_with_epilogue_and_batch(monkeypatch, case):
    """A linear layer's epilogue (bias, GELU) reads the SBUF accumulators; batch axes loop
    outside the blocks. (A row bias folds into PSUM only in the PSUM forms: here the bias is a
    full-shape add after a bmm, so the epilogue takes it.)"""
    M, K, N, target, block, group, seed, scale = case
    _force_outres(monkeypatch, block, group, 4)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(K, N, generator=g).to(torch.bfloat16)
    r = torch.randn(2, M, N, generator=g).to(torch.bfloat16)

    def fn(x, w, r):
        return F.gelu(torch.matmul(x, w) + r)
    low = lower_and_run(fn, x, w, r, target=target)
    assert "resident=C" in _notes(low), _notes(low)
    assert_close(low.outputs[0], fn(x, w, r), scale=scale)


def test_the_tolerance_catches_a_dropped_chunk(monkeypatch):
    """The comparison above can fail: without the last chunk's adds the result is wrong."""
    _force_outres(monkeypatch, 2, 1, 4)
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(256, 640, generator=g).to(torch.bfloat16), torch.randn(640, 512, generator=g).to(torch.bfloat16)
    low = lower_and_run(torch.mm, a, b)
    dropped = torch.mm(a[:, :512], b[:512])          # every chunk but the last (K tiles 4..5)
    with pytest.raises(AssertionError):
        assert_close(dropped, torch.mm(a, b), scale=640 ** 0.5)
    assert_close(low.outputs[0], torch.mm(a, b), scale=640 ** 0.5)


def test_output_resident_blocking_is_chosen_where_psum_limits_the_block():
    """trn1 (slow DMA, no DMA transpose): the NKI tutorial's mm keeps the output block in SBUF;
    a small linear keeps its PSUM form."""
    from runtime_sim.isa import DType
    from runtime_sim.targets import get_target
    t = get_target("trn1")
    big = matmul_plan.MatmulShape(1, 4096, 8192, 8192, DType.BF16, DType.BF16, matmul_plan.PE_T,
                                  matmul_plan.DIRECT, (), 1)
    small = replace(big, M=128, K=768, N=3072)
    assert matmul_plan.choose_blocking(big, t)[0].resident == "C"
    assert matmul_plan.choose_blocking(small, t)[0].resident != "C"
    assert all(c.resident != "C" for c in matmul_plan.candidates(replace(big, no_outres=True), t))


def test_output_resident_cells_take_every_psum_bank(monkeypatch):
    """One n-tile per block (group=1): the m-tile loop unrolls enough m-tiles that consecutive
    cells take different PSUM banks (on one bank every product waits for the previous cell's
    add)."""
    import re
    _force_outres(monkeypatch, 6, 1, 4)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(768, 1024, generator=g).to(torch.bfloat16), torch.randn(1024, 512, generator=g).to(torch.bfloat16)
    low = lower_and_run(torch.mm, a, b)
    banks = set(re.findall(r"matmul\([^)]*\) (k0\.ps\d+)\[", low.dumps["tir.txt"]))
    assert len(banks) == 4, banks
    assert_close(low.outputs[0], torch.mm(a, b))


def test_both_streamed_operands_keep_queues_of_their_own(monkeypatch):
    """Output-resident: A and B are weights (graph inputs) refilled chunk by chunk. They stay
    off the single in-order weight stream (schedule._stream_loads), where a load waiting for its
    slot would hold up the other operand's (the trn1 NKI-tutorial GEMM took 11.1 ms instead of
    6.9 ms that way); the values match eager."""
    _force_outres(monkeypatch, 2, 2, 4)
    g = torch.Generator().manual_seed(7)
    a, b = (torch.randn(200, 2200, generator=g).bfloat16(), torch.randn(2200, 600, generator=g).bfloat16())
    low = lower_and_run(torch.mm, a, b, target="trn1")   # (trn1: every load outlasts its descriptor)
    assert "resident=C" in _notes(low), _notes(low)
    assert_close(low.outputs[0], torch.mm(a, b))
    qs: dict[str, set] = {}
    for q, st in low.compiled.program.streams.items():
        for ins in st:
            if q.engine.value == "dma" and ins.srcs and ins.srcs[0].buffer in ("in0", "in1"):
                qs.setdefault(ins.srcs[0].buffer, set()).add(q)
    assert set(qs) == {"in0", "in1"} and not qs["in0"] & qs["in1"], qs
