"""Tiling: kernel-level IR -> instructions in program order (one tiler per kernel kind)."""
from __future__ import annotations

from lowering.kir import KKind, KProgram
from lowering.tiling.builder import TileBuilder
from lowering.tiling.matmul import tile_matmul
from lowering.tiling.pointwise import tile_pointwise
from lowering.tiling.reduce import tile_reduce
from lowering.tiling.rowwise import tile_layer_norm, tile_softmax
from lowering.tiling.schedule import ListScheduler
from runtime_sim.targets import Target

TILERS = {
    KKind.POINTWISE: tile_pointwise,
    KKind.MATMUL: tile_matmul,
    KKind.REDUCE: tile_reduce,
    KKind.SOFTMAX: tile_softmax,
    KKind.LAYER_NORM: tile_layer_norm,
}


def tile_program(kp: KProgram, target: Target) -> TileBuilder:
    b = TileBuilder(target, scheduler=ListScheduler(target))
    for i, k in enumerate(kp.kernels):
        b.tag = f"k{i}:{k.kind.value}:{','.join(k.origin)}"
        b.prefix = f"k{i}."
        TILERS[k.kind](b, k)
    return b
