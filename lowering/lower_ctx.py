"""``LowerCtx``: what a lowering rule (``lowering/ops/<family>.py``) may do while one FX node
is lowered: read node values (fake tensors with concrete shapes), allocate HBM tensors, emit
kernels into the partition's ``KProgram``. ``frontend.build_kir`` creates one per partition and
walks the graph; the rules receive it as their first argument.

Invariants
- Every tensor a rule allocates is a fresh contiguous HBM buffer (``new_tensor``); kernels are
  appended in emission order and carry the FX node they came from (``KOp.origin``).
- A torch dtype without a machine type is ``Unsupported`` (the partition falls back), never a
  crash.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from lowering.compiled import TORCH_TO_DTYPE
from lowering.errors import Unsupported
from lowering.kir import HbmTensor, KOp, KProgram, Role, TensorRef, contiguous_strides
from lowering.registry_table import op_name
from runtime_sim.isa import DType


def machine_dtype(dt: torch.dtype, op: str = "") -> DType:
    try:
        return TORCH_TO_DTYPE[dt]
    except KeyError:
        raise Unsupported(op or "tensor", f"dtype {dt} has no machine type") from None


class LowerCtx:
    """What a lowering rule may do: allocate HBM tensors, emit kernels, read node values."""

    def __init__(self, vals: dict[fx.Node, Any]):
        self.kp = KProgram()
        self.vals = vals
        self.node: fx.Node | None = None
        self._n = 0

    # -- values ---------------------------------------------------------------------------
    def val(self, node: fx.Node) -> Any:
        """The fake-tensor value (concrete shapes) of ``node``."""
        return self.vals[node]

    @property
    def out_val(self) -> Any:
        assert self.node is not None
        return self.vals[self.node]

    @property
    def op(self) -> str:
        return op_name(self.node.target) if self.node is not None else "?"

    # -- buffers and kernels -------------------------------------------------------------
    def new_tensor(self, shape: tuple[int, ...], dtype: DType | torch.dtype,
                   role: Role = Role.TEMP, hint: str = "t") -> TensorRef:
        if isinstance(dtype, torch.dtype):
            dtype = machine_dtype(dtype, self.op)
        name = f"{hint}{self._n}"
        self._n += 1
        shape = tuple(int(s) for s in shape)
        self.kp.buffers[name] = HbmTensor(name, math.prod(shape), dtype, role)
        return TensorRef(name, dtype, shape, contiguous_strides(shape), 0)

    def new_like_out(self, hint: str = "t") -> TensorRef:
        v = self.out_val
        return self.new_tensor(tuple(v.shape), v.dtype, hint=hint)

    def emit(self, kop: KOp) -> None:
        if self.node is not None and not kop.origin:
            kop = KOp(kop.kind, kop.outs, kop.ins, kop.attrs, (self.node.name,))
        self.kp.kernels.append(kop)
