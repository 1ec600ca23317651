"""Simulated time vs roofline for compiled programs (trn2 by default).

    python bench/bench_lowering.py [--target trn2] [--sizes 256,512,1024]

For ``mm`` at a few sizes (fp32 and bf16) and for a GPT-style block (forward and backward through
torch.compile), prints simulated time, roofline time (the larger of FLOPs at TensorE peak and the
minimum HBM traffic at the core's HBM bandwidth, see runtime_sim/stats.py) and their ratio, plus
the busiest engine. All programs run in timing mode (values are not computed), so large shapes
stay fast. Everything printed is measured in this run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from torch._decomp import core_aten_decompositions  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from lowering.api import TensorSpec, compile_graph  # noqa: E402


def bench_mm(n: int, dtype: torch.dtype, target: str) -> dict:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    gm = make_fx(lambda x, y: x @ y, decomposition_table=core_aten_decompositions())(a, b)
    t0 = time.perf_counter()
    cg = compile_graph(gm, [TensorSpec((n, n), dtype)] * 2, target)
    t1 = time.perf_counter()
    _, res = cg.run(None, mode="timing")
    t2 = time.perf_counter()
    s = res.stats
    busy = s.busy_fraction()
    top = max(busy, key=busy.get)
    return {"name": f"mm {n}x{n}x{n} {str(dtype).replace('torch.', '')}", "sim_us": s.total_ns / 1e3,
            "roof_us": s.roofline_ns / 1e3, "instrs": s.instructions,
            "busiest": f"{top} {busy[top]:.0%}", "compile_s": t1 - t0, "sim_s": t2 - t1}


def bench_gpt(target: str) -> list[dict]:
    import neuron_compiler
    from neuron_compiler.demo import GPTBlock
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPTBlock()
    x = torch.randn(2, 64, 128, requires_grad=True)
    cm = torch.compile(model, backend="neuron", options={"target": target, "sim_mode": "timing"})
    with neuron_compiler.profile() as prof:
        cm(x).sum().backward()
    rows = []
    for p in prof.to_dict()["partitions"]:
        busy = p["engine_busy"]
        top = max(busy, key=busy.get) if busy else "-"
        rows.append({"name": f"GPT block {p['name'].split('/')[0].split('_')[0]}",
                     "sim_us": p["simulated_time_us"], "roof_us": p["roofline_time_us"],
                     "instrs": p["instructions"], "busiest": f"{top} {busy.get(top, 0):.0%}",
                     "compile_s": float("nan"), "sim_s": float("nan")})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--sizes", default="256,512,1024")
    args = ap.parse_args(argv)
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        for dt in (torch.bfloat16, torch.float32):
            rows.append(bench_mm(n, dt, args.target))
    rows += bench_gpt(args.target)
    print(f"target {args.target}")
    print(f"{'kernel':32s} {'sim us':>10s} {'roofline us':>12s} {'sim/roof':>9s} {'instrs':>8s}  busiest")
    for r in rows:
        print(f"{r['name']:32s} {r['sim_us']:10.2f} {r['roof_us']:12.2f} "
              f"{r['sim_us'] / r['roof_us']:9.2f} {r['instrs']:8d}  {r['busiest']}")


if __name__ == "__main__":
    main()
