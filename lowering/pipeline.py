"""The lowering pipeline, in one visible function.

    ATen FX graph
      -> build_kir            kernel-level IR, one kernel per op        (ir_pre_fusion.txt)
      -> fuse                 elementwise chains, matmul epilogues      (ir_post_fusion.txt)
      -> fold_norm_affine     layer-norm weight/bias into the matmuls reading the norm
      -> update_inputs_in_place  an output copied whole from an input, then scattered into,
                              written into that input's buffer (a KV cache's index_copy_)
      -> attend_before_cache_update  a decode attention reads the cache before its one-row
                              update, plus the new rows (the update moves after it)
      -> choose_input_layouts resident weights stored as their matmuls read them
      -> choose_resident      intermediates that stay in SBUF between kernels
      -> tile_program         tile IR: loop nests over tiles            (tir.txt)
      -> prefetch_far_weights the first blocks of a weight too big for SBUF loaded kernels
                              ahead, into SBUF left free, while the DMA queues idle
      -> schedule             a queue per tile instruction
      -> plan_memory          SBUF/PSUM offsets from buffer lifetimes   (memory_plan.txt)
      -> synchronize          semaphore waits per loop iteration        (sync.txt)
      -> emit_program         the machine program                       (program.txt)
      -> verify_program       the simulator's static checks

``dump(name, text)`` receives each stage's text when given (texts are only built then).
Verifiers run between passes.
"""
from __future__ import annotations

from typing import Callable

import torch.fx as fx

from lowering.compiled import CompiledGraph, OutputView, TensorSpec
from lowering.errors import Unsupported
from lowering.frontend import build_kir
from lowering.passes.decode_cache import attend_before_cache_update
from lowering.passes.hoist import hoist_small_kernels
from lowering.passes.fusion import fuse
from lowering.passes.inplace import update_inputs_in_place
from lowering.passes.layouts import choose_input_layouts
from lowering.passes.norm_fold import fold_norm_affine
from lowering.passes.residency import choose_resident, row_lengths
from lowering.registry import op_name
from lowering.tiling import tile_program
from lowering.tir.analysis import Structure, without_cyclic_gc
from lowering.tir.emit import emit_program
from lowering.tir.plan import plan_memory
from lowering.tir.prefetch import prefetch_far_weights
from lowering.tir.resident import NotResident
from lowering.tir.schedule import schedule
from lowering.tir.sync import synchronize
from lowering.tir.verify import verify_tir
from lowering.verify import verify_kir, verify_program
from runtime_sim.targets import get_target

Dump = Callable[[str, str], None]


@without_cyclic_gc          # tiling's many small objects: a collection only rescans the heap
def compile_graph(gm: fx.GraphModule, input_specs: list[TensorSpec], target: str = "trn2",
                  dump: Dump | None = None, name: str | None = None) -> CompiledGraph:
    t = get_target(target)

    def emit(fname: str, text: Callable[[], str]) -> None:
        if dump is not None:
            dump(fname, text())

    kp = build_kir(gm, list(input_specs))
    emit("ir_pre_fusion.txt", lambda: str(kp))
    verify_kir(kp)
    fuse(kp)
    if fold_norm_affine(kp):
        kp.notes.append("layer-norm affine folded into the A^T tiles of the matmuls reading it")
    merged = update_inputs_in_place(kp, {n for n, s in zip(kp.inputs, input_specs) if s.mutated})
    if merged:
        kp.notes.append("outputs written in place into the input they copy: " + ", ".join(merged))
    moved = hoist_small_kernels(kp)
    if moved:
        kp.notes.append("small pointwise kernels moved up to their inputs: " + "; ".join(moved))
    early = attend_before_cache_update(kp, t)
    if early:
        kp.notes.append("decode attention before its cache update: " + "; ".join(early))
    layouts, copies = choose_input_layouts(kp, [s.shape for s in input_specs],
                                           [s.resident for s in input_specs])
    if any(layouts):
        kp.notes.append("stored transposed on upload (resident weights read as W.T by a matmul): "
                        + ", ".join(n for n, p in zip(kp.inputs, layouts) if p))
    if copies:
        kp.notes.append("a second copy stored transposed on upload for the matmuls reading W.T "
                        "(other kernels read the input as given): "
                        + ", ".join(f"{kp.inputs[i]} -> {c}" for c, i, _ in copies))
    emit("ir_post_fusion.txt", lambda: str(kp))
    verify_kir(kp)
    op_of = {n.name: op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    try:
        tp, notes = _tile_with_residency(kp, t)
        tp, note = prefetch_far_weights(tp, t)
        if note:
            notes.append(note)
        emit("tir.txt", lambda: "\n".join([f"# {n}" for n in notes] + [str(tp)]))
        st = Structure(tp)
        verify_tir(tp, st)
        queues = schedule(tp, t, st)
        plan = plan_memory(tp, t, st)
    except Unsupported as e:  # name the ATen op (tilers know node names)
        names = e.op.split(",")
        raise Unsupported(op_of.get(names[0], e.op), e.reason,
                          e.nodes or tuple(x for x in names if x in op_of)) from e
    emit("memory_plan.txt", lambda: plan.text(tp, t))
    sync = synchronize(tp, queues, plan, st)
    emit("sync.txt", sync.text)
    program = emit_program(tp, queues, plan, sync, st)
    verify_program(program)
    emit("program.txt", lambda: str(program))
    ops = tuple(sorted({op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
    outputs = tuple(OutputView(r.buffer, r.shape, r.strides, r.offset, _torch_dtype(r.dtype))
                    for r in kp.outputs)
    return CompiledGraph(name or "partition", program, tuple(input_specs), outputs, ops,
                         input_layouts=layouts, input_copies=copies)


def _tile_with_residency(kp, t):
    """Tile with the chosen resident tensors; a tensor whose accesses do not follow its SBUF
    layout gets the next shorter row length, or is dropped from the set after its last one,
    and the program is tiled again."""
    dropped: set[str] = set()
    narrow: dict[str, int] = {}
    lengths = row_lengths(kp)
    while True:
        resident = choose_resident(kp, t.sbuf_bytes_per_partition, frozenset(dropped), narrow)
        try:
            return tile_program(kp, t, resident)
        except NotResident as first:
            # every tensor refused in this pass at once (one narrowing step each)
            refused = {e.buffer: e for e in reversed((first,) + first.also)}
            for name, e in refused.items():
                if name in dropped or name not in resident:
                    raise e
                narrow[name] = narrow.get(name, 0) + 1
                if narrow[name] >= len(lengths.get(name, ())):
                    dropped.add(name)


def _torch_dtype(dt):
    from lowering.compiled import TORCH_TO_DTYPE
    for k, v in TORCH_TO_DTYPE.items():
        if v is dt:
            return k
    raise KeyError(dt)
