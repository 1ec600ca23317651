"""``python -m runtime_sim.calibrate_collectives [--json PATH]``

Reproduces the published nccom-test example tables (aws-neuron-sdk@81ce03a,
tools/neuron-sys-tools/nccom-test.rst) with the collective model (``runtime_sim.collectives``)
and prints, per row: the published time and bus bandwidth, the modelled ones, their ratio
(modelled / published), the published and modelled algorithm, and whether the row is within 25%
(or RED, with the reason). Nothing in the model is fitted to these rows.

The tables do not state their instance type ("Performance data shown in these examples should not
be considered up-to-date", nccom-test.rst L576-579). The generation each is compared against is
chosen from when the table was published and what it shows (``TABLES``); say so when quoting.
A table from a release whose runtime could run fewer algorithms is compared with the algorithm
it had (``Table.algorithm``, with its sources). What was searched for a fixed cost per operation,
which the small-message rows would need, and not found is printed with the report (``SEARCHED``).
Exit status 1 when any row is outside 25%.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from .collectives import CollectiveCost, channels, collective_cost, place
from .targets import get_interconnect, get_target

TOLERANCE = 0.25
DOC = "tools/neuron-sys-tools/nccom-test.rst"


@dataclass(frozen=True)
class Row:
    line: int
    nbytes: int
    time_us: float
    busbw_gib_s: float
    algorithm: str | None = None


@dataclass(frozen=True)
class Table:
    """One published example: the command, its rows, and the generation compared against."""

    name: str
    lines: str
    command: str
    kind: str
    ranks: int
    target: str
    why_target: str
    rows: tuple[Row, ...]
    # bytes per "GB" in the table's bandwidth columns. nccom-test.rst L58-59 says GiB (2**30),
    # as L620-633 and L832-862 compute; L752-764 computes 1e9 (2 MiB in 686.32 us = 3.06e9 B/s,
    # printed algbw 3.06; GiB would print 2.85): its rows are compared in its own unit.
    gb: float = 2**30
    # What the time column was when the table was published: the Neuron 2.10 page (f5d2d79a
    # L61) says "the P50 of all durations", today's (L57) "the average of all durations".
    statistic: str = "average (L57)"
    # The algorithm the runtime of the table's release could run (None: the model's own choice
    # by size), and why.
    algorithm: str | None = None
    why_algorithm: str = ""


# The 2023 tables ran on Neuron 2.10 (05/01/2023). Collectives release notes of that time
# (aws-neuron-sdk@49ee15c5 release-notes/runtime/aws-neuronx-collectives/index.rst, RNC below, and
# .../aws-neuronx-runtime-lib/index.rst, RNR): hierarchical all-reduce "now used by default"
# (RNC L221, 2.12.22.0, 03/28/2023); the all-to-all (Mesh) all-reduce came after the tables (RNR
# L408, runtime 2.14.8.0, 06/14/2023, "expected to improve All-Reduce performance by 3-7x"; RNC
# L174, 2.15.13.0, 07/19/2023); RDH between instances later still (RNR L43, 2.26.42.0,
# 06/24/2025); the intra-node algorithm page (Ring, Mesh, KangaRing, RDH) is dated 12/02/2025.
_RING_2023 = ("ASSUMED Ring inside the instance (hierarchical between instances): the tables "
              "(Neuron 2.10, 05/01/2023) predate the Mesh all-reduce (runtime 2.14.8.0, "
              "06/14/2023, RNR L408; collectives 2.15.13.0, 07/19/2023, RNC L174) and RDH "
              "between instances (runtime 2.26.42.0, 06/24/2025, RNR L43); no document names "
              "another algorithm before them (RNC/RNR = release-notes/runtime/aws-neuronx-"
              "{collectives,runtime-lib}/index.rst at aws-neuron-sdk@49ee15c5)")
_P50_2023 = "P50 (the Neuron 2.10 page, f5d2d79a L61; today's text says average, L57)"


TABLES = (
    Table(
        "2-rank all-reduce, fp32, 1 KiB .. 1 GiB", "L620-633",
        "nccom-test -r 2 --minbytes 1kb --maxbytes 1gb --stepfactor 4 --datatype fp32 allr",
        "all_reduce", 2, "trn1",
        "added to the docs in Neuron 2.10.0 (aws-neuron-sdk commit f5d2d79a, 2023-05-01), whose "
        "nccom-test page says the tool 'is compatible with both trn1 and inf2 instance types' "
        "(that version's L14-15): Trainium2 was not released yet. trn1 (NeuronCore-v2, as inf2) at "
        "its default LNC=1 (L567-568): both ranks are the two cores of one chip, no NeuronLink.",
        tuple(Row(623 + i, b, t, bw) for i, (b, t, bw) in enumerate((
            (1024, 58, 0.02), (4096, 58, 0.07), (16384, 58, 0.26), (65536, 58, 1.05),
            (262144, 60, 4.07), (1048576, 68, 14.36), (4194304, 107, 36.51),
            (16777216, 332, 47.06), (67108864, 1214, 51.48), (268435456, 4750, 52.63),
            (1073741824, 18930, 52.83)))),
        statistic=_P50_2023, algorithm="ring", why_algorithm=_RING_2023),
    Table(
        "16-rank all-reduce, fp32, with algorithms", "L752-764",
        "nccom-test -r 16 allr -b 4 -e 1gb -f 16 -d fp32 --show-algorithm",
        "all_reduce", 16, "trn2",
        "added in Neuron 2.28.0 (commit 86a92868, 2026-02-25); it shows KangaRing, which pairs "
        "ranks 'out of four on the same Neuron Device' on the 2D torus (intranode-collective-comm."
        "rst L123): 4 ranks per chip is trn2 at its default LNC=2; trn3 has no torus (a switch, "
        "trn3-arch.rst L13). So trn2, LNC=2: 16 ranks on 4 chips of one instance.",
        tuple(Row(756 + i, b, t, bw, a) for i, (b, t, bw, a) in enumerate((
            (4, 299.91, 0.00, "mesh"), (32, 299.69, 0.00, "mesh"), (512, 299.82, 0.00, "mesh"),
            (8192, 299.74, 0.05, "mesh"), (131072, 574.15, 0.43, "mesh"),
            (2097152, 686.32, 5.73, "rdh"), (33554432, 2754.15, 22.84, "kangaring"),
            (536870912, 9689.51, 103.89, "kangaring")))), gb=1e9),
    Table(
        "64-rank all-reduce on two instances, fp32 (extra: not asked by issue 24)", "L832-862",
        "nccom-test -r 64 -N 2 -b 8 -e 1GB -f 2 -n 50 -w 5 -d fp32 allr --hosts ...",
        "all_reduce", 64, "trn1",
        "added in Neuron 2.10.0 (commit f5d2d79a, 2023-05-01) like the 2-rank table; 64 ranks on "
        "2 instances is 32 per instance = trn1.32xlarge's 16 chips x 2 cores at LNC=1.",
        (Row(835, 8, 520, 0.00), Row(852, 1048576, 1328, 1.45), Row(858, 67108864, 3963, 31.05),
         Row(862, 1073741824, 41806, 47.09)),
        statistic=_P50_2023, algorithm="ring", why_algorithm=_RING_2023),
)


def _reason(row: Row, cost: CollectiveCost, table: Table) -> str:
    unit = "GiB/s" if table.gb == 2**30 else "GB/s"
    model_busbw = cost.busbw_gib_s * 2**30 / table.gb
    ic = get_interconnect(cost.target)
    if cost.bound == "latency":
        why = (f"published {row.time_us:g} us is a per-operation floor; the model has only "
               f"{cost.steps} hop(s) x {ic.hop_ns / 1e3:g} us"
               + (f" + {cost.inter_steps} x {ic.inter_hop_ns / 1e3:g} us" if cost.inter_steps else "")
               + " (intranode-collective-comm.rst L61, internode L66): no document gives a fixed "
               "cost per collective operation (searched: see 'Per-operation cost' below)")
    else:
        frac = row.busbw_gib_s / model_busbw if model_busbw else 0.0
        why = (f"the model is {cost.bound}-bound at {model_busbw:.1f} {unit} bus bandwidth, "
               f"the run reached {row.busbw_gib_s:g} ({frac:.0%} of it)"
               + (f"; the published time exceeds the modelled transfer by "
                  f"{row.time_us - cost.transfer_ns / 1e3:.0f} us, which no documented mechanism "
                  "gives (compare the floor of this table's smallest sizes)"
                  if cost.transfer_ns / 1e3 < row.time_us * 0.75 else ""))
    if row.algorithm and row.algorithm != cost.algorithm:
        forced = collective_cost(table.kind, row.nbytes, table.ranks, table.target,
                                 algorithm=row.algorithm)
        why += (f"; published algorithm {row.algorithm}, the documented sweet ranges "
                f"(intranode-collective-comm.rst L160-189) give {cost.algorithm}; with "
                f"{row.algorithm} the model gives {forced.total_ns / 1e3:.2f} us (ratio "
                f"{forced.total_ns / 1e3 / row.time_us:.2f}): the choice is not what makes it red")
    return why


def evaluate() -> list[dict]:
    """One dict per published row: published, modelled, ratio, status and reason."""
    out = []
    for table in TABLES:
        for row in table.rows:
            cost = collective_cost(table.kind, row.nbytes, table.ranks, table.target,
                                   algorithm=table.algorithm)
            model_us = cost.total_ns / 1e3
            ratio = model_us / row.time_us
            ok = abs(ratio - 1.0) <= TOLERANCE
            out.append({
                "table": table.name, "source": f"{DOC} L{row.line}", "target": table.target,
                "kind": table.kind, "ranks": table.ranks, "bytes": row.nbytes,
                "statistic": table.statistic,
                "published_us": row.time_us, "model_us": model_us, "ratio": ratio,
                "bandwidth_unit": "GiB/s" if table.gb == 2**30 else "GB/s",
                "published_busbw": row.busbw_gib_s,
                "model_busbw": cost.busbw_gib_s * 2**30 / table.gb,
                "published_algorithm": row.algorithm, "model_algorithm": cost.algorithm,
                "algorithm_set_by_table": table.algorithm is not None,
                "bound": cost.bound, "within_25pct": ok,
                "reason": None if ok else _reason(row, cost, table)})
    return out


def _size(n: int) -> str:
    for unit, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"


def assumption_lines() -> list[str]:
    """The model's numbers in force for the tables' generations, each with its source or
    ASSUMED (printed with the report)."""
    out = ["Model numbers in force (runtime_sim/targets.py Interconnect, runtime_sim/collectives.py):"]
    for name in sorted({t.target for t in TABLES}):
        t, ic = get_target(name), get_interconnect(name)
        lnc = ic.default_lnc
        ch = channels(t, ic, lnc)
        out.append(
            f"  {name}: LNC={lnc}; {ic.cc_cores_per_chip} CC cores per chip / {t.cores_per_chip} "
            f"cores x LNC = {ch} CC channels per rank, each ONE DMA engine at "
            f"{t.dma_engine_bytes_per_ns:g} B/ns (ASSUMED: one CC core drives one DMA ring at a "
            f"time; compute-comm-overlap.rst L18, L79, L110) = {ch * t.dma_engine_bytes_per_ns:g} "
            f"GB/s per rank; per-hop {ic.hop_ns / 1e3:g} us (intranode L61 'about 1-2 us', "
            f"midpoint), between instances {ic.inter_hop_ns / 1e3:g} us (internode L66); HBM "
            f"{t.hbm_bytes_per_ns:g} B/ns per chip; NeuronLink {ic.chip_link_bytes_per_ns:g} GB/s "
            f"per chip")
    out += ["  Alternatives the documents leave open (not used): 20 CC cores per trn2/trn3 chip "
            "(NKI architecture guides L18); NKI's channel limit (4 for node-wide groups, 2 "
            "otherwise: nki/api/nki/collectives/__init__.py L308-309); the NKI DMA overview's "
            "27.2 GB/s per engine (L16) instead of its table's 17/23/33 B/ns (L43-63).",
            "  What nccom-test times: 'the average of all durations for the Collective "
            "Communication operations executed' (L57; 'the P50' on the Neuron 2.10 page, "
            "f5d2d79a L61); the operations run inside generated NEFFs (L15, L221-231); whether a "
            "NEFF's launch is inside an operation's duration, and how the ranks' durations are "
            "combined ('Latency data will be reported back from each host', L337), is not "
            "stated. No per-operation constant is in the model."]
    return out


# What was searched for a fixed cost per collective operation, and what was found instead
# (2026-12-05; printed with the report, so a reader sees why the small-message rows are red).
SEARCHED = (
    "Per-operation cost: searched, NOT FOUND (2026-12-05). No document gives a fixed time per "
    "collective operation, per CC-core trigger or per NEFF launch that the small-message rows "
    "could be checked against, so the model has none and those rows stay red.",
    "  Where (aws-neuron-sdk@81ce03a and its history): tools/neuron-sys-tools/nccom-test.rst "
    "(every version, f5d2d79a 2.10.0 .. a3247f5b 2.32.0); neuron-runtime/explore/"
    "{intranode,internode}-collective-comm.rst, compute-comm-overlap.rst, "
    "runtime-performance-tips.rst, device-memory.rst; neuron-runtime/about/collectives.rst; "
    "neuron-runtime/api/{nrt,nrt_async,nrt_experimental,nec,nrt-async-api-overview}.rst; "
    "neuron-runtime/guides/{configuration-guide,nrt-developer-guide}.rst; neuron-runtime/"
    "nrt-troubleshoot.rst; tools/neuron-explorer/*.rst; archive/profiler/*.rst; "
    "nki/api/nki/collectives/__init__.py; nki/library/api/{collectives,fg-allgather,"
    "sb2sb-allgather,fgcc}.rst; nki/guides/architecture/*_arch.rst; about-neuron/arch/"
    "neuron-hardware/*.rst; release-notes/components/{runtime,dev-tools}.rst, release-notes/"
    "prev/rn.rst, about-neuron/whats-new.rst, and the since-removed release-notes/runtime/"
    "aws-neuronx-{collectives,runtime-lib}/index.rst (RNC/RNR, at 49ee15c5); the search "
    "corpora (docs, pages, issues) gave only NCCL material.",
    "  Terms: latency, overhead, barrier, semaphore, proxy, 'CC core', 'Collectives Engine', "
    "'NEFF start', 'context switch', launch, nrt_execute, cc_exec_barrier, and any figure in "
    "us / usec / microseconds near collective, all-reduce, all-gather or reduce-scatter.",
    "  Found, and why not used: (1) 'Improve collectives barrier latency from 500us to 40us' "
    "(RNC L115, collectives 2.19.7.0, 12/21/2023), where nrt_barrier 'Implements a barrier by "
    "running a small all-reduce over all workers' (neuron-runtime/api/nrt_experimental.rst "
    "L141): a measured small all-reduce for a group it does not state, cut 12x by one "
    "software release, so a measurement like these rows, not a mechanism; as a floor it "
    "would contradict the 2-rank table of the same year (58 us < 500 us). (2) NEFF start: "
    "'Improved trn3 NEFF start overhead by 20us' (release-notes/components/runtime.rst L40), "
    "'Improved Neff context switch overhead reducing latency by up to 500us' (L1179), "
    "'Reduced the overhead of starting a NEFF program by up to 50% with an on-device "
    "hardware barrier between ranks' (L836): savings, not the overhead, and per NEFF, while "
    "these durations are per operation inside a NEFF (L57, L221-231). (3) Relative only: "
    "'Collectives Engine overhead' (whats-new.rst L477), 'up to 100x' (runtime.rst L834), CC "
    "ops 'up to 30% for problem sizes smaller than 16MB' (RNR L252, 02/13/2024), proxy "
    "threads 'up to 2x improvement in p50/p99 collective communication latency' (runtime.rst "
    "L561), integer-to-float latencies '~0.5 us' (dev-tools.rst L73). (4) The whole latency "
    "term is '10^0 to 10^1 us' (intranode L61): 300 us is 30x its top.",
    "  The floors are a software figure that changes by release, not a hardware constant: "
    "on this same page a 32-rank 1 KiB all-gather takes 151 us (Neuron 2.10, L644) and 6.16 "
    "us (added in 2.24, L682); an 8-rank one 10 us (L694), added in 2.28 with the 16-rank "
    "table's 300 us all-reduce; in the multistream example (added in 2.32) a 1 KiB bf16 "
    "all-reduce over four 16-rank groups takes 101 us (L798) and a 1 KiB fp32 64-rank "
    "all-gather on a second stream 258 us (L811). No single constant is consistent with all "
    "of them, and one picked to match any would be a fit.",
    "  Configuration checked (could the model already have it, set wrongly?): LNC and ranks "
    "per chip are nccom-test's defaults (L567-568); consecutive ranks fill chips of the "
    "row-major 4x4 torus the neuron-ls tables give (runtime-performance-tips.rst L113-255, "
    "L369-511); the 2023 tables run Ring (above) and report P50; the 16-rank table's "
    "published algorithm, forced, leaves L762 red (printed in its reason). None of these "
    "produces a floor.",
)


def format_report(rows: list[dict]) -> str:
    lines = ["Collective model against the published nccom-test examples "
             f"({DOC}, aws-neuron-sdk@81ce03a)",
             "The tables do not state their instance type (L576-579: 'should not be considered "
             "up-to-date'); the generation compared against, and why:"]
    for t in TABLES:
        unit = "GiB/s" if t.gb == 2**30 else "GB/s (1e9 B/s: this table's own unit)"
        lines += [f"", f"== {t.name} ({t.lines}) on {t.target}", f"   $ {t.command}",
                  f"   {t.why_target}", f"   bus bandwidth in {unit}; time is the {t.statistic}"]
        if t.algorithm:
            lines.append(f"   algorithm {t.algorithm} at every size: {t.why_algorithm}")
        head = (f"   {'line':>5} {'size':>9} {'pub us':>9} {'model us':>9} {'ratio':>6} "
                f"{'pub busbw':>9} {'mod busbw':>9} {'pub alg':>9} {'mod alg':>9} {'bound':>7}  status")
        lines += [head, "   " + "-" * (len(head) - 3)]
        for r in (r for r in rows if r["table"] == t.name):
            status = "ok (within 25%)" if r["within_25pct"] else "RED: " + r["reason"]
            lines.append(
                f"   {r['source'].rsplit(' ', 1)[1]:>5} {_size(r['bytes']):>9} "
                f"{r['published_us']:>9.2f} {r['model_us']:>9.2f} {r['ratio']:>6.2f} "
                f"{r['published_busbw']:>9.2f} {r['model_busbw']:>9.2f} "
                f"{r['published_algorithm'] or '-':>9} {r['model_algorithm']:>9} {r['bound']:>7}  "
                f"{status}")
    ok = sum(r["within_25pct"] for r in rows)
    lines += [""] + assumption_lines() + [""] + list(SEARCHED)
    lines += ["", f"{ok} of {len(rows)} rows within 25% (ratio = modelled / published time). "
              "No model constant is fitted to these rows."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime_sim.calibrate_collectives",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    a = ap.parse_args(argv)
    rows = evaluate()
    print(format_report(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["within_25pct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
