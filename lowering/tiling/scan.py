"""Tiling of SCAN kernels (cumsum / cumprod).

Rows (every axis but the scanned one) go on partitions, 128 per tile; the scanned axis runs
along the free dim in chunks of ``CHUNK`` columns. Per row tile a [p, 1] fp32 ``carry`` starts
at the op's identity; per chunk:

    y = tensor_tensor_scan(x, x, initial=carry)   y[i] = (x[i] op y[i-1]) bypass x[i]
    carry = y[:, f-1]                              VectorE/GpSimdE tensor_copy
    store y (one chunk: y is the output dtype; several: y is fp32, cast before the store)

Invariants
- The running value is fp32 from the first element to the last (carried across chunks), each
  output is rounded once to its dtype: eager's fp32 accumulator.
- The scanned axis is one strided axis of the input (a single dim); rows may be strided (a scan
  over a leading dim reads its columns with strided DMA).
"""
from __future__ import annotations

from lowering.kir import KOp, ScanKAttrs, ScanOp
from lowering.tiling.layout import plan_rows
from lowering.tiling.pointwise import outer_loops
from lowering.tir.builder import ELEMENTWISE, TirBuilder, hbm_ap
from runtime_sim.isa import AluOp, DType, Memory, Op, TensorTensorScanAttrs

from contextlib import ExitStack

F32 = DType.FP32
CHUNK = 2048
OP = {ScanOp.SUM: (AluOp.ADD, 0.0), ScanOp.PROD: (AluOp.MULTIPLY, 1.0)}


def tile_scan(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, ScanKAttrs)
    x, out = k.ins[0], k.outs[0]
    plan = plan_rows(x.shape, (a.dim,), [x.strides, out.strides], [x.offset, out.offset])
    (C, (cx, co)), = plan.red
    alu, init = OP[a.op]
    attrs = TensorTensorScanAttrs(alu, AluOp.BYPASS, 0.0, True)
    P = b.target.sbuf_partitions
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, 2)
        for r0, p in b.tiled(plan.rows, P, "r"):
            carry = b.tile("scarry", Memory.SBUF, p, 1, F32).ap()
            b.memset(carry, init)
            xb = bases[0] + r0 * plan.row_strides[0]
            ob = bases[1] + r0 * plan.row_strides[1]
            for c0, f in b.tiled(C, CHUNK, "c"):
                xt = b.tile("sx", Memory.SBUF, p, f, x.dtype, 3).ap()
                b.dma(xt, hbm_ap(x.buffer, x.dtype, xb + c0 * cx, p, plan.row_strides[0], ((f, cx),)))
                # one chunk: the scan writes the output dtype; several: fp32, to carry exactly
                y = b.tile("sy", Memory.SBUF, p, f, F32 if C > CHUNK else out.dtype, 2)
                b.emit(Op.TENSOR_TENSOR_SCAN, y.ap(), (xt, xt, carry), attrs, engines=ELEMENTWISE)
                if C > CHUNK:
                    b.tensor_copy(carry, y.ap(elem_offset=f - 1, dims=((1, 1),)), engines=ELEMENTWISE)
                res = y.ap()
                if res.dtype != out.dtype:
                    res = b.tile("sy_out", Memory.SBUF, p, f, out.dtype, 3).ap()
                    b.tensor_copy(res, y.ap())
                b.dma(hbm_ap(out.buffer, out.dtype, ob + c0 * co, p, plan.row_strides[1], ((f, co),)), res)
