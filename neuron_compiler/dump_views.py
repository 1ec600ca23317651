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
- Each reason is stated once: ``decisions.md`` lists the boundaries by tensor (one entry per
  tensor, its readers beneath it); a WhyNoFuse line naming a tensor and its reader
  (``WhyNoFuse p -> c at <producer nodes> -> <reader nodes>: %t: why``) goes to that one
  edge, a reason shared by every reader of a tensor is given once for the tensor, and a line
  naming no tensor (a refused attention fusion) is listed once, numbered, and referred to.
- The SVG is self-contained (no fonts, scripts or links) and its size does not depend on the
  number of buffers beyond one rectangle each.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

_WHY_EDGE_RE = re.compile(r"^WhyNoFuse \w+ -> \w+ at (?P<prod>\S+) -> (?P<cons>\S+): "
                          r"%(?P<buf>[\w.]+): (?P<why>.*)$")
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
    """Tensor ``buffer`` written by kernel ``producer`` and read by kernel ``consumer``; ``why``:
    the WhyNoFuse lines recorded for this edge (whole lines, as the lowering wrote them)."""

    buffer: str
    producer: Kernel
    consumer: Kernel
    resident: bool
    why: tuple[str, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        """``why`` without the prefix that names the pair (the view names it already)."""
        return tuple(m.group("why") if (m := _WHY_EDGE_RE.match(w)) else w for w in self.why)


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
            d.boundaries.append(Boundary(buf, prod, k, buf in d.resident,
                                         _why_for(d.why_no_fuse, buf, prod, k)))
    return d


def _why_for(lines: list[str], buf: str, prod: Kernel, cons: Kernel) -> tuple[str, ...]:
    """The WhyNoFuse lines of the edge ``prod -> cons`` through ``buf``: a line naming the
    tensor belongs to the edge whose reader nodes it names (to every edge of the tensor when it
    names no reader the view knows); a line naming no tensor to every edge whose nodes it names."""
    of_buf = [(n, m) for n in lines if (m := _WHY_EDGE_RE.match(n)) and m.group("buf") == buf]
    exact = tuple(n for n, m in of_buf if set(m.group("cons").split(",")) == set(cons.origin))
    names = set(prod.origin) | set(cons.origin)
    untargeted = tuple(n for n in lines if not re.search(r": %[\w.]+:", n)
                       and names & set(re.findall(r"[\w.]+", n.split(":", 1)[0])))
    return (exact or tuple(n for n, _ in of_buf)) + untargeted


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
    shared = list(dict.fromkeys(w for b in d.boundaries for w in b.why
                                if not _WHY_EDGE_RE.match(w)))      # named by node, numbered
    if d.boundaries:
        out.append("Not fused (a tensor passes from one kernel to the next), by tensor:")
        out += _boundary_lines(d.boundaries, shared)
        if any(not b.why for b in d.boundaries):
            out += ["", "(\"not recorded\": no WhyNoFuse line of the lowering names this pair.)"]
    else:
        out.append("Not fused: no tensor passes between kernels.")
    if shared:
        out += ["", "Refused fusions recorded by the lowering for several kernels (referred to "
                    "above as [R1], [R2], ...):"]
        out += [f"- [R{i + 1}] {n}" for i, n in enumerate(shared)]
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


def _boundary_lines(boundaries: list[Boundary], shared: list[str]) -> list[str]:
    """One entry per tensor (where it lives, its writer), its readers beneath; a reason common
    to every reader is given once on the tensor's line."""
    def said(b: Boundary) -> str:
        parts = [r for w, r in zip(b.why, b.reasons) if w not in shared]
        parts += [f"[R{shared.index(w) + 1}]" for w in b.why if w in shared]
        return "; ".join(dict.fromkeys(parts)) or "not recorded"

    by_buf: dict[str, list[Boundary]] = {}
    for b in boundaries:
        by_buf.setdefault(b.buffer, []).append(b)
    out = []
    for buf, bs in by_buf.items():
        where = "stays in SBUF (resident)" if bs[0].resident else "goes through HBM"
        head = f"- %{buf}: written by {bs[0].producer.short}, {where}"
        whys = {said(b) for b in bs}
        if len(bs) == 1 or len(whys) == 1:
            readers = ", ".join(b.consumer.short for b in bs)
            out.append(f"{head}; read by {readers}; why not fused: {whys.pop()}")
        else:
            out.append(f"{head}; why not fused, per reader:")
            out += [f"  - {b.consumer.short}: {said(b)}" for b in bs]
    return out


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
