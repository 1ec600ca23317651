"""Helpers shared by the op families (``lowering/ops/<family>.py``).

A leaf of the ``ops`` package: it imports no family, no registry and no ``lowering.ops``
package module, so any family may import it.
"""
from __future__ import annotations

import torch

from lowering.kir import TensorRef
from runtime_sim.isa import DType

_DT_TO_TORCH = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
                DType.INT32: torch.int32, DType.INT64: torch.int64, DType.BOOL: torch.bool,
                DType.UINT8: torch.uint8, DType.INT8: torch.int8}


def torch_dtype_of(ref: TensorRef) -> torch.dtype:
    """The torch dtype of a tensor's machine dtype (fp32 for one torch has no exact match of)."""
    return _DT_TO_TORCH.get(ref.dtype, torch.float32)
