"""Tiling: kernel-level IR -> tile IR (one tiler per kernel kind, all writing a TirBuilder)."""
from __future__ import annotations

from lowering.kir import KKind, KProgram, Role
from lowering.tiling.attention.kernel import tile_attention
from lowering.tiling.conv import tile_conv
from lowering.tiling.conv_backward import tile_conv_wgrad
from lowering.tiling.gather import tile_gather
from lowering.tiling.matmul.kernel import tile_matmul
from lowering.tiling.norm_backward import tile_layer_norm_bwd
from lowering.tiling.pointwise import tile_pointwise
from lowering.tiling.rand import tile_rand
from lowering.tiling.reduce import tile_reduce
from lowering.tiling.resample import tile_resample
from lowering.tiling.pool import tile_maxpool_bwd
from lowering.tiling.rowwise import tile_layer_norm, tile_softmax
from lowering.tiling.scan import tile_scan
from lowering.tiling.scatter import tile_scatter
from lowering.tiling.select import tile_select
from lowering.tir.builder import TirBuilder
from lowering.tir.resident import NotResident
from lowering.tir.ir import TProgram
from runtime_sim.targets import Target

TILERS = {
    KKind.POINTWISE: tile_pointwise,
    KKind.MATMUL: tile_matmul,
    KKind.REDUCE: tile_reduce,
    KKind.SOFTMAX: tile_softmax,
    KKind.LAYER_NORM: tile_layer_norm,
    KKind.ATTENTION: tile_attention,
    KKind.GATHER: tile_gather,
    KKind.CONV: tile_conv,
    KKind.CONV_WGRAD: tile_conv_wgrad,
    KKind.SCATTER: tile_scatter,
    KKind.SCAN: tile_scan,
    KKind.SELECT: tile_select,
    KKind.LAYER_NORM_BWD: tile_layer_norm_bwd,
    KKind.RAND: tile_rand,
    KKind.RESAMPLE: tile_resample,
    KKind.MAXPOOL_BWD: tile_maxpool_bwd,
}


def tile_program(kp: KProgram, target: Target, resident: dict | None = None) -> tuple[TProgram, list[str]]:
    """The tile program of ``kp`` and the tilers' notes (choices worth a line in the dump);
    ``resident`` (``passes.residency.choose_resident``) names the tensors kept in SBUF."""
    b = TirBuilder(target)
    resident = resident or {}
    for h in kp.buffers.values():
        b.hbm_tensor(h.name, h.bytes, h.dtype, h.role.value, resident.get(h.name))
    b.live = {r.buffer for k in kp.kernels for r in k.ins} | {r.buffer for r in kp.outputs}
    refused: list[NotResident] = []
    for i, k in enumerate(kp.kernels):
        b.tag = f"k{i}:{k.kind.value}:{','.join(k.origin)}"
        b.prefix = f"k{i}."
        try:
            TILERS[k.kind](b, k)
        except NotResident as e:
            # the program is tiled again without it; the kernels after this one are still
            # tiled (and thrown away) to find every other refusal in the same pass
            refused.append(e)
        except Exception:
            if not refused:
                raise
            break                     # possibly a consequence of the refused kernels' state
    if refused:
        refused[0].also = tuple(refused[1:])
        raise refused[0]
    if resident:
        b.notes.append("resident in SBUF: " + ", ".join(
            f"{n} ({r.rows}x{r.cols}, {r.bytes_per_partition} B/partition)" for n, r in resident.items()))
    # an input is a program output only when a kernel writes it (passes/inplace.py)
    written = {r.buffer for k in kp.kernels for r in k.outs}
    outs = tuple(dict.fromkeys(r.buffer for r in kp.outputs
                               if kp.buffers[r.buffer].role is not Role.INPUT or r.buffer in written))
    return b.program(tuple(kp.inputs), outs), b.notes
