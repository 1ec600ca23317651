"""``python -m runtime_sim.calibrate [--json PATH] [--only SUBSTRING] [-v]``

Runs the calibration suite (runtime_sim/calibration): the NKI matmul tutorial's four kernels and
the fused Mamba tutorial's kernels, hand-written in our ISA, simulated in timing mode on the
target each measurement was published for, and prints published latency, simulated latency,
their ratio and the published vs simulated activity percentages. ``--json`` writes a list of
``{name, source, target, published_us, simulated_us, ratio, active_percent?, note?}``. Exit status
1 when a reproduced figure is outside the tolerance (latency 25%, activity 10 points); validation
rows (``gating`` false: the fused Mamba tutorial's seq scaling table) are printed with their ratio
and marked "validation (not gating)" when outside it, but do not set the exit status.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .calibration import CASES, format_table, run_case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime_sim.calibrate", description=__doc__.split("\n\n")[1])
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--only", metavar="SUBSTRING", help="run only the cases whose name contains it")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every simulation")
    a = ap.parse_args(argv)
    cases = [c for c in CASES if not a.only or a.only in c.name]
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if a.verbose else (lambda s: None)
    t0 = time.perf_counter()
    rows = [run_case(c, log) for c in cases]
    print(format_table(rows))
    n = sum(r.instructions for r in rows)
    print(f"({n:,} instructions simulated in {time.perf_counter() - t0:.1f} s including program construction)")
    if a.json:
        p = Path(a.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps([r.to_dict() for r in rows], indent=2))
    return 0 if all(r.ok() for r in rows if r.case.gating) else 1


if __name__ == "__main__":
    sys.exit(main())
