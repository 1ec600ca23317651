"""A sweep of public architectures through ``torch.compile(backend="neuron")``.

    python bench/bench_zoo.py [--only NAME[,NAME]] [--mode fp32|bf16|both] [--timeout S]
                              [--json PATH] [--markdown PATH] [--list]

Two modes per architecture (see docs/zoo.md):
- ``fp32``: tiny configuration, functional mode (values come from the simulated programs),
  compared with eager per element: ``|compiled - eager| <= atol + rtol * |eager|``
  (fp32: atol = rtol = 1e-3), NaN where eager has NaN, same shapes.
- ``bf16``: real layer shapes (one layer), the model in bf16, ``sim_mode="timing"``: the program
  is built, checked and timed; its values are eager's by design, so no value check (``n/a``).

Each (architecture, mode) runs in a fresh subprocess (this file with ``--worker``) under a
timeout: a crash or a hang does not stop the sweep, and each is its own status. Per row:
compile status (``ok``; ``internal error`` = an exception raised in the backend, the lowering or
the simulator; ``torch error`` = an exception in Dynamo/AOTAutograd outside them; ``fell back`` =
no node ran on the device; ``timeout``; ``crash``; ``build error`` = the model or its eager run
failed, a bug of this script; ``unavailable`` = torchvision/timm cannot be imported, reason
printed), match, device share (``device_nodes / (device_nodes + fallback_nodes)`` of
``neuron_compiler.profile().to_dict()``), fallbacks (op: reason), the first call's wall time
(Dynamo + lowering + simulation or eager values) and ``simulated_time_us``.

Exit code 1 when any row is an internal error, a torch error, a crash, a build error or a
mismatch; timeouts are listed but do not change it (compile time is measured by
bench_codegen.py); 0 otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

TOL = {"fp32": (1e-3, 1e-3)}          # (atol, rtol) per element; bf16 rows are timing-only
OUR_PACKAGES = ("neuron_compiler", "lowering", "runtime_sim")
WEAK = 1e-4                           # eager outputs all below this: a check that cannot fail
FAILING = ("internal error", "torch error", "crash", "build error")


@dataclass(frozen=True)
class Arch:
    name: str         # row name; "base@impl" for another attention implementation
    family: str
    source: str       # transformers | torchvision | timm
    modes: tuple
    note: str

    @property
    def base(self) -> str:
        return self.name.split("@")[0]


def registry() -> list[Arch]:
    """Every row, without importing transformers, torchvision or timm."""
    import zoo_models as zm
    import zoo_vision as zv
    both = ("fp32", "bf16")
    rows = [Arch(n, "decoder", "transformers", both, note if "no sdpa" in note else f"{note} (sdpa)")
            for n, (_, note) in zm.DECODERS.items()]
    rows += [Arch(f"{n}@eager", "decoder", "transformers", ("fp32",),
                  f"{zm.DECODERS[n][1]} (eager attention)") for n in zm.EAGER_ATTENTION]
    rows += [Arch(f"{n}@flex", "decoder", "transformers", ("fp32",),
                  f"{zm.DECODERS[n][1]} (flex_attention)") for n in zm.FLEX_ATTENTION]
    rows += [Arch(f"{n}@nocache", "decoder", "transformers", ("fp32",),
                  f"{zm.DECODERS[n][1]} (sdpa, use_cache=False)") for n in zm.NO_CACHE]
    rows += [Arch(n, "encoder", "transformers", both, note) for n, (_, note) in zm.ENCODERS.items()]
    rows += [Arch(n, "encoder-decoder", "transformers", both, note)
             for n, (_, note) in zm.SEQ2SEQ.items()]
    rows += [Arch(n, fam, "transformers", both, note) for n, (_, fam, note) in zm.OTHERS.items()]
    rows += [Arch(n, "cnn" if src == "torchvision" else "vision", src, both, note)
             for n, (_, src, note) in zv.VISION.items()]
    return rows


def build(name: str, mode: str):
    """``(model, args, kwargs)`` for one row (imports the model's package)."""
    import zoo_models as zm
    import zoo_vision as zv
    base, _, impl = name.partition("@")
    attn = {"": "sdpa", "eager": "eager", "flex": "flex_attention", "nocache": "sdpa"}[impl]
    if base in zm.DECODERS:
        model, kw = zm.DECODERS[base][0](mode, attn, cache=impl != "nocache")
        return model, (), kw
    for table in (zm.ENCODERS, zm.SEQ2SEQ, zm.OTHERS):
        if base in table:
            model, kw = table[base][0](mode)
            return model, (), kw
    model, args = zv.VISION[base][0](mode)
    return model, args, {}


# --------------------------------------------------------------------------------- the worker
def _tensors(out, prefix="out") -> list[tuple[str, object]]:
    """Every tensor of a model output (ModelOutput, dict, tuple, tensor), with a path; caches
    and other objects are skipped."""
    import torch
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if isinstance(out, dict):
        items = list(out.items())
    elif isinstance(out, (tuple, list)):
        items = list(enumerate(out))
    else:
        return []
    found = []
    for k, v in items:
        found += _tensors(v, f"{prefix}.{k}")
    return found


def compare(out, ref, mode: str) -> dict:
    import torch
    atol, rtol = TOL[mode]
    a, b = _tensors(out), _tensors(ref)
    if [k for k, _ in a] != [k for k, _ in b]:
        return {"match": False, "max_abs_err": None,
                "detail": f"outputs differ: {[k for k, _ in a]} vs {[k for k, _ in b]}"}
    worst, worst_at, ok, scale = 0.0, "", True, 0.0
    for (key, x), (_, y) in zip(a, b):
        if x.shape != y.shape:
            return {"match": False, "max_abs_err": None,
                    "detail": f"{key}: shape {tuple(x.shape)} vs eager {tuple(y.shape)}"}
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y):
                return {"match": False, "max_abs_err": None, "detail": f"{key}: integers differ"}
            continue
        x, y = x.detach().double(), y.detach().double()
        nan_x, nan_y = torch.isnan(x), torch.isnan(y)
        if not torch.equal(nan_x, nan_y):
            return {"match": False, "max_abs_err": float("nan"), "detail": f"{key}: NaN positions"}
        both = ~nan_y
        diff = (x - y).abs()[both]
        finite = y[both & torch.isfinite(y)]
        if finite.numel():
            scale = max(scale, float(finite.abs().max()))
        if diff.numel():
            err = float(diff.max())
            if err > worst:
                worst, worst_at = err, key
            ok &= bool((diff <= atol + rtol * y.abs()[both]).all())
    return {"match": ok, "max_abs_err": worst, "detail": worst_at, "ref_max_abs": scale}


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:limit]


def classify(exc: BaseException) -> dict:
    """internal error (raised in the backend, lowering or simulator) or torch error; the row
    names the root cause, and keeps the outermost message (which names the partition)."""
    chain, seen = [], set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or getattr(e, "inner_exception", None) or e.__context__
    ours = False
    for e in chain:
        mod = type(e).__module__ or ""
        frames = traceback.extract_tb(e.__traceback__)
        if mod.split(".")[0] in OUR_PACKAGES or any(
                f"{os.sep}{p}{os.sep}" in fr.filename for fr in frames for p in OUR_PACKAGES):
            ours = True
    from neuron_compiler.errors import NeuronInternalError   # NeuronRunError is one too
    internal = [e for e in chain if isinstance(e, NeuronInternalError)]
    root = chain[-1]
    tb = traceback.extract_tb(root.__traceback__)
    where = [f"{os.path.relpath(fr.filename, os.path.dirname(HERE))}:{fr.lineno} {fr.name}"
             for fr in tb if any(f"{os.sep}{p}{os.sep}" in fr.filename for p in OUR_PACKAGES)]
    return {"status": "internal error" if ours else "torch error",
            "error": _first_line(root),
            "context": _first_line(internal[0] if internal else chain[0], 4000),
            "where": where[-3:]}


def _cast(v, dtype):
    import torch
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.to(dtype)
    return v


def work(name: str, mode: str) -> dict:
    import torch
    torch.set_num_threads(int(os.environ.get("NEURON_ZOO_THREADS", "1")))
    res: dict = {"name": name, "mode": mode}
    try:
        model, args, kwargs = build(name, mode)
    except Exception as exc:   # noqa: BLE001 - reported as a row
        unavailable = type(exc).__name__ == "Unavailable"
        return {**res, "status": "unavailable" if unavailable else "build error",
                "error": _first_line(exc)}
    import neuron_compiler
    dtype = torch.float32 if mode == "fp32" else torch.bfloat16
    model = model.eval().to(dtype)
    args = tuple(_cast(a, dtype) for a in args)
    kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
    ref = None
    with torch.no_grad():
        if mode == "fp32":
            try:
                ref = model(*args, **kwargs)
            except Exception as exc:   # noqa: BLE001
                return {**res, "status": "build error", "error": "eager: " + _first_line(exc)}
        torch._dynamo.reset()
        sim_mode = "functional" if mode == "fp32" else "timing"
        compiled = torch.compile(model, backend="neuron", options={"sim_mode": sim_mode})
        out = None
        with neuron_compiler.profile() as prof:
            t0 = time.perf_counter()
            try:
                out = compiled(*args, **kwargs)
            except Exception as exc:   # noqa: BLE001
                res.update(classify(exc))
            res["first_call_s"] = time.perf_counter() - t0
    d = prof.to_dict()
    dev, fb = d["device_nodes"], d["fallback_nodes"]
    res.update(device_nodes=dev, fallback_nodes=fb,
               device_share=dev / (dev + fb) if dev + fb else 0.0,
               simulated_time_us=d["simulated_time_us"],
               fallback_time_us=d.get("fallback_time_us"),
               fallbacks=[{"op": f["op"], "count": f["count"], "reason": f["reason"]}
                          for f in d["fallbacks"]])
    if "status" in res:
        return res
    res["status"] = "ok" if dev else "fell back"
    if ref is not None:
        res.update(compare(out, ref, mode))
    return res


# --------------------------------------------------------------------------------- the driver
def run_one(arch: Arch, mode: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "row.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", arch.name, "--mode", mode,
               "--out", path]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"name": arch.name, "mode": mode, "status": "timeout",
                    "error": f"no result within {timeout:.0f} s", "wall_s": timeout}
        wall = time.perf_counter() - t0
        if os.path.exists(path):
            with open(path) as f:
                row = json.load(f)
            row["wall_s"] = wall
            return row
        tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [""]
        return {"name": arch.name, "mode": mode, "status": "crash", "wall_s": wall,
                "error": f"exit {proc.returncode}: {tail[0][:300]}"}


def failed(row: dict) -> bool:
    return row["status"] in FAILING or row.get("match") is False


def _short_op(op: str) -> str:
    op = op[len("aten."):] if op.startswith("aten.") else op
    return op[:-len(".default")] if op.endswith(".default") else op


def _fallbacks(row: dict, width: int = 70) -> str:
    parts = []
    for f in row.get("fallbacks", []):
        reason = f["reason"]
        reason = reason[len(f["op"]) + 2:] if reason.startswith(f["op"] + ": ") else reason
        count = "" if f["count"] == 1 else f" x{f['count']}"
        parts.append(f"{_short_op(f['op'])}{count}: {reason}")
    text = "; ".join(parts)
    return text if len(text) <= width else text[:width - 3] + "..."


def _match(row: dict) -> str:
    if "match" not in row:
        return "n/a" if row["mode"] == "bf16" and row["status"] == "ok" else "-"
    err = row.get("max_abs_err")
    e = "?" if err is None else f"{err:.1e}"
    weak = row.get("ref_max_abs", 1.0) < WEAK
    return f"{'pass' if row['match'] else 'FAIL'} {e}" + (" (eager output ~0)" if weak else "")


def _status(row: dict) -> str:
    s = row["status"]
    return s if s in ("ok", "fell back") else f"{s}: {row.get('error', '')}"


def cells(row: dict) -> list[str]:
    share = (f"{100 * row['device_share']:.0f}% ({row['device_nodes']}/"
             f"{row['device_nodes'] + row['fallback_nodes']})" if "device_share" in row else "-")
    first = f"{row['first_call_s']:.1f}" if "first_call_s" in row else "-"
    sim = f"{row['simulated_time_us']:.1f}" if "simulated_time_us" in row else "-"
    return [row["name"], row["mode"], _status(row), _match(row), share, _fallbacks(row), first, sim]


HEAD = ["architecture", "mode", "status", "match (max abs err)", "device share", "fallbacks",
        "first call s", "sim us"]


def text_line(row: dict) -> str:
    c = cells(row)
    st = c[2] if len(c[2]) <= 70 else c[2][:67] + "..."
    return (f"{c[0]:34s} {c[1]:4s} {st:14s} {c[3]:15s} {c[4]:15s} {c[6]:>7s} {c[7]:>10s}  {c[5]}")


def markdown(rows: list[dict], header: str) -> str:
    esc = lambda s: s.replace("|", "\\|")   # noqa: E731
    lines = [header, "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(esc(c) for c in cells(r)) + " |" for r in rows]
    lines += ["", summary(rows)]
    bad = [r for r in rows if failed(r) or r["status"] == "timeout"]
    if bad:
        lines += ["", "Failures (reproduce one with the command shown):", ""]
        for r in bad:
            what = (f"mismatch, max abs err {r.get('max_abs_err')} at {r.get('detail')}"
                    if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')}")
            ctx = _where(r)
            lines.append(f"- `{r['name']}` {r['mode']}: {esc(what)}{esc(ctx)}  \n"
                         f"  `python bench/bench_zoo.py --only {r['name']} --mode {r['mode']}`")
    return "\n".join(lines) + "\n"


def _where(row: dict) -> str:
    """The partition and the op(s) an internal error names, from its outermost message."""
    ctx = row.get("context") or ""
    if ctx == row.get("error") or not ctx:
        return ""
    words = ctx.split()
    part = next((w for w in words if "/fused_" in w), "")
    at = ctx.find("(op: ")
    ops = ctx[at + 5:].split(";")[0].split("):")[0] if at >= 0 else ""
    ops = ops if len(ops) <= 160 else ops[:157] + "..."
    return f" (partition {part}{', op: ' + ops if ops else ''})" if part or ops else ""


def summary(rows: list[dict]) -> str:
    archs = sorted({r["name"].split("@")[0] for r in rows})
    count = lambda pred: sum(1 for r in rows if pred(r))   # noqa: E731
    return (f"{len(archs)} architectures, {len(rows)} rows: "
            f"{count(lambda r: r['status'] == 'ok')} ok "
            f"({count(lambda r: r.get('match') is True)} matched, "
            f"{count(lambda r: r.get('match') is False)} mismatched), "
            f"{count(lambda r: r['status'] == 'fell back')} fell back, "
            f"{count(lambda r: r['status'] == 'internal error')} internal errors, "
            f"{count(lambda r: r['status'] == 'torch error')} torch errors, "
            f"{count(lambda r: r['status'] == 'timeout')} timeouts, "
            f"{count(lambda r: r['status'] == 'crash')} crashes, "
            f"{count(lambda r: r['status'] == 'build error')} build errors, "
            f"{count(lambda r: r['status'] == 'unavailable')} unavailable")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(paths: list[str], md_path: str | None, json_path: str | None) -> int:
    """Rows of saved runs merged (fp32 rows first, each mode in registry order); the header
    names each run."""
    merged: dict = {}
    runs = []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        runs.append(f"commit `{run['commit']}` {run['date']} ({len(run['rows'])} rows, timeout "
                    f"{run['timeout_s']:.0f} s)")
        for row in run["rows"]:
            merged[(row["name"], row["mode"])] = row
    order = {a.name: i for i, a in enumerate(registry())}
    rows = sorted(merged.values(), key=lambda r: (r["mode"] != "fp32", order.get(r["name"], 1 << 30)))
    for row in rows:
        print(text_line(row))
    print(summary(rows))
    if md_path:
        with open(md_path, "w") as f:
            f.write(markdown(rows, "Runs: " + "; then ".join(runs) + "."))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"runs": runs, "rows": rows}, f, indent=1)
    return 1 if any(failed(r) for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated row names (see --list)")
    p.add_argument("--mode", choices=("fp32", "bf16", "both"), default="both")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per row")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--markdown", help="write the table as Markdown here")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--render", help="JSON[,JSON]: no run; merge saved --json files (a later "
                                    "file's row replaces an earlier one's) into --markdown/--json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        row = work(a.worker, a.mode)
        with open(a.out, "w") as f:
            json.dump(row, f)
        return 0
    if a.render:
        return render(a.render.split(","), a.markdown, a.json)
    archs = registry()
    if a.only:
        names = [n.strip() for n in a.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {x.name for x in archs}]
        if unknown:
            p.error(f"unknown row(s) {unknown}; --list shows the names")
        archs = [x for x in archs if x.name in names]
    if a.list:
        for x in archs:
            print(f"{x.name:34s} {x.family:16s} {x.source:13s} {','.join(x.modes):10s} {x.note}")
        print(f"{len({x.base for x in archs})} architectures, "
              f"{sum(len(x.modes) for x in archs)} rows")
        return 0
    modes = ("fp32", "bf16") if a.mode == "both" else (a.mode,)
    commit = _commit()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"bench_zoo: commit {commit}, {stamp}, timeout {a.timeout:.0f} s per row", flush=True)
    print(f"{'architecture':34s} {'mode':4s} {'status':14s} {'match':15s} {'device':15s} "
          f"{'first s':>7s} {'sim us':>10s}  fallbacks", flush=True)
    rows = []
    for mode in modes:
        for arch in archs:
            if mode not in arch.modes:
                continue
            row = run_one(arch, mode, a.timeout)
            rows.append(row)
            print(text_line(row), flush=True)
    print(summary(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"commit": commit, "date": stamp, "timeout_s": a.timeout, "rows": rows}, f,
                      indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(rows, f"Run on commit `{commit}`, {stamp}; timeout {a.timeout:.0f} s "
                                   f"per row."))
    return 1 if any(failed(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
