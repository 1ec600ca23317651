"""``NkiTensor``'s Python operators, set on the class by ``install()``.

- ``a + b``, ``a - b``, ``a * b``, ``a / b``, ``a ** b`` (and reflected), ``-a``, ``a > b``,
  ``a >= b``, ``a < b``, ``a <= b``, ``a & b``, ``a | b``: the ``nl.*`` element-wise functions
  (``language``);
- ``a[key] = value``: ``ops.assign`` into the view ``a[key]``;
- ``a += b``, ``a -= b``, ``a *= b``, ``a /= b``: ``ops.update`` in place (a matmul added into
  PSUM accumulates there);
- ``a.broadcast_to(shape)``: ``ops.broadcast_to``.

Invariants
- ``tensor.py`` (storages and views) is a leaf of the front end: ``ops`` and ``language`` build on
  it, so it cannot import them. ``install()``, called once by the package's ``__init__`` (this
  module is imported from there only), joins them before any kernel can be traced.
- Each operator looks its ``nl.*`` function up at call time (``getattr(nl, name)``).
"""
from __future__ import annotations

from collections.abc import Callable

import neuron_compiler.nki.language as nl
import neuron_compiler.nki.ops as ops
from neuron_compiler.nki.tensor import NkiTensor


def _binary(name: str, reverse: bool = False) -> Callable:
    def operator(self: NkiTensor, other):
        f = getattr(nl, name)
        return f(other, self) if reverse else f(self, other)
    return operator


def _in_place(name: str) -> Callable:
    def operator(self: NkiTensor, other) -> NkiTensor:
        ops.update(self, other, name)
        return self
    return operator


def _negative(self: NkiTensor):
    return nl.negative(self)


def _setitem(self: NkiTensor, key, value) -> None:
    ops.assign(self[key], value)


def _broadcast_to(self: NkiTensor, shape) -> NkiTensor:
    return ops.broadcast_to(self, tuple(int(s) for s in shape))


OPERATORS: dict[str, Callable] = {
    "__add__": _binary("add"), "__radd__": _binary("add", True),
    "__sub__": _binary("subtract"), "__rsub__": _binary("subtract", True),
    "__mul__": _binary("multiply"), "__rmul__": _binary("multiply", True),
    "__truediv__": _binary("divide"), "__rtruediv__": _binary("divide", True),
    "__pow__": _binary("power"),
    "__neg__": _negative,
    "__gt__": _binary("greater"), "__ge__": _binary("greater_equal"),
    "__lt__": _binary("less"), "__le__": _binary("less_equal"),
    "__and__": _binary("logical_and"), "__or__": _binary("logical_or"),
    "__setitem__": _setitem,
    "__iadd__": _in_place("add"), "__isub__": _in_place("subtract"),
    "__imul__": _in_place("multiply"), "__itruediv__": _in_place("divide"),
    "broadcast_to": _broadcast_to,
}


def install() -> None:
    """Set ``OPERATORS`` on ``NkiTensor`` (idempotent)."""
    for name, fn in OPERATORS.items():
        fn.__name__, fn.__qualname__ = name, f"NkiTensor.{name}"
        setattr(NkiTensor, name, fn)
