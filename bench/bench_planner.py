"""Benchmark of ``lowering.memory.pack_offsets`` on the MiniMalloc
"challenging" instances.

Prints one row per instance (buffers, lower bound, our peak, ratio, seconds),
the geometric mean of peak / lower bound, and for reference the same ratio for
greedy-by-size first fit (TFLite Micro's planner) computed in the same run.

    python bench/bench_planner.py [--data DIR] [--effort N] [--time-budget S]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lowering.memory import lower_bound, pack_offsets, peak, validate  # noqa: E402

Row = tuple[str, int, int, int]


def load(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return [(r["id"], int(r["lower"]), int(r["upper"]), int(r["size"])) for r in reader]


def greedy_by_size_first_fit(rows: list[Row]) -> dict[str, int]:
    """Reference baseline: largest buffer first, each at the lowest offset
    where it fits among the already placed buffers alive at the same time."""
    placed: list[tuple[int, int, int, int]] = []  # (lower, upper, offset, end)
    offsets: dict[str, int] = {}
    for ident, lower, upper, size in sorted(rows, key=lambda r: (-r[3], r[1], r[0])):
        busy = sorted((o, e) for lo, up, o, e in placed if lo < upper and lower < up)
        offset = 0
        for start, end in busy:
            if start >= offset + size:
                break
            offset = max(offset, end)
        offsets[ident] = offset
        placed.append((lower, upper, offset, offset + size))
    return offsets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/minimalloc-challenging")
    parser.add_argument("--effort", type=int, default=None, help="search steps (default: pack_offsets')")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds per instance")
    args = parser.parse_args(argv)
    files = sorted(args.data.glob("*.csv"))
    if not files:
        print(f"no CSV instances in {args.data}", file=sys.stderr)
        return 1
    header = f"{'instance':<16}{'buffers':>8}{'lower bd':>11}{'peak':>11}{'ratio':>8}{'seconds':>9}{'greedy':>8}"
    print(header)
    print("-" * len(header))
    ours, greedy = [], []
    for path in files:
        rows = load(path)
        bound = lower_bound(rows)
        start = time.process_time()
        offsets = pack_offsets(rows, effort=args.effort, time_budget_s=args.time_budget)
        seconds = time.process_time() - start
        validate(rows, offsets)
        top = peak(rows, offsets)
        reference = greedy_by_size_first_fit(rows)
        validate(rows, reference)
        ours.append(top / bound)
        greedy.append(peak(rows, reference) / bound)
        print(
            f"{path.stem:<16}{len(rows):>8}{bound:>11}{top:>11}{ours[-1]:>8.4f}"
            f"{seconds:>9.2f}{greedy[-1]:>8.3f}"
        )
    print("-" * len(header))
    geo = math.exp(sum(map(math.log, ours)) / len(ours))
    geo_greedy = math.exp(sum(map(math.log, greedy)) / len(greedy))
    print(f"geometric mean peak/lower bound: {geo:.4f}   (greedy by size, first fit: {geo_greedy:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
