"""Views derived from a partition's stage files: the compiler's decisions and the memory plan.

    decisions(stage_texts) -> Decisions    fusion, matmul blocking, other tiling choices
    decisions_markdown(d)  -> str          ``decisions.md`` of a dumped partition
    memory_plan_svg(text)  -> str          ``memory_plan.svg``: SBUF and PSUM offsets over time

The stage files are what ``lowering.pipeline.compile_graph`` hands the dump callback:
``ir_pre_fusion.txt`` / ``ir_post_fusion.txt`` (kernel IR before / after fusion, with the
refused fusions as ``# WhyNoFuse ...`` lines), ``tir.txt`` (the tiler's notes as ``# ...``
lines first: each matmul's chosen blocking with its estimate, how many candidates were scored
and the next best; the tensors kept resident in SBUF) and ``memory_plan.txt`` (the planner's
offsets and lifetimes).

Invariants
- Pure functions of the texts: nothing here imports the lowering, so a dump can be read where
  the compiler is not installed, and an unrecognised line is skipped, never guessed at.
- Fusion: a post-fusion kernel whose ``# origin`` names several ATen nodes is a fusion; every
  temporary tensor still written by one kernel and read by another is a kernel boundary (a
  fusion that did not happen), shown with where the tensor lives between them (resident in
  SBUF, per ``tir.txt``, or through HBM) and the WhyNoFuse reason the lowering recorded for it;
  where it recorded none, the view says so instead of inventing one.
- The SVG is self-contained (no fonts, scripts or links) and its size does not depend on the
  number of buffers beyond one rectangle each.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

_KERNEL_RE = re.compile(r"^(?P<outs>%.*?) = (?P<kind>\w+)\[(?P<attrs>.*)\]\((?P<ins>.*)\)"
                        r"\s+#\s*(?P<origin>\S+)\s*$")
_BUF_RE = re.compile(r"^buffer %(\w+): (\d+) x (\w+) \((\w+)\)")
_REF_RE = re.compile(r"%(\w+)\[")
_BLOCKING_RE = re.compile(r"^(?P<kernel>k\d+):matmul:(?P<origin>[^:]+): (?P<shape>[^;]*?); "
                          r"chose (?P<chosen>.*?) est=(?P<est>[\d.]+) us(?P<parts> \([^)]*\))?; "
                          r"(?P<n>\d+) candidates(?:, next best: (?P<next>.*))?$")
_EST_RE = re.compile(r"^(?P<cfg>.*?) est=(?P<est>[\d.]+) us")
_PLAN_ROW_RE = re.compile(r"^\s+(?P<mem>sbuf|psum)\s+(?P<name>\S+)\s+@\s*(?P<off>\d+) "
                          r"(?P<bufs>\d+) x (?P<size>\d+) B\s+live \[(?P<lo>\d+), (?P<hi>\d+)\]"
                          r"(?P<alias>\s+\(in .*\))?\s*$")
_CAP_RE = re.compile(r"SBUF (\d+) B/partition, PSUM (\d+) B/partition")
_PEAK_RE = re.compile(r"^(sbuf|psum) peak (\d+) B/partition, lower bound (\d+)")


@dataclass(frozen=True)
class Kernel:
    index: int
    kind: str
    outs: tuple[str, ...]
    ins: tuple[str, ...]
    origin: tuple[str, ...]
    attrs: str

    @property
    def label(self) -> str:
        return f"k{self.index} {self.kind} ({', '.join(self.origin)})"

    @property
    def short(self) -> str:
        """The label with at most 3 origin nodes named."""
        names = ", ".join(self.origin[:3])
        more = f" +{len(self.origin) - 3} more" if len(self.origin) > 3 else ""
        return f"k{self.index} {self.kind} ({names}{more})"


@dataclass(frozen=True)
class Boundary:
    """Tensor ``buffer`` written by kernel ``producer`` and read by kernel ``consumer``."""

    buffer: str
    producer: Kernel
    consumer: Kernel
    resident: bool
    why: tuple[str, ...]


@dataclass(frozen=True)
class Blocking:
    kernel: str
    origin: str
    shape: str
    chosen: str
    est_us: float
    parts: str
    candidates: int
    next_best: tuple[tuple[str, float], ...]


@dataclass
class Decisions:
    pre_kernels: list[Kernel] = field(default_factory=list)
    post_kernels: list[Kernel] = field(default_factory=list)
    fused: list[Kernel] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    why_no_fuse: list[str] = field(default_factory=list)
    blockings: list[Blocking] = field(default_factory=list)
    tiling_notes: list[str] = field(default_factory=list)
    resident: list[str] = field(default_factory=list)


def parse_kernels(text: str) -> tuple[list[Kernel], dict[str, str], list[str]]:
    """(kernels, buffer -> role, ``#`` note lines) of a kernel-IR dump."""
    kernels, roles, notes = [], {}, []
    for line in text.splitlines():
        if (m := _BUF_RE.match(line)):
            roles[m.group(1)] = m.group(4)
        elif line.startswith("# "):
            notes.append(line[2:].strip())
        elif (m := _KERNEL_RE.match(line)):
            kernels.append(Kernel(len(kernels), m.group("kind"),
                                  tuple(_REF_RE.findall(m.group("outs") + "[")),
                                  tuple(dict.fromkeys(_REF_RE.findall(m.group("ins")))),
                                  tuple(m.group("origin").split(",")), m.group("attrs")))
    return kernels, roles, notes


def parse_blocking(note: str) -> Blocking | None:
    m = _BLOCKING_RE.match(note)
    if m is None:
        return None
    nxt = []
    for part in (m.group("next") or "").split("; "):
        if (e := _EST_RE.match(part.strip())):
            nxt.append((e.group("cfg"), float(e.group("est"))))
    return Blocking(m.group("kernel"), m.group("origin"), m.group("shape"), m.group("chosen"),
                    float(m.group("est")), (m.group("parts") or "").strip(" ()"),
                    int(m.group("n")), tuple(nxt))


def decisions(texts: dict[str, str]) -> Decisions:
    """The decisions recorded in a partition's stage files (``{file name: text}``)."""
    d = Decisions()
    d.pre_kernels, _, _ = parse_kernels(texts.get("ir_pre_fusion.txt", ""))
    d.post_kernels, roles, notes = parse_kernels(texts.get("ir_post_fusion.txt", ""))
    d.why_no_fuse = [n for n in notes if n.startswith("WhyNoFuse")]
    for line in texts.get("tir.txt", "").splitlines():
        if not line.startswith("# "):
            continue
        note = line[2:].strip()
        if note.startswith("resident in SBUF:"):
            d.resident = re.findall(r"(\w+) \(", note.split(":", 1)[1])
        elif (b := parse_blocking(note)) is not None:
            d.blockings.append(b)
        else:
            d.tiling_notes.append(note)
    d.fused = [k for k in d.post_kernels if len(k.origin) > 1]
    writer = {o: k for k in d.post_kernels for o in k.outs}
    for k in d.post_kernels:
        for buf in k.ins:
            prod = writer.get(buf)
            if prod is None or prod is k or roles.get(buf) != "temp":
                continue
            names = set(prod.origin) | set(k.origin)
            # a line naming a tensor (``...: %buf: reason``) belongs to that tensor's boundary;
            # one without (a refused attention fusion) to every boundary of the nodes it names
            why = tuple(n for n in d.why_no_fuse
                        if (f": %{buf}:" in n if re.search(r": %[\w.]+:", n) else
                            names & set(re.findall(r"[\w.]+", n.split(":", 1)[0]))))
            d.boundaries.append(Boundary(buf, prod, k, buf in d.resident, why))
    return d


def decisions_markdown(d: Decisions, title: str = "") -> str:
    """``decisions.md``: fusion, matmul blocking and tiling decisions, in that order."""
    out = [f"# Compiler decisions{(': ' + title) if title else ''}", "", "## Fusion", ""]
    out.append(f"{len(d.pre_kernels)} kernels before fusion, {len(d.post_kernels)} after.")
    out.append("")
    if d.fused:
        out.append("Fused (one kernel computes several ATen nodes):")
        out += [f"- {k.label}" for k in d.fused]
    else:
        out.append("Fused: nothing (every kernel computes one ATen node).")
    out.append("")
    if d.boundaries:
        out.append("Not fused (a tensor passes from one kernel to the next):")
        for b in d.boundaries:
            where = "stays in SBUF (resident)" if b.resident else "goes through HBM"
            why = "; ".join(b.why) if b.why else "not recorded"
            out.append(f"- %{b.buffer}: {b.producer.short} -> {b.consumer.short}: {where}; "
                       f"why not fused: {why}")
        if any(not b.why for b in d.boundaries):
            out += ["", "(\"not recorded\": no WhyNoFuse line of the lowering names this pair.)"]
    else:
        out.append("Not fused: no tensor passes between kernels.")
    other = [n for n in d.why_no_fuse if not any(n in b.why for b in d.boundaries)]
    if other:
        out += ["", "Refused fusions recorded by the lowering:"] + [f"- {n}" for n in other]
    out += ["", "## Matmul blocking", ""]
    if d.blockings:
        out.append("Each matmul's blocking is the candidate with the lowest estimated time among "
                   "those that fit the target (scored with the simulator's cost table).")
        out.append("")
        for b in d.blockings:
            out.append(f"- {b.kernel} ({b.origin}): {b.shape}")
            out.append(f"  - chosen: {b.chosen}, est {b.est_us:.2f} us"
                       + (f" ({b.parts})" if b.parts else ""))
            if b.next_best:
                runner = b.next_best[0]
                gap = runner[1] - b.est_us
                out.append(f"  - why: lowest of {b.candidates} fitting candidates; next best "
                           f"{runner[0]} est {runner[1]:.2f} us "
                           f"({'the same estimate: the tie is broken by the candidate order' if gap <= 1e-9 else f'+{gap:.2f} us'})")
            else:
                out.append(f"  - why: the only fitting candidate of {b.candidates}")
    else:
        out.append("No matmul in this partition.")
    out += ["", "## Other tiling decisions", ""]
    out += [f"- {n}" for n in d.tiling_notes] or ["(none recorded)"]
    out += ["", "Resident in SBUF between kernels: "
            + (", ".join(f"%{r}" for r in d.resident) if d.resident else "nothing"), ""]
    return "\n".join(out)


# ---- memory plan picture -----------------------------------------------------------------------
@dataclass(frozen=True)
class PlanRow:
    memory: str
    name: str
    offset: int
    bytes: int      # bufs x slot size, per partition
    first: int
    last: int       # inclusive


def parse_memory_plan(text: str) -> tuple[list[PlanRow], dict[str, int], dict[str, int]]:
    """(buffers, capacity per memory, peak per memory) of ``memory_plan.txt``; aliases (buffers
    inside another's bytes) are left out."""
    rows, cap, peak = [], {}, {}
    for line in text.splitlines():
        if (m := _CAP_RE.search(line)) and not cap:
            cap = {"sbuf": int(m.group(1)), "psum": int(m.group(2))}
        elif (m := _PEAK_RE.match(line)):
            peak[m.group(1)] = int(m.group(2))
        elif (m := _PLAN_ROW_RE.match(line)) and not m.group("alias"):
            rows.append(PlanRow(m.group("mem"), m.group("name"), int(m.group("off")),
                                int(m.group("bufs")) * int(m.group("size")),
                                int(m.group("lo")), int(m.group("hi"))))
    return rows, cap, peak


_COLORS = ("#3b6fb6", "#e08a2c", "#4a9a5b", "#b6443b", "#7d5ba6", "#8c6d46", "#d06aa8",
           "#4aa3b6")


def memory_plan_svg(text: str, width: int = 860) -> str:
    """An ``<svg>``: one panel per memory (SBUF, PSUM); x = top-level statement (time), y = byte
    offset within a partition, one rectangle per buffer over its lifetime, coloured by kernel."""
    rows, cap, peak = parse_memory_plan(text)
    panels = [m for m in ("sbuf", "psum") if any(r.memory == m for r in rows)]
    if not panels:
        return ('<svg xmlns="http://www.w3.org/2000/svg" width="360" height="30">'
                '<text x="4" y="20" font-size="13">no SBUF/PSUM buffers planned</text></svg>')
    steps = max(r.last for r in rows) + 1
    kernels = sorted({r.name.split(".")[0] for r in rows})
    color = {k: _COLORS[i % len(_COLORS)] for i, k in enumerate(kernels)}
    ph, left, top_pad = 200, 70, 34
    height = len(panels) * (ph + top_pad + 26) + 30
    plot_w = width - left - 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">']
    y0 = 0
    for mem in panels:
        mrows = [r for r in rows if r.memory == mem]
        top = max(max(r.offset + r.bytes for r in mrows), 1)
        y0 += top_pad
        title = (f"{mem.upper()}: peak {peak.get(mem, top):,} B/partition of "
                 f"{cap.get(mem, 0):,} ({100.0 * peak.get(mem, top) / cap[mem]:.1f}%)"
                 if cap.get(mem) else f"{mem.upper()}")
        out.append(f'<text x="{left}" y="{y0 - 8}" font-size="13" font-weight="bold">'
                   f'{html.escape(title)}</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{ph}" fill="#f7f7f7" '
                   f'stroke="#999"/>')
        for frac in (0.0, 0.5, 1.0):
            y = y0 + ph - frac * ph
            out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{int(frac * top):,}</text>')
        for r in mrows:
            x = left + plot_w * r.first / steps
            w = max(plot_w * (r.last + 1 - r.first) / steps, 1.0)
            y = y0 + ph - ph * (r.offset + r.bytes) / top
            h = max(ph * r.bytes / top, 1.0)
            tip = (f"{r.name}: @{r.offset} {r.bytes} B/partition, live [{r.first}, {r.last}]")
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                       f'fill="{color[r.name.split(".")[0]]}" fill-opacity="0.8" stroke="#fff" '
                       f'stroke-width="0.5"><title>{html.escape(tip)}</title></rect>')
        out.append(f'<text x="{left + plot_w / 2}" y="{y0 + ph + 16}" text-anchor="middle">'
                   f'top-level statement (0 .. {steps - 1}); y: byte offset in a partition'
                   f'</text>')
        y0 += ph + 26
    lx = left
    for k in kernels:
        out.append(f'<rect x="{lx}" y="{y0 + 4}" width="10" height="10" fill="{color[k]}"/>'
                   f'<text x="{lx + 14}" y="{y0 + 13}">{html.escape(_legend(k))}</text>')
        lx += 24 + 7 * len(_legend(k))
    out.append("</svg>")
    return "\n".join(out)


def _legend(prefix: str) -> str:
    """Buffer-name prefixes: ``k3`` is kernel 3's, ``r`` holds tensors resident in SBUF."""
    return "resident tensors" if prefix == "r" else f"kernel {prefix}"
