"""Simulator speed: instructions per second of host time, timing and functional mode.

Builds a synthetic tiled-matmul-like stream: per tile, two DMA loads (double-buffered SBUF slots),
a matmul into one of two PSUM banks, a VectorE PSUM evacuation, a ScalarE activation and a DMA
store, all ordered by counting semaphores (6 instructions per tile on 15 queues; several DMA
queues signal the same semaphore, so the race checker's multi-signaller path is exercised).

Rates are instructions per second of process CPU time (the machine may be shared: CPU time is
less noisy than wall time; both are printed).

    python bench/bench_sim_speed.py [--instructions 200000] [--functional-instructions 20000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime_sim import (SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, Buffer, DmaAttrs,  # noqa: E402
                         DType, Instr, MatmulAttrs, Memory, Op, Program, TensorCopyAttrs, ap,
                         dma_queue, simulate, tile_ap)

BF16, F32 = DType.BF16, DType.FP32


def build(n_instr: int, K: int = 128, M: int = 128, N: int = 512) -> tuple[Program, dict[str, np.ndarray]]:
    tiles = max(1, n_instr // 6)
    A = Buffer("A", Memory.HBM, 1, K * M * 2)
    Bm = Buffer("B", Memory.HBM, 1, K * N * 2)
    O = Buffer("O", Memory.HBM, 1, 4 * M * N * 2)
    bufs = [A, Bm, O]
    sa = [Buffer(f"a{s}", Memory.SBUF, 128, M * 2, s * M * 2) for s in range(2)]
    sb = [Buffer(f"b{s}", Memory.SBUF, 128, N * 2, 4096 + s * N * 2) for s in range(2)]
    so = [Buffer(f"o{s}", Memory.SBUF, 128, N * 4, 16384 + s * N * 4) for s in range(2)]
    sy = [Buffer(f"y{s}", Memory.SBUF, 128, N * 2, 32768 + s * N * 2) for s in range(2)]
    ps = [Buffer(f"ps{s}", Memory.PSUM, 128, N * 4, s * 2048) for s in range(2)]
    bufs += sa + sb + so + sy + ps
    st: dict = {}

    def add(q, ins):
        st.setdefault(q, []).append(ins)

    for t in range(tiles):
        s, k = t % 2, t // 2          # slot, use count of that slot before this one
        w = lambda name: ((f"{name}{s}", k),) if k else ()
        add(dma_queue(16 * (t % 4)), Instr(Op.DMA_COPY, tile_ap(sa[s], BF16, K, M), (ap(A, BF16, [(M, K), (1, M)]),),
                                           DmaAttrs(), waits=w("a_free"), signals=(f"a_ld{s}",)))
        add(dma_queue(16 * (t % 4) + 1), Instr(Op.DMA_COPY, tile_ap(sb[s], BF16, K, N), (ap(Bm, BF16, [(N, K), (1, N)]),),
                                               DmaAttrs(), waits=w("b_free"), signals=(f"b_ld{s}",)))
        add(TENSOR, Instr(Op.MATMUL, tile_ap(ps[s], F32, M, N), (tile_ap(sa[s], BF16, K, M), tile_ap(sb[s], BF16, K, N)),
                          MatmulAttrs(), waits=((f"a_ld{s}", k + 1), (f"b_ld{s}", k + 1)) + w("ps_free"),
                          signals=(f"mm{s}", f"a_free{s}", f"b_free{s}")))
        add(VECTOR, Instr(Op.TENSOR_COPY, tile_ap(so[s], F32, M, N), (tile_ap(ps[s], F32, M, N),), TensorCopyAttrs(),
                          waits=((f"mm{s}", k + 1),) + w("o_free"), signals=(f"cp{s}", f"ps_free{s}")))
        add(SCALAR, Instr(Op.ACTIVATION, tile_ap(sy[s], BF16, M, N), (tile_ap(so[s], F32, M, N),),
                          ActivationAttrs(ActFunc.GELU_TANH), waits=((f"cp{s}", k + 1),) + w("y_free"),
                          signals=(f"act{s}", f"o_free{s}")))
        r = t % 4
        add(dma_queue(16 * (4 + r)), Instr(Op.DMA_COPY, ap(O, BF16, [(N, M), (1, N)], byte_offset=r * M * N * 2),
                                           (tile_ap(sy[s], BF16, M, N),), DmaAttrs(), waits=((f"act{s}", k + 1),),
                                           signals=(f"y_free{s}",)))
    prog = Program("trn2", tuple(bufs), {q: tuple(v) for q, v in st.items()}, inputs=("A", "B"), outputs=("O",))
    rng = np.random.default_rng(0)
    feeds = {"A": rng.standard_normal(K * M).astype(BF16.np), "B": rng.standard_normal(K * N).astype(BF16.np)}
    return prog, feeds


def bench(prog: Program, feeds: dict, mode: str, checks: bool | str) -> tuple[float, float, object]:
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(prog, feeds, mode=mode, checks=checks)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return prog.num_instructions / cpu, prog.num_instructions / wall, res


def main() -> None:
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--instructions", type=int, default=200_000)
    ap_.add_argument("--functional-instructions", type=int, default=20_000)
    a = ap_.parse_args()
    prog, feeds = build(a.instructions)
    print(f"timing-mode program: {prog.num_instructions} instructions on {len(prog.streams)} queues")
    for checks in (False, "static", True):
        rate, wrate, res = bench(prog, feeds, "timing", checks)
        st = res.stats
        print(f"  timing     checks={checks!s:6}: {rate:10,.0f} instr/s cpu ({wrate:,.0f} wall)   simulated "
              f"{st.total_ns / 1e3:,.1f} us, pe busy {st.busy_fraction()['pe']:.2f}, "
              f"dma busy {st.busy_fraction()['dma']:.2f}", flush=True)
    fprog, feeds = build(a.functional_instructions)
    print(f"functional-mode program: {fprog.num_instructions} instructions")
    for checks in (False, True):
        rate, wrate, res = bench(fprog, feeds, "functional", checks)
        print(f"  functional checks={checks!s:6}: {rate:10,.0f} instr/s cpu ({wrate:,.0f} wall)", flush=True)


if __name__ == "__main__":
    main()
