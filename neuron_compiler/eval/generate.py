"""``neuron-eval --generate N [--prompt-len L]``: greedy generation with a static KV cache, timed
per call: time to first token (TTFT), time per output token (TPOT), tokens per second, the KV
cache's HBM footprint, the Dynamo graphs compiled, and the tokens against eager's.

One generation, the same call for eager and for every target:
    model.generate(prompt, attention_mask=ones, max_new_tokens=N, min_new_tokens=N,
                   do_sample=False, cache_implementation="static",
                   return_dict_in_generate=True, output_logits=True)
With ``--buckets``, the prompt is left-padded to its bucket with its attention mask
(``neuron_compiler.bucket_prompt``), for eager and every target alike, as a server does so that
the prompt lengths of one bucket share one prefill compile.
On a target, ``model.forward`` is replaced by ``torch.compile(model.forward, backend=neuron)``
wrapped in a recorder that opens one ``neuron_compiler.profile()`` per forward call (profiles
nest, so each call's own simulated time, transfer, call overhead and fallback time are read
from its own profile). The first forward call of a generation is the prefill (the whole
prompt, filling the cache); the N-1 others are decode steps (one token each).

Invariants
- Each run (eager and each target) starts from a deep copy of the factory's model, so no run
  sees another's cache or compiled forward. ``--warmup`` generations (default 1: they compile
  the prefill and the decode graph) come first, unmeasured; then one measured generation.
- TTFT = latency of the measured prefill call; TPOT samples = latencies of its N-1 decode calls;
  a call's latency is measure.py's: simulated device time + host transfer + runtime call
  overhead + eager fallback wall time, from that call's profile. The host's own generate loop
  (logits processing, argmax, cache bookkeeping in Python) is not part of either. tokens/s =
  1e6 / TPOT p50. The report's ``latency_us``, ``throughput_per_s``, cost and device share of
  a target are those of one decode step (a call is a decode step).
- ``kv_cache`` is measured from the static cache the generation returned: the bytes of every
  layer's key and value tensors (= layers x 2 x batch x kv_heads x max_cache_len x head_dim x
  itemsize); it is added to the target's HBM estimate.
- Accuracy compares the N generated token ids exactly (int64: any mismatch fails, exit 1) and
  the logits of the first and the last generated token with the fp32 thresholds. With
  ``--sim-mode functional`` (the default) the compiled model's values come from the simulator,
  so the tokens are the compiler's; with ``--sim-mode timing`` they come from eager partitions
  and the comparison only checks partitioning and fallbacks (``tokens_from`` says which).
- N >= 2, L >= 1, and L + N within the model's position limit, or ``ModelSpecError`` (exit
  2); so is a model that cannot generate (no ``generate``/``config``, or ``can_generate()`` is
  False: not a transformers causal LM).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable

import numpy as np
import torch

import neuron_compiler
from neuron_compiler.buckets import bucket_prompt, prompt_buckets
from neuron_compiler.eval.accuracy import dtype_name
from neuron_compiler.eval.entries import (CompileFailure, CountingBackend, call_latency,
                                          compile_entry, target_entry, target_options)
from neuron_compiler.eval.zoo import LoadedModel, ModelSpecError

DEFAULT_PROMPT_LEN = 8
KV_FORMULA = "layers x 2 (K, V) x batch x kv_heads x max_cache_len x head_dim x itemsize"
_POSITION_KEYS = ("max_position_embeddings", "n_positions")


def position_limit(model: torch.nn.Module) -> int | None:
    return next((getattr(model.config, k) for k in _POSITION_KEYS
                 if isinstance(getattr(model.config, k, None), int)), None)


def resolve_buckets(spec: str, limit: int | None, n: int) -> tuple[int, ...]:
    """``--buckets``: "auto" (``prompt_buckets`` up to the model's positions minus N; 2048
    without a position limit) or comma-separated lengths."""
    if spec == "auto":
        return prompt_buckets(max((limit or 2048) - n, 1))
    try:
        sizes = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ValueError(f"expected 'auto' or comma-separated lengths >= 1, got {spec!r}")
    return sizes


def generation_prompt(loaded: LoadedModel, cfg) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(prompt ids, attention mask, the report's prompt entry): ``prompt_ids``, left-padded to
    its bucket with ``--buckets`` (``neuron_compiler.bucket_prompt``; eager and every target
    get the same padded prompt)."""
    ids, source = prompt_ids(loaded, cfg.prompt_len)
    info = {"prompt": source, "prompt_len": int(ids.shape[1]), "bucket": None}
    if cfg.buckets is None:
        return ids, torch.ones_like(ids), info
    model = loaded.model
    sizes = resolve_buckets(cfg.buckets, position_limit(model), cfg.generate)
    pad = next((v for v in (getattr(model.config, "pad_token_id", None),
                            getattr(model.config, "eos_token_id", None)) if isinstance(v, int)), 0)
    b = bucket_prompt(ids, buckets=sizes, pad_token_id=pad)
    info["bucket"] = {"length": b.bucket, "padding": b.padding, "buckets": list(sizes),
                      "pad_token_id": pad}
    return b.input_ids, b.attention_mask, info


def check_generative(loaded: LoadedModel, n: int, prompt_len: int | None,
                     buckets: str | None = None) -> None:
    """Raise ``ModelSpecError`` unless ``loaded`` can generate ``n`` tokens after a prompt of
    ``prompt_len`` (module docstring)."""
    model = loaded.model
    name = type(model).__name__
    if not (isinstance(model, torch.nn.Module) and callable(getattr(model, "generate", None))
            and hasattr(model, "config")):
        raise ModelSpecError(
            f"--generate needs a transformers causal language model (a model with a "
            f"`generate` method and a `config`, e.g. GPT2LMHeadModel, LlamaForCausalLM); "
            f"{loaded.spec} builds a {name}, which cannot generate. Run without --generate "
            f"to measure one forward call")
    can = getattr(model, "can_generate", None)
    if callable(can) and not can():
        raise ModelSpecError(f"--generate: {name}.can_generate() is False: it is not a causal "
                             f"language model (use its ...ForCausalLM / ...LMHeadModel class)")
    if n < 2:
        raise ModelSpecError(f"--generate N needs N >= 2 (the first token comes from the "
                             f"prefill, TPOT needs at least one decode step), got {n}")
    if prompt_len is not None and prompt_len < 1:
        raise ModelSpecError(f"--prompt-len must be >= 1, got {prompt_len}")
    ids, _ = prompt_ids(loaded, prompt_len)
    limit = position_limit(model)
    if buckets is not None:
        try:
            ids = bucket_prompt(ids, buckets=resolve_buckets(buckets, limit, n)).input_ids
        except ValueError as exc:
            raise ModelSpecError(f"--buckets: {exc}") from None
    if limit is not None and ids.shape[1] + n > limit:
        raise ModelSpecError(f"--generate {n} after a prompt of {ids.shape[1]} tokens needs "
                             f"{ids.shape[1] + n} positions; {name} has {limit}: lower N or "
                             f"--prompt-len" + (" or the buckets" if buckets is not None else ""))


def prompt_ids(loaded: LoadedModel, prompt_len: int | None) -> tuple[torch.Tensor, str]:
    """(the prompt [batch, L] int64, where it came from): the model input's ``input_ids``
    (keyword, or a first positional integer tensor) cut to its first L tokens; without such an
    input, or when L exceeds it, L tokens drawn with seed 0 from the model's vocabulary
    (default L: the input's length, else ``DEFAULT_PROMPT_LEN``)."""
    ids = loaded.kwargs.get("input_ids")
    if ids is None and loaded.args and isinstance(loaded.args[0], torch.Tensor):
        ids = loaded.args[0]
    if not (isinstance(ids, torch.Tensor) and ids.dim() == 2
            and not ids.is_floating_point()):
        ids = None
    if ids is not None and (prompt_len is None or prompt_len <= ids.shape[1]):
        L = ids.shape[1] if prompt_len is None else prompt_len
        return ids[:, :L].clone(), f"the model input's input_ids, first {L} tokens"
    L = prompt_len or DEFAULT_PROMPT_LEN
    batch = ids.shape[0] if ids is not None else 1
    vocab = int(getattr(loaded.model.config, "vocab_size", 2))
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, L), generator=gen),
            f"{L} random tokens (seed 0, vocabulary {vocab})")


def kv_cache_info(cache: object) -> dict | None:
    """Bytes and shape of a static cache's key/value tensors (None: not a layered cache)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    tensors = [t for layer in layers for t in (getattr(layer, "keys", None),
                                               getattr(layer, "values", None))
               if isinstance(t, torch.Tensor)]
    if not tensors:
        return None
    b, h, L, d = (list(tensors[0].shape) + [None] * 4)[:4]
    return {"bytes": int(sum(t.numel() * t.element_size() for t in tensors)),
            "layers": len(layers), "tensors": len(tensors), "batch": b, "kv_heads": h,
            "max_cache_len": L, "head_dim": d, "dtype": dtype_name(tensors[0].dtype),
            "formula": KV_FORMULA, "class": type(cache).__name__}


class _Recorder:
    """Replaces ``model.forward``: each call runs ``forward`` inside its own profile (when
    ``profiled``) and, for each call index in ``count_at``, inside a counting dispatch mode of
    its own (``counters[index]``)."""

    def __init__(self, forward: Callable, original: Callable, profiled: bool):
        self.forward, self.profiled = forward, profiled
        self.calls: list[dict] = []
        self.count_at: tuple[int | tuple[int, ...], Callable[[], object]] | None = None
        self.counters: dict[int, object] = {}
        call = self._call
        # generate() inspects forward's signature (``logits_to_keep``, ...): keep it
        self.wrapped = functools.wraps(original)(lambda *args, **kwargs: call(*args, **kwargs))

    def _call(self, *args, **kwargs):
        i = len(self.calls)
        with contextlib.ExitStack() as stack:
            prof = stack.enter_context(neuron_compiler.profile()) if self.profiled else None
            if self.count_at is not None and i in _indices(self.count_at[0]):
                self.counters[i] = stack.enter_context(self.count_at[1]())
            t0 = time.perf_counter()
            out = self.forward(*args, **kwargs)
            wall = time.perf_counter() - t0
        self.calls.append({"wall_s": wall, "profile": prof.to_dict() if prof else None})
        return out


def _indices(at: int | tuple[int, ...]) -> tuple[int, ...]:
    return at if isinstance(at, tuple) else (at,)


def _generate(model: torch.nn.Module, ids: torch.Tensor, n: int,
              mask: torch.Tensor | None = None) -> object:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                              max_new_tokens=n,
                              min_new_tokens=n, do_sample=False,
                              cache_implementation="static", return_dict_in_generate=True,
                              output_logits=True)


def _values(out: object, prompt_len: int) -> dict:
    """What accuracy compares: the new token ids and the first and last tokens' logits."""
    logits = out.logits
    return {"tokens": out.sequences[:, prompt_len:].clone(),
            "first_token_logits": logits[0].detach().clone(),
            "last_token_logits": logits[-1].detach().clone()}


def _cache(out: object) -> object:
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def eager_generate(loaded: LoadedModel, cfg) -> tuple[dict, dict]:
    """(reference values, the report's ``model.generate`` entry): one eager generation for the
    tokens and the KV cache, one more (two tokens) with FLOPs counted for the prefill and the
    first decode step."""
    from neuron_compiler.eval.flops import model_flop_counter
    ids, mask, prompt = generation_prompt(loaded, cfg)
    n = cfg.generate
    model = copy.deepcopy(loaded.model)
    rec = _Recorder(model.forward, model.forward, profiled=False)
    model.forward = rec.wrapped
    t0 = time.perf_counter()
    out = _generate(model, ids, n, mask)
    wall = time.perf_counter() - t0
    walls = [c["wall_s"] * 1e3 for c in rec.calls]
    # one more generation of two tokens, the prefill and the first decode step each counted
    # (a counter of its own per call; not the timed run, which the counting would slow)
    probe = copy.deepcopy(loaded.model)
    prec = _Recorder(probe.forward, probe.forward, profiled=False)
    prec.count_at = ((0, 1), model_flop_counter)
    probe.forward = prec.wrapped
    _generate(probe, ids, 2, mask)
    flops = [int(prec.counters[at].get_total_flops()) for at in (0, 1)]
    del probe
    tokens = out.sequences[:, ids.shape[1]:]
    return _values(out, ids.shape[1]), {
        "tokens": n, "prompt_len": prompt["prompt_len"], "batch": int(ids.shape[0]),
        "prompt": prompt["prompt"], "prompt_bucket": prompt["bucket"],
        "call": (f"model.generate(prompt, max_new_tokens={n}, min_new_tokens={n}, "
                 f"do_sample=False, cache_implementation='static')"),
        "forward_calls": len(rec.calls),
        "kv_cache": kv_cache_info(_cache(out)),
        "prefill_flops": flops[0], "decode_flops": flops[1],
        "eager_wall_ms": wall * 1e3,
        "eager_ttft_ms": walls[0],
        "eager_tpot_p50_ms": float(np.median(walls[1:])) if len(walls) > 1 else None,
        "token_ids": tokens[0].tolist(),
    }


def _latency(d: dict) -> float:
    return sum(call_latency(d))


def run_generate(loaded: LoadedModel, ref: dict, model_info: dict, target: str,
                 cfg) -> tuple[dict, dict, list[dict]]:
    """(targets[target], compile.targets[target], accuracy rows) of ``--generate`` on one
    target (module docstring); raises ``entries.CompileFailure``."""
    from neuron_compiler.eval.accuracy import compare_outputs
    from neuron_compiler.eval.flops import HostFlops
    torch._dynamo.reset()
    options = target_options(cfg, target)
    backend = CountingBackend(options)
    ids, mask, prompt = generation_prompt(loaded, cfg)
    n = cfg.generate
    model = copy.deepcopy(loaded.model)
    rec = _Recorder(torch.compile(model.forward, backend=backend), model.forward, True)
    model.forward = rec.wrapped
    warm: list[dict] = []
    first_call_s, graphs_after_first = 0.0, 0
    try:
        for run in range(cfg.warmup + 1):
            measured = run == cfg.warmup
            cfg.progress(f"[{target}] " + (f"measured generation of {n} tokens" if measured
                                           else f"warm-up generation {run + 1}/{cfg.warmup}"))
            rec.calls = []
            # host FLOPs of one decode step: the last warm-up's last one (the measured run's
            # when there is no warm-up, whose last step then also times the counting)
            rec.count_at = (n - 1, HostFlops) if run == max(cfg.warmup - 1, 0) else None
            t0 = time.perf_counter()
            with neuron_compiler.profile() as prof:
                out = _generate(model, ids, n, mask)
            if run == 0:
                first_call_s = time.perf_counter() - t0
                graphs_after_first = backend.graphs
            if measured:
                calls, whole = [c["profile"] for c in rec.calls], prof.to_dict()
            else:
                warm += [c["profile"] for c in rec.calls]
    except Exception as exc:
        raise CompileFailure(target, exc) from exc
    prefill, decode = calls[0], calls[1:]
    per_target = target_entry(target, cfg, options, model_info, warm, decode, rec.counters.get(n - 1),
                              model_info["generate"]["decode_flops"])
    kv = kv_cache_info(_cache(out))
    mem = per_target["memory"]
    if kv is not None:
        mem["kv_cache_bytes"] = kv["bytes"]
        mem["hbm_bytes"] += kv["bytes"]
        mem["hbm_fraction_of_core"] = mem["hbm_bytes"] / mem["hbm_capacity_core_bytes"]
        mem["fits_one_core"] = mem["hbm_bytes"] <= mem["hbm_capacity_core_bytes"]
        mem["estimate"] += "; + the static KV cache (--generate)"
    got = _values(out, ids.shape[1])
    same = got["tokens"] == ref["tokens"]
    mismatch = None if bool(same.all()) else int((~same).any(dim=0).nonzero()[0, 0])
    tpot = per_target["latency_us"]
    per_target["generate"] = {
        "tokens": n, "prompt_len": prompt["prompt_len"], "batch": int(ids.shape[0]),
        "prompt_bucket": prompt["bucket"],
        "ttft_us": _latency(prefill),
        "ttft": {"simulated_us": prefill["simulated_time_us"],
                 "transfer_us": prefill["transfer_time_us"],
                 "call_overhead_us": prefill.get("call_overhead_time_us", 0.0),
                 "fallback_us": prefill["fallback_time_us"],
                 "collective_us": prefill.get("collective_time_us", 0.0)},
        "tpot_us": {k: tpot[k] for k in ("p50", "p90", "p99", "mean", "min", "max",
                                         "samples", "simulated_us", "transfer_us")},
        "tpot_collective_us": tpot.get("collective_us", 0.0),
        "decode_steps": len(decode),
        "tokens_per_s": per_target["throughput_per_s"],
        "generation_us": _latency(prefill) + sum(tpot["samples"]),
        "kv_cache": kv,
        "dynamo_graphs": backend.graphs,
        "graph_calls": [{"name": g["name"], "calls": g["calls"]} for g in whole["graphs"]],
        "tokens_match_eager": mismatch is None,
        "first_mismatch": mismatch,
        "tokens_from": ("simulator (sim_mode=functional)" if cfg.sim_mode == "functional"
                        else "eager partitions (sim_mode=timing): the comparison does not "
                             "test the simulated arithmetic"),
        "token_ids": got["tokens"][0].tolist(),
    }
    compile_info = compile_entry(first_call_s, backend.graphs,
                                 backend.graphs - graphs_after_first, warm + calls, whole)
    rows = compare_outputs(got, ref, cfg.effective_thresholds())
    for r in rows:
        r["target"] = target
    return per_target, compile_info, rows
