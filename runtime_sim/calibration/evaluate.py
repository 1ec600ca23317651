"""Running the suite: simulated values, tolerances, every row's sensitivity to the ASSUMED
constants (and to the documented-but-approximate ones), the mean absolute error, the table.

No constant is fitted. An ``Assumed`` is one ``Target`` field that no document gives exactly
(``ASSUMED`` in targets.py), or one a document gives only approximately ("~1300 ns"); its
sensitivity is d ln(simulated) / d ln(constant) for every row, by central differences at
x 2 and / 2 (a constant nobody can measure here may be off by that much), printed so that a
reader sees which rows lean on which assumption.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..isa import DType, Program
from ..simulator import simulate
from ..stats import SimStats
from ..targets import Target, get_target
from .suite import CASES, DOCS, LABEL, POINT_METRICS, RATIO_METRICS, Case, Figure

LATENCY_TOL = 0.25
ACTIVE_TOL = 10.0


@dataclass(frozen=True)
class Assumed:
    name: str
    target: str | None      # the Target it belongs to (None: the field of every Target)
    field: str
    why: str

    def stored(self, target: str = "trn2") -> float:
        return getattr(get_target(self.target or target), self.field)

    def applies(self, target: str) -> bool:
        return self.target is None or self.target == target


ASSUMED: tuple[Assumed, ...] = (
    Assumed("dma_min_chunk_bytes", None, "dma_min_chunk_bytes",
            "ASSUMED: engine time of a contiguous DMA chunk shorter than it (targets.py)"),
    Assumed("trn1.dma_transfer_ns", "trn1", "dma_transfer_ns",
            "documented as \"~1300 ns\" per transfer (DG:39-41)"),
    Assumed("trn2.dma_transfer_ns", "trn2", "dma_transfer_ns",
            "documented as \"approximately 600 ns\" per hardware-DGE instruction (nki-dge.rst L124)"),
)
BY_NAME = {a.name: a for a in ASSUMED}
SENS_STEP = 2.0
Overrides = tuple[tuple[str, float], ...]      # (constant name, value), sorted


@dataclass
class Row:
    case: Case
    fig: Figure
    simulated: float | None
    published: float                 # scaled in the reduced suite
    sens: dict[str, float] = field(default_factory=dict)
    as_written: float | None = None  # the value of ``case.as_written`` (sensitivity runs)

    @property
    def gating(self) -> bool:
        return not self.fig.excluded

    def error(self, sim: float | None = None) -> float | None:
        """|ratio - 1| (ratio metrics) or |difference| in points (percentages); None for bounds."""
        s = self.simulated if sim is None else sim
        if s is None or self.fig.bound in (">=", "<="):
            return None
        if self.fig.metric in RATIO_METRICS:
            return abs(s / self.published - 1.0)
        return abs(s - self.published)

    def ok(self, sim: float | None = None) -> bool:
        s = self.simulated if sim is None else sim
        if s is None:
            return False
        if self.fig.bound == ">=":
            return s >= self.published
        if self.fig.bound == "<=":
            return s <= self.published
        e = self.error(s)
        return e is not None and e <= (LATENCY_TOL if self.fig.metric in RATIO_METRICS else ACTIVE_TOL)

    def to_dict(self) -> dict:
        f = self.fig
        d = {"case": self.case.name, "program": self.case.program, "metric": f.metric, "target": f.target,
             "dtype": f.dtype.value if f.dtype else None, "source": f.source,
             "source_path": DOCS[f.source.split(":")[0]], "published": self.published,
             "simulated": self.simulated, "gating": self.gating, "within_tolerance": self.ok(),
             "bound": f.bound or None, "quote": f.quote or None,
             "excluded": f.excluded or None, "known_red": f.known_red or None}
        if f.metric in RATIO_METRICS and self.simulated is not None:
            d["ratio"] = self.simulated / self.published
        if self.sens:
            d["sensitivity"] = dict(self.sens)
        if self.as_written is not None:
            d["as_written"] = self.as_written
        return d


class Runner:
    """Builds each (case, target, dtype) program once and simulates it under constant overrides."""

    def __init__(self, cases: tuple[Case, ...] = CASES, reduced: bool = False,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.cases, self.reduced, self.log = cases, reduced, log
        self.programs: dict[tuple, Program] = {}
        self.stats: dict[tuple, SimStats] = {}
        self.instructions = 0
        self.simulations = 0

    def scale(self, case: Case) -> float:
        return case.reduced[1] if self.reduced and case.reduced else 1.0

    def program(self, case: Case, target: str, dtype: DType | None) -> Program:
        k = (case.name, target, dtype)
        if k not in self.programs:
            build = case.reduced[0] if self.reduced and case.reduced else case.build
            self.programs[k] = build(target, dtype)
        return self.programs[k]

    def written(self, case: Case, fig: Figure) -> float:
        """``fig``'s value for the source's program as written (``Case.as_written``, full size)."""
        k = (case.name + " (as written)", fig.target, fig.dtype)
        if k not in self.programs:
            self.programs[k] = case.as_written(fig.target, fig.dtype)
        alt = replace(case, name=k[0], build=case.as_written, reduced=None, as_written=None)
        return self.value(alt, fig)

    def target(self, name: str, ov: Overrides) -> Target:
        t = get_target(name)
        ch = {BY_NAME[c].field: v for c, v in ov if BY_NAME[c].applies(name)}
        return replace(t, **ch) if ch else t

    def run(self, case: Case, fig: Figure, ov: Overrides = ()) -> SimStats:
        ov = tuple(sorted((c, v) for c, v in ov if BY_NAME[c].applies(fig.target)))
        k = (case.name, fig.target, fig.dtype, ov)
        if k not in self.stats:
            prog = self.program(case, fig.target, fig.dtype)
            t0 = time.perf_counter()
            self.stats[k] = simulate(prog, mode="timing", checks="static", target=self.target(fig.target, ov)).stats
            self.instructions += prog.num_instructions
            self.simulations += 1
            self.log(f"  {case.name} on {fig.target}{'' if fig.dtype is None else ' ' + fig.dtype.value}"
                     f"{' ' + str(ov) if ov else ''}: {prog.num_instructions} instructions, "
                     f"{self.stats[k].total_ns / 1e3:,.1f} us, {time.perf_counter() - t0:.1f} s")
        return self.stats[k]

    def value(self, case: Case, fig: Figure, ov: Overrides = ()) -> float:
        st = self.run(case, fig, ov)
        t = self.target(fig.target, ov)
        m = fig.metric
        if m == "latency_us":
            return st.total_ns / 1e3
        if m == "pe_flops":
            return 100.0 * st.tensor_flop_utilisation(t.tensor_peak_flops_per_ns)
        if m in ("pe", "dve", "dma"):
            return 100.0 * st.busy_fraction().get(m, 0.0)
        if m == "dma_engine_ns":
            return st.engine_busy_ns.get("dma", 0.0)
        if m == "dma_eff":
            return 100.0 * st.dma_bytes / (st.total_ns * t.dma_bytes_per_ns)
        if m == "dma_rel":
            ref = self.reference(fig.target, ov)
            return 100.0 * (st.dma_bytes / st.total_ns) / (ref.dma_bytes / ref.total_ns)
        if m == "knee":
            return t.tensor_peak_flops_per_ns / (st.dma_bytes / st.total_ns)
        raise ValueError(f"unknown metric {m!r}")

    def reference(self, target: str, ov: Overrides) -> SimStats:
        """The 32 KiB-per-partition stream that the throughput curve is relative to."""
        k = ("curve reference", target, None, ov)
        if k not in self.stats:
            from .probes import CURVE_COUNT, dma_stream
            self.stats[k] = simulate(dma_stream(target, 32768, count=CURVE_COUNT), mode="timing",
                                     checks="static", target=self.target(target, ov)).stats
            self.simulations += 1
        return self.stats[k]

    def published(self, case: Case, fig: Figure) -> float:
        return fig.published * (self.scale(case) if fig.metric == "latency_us" else 1.0)


@dataclass
class Report:
    rows: list[Row]
    runner: Runner
    seconds: float = 0.0


def run_suite(cases: tuple[Case, ...] = CASES, reduced: bool = False, only: str | None = None,
              sensitivity: bool = False, log: Callable[[str], None] = lambda s: None) -> Report:
    t0 = time.perf_counter()
    sel = tuple(c for c in cases if not only or only in c.name)
    r = Runner(cases, reduced, log)
    rows = [Row(c, f, r.value(c, f), r.published(c, f)) for c in sel for f in c.figures]
    if sensitivity:
        for row in rows:
            if row.case.as_written is not None and not reduced:
                row.as_written = r.written(row.case, row.fig)
            for const in ASSUMED:
                if not const.applies(row.fig.target):
                    continue
                x = const.stored(row.fig.target)
                up = r.value(row.case, row.fig, ((const.name, x * SENS_STEP),))
                dn = r.value(row.case, row.fig, ((const.name, x / SENS_STEP),))
                row.sens[const.name] = (math.log(up / dn) / (2 * math.log(SENS_STEP))
                                        if up > 0 and dn > 0 else 0.0)
    return Report(rows, r, time.perf_counter() - t0)


# ---- summary figures and the table ------------------------------------------------------------

def mae(rows: list[Row]) -> tuple[float | None, int, float | None, int]:
    """(mean |ratio - 1| of the ratio rows, their count, mean |difference| in points of the
    percentage rows, their count) over the gating numeric rows."""
    rat, pts = [], []
    for row in rows:
        if not row.gating:
            continue
        e = row.error()
        if e is None:
            continue
        (rat if row.fig.metric in RATIO_METRICS else pts).append(e)
    return (sum(rat) / len(rat) if rat else None, len(rat), sum(pts) / len(pts) if pts else None, len(pts))


def _fmt(metric: str, x: float | None) -> str:
    if x is None:
        return "-"
    if metric == "latency_us":
        return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.2f} us"
    if metric in POINT_METRICS:
        return f"{x:.2f}%"
    return f"{x:.0f}"


def _cmp(row: Row, sim: float | None = None) -> str:
    s = row.simulated if sim is None else sim
    if s is None:
        return "-"
    if row.fig.metric in RATIO_METRICS:
        return f"x{s / row.published:.2f}"
    return f"{s - row.published:+.1f}"


def status(row: Row) -> str:
    if not row.gating:
        return "excluded"
    return "ok" if row.ok() else "RED"


def format_table(rep: Report) -> str:
    rows = rep.rows
    w = max(len(LABEL[r.fig.metric]) + 2 for r in rows)
    head = (f"{'row':{w}s} {'target':13s} {'source':12s} {'published':>10s} {'simulated':>10s} "
            f"{'ratio/diff':>10s}  status")
    out = [head, "-" * (len(head) + 24)]
    last = None
    said = None                      # the last exclusion printed: a case's rows share theirs
    for r in rows:
        if r.case is not last:
            out.append(f"{r.case.name}   [program {r.case.program}]")
            last = r.case
        f = r.fig
        tgt = f.target + ("" if f.dtype is None else " " + f.dtype.value)
        pub = "(read) " * bool(f.bound) + {">=": ">= ", "<=": "<= "}.get(f.bound, "") + _fmt(f.metric, r.published)
        out.append(f"  {LABEL[f.metric]:{w - 2}s} {tgt:13s} {f.source:12s} {pub:>10s} "
                   f"{_fmt(f.metric, r.simulated):>10s} {_cmp(r):>10s}  {status(r)}")
        if f.quote:
            out.append(f"      reads: \"{f.quote}\"")
        if f.excluded:
            if f.excluded != said:
                out.append(f"      excluded: {f.excluded}")
            said = f.excluded
        elif not r.ok():
            out.append(f"      red: {f.known_red or 'NOT EXPLAINED (a regression, or a new mismatch to explain)'}")
        if r.as_written is not None:
            out.append(f"      as written, no compiler hoist: {_fmt(f.metric, r.as_written)} {_cmp(r, r.as_written)}"
                       f" ({'ok' if r.ok(r.as_written) else 'RED'})")
    out.append("-" * (len(head) + 24))
    gate = [r for r in rows if r.gating]
    red = [r for r in gate if not r.ok()]
    out.append(f"{len(gate)} gating rows: {len(gate) - len(red)} within tolerance, {len(red)} red "
               f"(latency-like +-{LATENCY_TOL:.0%}, activity +-{ACTIVE_TOL:.0f} points, bounds as read); "
               f"{len(rows) - len(gate)} excluded")
    a, na, b, nb = mae(rows)
    out.append(f"mean absolute error, gating rows: "
               f"{'-' if a is None else f'{100 * a:.1f}%'} over {na} latency-like rows, "
               f"{'-' if b is None else f'{b:.1f} points'} over {nb} activity rows")
    lat = [r for r in gate if r.fig.metric in RATIO_METRICS and r.error() is not None]
    if lat:
        within = sum(r.ok() for r in lat)
        out.append(f"latency-like gating rows within +-{LATENCY_TOL:.0%}: {within} of {len(lat)} "
                   f"({within / len(lat):.0%}); no constant is fitted")
    if any(r.sens for r in rows):
        out.append(f"sensitivity d ln(simulated) / d ln(constant), at x{SENS_STEP:g} and /{SENS_STEP:g}:")
        for c in ASSUMED:
            out.append(f"  {c.name}: {c.why}")
        for r in rows:
            if r.sens:
                out.append(f"  {r.case.name[:60]:60s} {LABEL[r.fig.metric]:20s} " +
                           "  ".join(f"{k} {v:+.2f}" for k, v in r.sens.items()))
    out.append("sources (document:lines):")
    out.extend(f"  {k:4s} {v}" for k, v in DOCS.items())
    return "\n".join(out)
