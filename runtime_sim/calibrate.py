"""``python -m runtime_sim.calibrate [--reduced] [--sensitivity] [--json PATH] [--only SUBSTRING] [-v]``

Runs the calibration suite (runtime_sim/calibration): hand-written programs that follow the NKI
tutorials' kernels instruction for instruction (the matmul tutorial's four steps on trn1 and their
trn2 walk-through, the fused Mamba tutorial's kernels, the LayerNorm tutorial's kernels, DMA and
roofline probes), simulated in timing mode on the target each figure was published for. Prints
every published figure with its source (document and lines), the simulated value, their ratio or
difference, whether it is within tolerance (red rows say why); then the mean absolute error and
every row's sensitivity to each ASSUMED constant (``--no-sensitivity`` skips it). No constant of
the machine is fitted to a published figure. ``--reduced``: the same programs at smaller trip counts
(the published latencies scaled by the share of the work; what the default test run checks).
``--json``: one object per row. Exit status 1 when a gating row is outside its tolerance (rows
the suite knows to be red included: the model does not reproduce them).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .calibration import ASSUMED, format_table, run_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime_sim.calibrate", description=__doc__.split("\n\n")[1])
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--only", metavar="SUBSTRING", help="run only the cases whose name contains it")
    ap.add_argument("--reduced", action="store_true", help="smaller trip counts (published latencies scaled)")
    ap.add_argument("--no-sensitivity", action="store_true",
                    help="skip each row's sensitivity to each ASSUMED constant")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every simulation")
    a = ap.parse_args(argv)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if a.verbose else (lambda s: None)
    rep = run_suite(reduced=a.reduced, only=a.only, sensitivity=not a.no_sensitivity, log=log)
    print(format_table(rep))
    r = rep.runner
    print(f"({r.simulations} simulations, {r.instructions:,} instructions, {rep.seconds:.1f} s including "
          f"program construction{'; reduced suite' if a.reduced else ''})")
    if a.json:
        p = Path(a.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"rows": [row.to_dict() for row in rep.rows],
                                 "assumed": {c.name: {"target": c.target, "field": c.field, "why": c.why}
                                             for c in ASSUMED}}, indent=2))
    return 0 if all(row.ok() for row in rep.rows if row.gating) else 1


if __name__ == "__main__":
    sys.exit(main())
