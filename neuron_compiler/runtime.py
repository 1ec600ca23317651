"""Run a partitioned ATen graph: device partitions on the simulator, the rest in eager PyTorch.

- ``DevicePartition`` replaces each fused submodule. Per input signature (tensor shapes and
  dtypes, values of SymInt inputs) it specialises the partition on concrete shapes and takes its
  program from the process-wide ``PROGRAM_CACHE`` or lowers it with
  ``lowering.api.compile_graph``. ``sim_mode="functional"``: output values come from the
  simulator; ``"timing"``: from running the partition eagerly, while the (data-independent,
  cached) simulated timing is recorded. A partition that computes in bf16/fp16/fp8 runs in
  fp32 there, its outputs rounded to their dtypes (``neuron_compiler.upcast``: CPU-speed
  values that differ from eager low-precision PyTorch only by rounding).
- ``FallbackOp`` replaces each eager fallback node and measures its host wall time.
- ``torch.profiler`` sees each device-partition call as a ``record_function`` range named
  ``neuron partition: <graph>/<partition>`` (its compile, when it is the first call, included)
  and each fallback op as ``neuron fallback: <aten op>``. A partition range lasts the HOST time
  of the call (the simulator's CPU time, or eager PyTorch's in timing mode), not the device's:
  so inside it, once the program has run, a second, instantaneous range is opened whose name
  carries the simulated device time of that call: ``neuron device time: <graph>/<partition>
  <us> us simulated on <target>`` (the same figure as the profile's ``simulated_time_us`` for
  the call). Its own duration is meaningless (~0); read the figure from its name.
- ``NeuronGraph`` is the callable handed back to AOTAutograd; each call runs inside
  ``profile.graph_call`` (counted, filed as warm-up or steady state).

Invariants
- Inputs reach the simulator as C-contiguous numpy copies (bf16/fp8 via ``ml_dtypes``); outputs
  come back as fresh torch tensors with the graph's dtype, shape and (when dense) strides.
- A partition whose lowering raised ``Unsupported`` for a signature runs eagerly for that
  signature (each node timed as a fallback), the reason recorded; under ``fallback="error"`` the
  first call raises instead. Any other exception from the lowering is raised as
  ``NeuronInternalError`` naming the graph, the partition, the signature and the op(s) (a bug;
  never a fallback).


Residency (``RESIDENCY``, process-wide): where the current data of each live tensor is
- A tensor is identified by its Python object (weakly referenced) and its data by its
  ``_version``: a different version (an in-place update: an optimizer step, ``copy_``) means
  new host data, which must be sent again. Tensors without a version counter (inference-mode
  tensors) are never tracked: each device boundary they cross costs a copy.
- Host -> device (charged to the partition that consumes it): a device-partition input whose
  current data is not in this target's simulated HBM. Parameters, buffers and any input passed
  again unchanged are therefore sent on their first call only (warm-up).
- Device -> host (charged to the partition that produced it): only when a host consumer reads
  a device-partition output: an eager fallback op (a view op falling back reads no data: its
  output aliases the input's residency), a graph output returned to the user or to AOTAutograd's
  runtime (input mutations, gradients), and nothing else. A partition's output consumed by
  another device partition of the same target stays in HBM. Forward outputs that AOTAutograd
  saves for the backward (output descriptor ``SavedForBackwards*``) do not leave the device at
  the forward: the backward charges them only if a fallback there reads them. Without output
  descriptors, every graph output is treated as read by the host.
- ``neuron`` device tensors (``neuron_compiler.device``): their payloads are owned by the device
  (``Residency.own``), so a graph compiled over device tensors reads its inputs, parameters and
  buffers without a copy; an output whose descriptor says AOTAutograd wraps it into a device
  tensor (``SubclassGetAttrAOTOutput`` of ``DEVICE_PAYLOAD_ATTR``; every output of an eager
  device op, ``device_outputs``) stays on the device (host data among them, an eager
  fallback's result, is sent once); a host consumer of a payload (an eager fallback node)
  pays a copy at every read. A device partition owns the outputs its graph returns as device
  tensors as soon as it writes them (``DevicePartition.device_outputs``), so inference-mode
  tensors, which residency cannot follow, stay on the device too. Input mutations of device
  tensors (a buffer updated in place, a static KV cache) are copied by AOTAutograd's runtime
  from device tensor to device tensor.
- Why these rules are sound: ATen graphs from AOTAutograd are functional (no node writes its
  inputs), so device data changes only where a partition writes a fresh output tensor; the
  host can read a device output only through a fallback op or a graph output, and both charge
  the copy; any host write bumps ``_version``, so the device copy is no longer current. Saved
  activations are reachable only by the backward graph that AOTAutograd hands them to.
- A parameter of an inference graph that a program stores in a layout of its own
  (``CompiledGraph.input_layouts``: an ``nn.Linear`` weight kept transposed; or
  ``input_copies``: a tied embedding's transposed copy for its LM head) is a copy of its
  own, tracked as resident on "<target> as <permutation>": sent once like any parameter (the
  host lays it out while sending), and sent again if the plain layout is wanted elsewhere.
- Each copy costs ``runtime_sim.costs.host_transfer_ns``: one DMA fixed latency per tensor plus
  bytes / the host link (option ``host_link_gbps``, else the target's ASSUMED figure; see
  ``neuron_compiler.assumptions``); bytes are ``numel x element size``. Each device-partition
  call also pays the runtime's launch overhead (option ``call_overhead_us``, else 0, ASSUMED),
  recorded apart from the simulated program time. Residency across partitions
  is not limited by HBM capacity: everything that was sent stays resident while its tensor
  lives. (One partition is: in functional mode, inputs or a program whose HBM buffers exceed
  one NeuronCore's HBM, ``hbm_capacity_bytes``, are refused with ``NeuronInputError`` before
  the simulator allocates them; meta-device inputs too, since their values do not exist.)
- A machine error the simulator raises while running a program (``MachineError``: race,
  bounds, alignment, deadlock, uninitialised read) is raised as ``NeuronRunError`` naming the
  graph, the partition, the signature, the instruction and the ATen op(s) of its tag.
"""
from __future__ import annotations

import operator
import os
import re
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import torch
from torch.fx import GraphModule, Node
from torch.profiler import record_function
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from neuron_compiler.assumptions import assumptions_of, host_assumptions
from neuron_compiler.cache import DiskCache, disk_cache, request_key
from neuron_compiler.collectives import CollectiveOp, collective_kind
from neuron_compiler.specialise import clone_graph_module, specialise
from neuron_compiler.cache import request as cache_request
from neuron_compiler.device.residency import (DEVICE_PAYLOAD_ATTR, RESIDENCY,  # noqa: F401
                                              Producer, Residency, tensor_bytes)
from neuron_compiler.device.tensor import DEVICE_TYPE, NeuronTensor
from neuron_compiler.device.transfers import charge_transfer_out
from neuron_compiler.dump import instructions_per_queue
from neuron_compiler.errors import (NeuronFallbackError, NeuronInputError,
                                    NeuronInternalError, NeuronRunError)
from neuron_compiler.logs import artifact, current_compile_id, log
from neuron_compiler.options import NeuronOptions
from neuron_compiler.partition import (is_compute_node, is_nki_op_node, lowering_api, op_name,
                                       split_out)
from neuron_compiler.program_cache import (PROGRAM_CACHE, CachedProgram,  # noqa: F401
                                           from_disk_entry, process_local, program_cache_info,
                                           program_key, to_disk_entry)     # (re-exports)
from neuron_compiler.profile import (FallbackEntry, GraphRecord, PartitionFailure,
                                     active_profiles, graph_call)
from neuron_compiler.upcast import needs_upcast, run_upcast, upcast_graph
from runtime_sim.errors import MachineError
from runtime_sim.isa import Memory
from runtime_sim.targets import get_target

Signature = tuple
DEVICE_TIME_RANGE = "neuron device time: "   # prefix of the profiler range of simulated time

_BITCAST: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
}


# ---- torch <-> numpy ---------------------------------------------------------------------------
def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy copy of ``t`` (bf16/fp8 as ``ml_dtypes`` arrays). Read through
    DLPack, not ``Tensor.numpy()``: that marks ``t``'s storage non-resizable for good, and FSDP2
    frees its unsharded parameters with ``storage.resize_(0)`` after each forward."""
    t = t.detach().resolve_conj().resolve_neg().cpu().contiguous()
    if t.dtype in _BITCAST:
        carrier, npdt = _BITCAST[t.dtype]
        return np.array(np.from_dlpack(t.view(carrier)).view(npdt), copy=True, order="C")
    return np.array(np.from_dlpack(t), copy=True, order="C")


def from_numpy(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``like``'s shape, dtype and (if dense) strides holding ``a``'s values."""
    a = np.ascontiguousarray(a)
    if like.dtype in _BITCAST:
        carrier, npdt = _BITCAST[like.dtype]
        if a.dtype != npdt:
            a = a.astype(npdt)
        t = torch.from_numpy(a.view(np.dtype(str(carrier).removeprefix("torch.")))).view(
            like.dtype)
    else:
        t = torch.from_numpy(a)
        if t.dtype != like.dtype:
            t = t.to(like.dtype)
    shape = tuple(int(s) for s in like.shape)
    if tuple(t.shape) != shape:
        if t.numel() != like.numel():
            raise RuntimeError(f"device output has {t.numel()} elements {tuple(t.shape)}, "
                               f"expected shape {shape}")
        t = t.reshape(shape)
    strides = tuple(int(s) for s in like.stride())
    if t.stride() != strides and _is_dense_permutation(shape, strides):
        t = torch.empty_strided(shape, strides, dtype=t.dtype).copy_(t)
    return t


def _is_dense_permutation(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when ``strides`` lay ``shape`` out densely, without overlap, in some dim order."""
    expected = 1
    for size, stride in sorted(zip(shape, strides), key=lambda d: (d[1], d[0])):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def signature(args: tuple) -> Signature:
    """What a compiled program is specialised on: tensor shapes/dtypes and SymInt values."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append(("T", tuple(int(s) for s in a.shape), str(a.dtype).removeprefix("torch."),
                        RESIDENCY.is_parameter(a)))
        elif isinstance(a, (int, float, bool, torch.SymInt)):
            sig.append(("S", int(a) if isinstance(a, (torch.SymInt, int)) else a))
        else:
            sig.append(("O", type(a).__name__))
    return tuple(sig)


def describe_signature(sig: Signature) -> str:
    parts = []
    for kind, *rest in sig:
        parts.append(f"{rest[1]}{list(rest[0])}" if kind == "T" else f"{rest[0]!r}")
    return "(" + ", ".join(parts) + ")"


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


# HBM per chip, hardware.md "Generations" table (ARCH1/ARCH2/ARCH3 there): trn1 32 GiB, trn2
# 96 GiB, trn3 144 GiB, shared by the chip's NeuronCores. ``runtime_sim.targets.Target`` has no
# capacity field (yet); when it gets ``hbm_bytes_per_core``, that is used instead.
def hbm_capacity_bytes(target: object) -> int:
    """HBM bytes one NeuronCore of ``target`` may use: its chip's HBM / cores per chip."""
    return int(target.hbm_bytes_per_core)  # type: ignore[attr-defined]


# ---- residency (neuron_compiler.device.residency) ---------------------------------------------
def read_on_host(value: object, profs: tuple, graph: GraphRecord | None = None) -> None:
    """A host consumer reads every tensor in ``value``: copy device-only data out. The payload
    of a ``neuron`` device tensor is copied out at every read (the host keeps no copy of it),
    on the host link of ``graph``, the compiled graph whose host code reads it."""
    for t in tree_leaves(value):
        if not isinstance(t, torch.Tensor):
            continue
        if RESIDENCY.owned(t):
            if profs and graph is not None:
                nbytes = tensor_bytes(t)
                ns = assumptions_of(graph).transfer_ns(nbytes, transfers=1)
                for p in profs:
                    p.note_transfer_out(None, ns, nbytes)
            continue
        copy, producer = RESIDENCY.to_host(t)
        if copy:
            charge_transfer_out(producer, t, profs)


# ---- eager fallback ----------------------------------------------------------------------------
def _is_view_op(op: object) -> bool:
    return isinstance(op, torch._ops.OpOverload) and bool(getattr(op, "is_view", False))


class FallbackOp(torch.nn.Module):
    """One eager fallback node: copies the device data it reads to the host (a view op reads
    none) and measures its wall time into the open profiles."""

    def __init__(self, op: object, name: str, reason: str, graph: GraphRecord):
        super().__init__()
        self.op, self.op_name, self.reason, self.graph = op, name, reason, graph
        self.is_view = _is_view_op(op)

    def forward(self, *args: object, **kwargs: object) -> object:
        profs = active_profiles()
        if not self.is_view:
            read_on_host((args, kwargs), profs, self.graph)
        with record_function(f"neuron fallback: {self.op_name}"):
            t0 = time.perf_counter_ns()
            out = self.op(*args, **kwargs)
            dt = time.perf_counter_ns() - t0
        if self.is_view and args and isinstance(args[0], torch.Tensor):
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    RESIDENCY.alias(o, args[0])
        for p in profs:
            p.note_fallback_time(self.graph, self.op_name, self.reason, dt)
        return out


def wrap_fallback_nodes(gm: GraphModule, reasons: dict[str, str], graph: GraphRecord,
                        default_reason: str) -> GraphModule:
    """Replace every compute ``call_function`` node of ``gm`` with a timed ``FallbackOp`` (a
    collective with a ``CollectiveOp``, an nki_op with an ``NkiOpCall``)."""
    for i, node in enumerate(list(gm.graph.nodes)):
        if not is_compute_node(node):
            continue
        kind = collective_kind(node)       # a collective is a device operation (collectives.py)
        if is_nki_op_node(node):           # so is an nki_op (neuron_compiler.nki.op)
            from neuron_compiler.nki.op import NkiOpCall
            name, mod = f"nki_{i}_{node.name}", NkiOpCall.for_node(node, graph)
        else:
            name = f"{'collective' if kind else 'eager'}_{i}_{node.name}"
            mod = (CollectiveOp(node.target, op_name(node), kind, graph) if kind else
                   FallbackOp(node.target, op_name(node), reasons.get(node.name, default_reason),
                              graph))
        gm.add_submodule(name, mod)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


# ---- device partitions -------------------------------------------------------------------------
@dataclass
class _Compiled:
    """One specialisation of a partition: its (shared) program, or the reason it has none."""

    signature: Signature
    program: CachedProgram | None = None
    out_meta: list[torch.Tensor] = field(default_factory=list)
    failure: PartitionFailure | None = None
    eager: GraphModule | None = None
    stats_dumped: bool = False

    @property
    def compiled(self) -> object | None:
        return self.program.compiled if self.program is not None else None


class DevicePartition(torch.nn.Module):
    """Stands in for one fused submodule; see the module docstring."""

    def __init__(self, sub: GraphModule, name: str, graph: GraphRecord, options: NeuronOptions,
                 dump: object | None, ops: Counter, mutated: tuple[bool, ...] = ()):
        super().__init__()
        self.sub, self.name, self.graph, self.options, self.dump = sub, name, graph, options, dump
        # per input: the caller overwrites it with an output, nothing else reads it
        # (backend.mutated_partition_inputs; TensorSpec.mutated)
        self.mutated = mutated
        self.ops = ops
        self.target = get_target(options.target)
        self.host = host_assumptions(options)    # host link, per-call overhead
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        self.returns_tuple = isinstance(out, (tuple, list))
        self._cache: dict[Signature, _Compiled] = {}
        # outputs (by position) that the enclosing graph returns as device tensors' payloads
        # (NeuronGraph._mark_device_outputs): owned by the device as soon as they are written
        self.device_outputs: set[int] = set()
        self._upcast: GraphModule | None = None   # timing mode's value graph (upcast.py)
        # the Dynamo compile this graph belongs to (the partition compiles lazily, outside it)
        self.compile_id = current_compile_id()

    def forward(self, *args: object) -> object:
        with record_function(f"neuron partition: {self.graph.name}/{self.name}"):
            return self._forward(args)

    def _forward(self, args: tuple) -> object:
        sig = signature(args)
        if self.options.sim_mode == "functional":
            self._check_inputs(args)             # before the compile: it needs no program
        entry = self._cache.get(sig)
        if entry is None:
            # the compile runs without the caller's dispatch modes: AOTAutograd's first-call
            # custom-op check (or a user's FlopCounterMode) would otherwise see, and slow down,
            # every fake and meta tensor op the lowering runs
            with _disable_current_modes():
                entry = self._prepare(sig, args)
            self._cache[sig] = entry
        if self.options.sim_mode == "functional" and entry.failure is None:
            self._check_fits(entry)
        profs = active_profiles()
        if entry.failure is not None:
            for p in profs:
                p.note_failure(entry.failure)
            assert entry.eager is not None
            return entry.eager(*args)
        compiled = entry.compiled
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        sent, sent_bytes = self._inputs_to_device(tensors, profs, compiled.input_layouts,
                                                  compiled.input_copies)
        try:
            out, outs, result = self._run(entry, args, tensors)
        except MachineError as exc:   # the program breaks a machine rule: a compiler bug
            raise self._internal_error(exc, self.sub, sig, NeuronRunError) from exc
        if entry.program.on_disk - entry.program.timed_on_disk:  # type: ignore[union-attr]
            self._store_timing(entry.program)                     # type: ignore[arg-type]
        if torch.autograd._profiler_enabled():
            us = result.stats.total_ns / 1e3
            with record_function(f"{DEVICE_TIME_RANGE}{self.graph.name}/{self.name} {us:.3f} us "
                                 f"simulated on {self.target.name}"):
                pass
        if self.dump is not None and not entry.stats_dumped:
            entry.stats_dumped = True
            self.dump.write_partition_stats(self.name, sig, result.stats)  # type: ignore
        shapes = [list(s[1]) for s in sig if s[0] == "T"]
        ns = self.host.transfer_ns(sent_bytes, transfers=sent) if sent else 0.0
        for p in profs:
            p.note_partition_call(self.graph, self.name, sig, shapes, compiled, result, ns,
                                  sent_bytes, sent, self.host.call_overhead_ns)
        producer = (self.graph, self.name, sig)
        inputs = {id(t) for t in tensors}
        for k, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and id(o) not in inputs:
                if k in self.device_outputs:
                    RESIDENCY.own(o)       # tracked even without a version counter
                elif not RESIDENCY.produced(o, self.target.name, producer):
                    # untracked: it leaves the device at once
                    charge_transfer_out(producer, o, profs)
        return out

    def _input_names(self) -> list[str]:
        return [n.name for n in self.sub.graph.nodes if n.op == "placeholder"]

    def _check_inputs(self, args: tuple) -> None:
        """Functional mode needs every input's values on the host, and all of them in HBM."""
        where = f"device partition {self.graph.name}/{self.name}"
        named = [(n, a) for n, a in zip(self._input_names(), args) if isinstance(a, torch.Tensor)]
        for name, a in named:
            if a.device.type != "cpu":
                raise NeuronInputError(
                    f"{where}: input {name} ({_describe(a)}) is on the {a.device.type} device; "
                    f"sim_mode='functional' computes values from the input's data, so it needs "
                    f"CPU tensors (sim_mode='timing' times the program without reading them)")
        self._check_capacity("its inputs", [(f"{n} ({_describe(a)})", tensor_bytes(a))
                                            for n, a in named])

    def _check_fits(self, entry: _Compiled) -> None:
        """The program's HBM buffers (inputs, outputs, temporaries) must fit the target's HBM
        before the simulator allocates and runs them."""
        self._check_capacity(
            "its program's HBM buffers (inputs, outputs, temporaries)",
            [(f"buffer {b.name}", b.partitions * b.bytes_per_partition)
             for b in entry.compiled.program.buffers  # type: ignore[union-attr]
             if b.memory is Memory.HBM])

    def _check_capacity(self, what: str, items: list[tuple[str, int]]) -> None:
        """Raise ``NeuronInputError`` when ``items`` ((name, bytes), all in HBM at once) exceed
        one NeuronCore's HBM; the message names the largest three."""
        total, capacity = sum(b for _, b in items), hbm_capacity_bytes(self.target)
        if total <= capacity:
            return
        largest = ", ".join(f"{n}: {b:,} bytes" for n, b in sorted(items, key=lambda i: -i[1])[:3])
        raise NeuronInputError(
            f"device partition {self.graph.name}/{self.name}: {what} need {total:,} bytes of "
            f"HBM, more than the {capacity:,} bytes of one {self.target.name} NeuronCore "
            f"(largest: {largest}); sim_mode='functional' refuses it before simulating "
            f"(sim_mode='timing' still times the program)")

    def _run(self, entry: _Compiled, args: tuple, tensors: list[torch.Tensor]) -> tuple:
        """Run ``entry``'s program on ``args``: (out as the graph returns it, its list, the
        simulation result)."""
        compiled = entry.compiled
        if self.options.sim_mode == "timing":
            if self._upcast is None:           # built once: the fp32 copy, or the graph
                self._upcast = (needs_upcast(self.sub) and upcast_graph(self.sub)) or self.sub
            if self._upcast is self.sub:
                out = self.sub(*args)
            else:
                out = run_upcast(self._upcast, args, [getattr(m, "dtype", None)
                                                      for m in entry.out_meta], self.returns_tuple)
            _, result = compiled.run(None, mode="timing")  # type: ignore[union-attr]
            return out, list(out) if self.returns_tuple else [out], result
        arrays = [to_numpy(a) for a in tensors]
        outs_np, result = compiled.run(arrays, mode="functional")  # type: ignore[union-attr]
        if len(outs_np) != len(entry.out_meta):
            raise RuntimeError(f"{self.graph.name}/{self.name}: program returned "
                               f"{len(outs_np)} outputs, graph has {len(entry.out_meta)}")
        outs = [from_numpy(a, m) for a, m in zip(outs_np, entry.out_meta)]
        return tuple(outs) if self.returns_tuple else outs[0], outs, result

    def _inputs_to_device(self, tensors: list[torch.Tensor], profs: tuple,
                          layouts: tuple = (), copies: tuple = ()) -> tuple[int, int]:
        """Charge the inputs whose current data is not in this target's HBM; (count, bytes). An
        input the program stores in a layout of its own (``input_layouts``), or a second copy
        of one stored permuted (``input_copies``), is a copy of its own on the device: resident
        like any other, but not the same as the plain copy."""
        sent = nbytes = 0
        seen: set[tuple[int, object]] = set()
        pairs = [(t, layouts[i] if i < len(layouts) else None) for i, t in enumerate(tensors)]
        pairs += [(tensors[i], perm) for _, i, perm in copies]
        for t, perm in pairs:
            if (id(t), perm) in seen:
                continue
            seen.add((id(t), perm))
            where = self.target.name if perm is None else f"{self.target.name} as {perm}"
            send, producer, fetch = RESIDENCY.to_device(t, where)
            if fetch:                                  # device-only data of another target
                charge_transfer_out(producer, t, profs)
            if send:
                sent += 1
                nbytes += tensor_bytes(t)
        return sent, nbytes

    def _prepare(self, sig: Signature, args: tuple) -> _Compiled:
        api = lowering_api()
        t0 = time.perf_counter()
        gm = specialise(self.sub, args)
        mutated = self.mutated + (False,) * (len(args) - len(self.mutated))
        tensors = [(a, m) for a, m in zip(args, mutated) if isinstance(a, torch.Tensor)]
        # a parameter of an inference graph is uploaded once and then stays in HBM: the compiler
        # may choose its layout (lowering.passes.layouts); training graphs keep torch's layouts
        # (their weights change every step and are shared with the backward)
        specs = [api.TensorSpec(tuple(int(s) for s in t.shape), t.dtype,
                                self.graph.kind == "inference" and RESIDENCY.is_parameter(t), m)
                 for t, m in tensors]
        out_node = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        out_nodes = list(out_node) if isinstance(out_node, (tuple, list)) else [out_node]
        out_meta = [n.meta["val"] for n in out_nodes]
        key = program_key(gm, specs, self.options, api.compile_graph)
        need_files = self.dump is not None
        prog = PROGRAM_CACHE.get(key, need_stage_files=need_files)
        hit = prog is not None
        disk, disk_hit = self._disk_cache(gm), None
        req = cache_request(key[0], key[1], key[2], self.options.target) if disk else None
        disk_key = request_key(req) if req is not None else ""
        if prog is None and disk is not None:
            prog = from_disk_entry(disk.load(disk_key), api, need_files)
            disk_hit = prog is not None
            if prog is not None:
                prog.on_disk.add(disk.root)
                if prog.request is not None and prog.compiled is not None and \
                        prog.compiled._timing is not None:  # type: ignore[attr-defined]
                    prog.timed_on_disk.add(disk.root)
                PROGRAM_CACHE.put(key, prog)
                PROGRAM_CACHE.disk_hits += 1
        writer = (self.dump.partition_writer(self.name, sig, gm)  # type: ignore[union-attr]
                  if self.dump is not None else None)
        lowered = prog is None
        if prog is None:
            prog = self._lower(api, gm, specs, sig, writer)
            PROGRAM_CACHE.put(key, prog)
        if req is not None and prog.request is None:
            prog.request = req
        if disk is not None and disk.root not in prog.on_disk:
            # lowered now, or earlier in this process by a compile without this cache_dir
            # (then an entry another process wrote is kept: it may carry stage files)
            kept = not lowered and os.path.exists(disk.path(disk_key))
            if kept or disk.store(disk_key, to_disk_entry(prog)) is not None:
                prog.on_disk.add(disk.root)
        if hit or disk_hit:
            if writer is not None:
                for filename, text in prog.stage_files or ():
                    writer(filename, text)
                where = (f"the on-disk compile cache ({disk.path(disk_key)})"  # type: ignore
                         if disk_hit else "the process-wide program cache")
                writer("cache_hit.txt", f"program taken from {where}: first lowered for "
                                        f"{prog.origin}\n")
        entry = _Compiled(sig, program=prog, out_meta=out_meta)
        if prog.unsupported is not None:
            exc = prog.unsupported
            recut = self._recut(exc)
            if recut is not None:              # only the refused nodes leave the device
                gm_cut, bad = recut
                entries = self._failure_entries(exc, sig, bad)
            else:
                entries = self._failure_entries(exc, sig)
            if self.options.fallback == "error":
                raise NeuronFallbackError([(e.op, e.count, e.reason) for e in entries]) from exc
            entry.failure = PartitionFailure(self.graph, self.name, entries)
            if recut is not None:
                entry.eager = gm_cut
            else:
                reasons = {n.name: self._node_reason(n, exc, sig) for n in self.sub.graph.nodes
                           if is_compute_node(n)}
                entry.eager = wrap_fallback_nodes(clone_graph_module(self.sub), reasons,
                                                  self.graph, str(exc))
        elif self.dump is not None:
            self.dump.write_compiled(self.name, sig, prog.compiled)  # type: ignore
        if self.dump is not None:
            self.dump.finish_partition(self.name, sig)  # type: ignore[union-attr]
        dt = time.perf_counter() - t0
        for p in active_profiles():
            p.note_compile(dt, cache_hit=hit, disk_hit=disk_hit)
        self._log_compile(sig, prog, dt, hit, disk_hit)
        return entry

    def _store_timing(self, prog: CachedProgram) -> None:
        """Rewrite ``prog``'s disk entries with its timing statistics, once it has been timed
        (a timing result depends only on the program: see ``neuron_compiler.cache``)."""
        if prog.request is None or getattr(prog.compiled, "_timing", None) is None:
            return
        for root in prog.on_disk - prog.timed_on_disk:
            disk_cache(root).store(request_key(prog.request), to_disk_entry(prog))
            prog.timed_on_disk.add(root)

    def _disk_cache(self, gm: GraphModule) -> DiskCache | None:
        """The on-disk cache when ``cache_dir`` is set and ``gm``'s key can be shared between
        processes (a graph holding Python objects is keyed by their ids: never shared)."""
        if self.options.cache_dir is None or process_local(gm):
            return None
        return disk_cache(self.options.cache_dir)

    def _log_compile(self, sig: Signature, prog: CachedProgram, dt: float, hit: bool,
                     disk_hit: bool | None) -> None:
        """Log one specialisation's compile and emit its tlparse artifact (see ``logs``)."""
        where = f"{self.graph.name}/{self.name}"
        log.debug("%s: signature %s", where, describe_signature(sig))
        queues = instructions_per_queue(prog.compiled)
        if prog.unsupported is not None:
            log.info("%s: not lowered, runs eagerly (op %s): %s", where,
                     getattr(prog.unsupported, "op", "?"), prog.unsupported)
        elif hit:
            log.info("%s: program cache hit (first lowered for %s), %.1f ms", where,
                     prog.origin, dt * 1e3)
        elif disk_hit:
            log.info("%s: on-disk compile cache hit (first lowered for %s), %.1f ms", where,
                     prog.origin, dt * 1e3)
        else:
            log.info("%s: compiled in %.1f ms, %d instructions", where, dt * 1e3,
                     sum(queues.values()))
        artifact("neuron_compiler_partition", lambda: {
            "graph": self.graph.name, "partition": self.name,
            "signature": describe_signature(sig), "compile_time_s": dt, "cache_hit": hit,
            "disk_cache_hit": disk_hit,
            "unsupported": None if prog.unsupported is None else str(prog.unsupported),
            "instructions_per_queue": queues}, compile_id=self.compile_id)

    def _lower(self, api: object, gm: GraphModule, specs: list, sig: Signature,
               writer: object | None) -> CachedProgram:
        files: list[tuple[str, str]] | None = [] if writer is not None else None

        def capture(filename: str, text: str) -> None:
            files.append((filename, text))  # type: ignore[union-attr]
            writer(filename, text)  # type: ignore[operator]

        dump = capture if writer is not None else None
        prog = CachedProgram(f"{self.graph.name}/{self.name} {describe_signature(sig)}", files)
        try:
            lnc = {"lnc": self.options.lnc} if self.options.lnc != 1 else {}
            prog.compiled = api.compile_graph(gm, specs, self.options.target,  # type: ignore
                                              dump=dump, name=self.name, **lnc)
        except api.Unsupported as exc:  # type: ignore[attr-defined]
            if dump is not None:
                dump("unsupported.txt", f"{exc}\n")
            prog.unsupported = exc
        except Exception as exc:   # a compiler bug: an error with context, never a fallback
            err = self._internal_error(exc, gm, sig)
            log.warning("compile failed: %s", err)
            if self.dump is not None:
                self.dump.finish_partition(  # type: ignore[union-attr]
                    self.name, sig, error=f"{err}\n\n{traceback.format_exc()}")
            raise err from exc
        return prog

    def _internal_error(self, exc: Exception, gm: GraphModule, sig: Signature,
                        kind: type[NeuronInternalError] = NeuronInternalError
                        ) -> NeuronInternalError:
        """``exc`` as a ``kind`` naming the ATen nodes involved: those of the failing
        instruction's tag (``k<i>:<kernel kind>:<node>,<node>...``, set by the lowering) when
        the error names an instruction, else those its message mentions, else every op."""
        tag = getattr(getattr(exc, "instr", None), "tag", "") or ""
        tagged = set(tag.rsplit(":", 1)[-1].split(",")) if tag else set()
        msg = str(exc)
        nodes = [n for n in gm.graph.nodes if is_compute_node(n)]
        named = [n for n in nodes if n.name in tagged] or [
            n for n in nodes if re.search(rf"(?<![\w.]){re.escape(n.name)}(?!\w)", msg)]
        every = [f"{op} x{c}" for op, c in sorted(self.ops.items())]
        return kind(self.graph.name, self.name, describe_signature(sig),
                    [f"{op_name(n)} (node {n.name})" for n in named] or every, every, exc)

    def _node_reason(self, node: Node, exc: Exception, sig: Signature) -> str:
        if op_name(node) == str(getattr(exc, "op", "")):
            return str(exc)
        return f"in device partition {self.name}, which could not be lowered: {exc}"

    def _failure_entries(self, exc: Exception, sig: Signature,
                         only: frozenset[str] | None = None) -> tuple[FallbackEntry, ...]:
        counts: Counter = Counter((op_name(n), self._node_reason(n, exc, sig))
                                  for n in self.sub.graph.nodes if is_compute_node(n)
                                  and (only is None or n.name in only))
        return tuple(FallbackEntry(op, c, r) for (op, r), c in sorted(counts.items()))

    def _recut(self, exc: Exception) -> tuple[GraphModule, frozenset[str]] | None:
        """The partition without the nodes the lowering refused (``Unsupported.nodes``): those
        run in eager PyTorch with the refusal as their reason, every other connected region is a
        device partition of its own (``<name>_r<i>``, compiled at its first call, and cut again
        if it too is refused). None when the refusal names no node of this partition, or all of
        them (then the whole partition falls back)."""
        compute = {n.name for n in self.sub.graph.nodes if is_compute_node(n)}
        bad = frozenset(getattr(exc, "nodes", ()) or ()) & compute
        if not bad or bad == compute:
            return None
        gm = clone_graph_module(self.sub)
        fused, parts = split_out(gm, bad, f"{self.name}_r")
        for pname, ops in parts.items():
            setattr(fused, pname, DevicePartition(getattr(fused, pname), pname, self.graph,
                                                  self.options, self.dump, ops))
        reasons = {name: str(exc) for name in bad}
        log.info("%s/%s: %s refused by the lowering (%s); the other %d nodes go on in %d "
                 "device partitions", self.graph.name, self.name, ", ".join(sorted(bad)), exc,
                 len(compute) - len(bad), len(parts))
        return wrap_fallback_nodes(fused, reasons, self.graph, str(exc)), bad


def _is_device_payload(desc: object) -> bool:
    """True for AOTAutograd's descriptor of an output that becomes the payload of a ``neuron``
    device tensor (``SubclassGetAttrAOTOutput`` of attribute ``DEVICE_PAYLOAD_ATTR``)."""
    return (type(desc).__name__ == "SubclassGetAttrAOTOutput"
            and getattr(desc, "attr", None) == DEVICE_PAYLOAD_ATTR)


class NeuronGraph:
    """The compiled ATen graph: the outer GraphModule plus its compile-time record. Its outputs
    are read by the host (AOTAutograd's runtime, the user), except those saved for the backward
    graph (see "Residency" in the module docstring) and those that stay on the ``neuron``
    device: every output when ``device_outputs`` (an eager op of a device tensor,
    ``neuron_compiler.device``), else each output whose descriptor says AOTAutograd wraps it
    into a device tensor (a graph compiled over device tensors). Those are owned by the device
    (``Residency.own``): never copied to the host."""

    def __init__(self, gm: GraphModule, record: GraphRecord, device_outputs: bool = False):
        self.gm, self.record = gm, record
        out = next(n for n in gm.graph.nodes if n.op == "output")
        descs = out.meta.get("desc") or ()
        self.saved_for_backward = frozenset(
            i for i, d in enumerate(descs) if type(d).__name__.startswith("SavedForBackwards"))
        self.device_outputs = device_outputs
        self.on_device = frozenset(i for i, d in enumerate(descs) if _is_device_payload(d))
        # plain outputs of the neuron device (a factory traced with device=x.device), built on
        # the host by the compiled graph (backend._factories_on_host): wrapped back
        vals = [getattr(a, "meta", {}).get("val") for a in
                (out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],))]
        self.device_factories = frozenset(
            i for i, v in enumerate(vals)
            if isinstance(v, torch.Tensor) and v.device.type == DEVICE_TYPE
            and i not in self.saved_for_backward)     # saved activations stay payloads
        self._mark_device_outputs(out)

    def _mark_device_outputs(self, out: Node) -> None:
        """Tell each device partition which of its outputs this graph returns as device
        tensors' payloads, so that it never charges them out (inference-mode tensors have no
        version counter: residency could not follow them from the partition to here)."""
        args = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
        for i, a in enumerate(args):
            if not (self.device_outputs or i in self.on_device or i in self.device_factories):
                continue
            if not isinstance(a, Node):
                continue
            k = 0
            if a.op == "call_function" and a.target is operator.getitem:
                a, k = a.args[0], a.args[1]
            if isinstance(a, Node) and a.op == "call_module":
                part = getattr(self.gm, str(a.target), None)
                if isinstance(part, DevicePartition) and isinstance(k, int):
                    part.device_outputs.add(k)

    def __call__(self, *args: object) -> object:
        with graph_call(self.record):
            out = self.gm(*args)
            profs = active_profiles()
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for i, o in enumerate(outs):
                if self.device_outputs or i in self.on_device or i in self.device_factories:
                    for t in tree_leaves(o):
                        if isinstance(t, torch.Tensor):
                            self._keep_on_device(t, profs)
                elif i not in self.saved_for_backward:
                    read_on_host(o, profs, self.record)
        if self.device_factories and isinstance(out, (tuple, list)):
            out = type(out)(NeuronTensor(o) if i in self.device_factories
                            and isinstance(o, torch.Tensor) else o for i, o in enumerate(out))
        return out

    def _keep_on_device(self, t: torch.Tensor, profs: tuple) -> None:
        """``t`` becomes a device tensor's payload; host data (an eager fallback's output) is
        sent over the host link first."""
        if not RESIDENCY.device_only(t) and profs:
            nbytes = tensor_bytes(t)
            ns = assumptions_of(self.record).transfer_ns(nbytes, transfers=1)
            for p in profs:
                p.note_transfer_out(None, ns, nbytes)   # counted with the unattributed copies
        RESIDENCY.own(t)
