"""Generated code against the physical floor, per target, and cold compile time against Inductor.

    python bench/bench_codegen.py                      # everything: ~20 min on 2 cores for parts 1-2,
                                                       # part 3 ~30 min more (Inductor's cold compiles)
    python bench/bench_codegen.py --cases quick --targets trn2 --skip-inductor
    python bench/bench_codegen.py --cases mm2048,bert,cold_bert --json rows.json
    python bench/bench_codegen.py --cases first_mobilenet_v3_small,first_gpt2 --repeat 1

Part 1, for each case of issue 6's table on each target (trn1, trn2, trn3), in sim_mode="timing":
  - steady us: the simulated steady state, i.e. the *second* call of the compiled function: device
    time (``simulated_time_us``) for kernels (operands live on the device, as in a kernel
    benchmark); device time plus that call's host<->device transfer for models. Eager fallback
    wall time is not included (as in floors.py); fallback ops are listed instead.
  - floor us: max(TensorE FLOPs / bf16 peak, ScalarE transcendentals / ScalarE rate, compulsory HBM
    bytes / per-core HBM bandwidth), from the published per-core peaks below, computed exactly as
    ``../shared/tools/floors.py`` does (same table, same work counts; models: FLOPs from
    ``FlopCounterMode``, bytes = every weight read once). Never from the project's own report.
  - of floor: floor / steady (1.0 = at the floor); instrs: machine instructions summed over the
    device partitions; compile s: wall time of the first call (after one tiny warm-up compile
  that absorbs the process's one-time import costs); xfer 2nd/1st (models): the second call's
  host<->device transfer time over the first call's (parameters stay resident after the first);
  fallbacks: ops run in eager PyTorch.
  decode_gpt2 (issue 23): one decode step of gpt2-small (bf16, b1) over a static KV cache of 1024
  tokens, device time (weights and cache live on the device; the call's transfer is printed
  beside it); its floor is every byte it must read (weights except the position table it only
  gathers from, plus the whole cache) at the per-core HBM rate (issue 23 wants >= 70%).
  A case that crashes prints FAILED with the exception and the run goes on.

Part 2, cold compile (first call wall time minus the wall time of one eager call of the same
function timed right after it, since the first call also runs the function once: timing mode takes
its values from eager PyTorch, Inductor runs its kernels; sim_mode="timing", target trn2) of full-size bert-base
and gpt2-small (b1 s128 bf16, random weights, no_grad) beside PyTorch Inductor's cold compile
(``torch.compile(m)``, default backend, same model, same input), and their ratio (issue 6 wants
<= 0.30); plus the compile of mm 8192^3 bf16 (issue 6 wants < 2 s). Each measurement runs in a
fresh Python process (so no in-process cache of either compiler survives), with the backend's
modules and the model built before the clock starts; Inductor's caches are off: a fresh
TORCHINDUCTOR_CACHE_DIR, force_disable_caches, fx_graph_cache, autotune_local_cache and the AOT
autograd cache disabled; NEURON_CACHE_DIR / NEURON_DUMP_DIR are unset for ours. Wall times
depend on the machine and its load: compare figures from the same run only. The machine's speed
drifts (on the 2-core development VM a fixed pure-Python loop varies by up to 1.5x from one run
to the next), so each case runs ``--repeat`` rounds (default 3), every round compiling with each
backend in turn, and each backend's figure is its fastest round (all rounds are printed).

Part 3, first calls (issue 21), each in a fresh process as in part 2, same rounds: the wall
time of the *whole* first call (Dynamo, AOTAutograd, the backend's compile, then the values)
against Inductor's (``torch.compile(m)``, caches off as above), and their ratio:
  - first_mobilenet_v3_small, first_efficientnet_b0, first_swin_t: torchvision's models
    (``bench/zoo_vision.py``: without torchvision's C extension; random weights, 1000 classes),
    bf16, a 64 px image, batch 1, ``sim_mode="timing"``, no_grad; the backend's modules imported
    before the clock as in part 2 (issue 21: ratio <= 0.5);
  - first_gpt2: gpt2-small (``GPT2LMHeadModel(GPT2Config())``, random weights, bf16, input
    [1, 128]), *imports included*: the clock starts before ``import torch`` (``_STARTED``) and
    neither backend is imported before the call; the model's construction (the same user code
    for both) is timed apart and taken off; then the later calls' median of 3 (issue 21: ratio
    <= 0.3, later calls < 2 s).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

_STARTED = time.perf_counter()  # before ``import torch``: first_gpt2 counts the imports from here

from dataclasses import dataclass  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Per NeuronCore, from shared/hardware.md (AWS NeuronCore-v2/v3/v4 architecture pages);
# the same table as ../shared/tools/floors.py (tests/test_bench_codegen.py checks they agree).
PEAK = {
    #        bf16 FLOP/s               HBM B/s       ScalarE elements/s
    "trn1": (128 * 128 * 2 * 2.8e9, 820e9 / 2, 128 * 1.4e9),
    "trn2": (128 * 128 * 2 * 2.4e9, 2.9e12 / 8, 128 * 1.2e9),
    # trn3: ScalarE plus VectorE's exponential at 4x ScalarE's rate (trainium3_arch.rst, VectorE).
    "trn3": (128 * 128 * 2 * 2.4e9, 4.9e12 / 8, 5 * 128 * 1.2e9),
}


def floor_s(target: str, flops: float = 0.0, nbytes: float = 0.0, transcendentals: float = 0.0):
    pe, bw, act = PEAK[target]
    return max(flops / pe, nbytes / bw, transcendentals / act)


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


@dataclass(frozen=True)
class Case:
    """``build()`` returns (fn, args, work), work being floor_s's keyword arguments."""
    key: str
    name: str
    build: Callable[[], tuple]
    model: bool = False  # steady state includes the call's transfer


def _mm(m, k, n):
    return lambda: (torch.mm, (bf16(m, k), bf16(k, n)), {"flops": 2 * m * k * n})


def _attention(written_out: bool, causal: bool = False):
    b, h, s, d = 1, 8, 2048, 128
    fn = ((lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, dim=-1) @ v)
          if written_out else (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
    # causal: the visible half of the score matrix (the diagonal blocks counted whole is the
    # compiler's business, not the floor's)
    frac = (s + 1) / (2 * s) if causal else 1.0
    work = {"flops": 4 * b * h * s * s * d * frac, "nbytes": 4 * b * h * s * d * 2,
            "transcendentals": b * h * s * s * frac}
    return lambda: (fn, (bf16(b, h, s, d), bf16(b, h, s, d), bf16(b, h, s, d)), work)


def _rowwise(kind: str):
    rows, cols = 8192, 4096
    io = 2 * rows * cols * 2

    def build():
        x, w = bf16(rows, cols), bf16(cols)
        if kind == "layer_norm":
            return (lambda x, w: F.layer_norm(x, (cols,), w, w)), (x, w), {"nbytes": io + 4 * cols}
        fn = (lambda x: torch.softmax(x, dim=-1)) if kind == "softmax" else F.gelu
        return fn, (x,), {"nbytes": io, "transcendentals": rows * cols}
    return build


def make_model(key: str):
    """(model, input_ids) for 'gpt2' or 'bert': full-size configs, random weights, bf16, eval."""
    import transformers as T
    torch.manual_seed(0)
    if key == "gpt2":
        return (T.GPT2LMHeadModel(T.GPT2Config()).eval().to(torch.bfloat16),
                torch.randint(0, 50257, (1, 128)))
    return T.BertModel(T.BertConfig()).eval().to(torch.bfloat16), torch.randint(0, 30522, (1, 128))


def _model(key: str):
    def build():
        from torch.utils.flop_counter import FlopCounterMode
        m, ids = make_model(key)
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            m(input_ids=ids)
        wbytes = sum(p.numel() * p.element_size() for p in m.parameters())
        return (lambda ids, m=m: m(input_ids=ids)), (ids,), {"flops": fc.get_total_flops(),
                                                             "nbytes": wbytes}
    return build


def _decode_gpt2(cache_len: int = 1024, pos: int = 1000):
    """One greedy decode step of gpt2-small (bf16, b1) over a static KV cache of ``cache_len``
    tokens at position ``pos``; the floor is every byte it must read (weights, except the
    position table it only gathers from, and the whole KV cache) at the per-core HBM rate."""
    def build():
        import transformers as T
        from transformers import StaticCache
        m, _ = make_model("gpt2")
        cache = StaticCache(config=m.config, max_cache_len=cache_len)
        linear = {id(x.weight) for x in m.modules() if isinstance(x, torch.nn.Linear)}
        gathered = {id(x.weight) for x in m.modules() if isinstance(x, torch.nn.Embedding)} - linear
        wbytes = sum(p.numel() * p.element_size() for p in m.parameters() if id(p) not in gathered)
        c = m.config
        kv = c.n_layer * 2 * cache_len * c.n_embd * 2
        fn = (lambda ids, cp, m=m, cache=cache: m(input_ids=ids, past_key_values=cache,
                                                  cache_position=cp, use_cache=True).logits)
        del T
        return fn, (torch.randint(0, 50257, (1, 1)), torch.tensor([pos])), {"nbytes": wbytes + kv}
    return build


CASES = [
    Case("mm_nki", "mm 4096x8192x8192 (NKI tutorial)", _mm(4096, 8192, 8192)),
    Case("mm4096", "mm 4096^3", _mm(4096, 4096, 4096)),
    Case("mm2048", "mm 2048^3", _mm(2048, 2048, 2048)),
    Case("sdpa", "sdpa [1,8,2048,128]", _attention(False)),
    Case("attn", "attention written out", _attention(True)),
    Case("sdpa_causal", "sdpa causal [1,8,2048,128]", _attention(False, causal=True)),
    Case("layer_norm", "layer_norm [8192,4096]", _rowwise("layer_norm")),
    Case("softmax", "softmax [8192,4096]", _rowwise("softmax")),
    Case("gelu", "gelu [8192,4096]", _rowwise("gelu")),
    Case("gpt2", "gpt2-small b1 s128", _model("gpt2"), model=True),
    Case("bert", "bert-base b1 s128", _model("bert"), model=True),
    Case("decode_gpt2", "gpt2-small decode, cache 1024", _decode_gpt2()),
]
COLD = {"cold_bert": "bert-base b1 s128", "cold_gpt2": "gpt2-small b1 s128",
        "mm8192": "mm 8192^3 bf16"}
# part 3: whole first calls (issue 21)
FIRST = {"first_mobilenet_v3_small": "first call mobilenet_v3_small 64px bf16",
         "first_efficientnet_b0": "first call efficientnet_b0 64px bf16",
         "first_swin_t": "first call swin_t 64px bf16",
         "first_gpt2": "first call gpt2-small s128 bf16, imports included"}
# the issues' goals for the ratio ours / Inductor's (mm8192: an absolute < 2 s instead)
GOAL = {"cold_bert": 0.30, "cold_gpt2": 0.30, "first_mobilenet_v3_small": 0.5,
        "first_efficientnet_b0": 0.5, "first_swin_t": 0.5, "first_gpt2": 0.3}
QUICK = ["mm2048", "sdpa", "attn", "layer_norm", "softmax", "gelu"]


def measure(name: str, fn, args, target: str, work: dict, with_transfer: bool) -> dict:
    """One row: compile (first call), then the profiled second call; exceptions become FAILED."""
    import neuron_compiler
    row = {"case": name, "target": target, "floor_us": floor_s(target, **work) * 1e6}
    try:
        torch._dynamo.reset()
        c = torch.compile(fn, backend="neuron", options={"target": target, "sim_mode": "timing"})
        t = time.perf_counter()
        with torch.no_grad(), neuron_compiler.profile() as p0:
            c(*args)
        row["compile_s"] = time.perf_counter() - t
        with torch.no_grad(), neuron_compiler.profile() as p:
            c(*args)
        d = p.to_dict()
        row["first_transfer_us"] = p0.to_dict().get("transfer_time_us", 0.0)
    except Exception as e:  # a crash is reported, not a traceback
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e) else ''}"
        return row
    xfer = d.get("transfer_time_us", 0.0) if with_transfer else 0.0
    row.update(device_us=d["simulated_time_us"], transfer_us=xfer,
               steady_us=d["simulated_time_us"] + xfer,
               instructions=sum(int(q["instructions"]) for q in d["partitions"]),
               fallbacks=sorted({str(f["op"]) for f in d["fallbacks"]}))
    row["of_floor"] = row["floor_us"] / row["steady_us"] if row["steady_us"] > 0 else 0.0
    return row


HEADER = (f"{'case':34s} {'target':6s} {'steady us':>10s} {'xfer us':>9s} {'floor us':>9s} "
          f"{'of floor':>8s} {'instrs':>8s} {'compile s':>9s} {'xfer 2nd/1st':>12s}  fallbacks")


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['case']:34s} {r['target']:6s} FAILED {r['error']}"
    first = r.get("first_transfer_us") or 0.0
    ratio = f"{r['transfer_us'] / first:12.1%}" if r["transfer_us"] and first else f"{'-':>12s}"
    return (f"{r['case']:34s} {r['target']:6s} {r['steady_us']:10.1f} {r['transfer_us']:9.1f} "
            f"{r['floor_us']:9.1f} {r['of_floor']:8.0%} {r['instructions']:8d} "
            f"{r['compile_s']:9.1f} {ratio}  {','.join(r['fallbacks']) or '-'}")


def _caches_off_and_imports(backend: str) -> dict:
    """Before the clock (parts 2 and 3 but first_gpt2): caches off, each backend's compiler
    imported (Inductor's compile_fx with its lowering, graph and scheduler; our lowering API and
    every op family's module); the ``torch.compile`` keyword arguments."""
    if backend == "inductor":
        import torch._functorch.config as fc
        import torch._inductor.config as ic
        importlib.import_module("torch._inductor.compile_fx")
        torch.compiler.config.force_disable_caches = True
        ic.fx_graph_cache = ic.autotune_local_cache = False
        fc.enable_autograd_cache = False
        return {}
    import neuron_compiler  # noqa: F401
    importlib.import_module("lowering.api")
    importlib.import_module("lowering.ops")
    return {"backend": "neuron", "options": {"target": "trn2", "sim_mode": "timing"}}


def vision_model(name: str):
    """(model, image) of part 3: torchvision ``name`` (random weights, 1000 classes), bf16, eval,
    a [1, 3, 64, 64] bf16 image; torchvision loaded by bench/zoo_vision.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from zoo_vision import load_torchvision
    tvm = load_torchvision().models
    torch.manual_seed(0)
    model = getattr(tvm, name)(weights=None, num_classes=1000).eval().to(torch.bfloat16)
    return model, torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(6)).to(
        torch.bfloat16)


def first_call(model, args: tuple, compile_kwargs: dict, later: int = 0) -> dict:
    """Wall time of the first call of ``torch.compile(model, **compile_kwargs)`` (the compile
    included), and the median of ``later`` calls after it."""
    torch._dynamo.reset()
    with torch.no_grad():
        t = time.perf_counter()
        c = torch.compile(model, **compile_kwargs)
        c(*args)
        out = {"first_call_s": time.perf_counter() - t}
        times = []
        for _ in range(later):
            t = time.perf_counter()
            c(*args)
            times.append(time.perf_counter() - t)
    if times:
        out["later_s"] = sorted(times)[len(times) // 2]
    return out


def _first_gpt2_child(backend: str) -> dict:
    """first_gpt2 in a fresh process: imports (from ``_STARTED``, before ``import torch``) plus
    the first call; the model's construction is taken off; nothing of either backend is imported
    before the call (caches are off through the environment ``cold`` sets)."""
    import transformers  # noqa: F401
    imports = time.perf_counter() - _STARTED
    t = time.perf_counter()
    model, ids = make_model("gpt2")
    build = time.perf_counter() - t
    opts = ({} if backend == "inductor" else
            {"backend": "neuron", "options": {"target": "trn2", "sim_mode": "timing"}})
    res = first_call(lambda ids: model(input_ids=ids), (ids,), opts, later=3)
    return {"compile_s": imports + res["first_call_s"], "imports_s": imports, "build_s": build,
            **res}


def cold_child(what: str, backend: str) -> dict:
    """Runs in a fresh process: part 2's compile time (first call minus one eager call), or part
    3's first call."""
    if what == "first_gpt2":
        return _first_gpt2_child(backend)
    opts = _caches_off_and_imports(backend)
    if what.startswith("first_"):
        model, x = vision_model(what.removeprefix("first_"))
        res = first_call(model, (x,), opts)
        return {"compile_s": res["first_call_s"], **res}
    if what == "mm8192":
        m, args = torch.mm, (bf16(8192, 8192), bf16(8192, 8192))
    else:
        model, ids = make_model(what.removeprefix("cold_"))
        m, args = (lambda ids: model(input_ids=ids)), (ids,)
    first = first_call(m, args, opts)["first_call_s"]
    with torch.no_grad():
        # the first call also executes the function once (timing mode takes its values from
        # eager, Inductor runs its kernels): one eager call, timed after it, is taken off both
        t = time.perf_counter()
        m(*args)
        run = time.perf_counter() - t
    return {"compile_s": max(first - run, 0.0), "first_call_s": first, "eager_s": run}


def cold(what: str, backend: str) -> dict:
    """Runs cold_child in a fresh interpreter; {'compile_s': ...} or {'error': ...}."""
    with tempfile.TemporaryDirectory(prefix="bench_codegen_") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("NEURON_CACHE_DIR", "NEURON_DUMP_DIR")}
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                   TORCHINDUCTOR_AUTOGRAD_CACHE="0")
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--cold-child",
                                f"{what}:{backend}"], env=env, capture_output=True, text=True,
                               timeout=3600)
        except subprocess.TimeoutExpired:
            return {"error": "TimeoutExpired: more than 3600 s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return {"error": f"child exit {p.returncode}: {err[:120]}"}


def cold_row(k: str, backends: tuple[str, ...], repeat: int, run=None) -> dict:
    """One row of part 2 or 3: ``repeat`` rounds, each running every backend once in turn (so a
    slow spell of the machine hits both alike); each backend's figure (and the fields measured
    with it) is its fastest round. ``run(k, backend)`` is ``cold`` unless given."""
    run = run or cold
    name = {**COLD, **FIRST}[k]
    row: dict = {"case": name if k in FIRST else f"cold compile {name}", "target": "trn2"}
    for b in backends:
        row[f"{b}_rounds_s"] = []
    for r in range(repeat):
        for b in backends:
            if f"{b}_error" in row:
                continue
            print(f"[bench_codegen] {row['case']} with {b} ({r + 1}/{repeat})",
                  file=sys.stderr, flush=True)
            res = run(k, b)
            if "error" in res:
                row[f"{b}_error"] = res["error"]
                continue
            row[f"{b}_rounds_s"].append(res["compile_s"])
            best = row.get(f"{b}_compile_s")
            if best is None or res["compile_s"] < best:
                row.update({f"{b}_{f}": v for f, v in res.items()})
    ours, theirs = row.get("neuron_compile_s"), row.get("inductor_compile_s")
    row["ratio"] = ours / theirs if ours is not None and theirs else None
    row["goal"] = GOAL.get(k)
    print(format_cold_row(name, row, backends), flush=True)
    return row


def format_cold_row(name: str, row: dict, backends: tuple[str, ...]) -> str:
    fmt = lambda v, w: f"{v:{w}.2f}" if v is not None else f"{'-':>{w}s}"  # noqa: E731
    ratio, goal = row.get("ratio"), row.get("goal")
    verdict = "" if ratio is None or goal is None else ("ok" if ratio <= goal else "OVER")
    extra = [f"{b} FAILED {row[f'{b}_error']}" for b in backends if f"{b}_error" in row]
    if any(f"{b}_later_s" in row for b in backends):
        extra.append("later calls s: " + ", ".join(
            f"{b} {row[f'{b}_later_s']:.2f}" for b in backends if f"{b}_later_s" in row))
    if any(f"{b}_imports_s" in row for b in backends):
        extra.append("of which imports s: " + ", ".join(
            f"{b} {row[f'{b}_imports_s']:.2f}" for b in backends if f"{b}_imports_s" in row))
    rounds = "  ".join(f"{b}: " + " ".join(f"{v:.2f}" for v in row[f"{b}_rounds_s"])
                       for b in backends if len(row.get(f"{b}_rounds_s", ())) > 1)
    if rounds:
        extra.append(f"(rounds {rounds})")
    return (f"{name:52s} {fmt(row.get('neuron_compile_s'), 9)} "
            f"{fmt(row.get('inductor_compile_s'), 10)} {fmt(ratio, 6)} "
            f"{fmt(goal, 5)} {verdict:4s}  " + "  ".join(extra)).rstrip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="trn1,trn2,trn3")
    ap.add_argument("--cases", default="all", help="comma list of keys, 'quick' or 'all': "
                    + ",".join([c.key for c in CASES] + list(COLD) + list(FIRST)))
    ap.add_argument("--skip-inductor", action="store_true", help="cold compile: ours only")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--repeat", type=int, default=3, metavar="N",
                    help="cold compile: rounds per case, fastest kept (default 3)")
    ap.add_argument("--cold-child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.cold_child:
        print(json.dumps(cold_child(*a.cold_child.split(":"))))
        return 0
    targets = [t for t in a.targets.split(",") if t]
    keys = (QUICK if a.cases == "quick" else [c.key for c in CASES] + list(COLD) + list(FIRST)
            if a.cases == "all" else [k for k in a.cases.split(",") if k])
    known = {c.key for c in CASES} | set(COLD) | set(FIRST)
    bad = [k for k in keys if k not in known] + [t for t in targets if t not in PEAK]
    if bad:
        ap.error(f"unknown case or target {bad}; cases: {sorted(known)}, targets: {sorted(PEAK)}")
    rows: list[dict] = []
    if any(c.key in keys for c in CASES):
        # one tiny compile first, so the first row does not also pay the process's one-time costs
        measure("warm-up", torch.mm, (bf16(128, 128), bf16(128, 128)), targets[0], {}, False)
        print(HEADER, flush=True)
    for case in (c for c in CASES if c.key in keys):
        print(f"[bench_codegen] building {case.name}", file=sys.stderr, flush=True)
        try:
            fn, args, work = case.build()
        except Exception as e:
            for t in targets:
                rows.append({"case": case.name, "target": t, "error": f"{type(e).__name__}: {e}"})
                print(format_row(rows[-1]), flush=True)
            continue
        for t in targets:
            print(f"[bench_codegen] {case.name} on {t}", file=sys.stderr, flush=True)
            rows.append(measure(case.name, fn, args, t, work, case.model))
            print(format_row(rows[-1]), flush=True)
    for title, table in (("cold compile (first call minus one eager call; mm 8192^3 < 2 s)", COLD),
                         ("first call, whole (Dynamo, AOTAutograd, compile, values)", FIRST)):
        todo = [k for k in table if k in keys]
        if todo:
            print(f"\n{title}, fresh process per measurement, trn2 timing\n"
                  f"{'':52s} {'neuron s':>9s} {'inductor s':>10s} {'ratio':>6s} {'goal':>5s}")
        for k in todo:
            rows.append(cold_row(k, ("neuron",) + (() if a.skip_inductor or k == "mm8192"
                                                   else ("inductor",)), a.repeat))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"targets": targets, "cases": keys, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
