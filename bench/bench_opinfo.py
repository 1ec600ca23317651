"""The OpInfo conformance figure (tests/opinfo_cases.py): every registered op that PyTorch's
``op_db`` knows, fp32 and bf16, first two samples each, run with
``neuron_compiler.testing.assert_matches_eager``.

    python bench/bench_opinfo.py [--json out.json] [--only NAME[,NAME]] [--failures]

Prints the share of cases that ran entirely on the device and matched eager, then every failing
case with its reason (``--failures``) and the skip table. Everything printed is measured now.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402

import opinfo_cases as oc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every case's result here")
    ap.add_argument("--only", help="comma-separated OpInfo entry names")
    ap.add_argument("--failures", action="store_true", help="print every failing case")
    a = ap.parse_args(argv)
    entries = oc.registered_entries()
    if a.only:
        keep = set(a.only.split(","))
        entries = {k: v for k, v in entries.items() if k in keep or k.split(".")[0] in keep}
    t0 = time.perf_counter()
    todo = oc.cases(entries)
    results = []
    for c in todo:
        results.append(oc.run_case(c, entries))
    passed, counted, skipped = oc.summary(results)
    print(f"torch {torch.__version__}: {len(entries)} op_db entries, {len(results)} cases "
          f"({skipped} skipped by design), {time.perf_counter() - t0:.0f} s")
    print(f"OpInfo conformance: {passed}/{counted} = {100 * passed / max(1, counted):.1f}% "
          f"ran entirely on the device and matched eager")
    fails = [r for r in results if not r.passed and not r.skipped]
    by_entry = Counter(r.case.entry for r in fails)
    if a.failures:
        for r in fails:
            print(f"  FAIL {r.case.id}: {r.reason}")
    else:
        print("failing entries (cases): " + ", ".join(f"{k} ({v})" for k, v in sorted(by_entry.items())))
    print("skipped by design: " + "; ".join(sorted({f"{r.case.entry}: {r.reason}" for r in results
                                                   if r.skipped})))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"case": r.case.id, "passed": r.passed, "skipped": r.skipped,
                        "reason": r.reason, "seconds": round(r.seconds, 3)} for r in results],
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
