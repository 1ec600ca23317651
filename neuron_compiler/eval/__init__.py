"""``neuron-eval``: evaluate a model on simulated Trainium targets in one command.

    neuron-eval zoo:gpt2 --targets trn2,trn3 --iters 10 --json report.json
    neuron-eval mypkg.models:make --baseline report.json --max-slowdown 0.05

Modules: ``zoo`` (MODEL -> model and inputs), ``measure`` (eager reference, compile,
steady state per target), ``entries`` (the configuration and per-target report entries that
``measure`` and ``generate`` share), ``accuracy`` (per-output metrics and per-dtype thresholds),
``prices`` (instance prices, HBM capacities, cost model), ``train`` (``--train``),
``generate`` (``--generate N``: TTFT, TPOT, KV cache, tokens against eager's), ``baseline`` (regressions),
``report`` (terminal table), ``html_report`` (``--html``), ``cli`` (flags, exit codes). The JSON schema is in docs/eval.md.

Invariants
- Exit codes (DESIGN.md, docs/eval.md, ``cli.py``): 0 all holds, 1 accuracy failure or
  regression, 2 usage error, 3 the model fails (its factory raises, or it does not run or
  compile), 4 a bug of neuron-eval.
- Importing this package imports neither transformers nor the lowering.
"""
from __future__ import annotations

from neuron_compiler.eval.cli import main

__all__ = ["main"]
