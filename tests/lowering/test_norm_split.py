"""Layer norm with its columns split over the engines (lowering/tiling/norm_split.py), and the
cost-table estimates that choose the split (lowering/tiling/estimate.py).

Every numeric case runs through the simulator against eager with the dtype's tolerance, on rows
that are not a multiple of 128 (a partial row tile follows the loop), and asserts from the tile
IR's note which statistics and which column split the compiler chose, so the case cannot
silently stop exercising the path it is named after.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from lowering.tiling import norm_split
from lowering.tiling.estimate import profile, scratch
from lowering.tiling.rowwise import bn_chunk
from lowering.tir.builder import TirBuilder
from lowering_helpers import check, rand
from runtime_sim.isa import AluOp, DType, EngineKind, Memory
from runtime_sim.targets import get_target

BF16, FP32 = torch.bfloat16, torch.float32
NOTE = re.compile(r"layer_norm \[(\d+)\]: statistics by (VectorE bn_stats|ScalarE sum)[^;]*; columns (.*)$")


def _split_of(low) -> tuple[str, list[tuple[int, int, str]]]:
    """(statistics engine, [(first column, end column, engines)]) from the tile IR note."""
    for line in low.dumps["tir.txt"].splitlines():
        m = NOTE.search(line)
        if m:
            parts = [(int(a), int(z), e) for a, z, e in
                     re.findall(r"\[(\d+), (\d+)\) on ([A-Za-z +]+?)(?:,|$)", m.group(3))]
            return ("bn" if m.group(2).startswith("VectorE") else "act"), parts
    raise AssertionError("no layer_norm split note in tir.txt")


def _ln(C: int, affine: int):
    if affine == 2:
        return lambda x, w, b: F.layer_norm(x, (C,), w, b)
    if affine == 1:
        return lambda x, w: F.layer_norm(x, (C,), w)
    return lambda x: F.layer_norm(x, (C,))


# (target, rows, columns, dtype, weight/bias count, expected statistics, both column parts?)
# 300 rows: two full row tiles that pipeline, then a partial one
CASES = [
    ("trn2", 300, 2048, BF16, 2, "bn", True),     # VectorE takes a share of the products
    ("trn2", 300, 1024, FP32, 2, "bn", True),
    ("trn3", 300, 2048, BF16, 2, "act", True),    # trn3's ScalarE is fast on bf16: it sums
    ("trn2", 300, 4099, FP32, 1, "act", True),    # 4099 has no equal split for bn_stats
    ("trn2", 300, 4099, FP32, 0, "act", False),   # ScalarE sums, VectorE normalises
    ("trn2", 257, 768, BF16, 2, "bn", False),     # short rows: all on ScalarE + GpSimdE
    ("trn2", 129, 2048, BF16, 2, "bn", True),     # lone row tiles: split for the makespan
    ("trn2", 128, 768, BF16, 2, "bn", True),      # (a GPT-2 norm: both parts side by side)
]


@pytest.mark.parametrize("target,R,C,dtype,affine,stats,both", CASES,
                         ids=[f"{t}-{r}x{c}-{str(d)[6:]}-{a}p" for t, r, c, d, a, _, _ in CASES])
def test_layer_norm_split_matches_eager(target, R, C, dtype, affine, stats, both):
    x = rand(R, C, dtype=dtype, low=-3, high=5, seed=131)
    args = [x, rand(C, dtype=dtype, seed=132), rand(C, dtype=dtype, seed=133)][:1 + affine]
    low = check(_ln(C, affine), *args, target=target)
    got, parts = _split_of(low)
    assert got == stats
    assert sum(z - a for a, z, _ in parts) == C
    assert (len(parts) == 2) == both, parts


@pytest.mark.parametrize("target,C,dtype", [("trn2", 2048, BF16), ("trn3", 2048, BF16)])
def test_native_layer_norm_mean_rstd_split(target, C, dtype):
    """mean and rstd outputs from both ways of computing the statistics (the ScalarE way keeps
    minus the mean and negates it only for the output)."""
    x = rand(300, C, dtype=dtype, low=-3, high=5, seed=134)
    w, b = rand(C, dtype=dtype, seed=135), rand(C, dtype=dtype, seed=136)
    low = check(lambda x, w, b: torch.ops.aten.native_layer_norm(x, [C], w, b, 1e-5), x, w, b,
                target=target)
    assert _split_of(low)[0] == ("bn" if target == "trn2" else "act")


@pytest.mark.parametrize("C,stats", [(1024, "bn"), (4099, "act")])
def test_large_mean_small_spread_keeps_precision(C, stats):
    """fp32 rows far from zero with a small spread (mean 30, spread 0.3): both statistics ways
    are centred, so they match eager at fp32 tolerance, where E[x^2] - E[x]^2 would lose about
    three digits of the variance to cancellation."""
    x = 30.0 + rand(300, C, seed=137) * 0.3
    w, b = rand(C, seed=138), rand(C, seed=139)
    low = check(lambda x, w, b: F.layer_norm(x, (C,), w, b), x, w, b)
    assert _split_of(low)[0] == stats


def _loads(target: str, split, C: int, dt=DType.BF16, n_params: int = 2):
    t = get_target(target)
    P = t.sbuf_partitions
    with scratch(t) as s:
        xa = s.tile("x", Memory.SBUF, P, C, dt).ap()
        ops = [AluOp.MULTIPLY, AluOp.ADD][:n_params]
        prm = [(s.tile(f"w{j}", Memory.SBUF, P, C, dt), op) for j, op in enumerate(ops)]
        out = s.tile("y", Memory.SBUF, P, C, dt).ap()
        norm_split.row_tile(s, xa, P, C, bn_chunk(C), split, prm, 1e-5, dt, lambda: out)
    return profile(s)


def test_split_balances_vector_and_gpsimd():
    """The chosen split of a long run of row tiles has a busiest engine no busier than either
    extreme (everything on one side) and within one grid step of VectorE/GpSimdE balance."""
    C = 4096
    sp = norm_split.choose(TirBuilder(get_target("trn2")), C, bn_chunk(C), DType.BF16, DType.BF16,
                           DType.BF16, [AluOp.MULTIPLY, AluOp.ADD], [64])
    assert sp.stats == "bn" and 0 < sp.cv < C
    busy = _loads("trn2", sp, C)[0]
    for cv in (0, C):
        assert max(busy.values()) <= max(_loads("trn2", norm_split.Split("bn", cv), C)[0].values())
    step = get_target("trn2").min_ii_cycles
    lo = _loads("trn2", norm_split.Split("bn", sp.cv - step), C)[0]
    hi = _loads("trn2", norm_split.Split("bn", sp.cv + step), C)[0]
    assert lo[EngineKind.VECTOR] < lo[EngineKind.GPSIMD] and hi[EngineKind.VECTOR] > hi[EngineKind.GPSIMD] * 0.95


def test_profile_makespan_and_shared_ports():
    """One row tile's makespan is at least its busiest engine's work; on trn1 (NC-v2: VectorE
    and GpSimdE share the SBUF port) both report their sum."""
    busy, span = _loads("trn2", norm_split.Split("bn", 512), 4096)
    assert span >= max(busy.values())
    busy1, _ = _loads("trn1", norm_split.Split("bn", 512), 4096)
    assert busy1[EngineKind.VECTOR] == busy1[EngineKind.GPSIMD]
    v_only, _ = _loads("trn1", norm_split.Split("bn", 4096), 4096)
    assert busy1[EngineKind.VECTOR] > v_only[EngineKind.VECTOR] * 0.5
