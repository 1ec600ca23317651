"""Resolve ``neuron-eval``'s MODEL argument into ``(model, args, kwargs)``.

    zoo:mlp | zoo:gpt2 | zoo:bert | zoo:llama      built-in tiny models (seeded random weights)
    package.module:factory                         importlib.import_module, then getattr
    path/to/file.py:factory                        loaded from the file

Invariants
- ``factory()`` takes no arguments and returns ``(model, args_tuple)`` or
  ``(model, kwargs_dict)`` (DESIGN.md). A MODEL that does not resolve to such a factory (no
  ``:``, an unknown zoo name, a file that does not exist, a module that is not found, a
  missing or non-callable factory, a factory that returns something else) raises
  ``ModelSpecError``: a usage error, exit 2.
- Code of the model that raises (the factory, a zoo builder, or the user's module while it is
  imported) raises ``ModelBuildError``: the model's own failure, exit 3. Its message is one
  paragraph naming the factory, the exception and the innermost frame it came from.
- The transformers models keep ``use_cache`` at its default (the cache object is not compared;
  only tensor outputs are).
- Built-in models are deterministic: each builder seeds ``torch.manual_seed(0)`` before it makes
  weights and inputs, and returns a model in ``eval()`` mode. The transformers models are built
  from configurations (no network, no download); without transformers the error says so.
- Importing this module imports neither transformers nor the user's module.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


class ModelSpecError(ValueError):
    """MODEL could not be resolved into a model and its inputs (a usage error)."""


class ModelBuildError(RuntimeError):
    """The model's own code raised while it was built (a factory or its module's import)."""

    def __init__(self, spec: str, what: str, exc: BaseException):
        self.spec, self.exc = spec, exc
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = (f" (at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno} in "
                 f"{tb.tb_frame.f_code.co_name})" if tb is not None else "")
        first = (str(exc).strip().splitlines() or [""])[0]
        super().__init__(
            f"{spec}: {what} raised {type(exc).__name__}: {first}{where}. This is a failure of "
            f"the model's own code, before anything was compiled: fix it, or run it in Python "
            f"to see the whole traceback")


@dataclass
class LoadedModel:
    spec: str
    model: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    description: str = ""


def _mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64))
    return model.eval(), (torch.randn(8, 64),)


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ModelSpecError(
            "this built-in model is built from a transformers configuration, but the "
            "'transformers' package is not installed (pip install transformers; zoo:mlp needs "
            f"nothing more): {exc}") from exc
    return transformers


_TOKEN_IDS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)   # inside the tiny vocabulary
_VOCAB, _SEQ = 512, 32


def _ids() -> dict:
    return {"input_ids": torch.randint(0, _VOCAB, (1, _SEQ))}


def _gpt2() -> tuple[nn.Module, dict]:
    T = _transformers()
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=_VOCAB,
                       **_TOKEN_IDS)
    return T.GPT2LMHeadModel(cfg).eval(), _ids()


def _bert() -> tuple[nn.Module, dict]:
    T = _transformers()
    torch.manual_seed(0)
    cfg = T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                       intermediate_size=256, vocab_size=_VOCAB, max_position_embeddings=64,
                       pad_token_id=0)
    return T.BertModel(cfg).eval(), _ids()


def _llama() -> tuple[nn.Module, dict]:
    T = _transformers()
    torch.manual_seed(0)
    # grouped-query attention, as Llama 3 has it: 2 key/value heads for 4 query heads
    cfg = T.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, vocab_size=_VOCAB,
                        max_position_embeddings=64, **_TOKEN_IDS)
    return T.LlamaForCausalLM(cfg).eval(), _ids()


def _llama3_8b() -> tuple[nn.Module, dict]:
    """Llama-3-8B's shapes (meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096, 32
    heads, 8 key/value heads, intermediate 14336, vocabulary 128256, rope_theta 500000), bf16,
    built on the meta device: ``--tp N`` makes only rank 0's shard (random values), see
    neuron_compiler/tp.py. Without --tp the whole model (16 GB) is made."""
    T = _transformers()
    torch.manual_seed(0)
    cfg = T.LlamaConfig(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                        num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                        bos_token_id=128000, eos_token_id=128001, pad_token_id=128001,
                        torch_dtype=torch.bfloat16)
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval(), {"input_ids": torch.randint(0, 128000, (1, 128))}


ZOO: dict[str, tuple[Callable[[], tuple], str]] = {
    "mlp": (_mlp, "Linear(64,256)-GELU-Linear(256,64)-LayerNorm, input [8,64] fp32"),
    "gpt2": (_gpt2, "transformers GPT2LMHeadModel, 2 layers, d=64, 4 heads, vocab 512, "
                    "input_ids [1,32]"),
    "bert": (_bert, "transformers BertModel, 2 layers, d=64, 4 heads, vocab 512, "
                    "input_ids [1,32]"),
    "llama": (_llama, "transformers LlamaForCausalLM, 2 layers, d=64, 4 heads (2 kv), "
                      "vocab 512, input_ids [1,32]"),
    "llama3-8b": (_llama3_8b, "transformers LlamaForCausalLM with Llama-3-8B's shapes (32 "
                              "layers, d=4096, 32 heads (8 kv), intermediate 14336, vocab "
                              "128256), bf16, random values, input_ids [1,128]; use --tp N"),
}


def _load_module(ref: str) -> object:
    if ref.endswith(".py") or os.sep in ref or "/" in ref:
        path = os.path.abspath(ref)
        if not os.path.isfile(path):
            raise ModelSpecError(f"model file {ref!r} does not exist")
        name = "_neuron_eval_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ModelSpecError(f"cannot load {ref!r} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ModelBuildError(ref, "importing it", exc) from exc
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())   # as `python -m` would: modules beside the caller
    try:
        return importlib.import_module(ref)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (ref == exc.name or ref.startswith(exc.name + ".")):
            raise ModelSpecError(f"cannot import module {ref!r}: no module named "
                                 f"{exc.name!r} (the current directory and PYTHONPATH were "
                                 f"searched)") from exc
        raise ModelBuildError(ref, "importing it", exc) from exc
    except Exception as exc:
        raise ModelBuildError(ref, "importing it", exc) from exc


def _check(spec: str, made: object) -> LoadedModel:
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ModelSpecError(f"{spec}: the factory must return (model, args_tuple) or "
                             f"(model, kwargs_dict), got {type(made).__name__}")
    model, inputs = made
    if not callable(model):
        raise ModelSpecError(f"{spec}: the model ({type(model).__name__}) is not callable")
    if isinstance(inputs, dict):
        return LoadedModel(spec, model, (), dict(inputs))
    if isinstance(inputs, (tuple, list)):
        return LoadedModel(spec, model, tuple(inputs), {})
    raise ModelSpecError(f"{spec}: the factory's inputs must be a tuple of positional "
                         f"arguments or a dict of keyword arguments, got "
                         f"{type(inputs).__name__}")


def _build(spec: str, fn: Callable[[], object], what: str) -> object:
    """``fn()``; a ``ModelSpecError`` (zoo: transformers missing) passes, anything else the
    factory raises becomes ``ModelBuildError``."""
    try:
        return fn()
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelBuildError(spec, what, exc) from exc


def load_model(spec: str) -> LoadedModel:
    """Resolve MODEL (module docstring); raises ``ModelSpecError`` on every usage problem and
    ``ModelBuildError`` when the model's own code raises."""
    if spec.startswith("zoo:"):
        name = spec[4:]
        if name not in ZOO:
            raise ModelSpecError(f"unknown built-in model {spec!r}; choose from "
                                 + ", ".join(f"zoo:{n}" for n in ZOO))
        build, description = ZOO[name]
        loaded = _check(spec, _build(spec, build, f"the built-in factory {build.__name__}()"))
        loaded.description = description
        return loaded
    ref, sep, factory = spec.rpartition(":")
    if not sep or not ref or not factory:
        raise ModelSpecError(f"MODEL must be 'module:factory', 'path/file.py:factory' or "
                             f"zoo:NAME ({', '.join(ZOO)}); got {spec!r}")
    module = _load_module(ref)
    fn = getattr(module, factory, None)
    if fn is None or not callable(fn):
        raise ModelSpecError(f"{ref!r} has no callable {factory!r}")
    loaded = _check(spec, _build(spec, fn, f"the factory {factory}()"))
    loaded.description = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    return loaded
