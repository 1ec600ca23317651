"""The lowering's public face: what ``neuron_compiler`` may call.

- ``why_unsupported(node) -> str | None``: None when the lowering registry can lower this FX node
  (op, dtypes, shapes as in ``node.meta['val']``), else a one-line reason for the fallback table.
- ``compile_graph(gm, input_specs, target, dump=None, name=None) -> CompiledGraph``: lower one device
  partition (an FX GraphModule of ATen nodes that all passed ``why_unsupported``), specialised on
  concrete input shapes/dtypes. Raises ``Unsupported`` when something can only be discovered at
  this point (the caller then runs the partition eagerly and records the reason).
  With ``lnc=2`` (physical cores per logical core) the partition is split over two physical
  cores and the result is a ``lowering.lnc.LncCompiledGraph`` (one program per core).
- ``decomposition_table(target) -> dict``: the decomposition policy (``lowering.policy``): the
  table AOTAutograd / ``make_fx`` trace with, so that graphs hold the ops the registry is keyed
  on, with kernel ops kept whole where their kernel takes the call on ``target``;
  ``sdpa_kernel_fits(q, k, v, ...)``: whether SDPA's CPU flash op stays whole.
- ``supported_ops() -> list[OpSupport]``: every ATen overload the registry lowers, with its
  family, dtypes, engines and limits (``python -m lowering.api`` prints ``docs/ops.md``).
- ``CompiledGraph.run(inputs, mode)``: ``inputs`` are C-contiguous numpy arrays in placeholder
  order (bf16 as ``ml_dtypes.bfloat16``); returns ``(outputs or None, SimResult)``. In
  ``"timing"`` mode no values are computed and outputs is None.

Invariants
- This module and everything under ``lowering`` may import torch and ``runtime_sim`` but never
  ``neuron_compiler``.
"""
from __future__ import annotations

from lowering.errors import LoweringError, Unsupported
from lowering.compiled import CompiledGraph, TensorSpec
from lowering.registry import OpSupport, ops_markdown, supported_ops, why_unsupported
from lowering.pipeline import compile_graph as _compile_one
from lowering.policy import decomposition_table, sdpa_kernel_fits


def compile_graph(gm, input_specs, target: str = "trn2", dump=None, name=None,
                  lnc: int = 1) -> CompiledGraph:
    """``lowering.pipeline.compile_graph``, or with ``lnc`` > 1 ``lowering.lnc.compile_lnc``."""
    if lnc == 1:
        return _compile_one(gm, input_specs, target, dump=dump, name=name)
    from lowering.lnc import compile_lnc
    return compile_lnc(gm, list(input_specs), target, lnc, dump=dump, name=name)

__all__ = ["why_unsupported", "compile_graph", "CompiledGraph", "TensorSpec", "Unsupported",
           "LoweringError", "supported_ops", "OpSupport", "ops_markdown", "decomposition_table",
           "sdpa_kernel_fits"]

if __name__ == "__main__":
    print(ops_markdown(), end="")
