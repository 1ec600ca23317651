"""Helpers for the lowering tests: lower a Python function directly (no Dynamo), run it on the
simulated device, and compare with eager PyTorch.

``lower_and_run(fn, *inputs)`` traces ``fn`` with ``make_fx`` and the core-ATen decomposition
table, asserts that every ATen node is supported by the lowering registry (the direct-lowering
equivalent of "it ran on the device": ``compile_graph`` only accepts supported nodes), compiles
the graph, runs the machine program in functional mode and asserts that instructions executed.

``assert_close(actual, expected)`` uses per-dtype tolerances and treats NaN and +-inf positions
as equal (they must coincide exactly, with the same sign for infinities).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np
import torch
import torch.fx as fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from lowering.api import CompiledGraph, TensorSpec, compile_graph, why_unsupported

# (rtol, atol) per dtype; atol is multiplied by max(1, |expected|.max()) * scale.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_DECOMP = core_aten_decompositions()


@dataclass
class Lowered:
    gm: fx.GraphModule
    compiled: CompiledGraph
    outputs: list[torch.Tensor]
    result: object  # runtime_sim.stats.SimResult
    dumps: dict[str, str] = field(default_factory=dict)


_FP8 = {torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn, torch.float8_e5m2: ml_dtypes.float8_e5m2}


def to_numpy(x: torch.Tensor) -> np.ndarray:
    x = x.detach().contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if x.dtype in _FP8:
        return x.view(torch.uint8).numpy().view(_FP8[x.dtype])
    return x.numpy()


def from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    if dtype in _FP8:
        return torch.from_numpy(a.astype(_FP8[dtype]).view(np.uint8).copy()).view(dtype)
    return torch.from_numpy(a.copy()).to(dtype)


def trace(fn: Callable, *inputs: torch.Tensor) -> fx.GraphModule:
    return make_fx(fn, decomposition_table=_DECOMP)(*inputs)


def unsupported_nodes(gm: fx.GraphModule) -> list[str]:
    bad = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            reason = why_unsupported(n)
            if reason is not None:
                bad.append(f"{n.format_node()}: {reason}")
    return bad


def compile_fn(fn: Callable, *inputs: torch.Tensor, target: str = "trn2",
               dumps: dict[str, str] | None = None,
               mutated: tuple[int, ...] = ()) -> tuple[fx.GraphModule, CompiledGraph]:
    """``mutated``: the inputs (by position) the caller overwrites with an output
    (``TensorSpec.mutated``)."""
    gm = trace(fn, *inputs)
    bad = unsupported_nodes(gm)
    assert not bad, "nodes the lowering does not support:\n  " + "\n  ".join(bad)
    specs = [TensorSpec(tuple(x.shape), x.dtype, mutated=i in mutated) for i, x in enumerate(inputs)]
    sink = (lambda name, text: dumps.__setitem__(name, text)) if dumps is not None else None
    return gm, compile_graph(gm, specs, target=target, dump=sink)


def lower_and_run(fn: Callable, *inputs: torch.Tensor, target: str = "trn2",
                  expect_instructions: bool = True, mutated: tuple[int, ...] = ()) -> Lowered:
    """Lower ``fn`` for ``target``, run it on the simulator; return the device outputs."""
    dumps: dict[str, str] = {}
    gm, cg = compile_fn(fn, *inputs, target=target, dumps=dumps, mutated=mutated)
    outs, res = cg.run([to_numpy(x) for x in inputs], mode="functional")
    if expect_instructions:
        assert res.stats.instructions > 0, "the program executed no instruction"
    # reshape to the graph output's shape (0-d outputs come back from run() as shape (1,);
    # test_ops_numeric.test_full_reduction_run_shape documents that)
    tensors = [from_numpy(o, v.dtype).reshape(v.shape) for o, v in zip(outs, cg.outputs)]
    return Lowered(gm, cg, tensors, res, dumps)


def _flat(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    out: list[torch.Tensor] = []
    for y in x:
        out.extend(_flat(y))
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, scale: float = 1.0,
                 rtol: float | None = None, atol: float | None = None, what: str = "") -> None:
    """Compare with the tolerance of ``expected.dtype``; NaN/inf positions must coincide."""
    where = f"{what}: " if what else ""
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{where}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{where}dtype {actual.dtype} != expected {expected.dtype}"
    if not expected.dtype.is_floating_point:
        mism = (actual != expected)
        assert not bool(mism.any()), (f"{where}{int(mism.sum())} of {expected.numel()} elements "
                                      f"differ; first at {mism.nonzero()[0].tolist()}: "
                                      f"{actual[mism][:5].tolist()} vs {expected[mism][:5].tolist()}")
        return
    a = actual.float()
    e = expected.float()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    assert torch.equal(nan_a, nan_e), (
        f"{where}NaN positions differ: {int(nan_a.sum())} NaN in actual, {int(nan_e.sum())} "
        f"expected; first mismatch at {(nan_a != nan_e).nonzero()[0].tolist()}")
    inf_a, inf_e = torch.isinf(a), torch.isinf(e)
    assert torch.equal(inf_a, inf_e) and torch.equal(a[inf_a], e[inf_e]), (
        f"{where}inf positions/signs differ: {int(inf_a.sum())} inf in actual, "
        f"{int(inf_e.sum())} expected")
    fin = ~(nan_e | inf_e)
    if not bool(fin.any()):
        return
    r0, a0 = TOLERANCES[expected.dtype]
    rtol = r0 if rtol is None else rtol
    mag = max(1.0, float(e[fin].abs().max()))
    atol = (a0 if atol is None else atol) * mag * scale
    err = (a[fin] - e[fin]).abs()
    bound = atol + rtol * e[fin].abs()
    bad = err > bound
    if bool(bad.any()):
        idx = int(torch.argmax(err - bound))
        raise AssertionError(
            f"{where}{int(bad.sum())} of {int(fin.sum())} elements out of tolerance "
            f"(rtol={rtol:g}, atol={atol:g}); worst: actual {float(a[fin][idx])!r} vs "
            f"expected {float(e[fin][idx])!r}, max abs err {float(err.max()):g}")


def check(fn: Callable, *inputs: torch.Tensor, target: str = "trn2", scale: float = 1.0,
          rtol: float | None = None, atol: float | None = None,
          expect_instructions: bool = True) -> Lowered:
    """Lower and run ``fn``; compare every output with eager ``fn(*inputs)``."""
    expected = _flat(fn(*inputs))
    low = lower_and_run(fn, *inputs, target=target, expect_instructions=expect_instructions)
    assert len(low.outputs) == len(expected), f"{len(low.outputs)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(low.outputs, expected)):
        assert_close(a, e, scale=scale, rtol=rtol, atol=atol, what=f"output {i}")
    return low


def rand(*shape: int, dtype: torch.dtype = torch.float32, low: float = -2.0, high: float = 2.0,
         seed: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) & 0xFFFF)
    x = torch.rand(shape, generator=g, dtype=torch.float32) * (high - low) + low
    return x.to(dtype)
