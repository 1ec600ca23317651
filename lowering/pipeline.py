"""The lowering pipeline, in one visible function.

    ATen FX graph
      -> build_kir            kernel-level IR, one kernel per op        (ir_pre_fusion.txt)
      -> fuse                 elementwise chains, matmul epilogues      (ir_post_fusion.txt)
      -> tile_program         tiles + instructions in program order, queues by list scheduling
      -> plan_pools           SBUF/PSUM offsets from pool lifetimes     (memory_plan.txt)
      -> synchronize          semaphore waits/signals from the bytes touched
      -> emit Program         the machine program                       (program.txt)
      -> verify_program       the simulator's static checks

``dump(name, text)`` receives each stage's text when given. Verifiers run between passes.
"""
from __future__ import annotations

from typing import Callable

import torch.fx as fx

from lowering.compiled import CompiledGraph, OutputView, TensorSpec
from lowering.errors import Unsupported
from lowering.frontend import build_kir
from lowering.kir import KProgram, Role
from lowering.memory import lower_bound
from lowering.memory.planner import LIFETIME_PAD, plan_pools
from lowering.passes.fusion import fuse
from lowering.registry import op_name
from lowering.tiling import tile_program
from lowering.tiling.builder import TileBuilder
from lowering.tiling.sync import synchronize
from lowering.verify import verify_kir, verify_program
from runtime_sim.isa import Buffer, Memory, Program
from runtime_sim.targets import Target, get_target

Dump = Callable[[str, str], None]


def compile_graph(gm: fx.GraphModule, input_specs: list[TensorSpec], target: str = "trn2",
                  dump: Dump | None = None, name: str | None = None) -> CompiledGraph:
    t = get_target(target)
    emit = dump or (lambda _n, _t: None)
    kp = build_kir(gm, list(input_specs))
    emit("ir_pre_fusion.txt", str(kp))
    verify_kir(kp)
    fuse(kp)
    emit("ir_post_fusion.txt", str(kp))
    verify_kir(kp)
    op_of = {n.name: op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    try:
        b = tile_program(kp, t)
        peaks = plan_pools(b.pools, t)
    except Unsupported as e:  # name the ATen op (tilers know node names)
        first = e.op.split(",")[0]
        raise Unsupported(op_of.get(first, e.op), e.reason) from e
    emit("memory_plan.txt", memory_plan_text(b, peaks, t))
    streams = synchronize(b.instrs, b.pools)
    program = emit_program(kp, b, streams, t)
    verify_program(program)
    emit("program.txt", str(program))
    ops = tuple(sorted({op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
    outputs = tuple(OutputView(r.buffer, r.shape, r.strides, r.offset, _torch_dtype(r.dtype))
                    for r in kp.outputs)
    return CompiledGraph(name or "partition", program, tuple(input_specs),
                         outputs, ops)


def emit_program(kp: KProgram, b: TileBuilder, streams, t: Target) -> Program:
    bufs = [Buffer(h.name, Memory.HBM, 1, h.bytes, 0) for h in kp.buffers.values()]
    bufs += [Buffer(p.name, p.memory, p.partitions, p.bytes_per_partition, p.offset)
             for p in b.pools.values() if p.offset is not None]
    outs = tuple(dict.fromkeys(r.buffer for r in kp.outputs
                               if kp.buffers[r.buffer].role is not Role.INPUT))
    return Program(t.name, tuple(bufs), streams, tuple(kp.inputs), outs)


def memory_plan_text(b: TileBuilder, peaks, t: Target) -> str:
    lines = [f"target {t.name}: SBUF {t.sbuf_bytes_per_partition} B/partition, "
             f"PSUM {t.psum_bytes_per_partition} B/partition (lifetimes padded by "
             f"{LIFETIME_PAD} instructions when that fits, so neighbouring kernels need not "
             f"share bytes; the lower bound uses the exact lifetimes)"]
    for mem, peak in peaks.items():
        live = [(p.name, p.first, p.last + 1, p.bytes_per_partition)
                for p in b.pools.values() if p.memory is mem and p.offset is not None]
        lb = lower_bound(live)
        ratio = f"{peak / lb:.3f}" if lb else "-"
        lines.append(f"{mem.value} peak {peak} B/partition, lower bound {lb} "
                     f"(largest live total), peak/lower bound {ratio}")
    for p in sorted(b.pools.values(), key=lambda p: (p.memory.value, p.offset or 0)):
        if p.offset is None:
            continue
        lines.append(f"  {p.memory.value:4s} {p.name:12s} @{p.offset:7d} {p.bufs} x "
                     f"{p.slot_bytes} B  live [{p.first}, {p.last}]")
    return "\n".join(lines)


def _torch_dtype(dt):
    from lowering.compiled import TORCH_TO_DTYPE
    for k, v in TORCH_TO_DTYPE.items():
        if v is dt:
            return k
    raise KeyError(dt)
