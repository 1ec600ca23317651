"""``neuron-eval MODEL``: flags, the run, the outputs and the exit code.

    neuron-eval zoo:gpt2 --targets trn2,trn3 --iters 10
    neuron-eval mymodule:make --json a.json                     # write the JSON report
    neuron-eval mymodule:make --baseline a.json --max-slowdown 0.05

Invariants
- ``main(argv)`` never raises and never calls ``sys.exit``: it returns the exit code of
  DESIGN.md and docs/eval.md, on every path:
    0  everything holds;
    1  an output fails its accuracy thresholds (``--generate``: a generated token differs from
       eager's), or a metric regressed against ``--baseline``;
    2  usage error: a bad flag or value, a MODEL that does not resolve to a factory
       (``zoo.ModelSpecError``), an unreadable baseline, ``--train`` on a model without
       trainable parameters or without a floating-point output, ``--generate`` on a model
       that cannot generate (not a transformers causal LM) or with N < 2, a prompt length
       < 1 or a prompt + N beyond the model's positions;
    3  the model fails: its factory or module raises (``zoo.ModelBuildError``), it raises in
       eager PyTorch, or it does not compile or run on some target;
    4  neuron-eval itself failed (a bug): the traceback is printed.
  Exit 1 is never the result of an exception: CI reads it as "regression".
- The terminal report goes to stdout, progress and errors to stderr; every error is one
  paragraph that says what failed and names the exit code. ``--json`` and ``--html`` are
  written on exits 0, 1 and 3 (on 3 with what was measured before the failure), atomically;
  the JSON has exactly the top-level keys ``baseline.TOP_LEVEL_KEYS``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence

from neuron_compiler.options import TARGETS

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_COMPILE, EXIT_INTERNAL = 0, 1, 2, 3, 4


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuron-eval",
        description="Evaluate a PyTorch model on simulated Trainium targets: compile, "
                    "accuracy against eager, steady-state latency per target, fallbacks, "
                    "memory, cost; optionally against a baseline report.",
        epilog="exit codes: 0 ok, 1 accuracy failure or regression, 2 usage error, "
               "3 the model fails (its factory raises, or it does not compile or run), "
               "4 internal error of neuron-eval. JSON schema: docs/eval.md.")
    p.add_argument("model", metavar="MODEL",
                   help="module:factory, path/file.py:factory (factory() returns (model, "
                        "args_tuple) or (model, kwargs_dict)), or zoo:mlp|gpt2|bert|llama|llama3-8b")
    p.add_argument("--targets", default="trn2,trn3",
                   help=f"comma-separated, from {','.join(TARGETS)} (default trn2,trn3)")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="calls before measuring (the first compiles; default 1)")
    p.add_argument("--iters", type=int, default=10, metavar="N",
                   help="steady-state calls measured (default 10)")
    p.add_argument("--sim-mode", choices=("functional", "timing"), default="functional",
                   help="functional (default): outputs computed by the simulated program, so "
                        "accuracy is meaningful; timing: outputs from eager, faster")
    p.add_argument("--fallback", choices=("allow", "error"), default="allow",
                   help="error: an op that cannot run on the device fails the compile (exit 3)")
    p.add_argument("--auto-cast", choices=("none", "matmul", "all"), default="none",
                   help="the backend's auto_cast option: compute fp32 matmuls (or all fp32 "
                        "ops) in bf16; fp32 outputs are then judged by the bfloat16 thresholds")
    p.add_argument("--host-link-gbps", type=float, default=None, metavar="GBPS",
                   help="the backend's host_link_gbps option: host<->device link bandwidth "
                        "in GB/s (default: each target's ASSUMED figure; no published one)")
    p.add_argument("--call-overhead-us", type=float, default=None, metavar="US",
                   help="the backend's call_overhead_us option: runtime launch overhead per "
                        "device-partition call (default 0, ASSUMED: no published figure)")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    p.add_argument("--html", metavar="PATH",
                   help="write a self-contained HTML report (inline SVG charts, no network)")
    p.add_argument("--train", action="store_true",
                   help="measure one training step per call (forward + loss + backward + "
                        "SGD step, all compiled) instead of an inference call")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="greedy generation of N tokens with a static KV cache (transformers "
                        "causal LMs): TTFT, TPOT p50/p99, tokens/s, KV cache HBM, tokens "
                        "against eager's; a call is then one decode step")
    p.add_argument("--prompt-len", type=int, default=None, metavar="L",
                   help="--generate: prompt length (default: the model input's length, or 8)")
    p.add_argument("--buckets", default=None, metavar="auto|L1,L2,...",
                   help="--generate: left-pad the prompt to the smallest of these lengths "
                        "(auto: powers of two from 16 up to the model's positions minus N) with "
                        "its attention mask, as a server does, so that every prompt length of a "
                        "bucket reuses one prefill compile (neuron_compiler.bucket_prompt)")
    p.add_argument("--baseline", metavar="PATH", help="a previous --json report to compare with")
    p.add_argument("--max-slowdown", type=float, default=0.10, metavar="FRACTION",
                   help="allowed growth of p50 latency, simulated time and cost, and drop of "
                        "throughput, against the baseline (default 0.10)")
    p.add_argument("--max-memory-growth", type=float, default=0.10, metavar="FRACTION",
                   help="allowed growth of HBM bytes against the baseline (default 0.10)")
    p.add_argument("--max-share-drop", type=float, default=0.0, metavar="FRACTION",
                   help="allowed drop of the device share by nodes (absolute; default 0)")
    p.add_argument("--max-compile-slowdown", type=float, default=None, metavar="FRACTION",
                   help="allowed growth of the first call's wall time (default: not checked)")
    for flag, what in (("--atol", "absolute tolerance"), ("--rtol", "relative tolerance"),
                       ("--min-cosine", "minimum cosine similarity")):
        p.add_argument(flag, action="append", default=[], metavar="[DTYPE=]VALUE",
                       help=f"{what}, for one dtype or all (repeatable)")
    p.add_argument("--price", action="append", default=[], metavar="INSTANCE=USD_PER_HOUR",
                   help="override an on-demand price (repeatable)")
    p.add_argument("--lnc", type=int, choices=(1, 2), default=None,
                   help="physical NeuronCores per logical core (backend option lnc; default 1; "
                        "2 on trn2/trn3 only, as AWS ships them): each device partition is "
                        "split over the pair where it can be, and collectives place the ranks "
                        "by it")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallel over N ranks (transformers Llama-family models): "
                        "rank 0's shard is compiled and simulated, its all_reduce/all_gather "
                        "timed by the collective model among N ranks (see "
                        "neuron_compiler/eval/parallel.py); values are one rank's")
    p.add_argument("--dp", type=int, default=1, metavar="N",
                   help="data parallel over N ranks: one rank simulated; group throughput, and "
                        "with --train the modelled DDP gradient all_reduce")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _config(args: argparse.Namespace):
    import neuron_compiler.eval.prices as prices
    from neuron_compiler.eval.accuracy import parse_threshold_flags
    from neuron_compiler.eval.baseline import Limits
    from neuron_compiler.eval.measure import EvalConfig
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if not targets or bad:
        raise _UsageError(f"--targets: unknown target(s) {', '.join(bad) or '(none)'}; "
                          f"choose from {', '.join(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise _UsageError(f"--targets: a target is repeated in {args.targets!r}")
    if args.warmup < 0 or args.iters < 1:
        raise _UsageError(f"--warmup must be >= 0 and --iters >= 1 (got {args.warmup}, "
                          f"{args.iters})")
    for flag in ("max_slowdown", "max_memory_growth", "max_share_drop", "max_compile_slowdown"):
        v = getattr(args, flag)
        if v is not None and not v >= 0:
            raise _UsageError(f"--{flag.replace('_', '-')} must be >= 0, got {v}")
    if args.prompt_len is not None and not args.generate:
        raise _UsageError("--prompt-len applies to --generate N only")
    if args.buckets is not None:
        if not args.generate:
            raise _UsageError("--buckets applies to --generate N only")
        from neuron_compiler.eval.generate import resolve_buckets
        try:
            resolve_buckets(args.buckets, None, args.generate)
        except ValueError as exc:
            raise _UsageError(f"--buckets: {exc}") from None
    if args.tp < 1 or args.dp < 1:
        raise _UsageError(f"--tp and --dp must be >= 1 (got {args.tp}, {args.dp})")
    if args.tp > 1 and args.dp > 1:
        raise _UsageError("--tp and --dp cannot be combined yet: choose one")
    if args.lnc == 2 and "trn1" in targets:
        raise _UsageError("--lnc 2: on trn1 only lnc=1 is supported (compiler error EARG001); "
                          "drop trn1 from --targets or use --lnc 1")
    if args.generate and args.train:
        raise _UsageError("--generate and --train cannot be combined: choose one")
    if args.generate < 0:
        raise _UsageError(f"--generate must be >= 2, got {args.generate}")
    from neuron_compiler.errors import NeuronOptionError
    from neuron_compiler.options import validate_options
    host = {"host_link_gbps": args.host_link_gbps, "call_overhead_us": args.call_overhead_us}
    try:
        validate_options(host)
    except NeuronOptionError as exc:
        flag = next(f"--{k.replace('_', '-')}" for k in host if k in str(exc))
        raise _UsageError(f"{flag}: {exc}") from None
    try:
        thresholds = parse_threshold_flags(args.atol, args.rtol, args.min_cosine)
        overrides = dict(prices.parse_price(p) for p in args.price)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    progress = (lambda msg: None) if args.quiet else (
        lambda msg: print(f"neuron-eval: {msg}", file=sys.stderr, flush=True))
    cfg = EvalConfig(targets=targets, warmup=args.warmup, iters=args.iters,
                     sim_mode=args.sim_mode, fallback=args.fallback, thresholds=thresholds,
                     prices=overrides, progress=progress, train=args.train,
                     generate=args.generate, prompt_len=args.prompt_len, buckets=args.buckets,
                     auto_cast=args.auto_cast, lnc=args.lnc, **host)
    limits = Limits(args.max_slowdown, args.max_memory_growth, args.max_share_drop,
                    args.max_compile_slowdown)
    return cfg, limits


def _write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees half a report)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _outputs(args: argparse.Namespace, report: dict, code: int) -> None:
    """The terminal report on stdout, and ``--json`` / ``--html`` when asked."""
    from neuron_compiler.eval.html_report import render_html
    from neuron_compiler.eval.report import render
    if args.json:
        _write(args.json, json.dumps(report, indent=2) + "\n")
    if args.html:
        _write(args.html, render_html(report, code))
    try:
        print(render(report, code), flush=True)
    except BrokenPipeError:   # `neuron-eval ... | head`: the reader left; keep the exit code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _fail(what: str, exc: BaseException, code: int) -> int:
    print(f"neuron-eval: {what}: {exc}\n(exit {code})", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``neuron-eval`` and return its exit code (module docstring); never raises."""
    try:
        return _main(argv)
    except Exception:   # a bug of neuron-eval: never exit 1, which CI reads as a regression
        print("neuron-eval: internal error (a bug of neuron-eval, not of the model or the "
              f"command line; exit {EXIT_INTERNAL}):\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if "neuron_compiler.tp" in sys.modules:      # --tp opened a single-process group
            sys.modules["neuron_compiler.tp"].close_fake_group()


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:   # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    from neuron_compiler.eval.baseline import comparison, load_baseline
    from neuron_compiler.eval.measure import (CompileFailure, ModelFailure, empty_report,
                                              evaluate)
    from neuron_compiler.eval.zoo import ModelBuildError, ModelSpecError, load_model
    import torch
    try:
        cfg, limits = _config(args)
        baseline = load_baseline(args.baseline) if args.baseline else None
        loaded = load_model(args.model)
        parallel = {}
        if isinstance(loaded.model, torch.nn.Module):   # --tp N; a model on the meta device
            from neuron_compiler.eval.parallel import apply_tp
            from neuron_compiler.tp import TPError
            try:
                parallel = apply_tp(loaded, args.tp)
            except TPError as exc:
                raise _UsageError(f"--tp {args.tp}: {exc}") from None
        if args.train:
            from neuron_compiler.eval.train import check_trainable
            check_trainable(loaded)
        if args.generate:
            from neuron_compiler.eval.generate import check_generative
            check_generative(loaded, args.generate, args.prompt_len, args.buckets)
    except ModelBuildError as exc:
        report = empty_report(cfg.targets, args.model)
        report["compile"] = {"ok": False, "error": str(exc), "failed_target": None,
                             "failed_stage": "build"}
        _outputs(args, report, EXIT_COMPILE)
        return _fail("the model could not be built", exc, EXIT_COMPILE)
    except (_UsageError, ModelSpecError, ValueError) as exc:
        return _fail("usage error", exc, EXIT_USAGE)
    try:
        report = evaluate(loaded, cfg)
    except ModelSpecError as exc:   # --train on a model with no float output
        return _fail("usage error", exc, EXIT_USAGE)
    except ModelFailure as exc:
        _outputs(args, exc.report, EXIT_COMPILE)   # type: ignore[attr-defined]
        return _fail("the model does not run", exc, EXIT_COMPILE)
    except CompileFailure as exc:
        _outputs(args, exc.report, EXIT_COMPILE)   # type: ignore[attr-defined]
        return _fail("the model does not compile", exc, EXIT_COMPILE)
    if args.tp > 1 or args.dp > 1:
        from neuron_compiler.eval.parallel import finish
        finish(report, args.tp, args.dp, parallel, args.train, args.lnc or 1)
    if baseline is not None:
        report["regressions"], report["baseline"] = comparison(report, baseline, limits,
                                                               args.baseline)
    code = EXIT_OK if report["accuracy"]["passed"] and not report["regressions"] else EXIT_FAIL
    _outputs(args, report, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
