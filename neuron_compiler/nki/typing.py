"""``nki.typing``: annotations kernels may use on their parameters. They carry no meaning here
(the front end reads shapes and dtypes from the arguments), so each is an open generic alias."""
from __future__ import annotations

from typing import Any


class _Annotation:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getitem__(self, item) -> Any:
        return self

    def __repr__(self) -> str:
        return f"nki.typing.{self._name}"


tensor = _Annotation("tensor")
mutable_tensor = _Annotation("mutable_tensor")
scalar = _Annotation("scalar")
