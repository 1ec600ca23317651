"""Simulator speed on the calibration kernels: instructions simulated per second of process CPU
time, in timing mode (full-size kernels, as ``python -m runtime_sim.calibrate`` runs them) and in
functional mode (the same kernels at reduced sizes, values computed and every check on).

Rates are instructions / CPU seconds of ``simulate`` alone (program construction excluded, it is
reported separately); wall time is printed too (this host may be shared, CPU time is less noisy).
The best of ``--repeat`` runs is kept. Goals (issue 3): >= 200,000 instructions/s in timing mode,
and the blocked-over-M,N,K 4096x8192x8192 kernel simulated in timing mode in under 60 s.

    python bench/bench_sim_speed.py [--repeat 2] [--checks static,False,True] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime_sim import DType, simulate  # noqa: E402
from runtime_sim.calibration import mamba as mb  # noqa: E402
from runtime_sim.calibration import matmul as mm  # noqa: E402

CHECKS = {"static": "static", "False": False, "True": True}


def timing_programs(quick: bool):
    """The full-size calibration programs on trn1 (as calibrated)."""
    yield "matmul fully_optimized 4096x8192x8192 bf16", lambda: mm.fully_optimized("trn1")
    if quick:
        return
    yield "matmul blocked_mn 4096x8192x8192 bf16", lambda: mm.blocked_mn("trn1")
    yield "matmul hoisted 4096x8192x8192 bf16", lambda: mm.hoisted("trn1")
    yield "matmul tiled 4096x8192x8192 bf16", lambda: mm.tiled("trn1")
    yield "mamba_v3 channels=4096 seq=8192", lambda: mb.mamba_v3("trn1")


def functional_programs():
    """Reduced sizes with inputs: (name, program, feeds)."""
    r = np.random.default_rng(0)
    M, K, N = 512, 1024, 2048
    feeds = {"lhsT": r.uniform(-1, 1, (K, M)).astype(np.float32).astype(DType.BF16.np),
             "rhs": r.uniform(-1, 1, (K, N)).astype(np.float32).astype(DType.BF16.np)}
    yield f"matmul tiled {M}x{K}x{N} bf16", mm.tiled("trn1", M=M, K=K, N=N), feeds
    yield (f"matmul fully_optimized {M}x{K}x{N} bf16",
           mm.fully_optimized("trn1", M=M, K=K, N=N, tiles_m=2, tiles_n=2, tiles_k=4), feeds)
    bt, S, ch, st = 1, 1024, 256, 8
    f = np.float32
    mfeeds = dict(delta=r.uniform(0, 0.5, (bt, ch, S)).astype(f), u=r.uniform(-1, 1, (bt, ch, S)).astype(f),
                  A=-r.uniform(0.5, 1, (ch, st)).astype(f), B=r.uniform(-1, 1, (bt, st, S)).astype(f),
                  C=r.uniform(-1, 1, (bt, st, S)).astype(f))
    yield f"mamba_v3 channels={ch} seq={S} state={st}", mb.mamba_v3("trn1", bt, S, ch, st), mfeeds


def run(prog, feeds, mode: str, checks, repeat: int) -> tuple[float, float, object]:
    best_cpu = best_wall = float("inf")
    res = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        res = simulate(prog, feeds, mode=mode, checks=checks)
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return best_cpu, best_wall, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--checks", default="static,False,True", help="timing-mode check levels to measure")
    ap.add_argument("--quick", action="store_true", help="only the blocked M,N,K kernel in timing mode")
    a = ap.parse_args()
    levels = [CHECKS[c] for c in a.checks.split(",")]
    print("timing mode (full-size calibration kernels, trn1):")
    tot_n = 0
    tot_cpu = {c: 0.0 for c in map(str, levels)}
    for name, build in timing_programs(a.quick):
        t0 = time.perf_counter()
        prog = build()
        bt = time.perf_counter() - t0
        n = prog.num_instructions
        tot_n += n
        parts = []
        for c in levels:
            cpu, wall, res = run(prog, None, "timing", c, a.repeat)
            tot_cpu[str(c)] += cpu
            parts.append(f"checks={c!s:6}: {n / cpu:9,.0f}/s cpu ({wall:5.2f} s wall)")
        print(f"  {name:44s} {n:7,d} instr, built in {bt:4.1f} s, simulated {res.stats.total_ns / 1e3:10,.1f} us")
        for p in parts:
            print(f"      {p}", flush=True)
    for c in map(str, levels):
        print(f"  all timing kernels, checks={c:6}: {tot_n / tot_cpu[c]:9,.0f} instructions/s cpu")
    print("functional mode (reduced sizes, values computed, all checks):")
    for name, prog, feeds in functional_programs():
        cpu, wall, res = run(prog, feeds, "functional", True, 1)
        n = prog.num_instructions
        print(f"  {name:44s} {n:7,d} instr: {n / cpu:9,.0f}/s cpu ({wall:5.2f} s wall)", flush=True)


if __name__ == "__main__":
    main()
