"""The lowering registry's table: ATen ``OpOverload`` -> ``Rule``, and the ``register``
decorator the op families (``lowering/ops/<family>.py``) use to fill it.

This module is a leaf under the families: it imports no family and no lookup triggers loading
here. The lookups that need every family loaded (``get_rule``, ``why_unsupported``,
``supported_ops``) live in ``registry.py``, above the families.

Invariants
- One rule per overload; registering twice is an error (one file per op family registers).
- A rule's ``check`` sees only what is known before shapes are concrete (``meta['val']`` may have
  symbolic sizes); constraints that need concrete sizes raise ``Unsupported`` in the rule itself.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

FLOAT_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
MASK_DTYPES = frozenset({torch.bool})
INDEX_DTYPES = frozenset({torch.int64, torch.int32})
FP8_DTYPES = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})

LowerFn = Callable[..., Any]
CheckFn = Callable[[fx.Node], "str | None"]


@dataclass(frozen=True)
class Rule:
    target: Any
    lower: LowerFn
    dtypes: frozenset
    check: CheckFn | None
    family: str


REGISTRY: dict[Any, Rule] = {}
# ops that are deliberately not lowered, with the reason the fallback table shows (not in the
# support table: they run in eager PyTorch)
DECLINED: dict[Any, str] = {
    torch.ops.aten.nonzero.default: "data-dependent output shape (the number of non-zero elements "
                                    "is only known at run time; a static-shape program cannot "
                                    "hold it)",
    torch.ops.aten._local_scalar_dense.default: "reads a device value back to the host (.item()) "
                                                "for Python control flow",
}


def register(*targets, dtypes: frozenset = FLOAT_DTYPES, check: CheckFn | None = None):
    """Decorator: ``@register(aten.mul.Tensor, aten.mul.Scalar)`` on ``fn(ctx, node, *args,
    **kwargs)``. ``dtypes`` bounds every tensor input and output of the node."""

    def deco(fn: LowerFn) -> LowerFn:
        family = fn.__module__.rsplit(".", 1)[-1]
        for t in targets:
            if t in REGISTRY:
                raise RuntimeError(f"two lowerings registered for {t}")
            REGISTRY[t] = Rule(t, fn, dtypes, check, family)
        return fn

    return deco


def op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)
