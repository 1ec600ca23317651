"""A compiled device partition: the machine program plus how to feed it and read it back.

Invariants
- ``program.inputs[i]`` is the HBM buffer of placeholder ``i``; it receives the C-contiguous
  bytes of that input, with its axes permuted by ``input_layouts[i]`` when that is set (only
  for inputs whose spec is ``resident``: the upload of a parameter lays it out once). ``outputs[j]`` describes graph output ``j``: which HBM buffer holds it and
  its (shape, strides, element offset) view within that buffer, so several outputs may share a
  buffer (views) and an output may be a view of an input.
- A timing result depends only on the program, so it is computed once and reused.
- ``input_copies`` name further ``program.inputs``, each a copy of a (resident) placeholder
  stored permuted (a tied embedding's transposed copy for its LM head), uploaded beside it.
- ``program.inputs`` named ``rng_seed*`` are seed buffers (two int32 words each) of RAND kernels,
  anywhere among the placeholders' buffers (which keep their order); ``run`` draws them from
  torch's default generator on every functional call.
- ``LncCompiledGraph`` (LNC > 1, built by ``lowering.lnc``) has the same face: ``program`` is
  core 0's, ``cores`` holds one ``CompiledGraph`` per physical core, and ``run`` runs them
  together (``runtime_sim.multicore``), returning a ``MultiCoreResult``.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np
import torch

from runtime_sim.isa import DType, Program
from runtime_sim.multicore import MultiCoreResult, simulate_cores
from runtime_sim.simulator import simulate
from runtime_sim.stats import SimResult

TORCH_TO_DTYPE: dict[torch.dtype, DType] = {
    torch.float32: DType.FP32, torch.bfloat16: DType.BF16, torch.float16: DType.FP16,
    torch.float8_e4m3fn: DType.FP8_E4M3, torch.float8_e5m2: DType.FP8_E5M2,
    torch.int32: DType.INT32, torch.int64: DType.INT64, torch.int8: DType.INT8,
    torch.uint8: DType.UINT8, torch.bool: DType.BOOL,
}


RNG_SEED_PREFIX = "rng_seed"


def rng_seed_words() -> np.ndarray:
    """Two int32 words for a Philox key, drawn from torch's default CPU generator (so a call is
    deterministic after ``torch.manual_seed`` and advances eager's random stream)."""
    return torch.randint(-2 ** 31, 2 ** 31, (2,), dtype=torch.int64).numpy().astype(np.int32)


@dataclass(frozen=True)
class TensorSpec:
    """One graph input. ``resident``: its data stays in HBM across calls (a parameter, uploaded
    once): the compiler may store it in a layout of its own (``CompiledGraph.input_layouts``).
    ``mutated``: the caller overwrites this input with one of the graph's outputs and nothing
    else reads its old value (AOTAutograd's input mutation, e.g. a static KV cache's
    ``index_copy_``): that output may be computed in the input's own buffer
    (``lowering.passes.inplace``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    resident: bool = False
    mutated: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class OutputView:
    buffer: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]   # in elements
    offset: int                # in elements
    dtype: torch.dtype


@dataclass
class CompiledGraph:
    name: str
    program: Program
    input_specs: tuple[TensorSpec, ...]
    outputs: tuple[OutputView, ...]
    ops: tuple[str, ...]            # ATen op names that this program computes
    spill_bytes: int = 0
    # per input: the permutation of its axes it is uploaded in (None: as given), chosen by
    # lowering.passes.layouts for resident inputs; ``run`` applies it to functional inputs
    input_layouts: tuple[tuple[int, ...] | None, ...] = ()
    # program inputs that are copies of a graph input stored permuted (program input name,
    # graph input index, permutation; lowering.passes.layouts): uploaded once beside it
    input_copies: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
    _timing: SimResult | None = field(default=None, repr=False)

    def run(self, inputs: list[np.ndarray] | None, mode: str = "functional",
            *, trace: bool = False) -> tuple[list[np.ndarray] | None, SimResult]:
        if mode == "timing":
            if self._timing is None or (trace and not self._timing.trace):
                # static checks only: races and uninitialised reads need values and are
                # checked on every functional run; timing mode must stay fast for big shapes
                self._timing = simulate(self.program, None, mode="timing", trace=trace,
                                        checks="static")
            return None, self._timing
        if mode != "functional":
            raise ValueError(f"sim mode must be 'functional' or 'timing', got {mode!r}")
        feed = self.feed(inputs)
        result = simulate(self.program, feed, mode="functional", trace=trace)
        if self._timing is None:
            self._timing = result
        return self.read_outputs(result.outputs, feed), result

    def feed(self, inputs: list[np.ndarray] | None) -> dict[str, np.ndarray]:
        """The program's input buffers' contents for ``inputs`` (placeholder order): laid out
        as ``input_layouts`` says, with fresh RAND seeds."""
        assert inputs is not None and len(inputs) == len(self.input_specs)
        copies = {c for c, _, _ in self.input_copies}
        names = [n for n in self.program.inputs
                 if not n.startswith(RNG_SEED_PREFIX) and n not in copies]
        assert len(names) == len(inputs), (names, len(inputs))
        layouts = self.input_layouts or (None,) * len(inputs)
        feed = {name: np.ascontiguousarray(x if perm is None else x.transpose(perm))
                for name, x, perm in zip(names, inputs, layouts)}
        for name, i, perm in self.input_copies:
            feed[name] = np.ascontiguousarray(inputs[i].transpose(perm))
        for name in self.program.inputs:         # RAND kernels' seeds (lowering/ops/random.py)
            if name.startswith(RNG_SEED_PREFIX):
                feed[name] = rng_seed_words()
        return feed

    def read_outputs(self, buffers: dict[str, np.ndarray],
                     feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs from the program's output buffers (``SimResult.outputs``) and
        its ``feed`` (an output may be a view of an input)."""
        outs = []
        for o in self.outputs:
            if o.buffer in buffers:
                raw = buffers[o.buffer]
            else:  # an output that is (a view of) an input buffer
                raw = feed[o.buffer].reshape(-1).view(np.uint8)
            npdt = TORCH_TO_DTYPE[o.dtype].np
            itemsize = npdt.itemsize
            # strided through an unsigned carrier of the same size: numpy's as_strided does not
            # understand ml_dtypes' fp8 types
            flat = raw.view(np.dtype(f"u{itemsize}"))
            view = np.lib.stride_tricks.as_strided(
                flat[o.offset:], shape=o.shape, strides=tuple(s * itemsize for s in o.strides))
            outs.append(np.ascontiguousarray(view).view(npdt).reshape(o.shape))  # 0-d stays 0-d
        return outs


@dataclass
class SplitPlan:
    """Where ``lowering.lnc`` cuts an axis of size ``size``: per placeholder / output, the cut
    dim or None (whole on every core), and ``bounds`` per core."""

    size: int
    bounds: tuple[tuple[int, int], ...]
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]    # None: computed whole on every core, taken from core 0
    cuts: dict[str, int | None]        # node name -> its cut dim (None: whole)
    text: str = ""
    # per input: None (whole) or per core its (lo, hi) along ``inputs[i]`` (a reshape may
    # scale the axis: a [B*L, D] input of a [B, L, D] output is cut in steps of L)
    input_bounds: tuple[tuple[tuple[int, int], ...] | None, ...] = ()


@dataclass
class LncCompiledGraph(CompiledGraph):
    """A partition compiled for a logical core of ``lnc`` physical cores (``lowering.lnc``):
    one program per physical core (``cores``; ``program`` is core 0's), run together on one HBM
    stack (``runtime_sim.multicore``); outputs are the cores' halves joined along ``plan``."""

    lnc: int = 2
    cores: tuple[CompiledGraph, ...] = ()
    plan: SplitPlan | None = None
    note: str = ""                    # why the partition runs on one physical core, or ""

    def run(self, inputs: list[np.ndarray] | None, mode: str = "functional",
            *, trace: bool = False) -> tuple[list[np.ndarray] | None, MultiCoreResult]:
        programs = [c.program for c in self.cores]
        if mode == "timing":
            # (a timing read from the on-disk cache has no per-core results: run again)
            if not isinstance(self._timing, MultiCoreResult) or (trace and not self._timing.trace):
                self._timing = simulate_cores(programs, None, mode="timing", checks="static",
                                              trace=trace)
            return None, self._timing   # type: ignore[return-value]
        if mode != "functional":
            raise ValueError(f"sim mode must be 'functional' or 'timing', got {mode!r}")
        assert inputs is not None and len(inputs) == len(self.input_specs)
        per_core = [self._core_inputs(inputs, k) for k in range(len(self.cores))]
        feeds = [c.feed(x) for c, x in zip(self.cores, per_core)]
        result = simulate_cores(programs, feeds, mode="functional", trace=trace)
        if self._timing is None:
            self._timing = result
        outs = [c.read_outputs(o, f) for c, o, f in zip(self.cores, result.core_outputs, feeds)]
        if self.plan is None:
            return outs[0], result
        return [outs[0][j] if d is None else np.concatenate([o[j] for o in outs], axis=d)
                for j, d in enumerate(self.plan.outputs)], result

    def _core_inputs(self, inputs: list[np.ndarray], k: int) -> list[np.ndarray]:
        if self.plan is None:
            return inputs
        return [x if b is None else np.take(x, np.arange(*b[k]), axis=d)
                for x, d, b in zip(inputs, self.plan.inputs, self.plan.input_bounds)]
