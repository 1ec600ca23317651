"""Free-axis chunks of streaming pointwise loop nests (lowering/tiling/stream.py, pointwise.py).

The chunk is scored from the target's DMA and engine costs; these tests pin the properties the
choice must have (bounds, even splits preferred, longer streams take bigger chunks) and run
chunked kernels -- a chunk loop with a partial last chunk, broadcast and strided operands --
against eager through the simulator.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from lowering.tiling.stream import choose_chunk, chunk_candidates
from lowering_helpers import check, rand
from runtime_sim.costs import dma_tile_data_ns
from runtime_sim.targets import get_target

BF16, FP32 = torch.bfloat16, torch.float32


def _gelu_compute(f: int) -> tuple[float, float]:
    ns = max(64, f) / 1.2          # one ScalarE pass at 1.2 GHz
    return ns, ns + 50.0


BF16_STREAMS = [(2, True, False), (2, True, True)]


def test_candidates_cover_even_splits():
    c = chunk_candidates(262144, 9557)
    assert max(c) <= 9557 and 8192 in c and min(c) >= 1
    assert chunk_candidates(5, 100) == sorted(set(chunk_candidates(5, 100)))
    assert chunk_candidates(1, 4) == [1]


def test_long_stream_takes_an_even_split_near_the_budget():
    t = get_target("trn2")
    f = choose_chunk(t, 262144, [(1, 128)], 1, BF16_STREAMS, _gelu_compute, 9557)
    assert f == 8192                      # divides the axis: no partial chunk behind the loop
    f2 = choose_chunk(t, 262144, [(1, 128)], 1, BF16_STREAMS, _gelu_compute, 4096)
    assert f2 <= 4096 and 262144 % f2 == 0


def test_short_streams_keep_several_chunks_to_pipeline():
    """One row tile of 8192 bf16: one chunk would expose its load and store around the
    compute, so the choice keeps a few chunks; more row tiles of the same row can take larger
    ones (the pipeline is long anyway)."""
    t = get_target("trn2")
    one = choose_chunk(t, 8192, [(1, 128)], 1, BF16_STREAMS, _gelu_compute, 9557)
    many = choose_chunk(t, 8192, [(64, 128)], 1, BF16_STREAMS, _gelu_compute, 9557)
    assert one < 8192 and many >= one


def test_dma_model_prefers_long_runs():
    t = get_target("trn2")
    contiguous = dma_tile_data_ns(128, 8192, 8192, t)
    strided = dma_tile_data_ns(128, 8192, 4, t)
    assert strided > 10 * contiguous
    assert dma_tile_data_ns(1, 8192, 8192, t) < contiguous     # one partition: one engine's share


def _chunk_loop(low) -> tuple[int, int] | None:
    """(trip count, chunk) of the first chunk loop ``for c.. in 0..n`` in tir.txt."""
    tir = low.dumps["tir.txt"]
    m = re.search(r"for (c\d+) in 0\.\.(\d+):\n\s+\d+: dma_copy\(transpose=False\) \S+\[p0:\+\d+ @0 \[1,(\d+)\]", tir)
    return (int(m.group(2)), int(m.group(3))) if m else None


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_chunked_row_with_partial_last_chunk(dtype):
    """128 rows of 9973 (a prime): the free axis is streamed in a loop of equal chunks plus a
    partial last chunk; the result matches eager."""
    x = rand(128, 9973, dtype=dtype, low=-4, high=4, seed=141)
    low = check(F.gelu, x)
    loop = _chunk_loop(low)
    assert loop is not None, low.dumps["tir.txt"][:2000]
    n, f = loop
    assert n * f < 9973 < (n + 1) * f     # a partial chunk follows the loop


def test_chunked_broadcast_and_strided_operands():
    """A broadcast row and a transposed (strided) view in one chunked expression."""
    x = rand(300, 5000, seed=142)
    row = rand(5000, seed=143)
    col = rand(300, 1, seed=144)
    check(lambda x, r, c: torch.sigmoid(x * r - c) + x, x, row, col)
    y = rand(257, 300, seed=145)
    check(lambda y: y.t() * 2.0 + 1.0, y)


# ---- per-row operands and row vectors shared by all row tiles --------------------------------
def _rms(x, w):
    return x * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_rms_norm_rows_per_row_factor_and_shared_weight(dtype):
    """RMSNorm-style rows: the per-row factor rsqrt(mean + eps) is computed once per row on a
    [p, 1] tile and applied by a tensor_scalar; the weight row is loaded once per chunk for all
    row tiles (partition stride 0), not once per row tile."""
    x = rand(300, 1024, dtype=dtype, seed=146)
    w = rand(1024, dtype=dtype, seed=147)
    low = check(_rms, x, w)
    tir = low.dumps["tir.txt"]
    kernel = [ln for ln in tir.splitlines() if ":pointwise:" in ln and "rsqrt" in ln.split("#")[-1]]
    assert any("activation(func=rsqrt" in ln and "[1,1]" in ln.split("<-")[0] for ln in kernel), tir
    assert any(ln.lstrip().split(" ", 1)[1].startswith("tensor_scalar") and "operand0_from_src=True" in ln
               for ln in kernel)
    weight_loads = [ln for ln in kernel if "dma_copy" in ln and "[0,128]" in ln]
    assert weight_loads and all(" sh" in ln or ".sh" in ln for ln in weight_loads), weight_loads


PER_ROW = {
    "sub_row_first": lambda x, c: c - x,
    "div_by_row": lambda x, c: x / c,
    "row_over_x": lambda x, c: c / x,
    "pow_row": lambda x, c: x.abs() ** (c.abs() + 0.5),
    "where_row": lambda x, c: torch.where(c > 0, x * c, x - c),
    "row_only": lambda x, c: torch.exp(c).expand(x.shape) + 0.0,
}


@pytest.mark.parametrize("name", list(PER_ROW))
def test_per_row_operands(name):
    x = rand(257, 130, seed=148) + 3.0
    c = rand(257, 1, seed=149)
    check(PER_ROW[name], x, c)
