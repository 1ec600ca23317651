"""Tiling of REDUCE kernels.

Two strategies, chosen from the layout:
- free-axis: kept elements on partitions (128 rows per tile), the reduced axes along the free
  dim in chunks; VectorE ``tensor_reduce`` (add / max / min / multiply) per chunk into a partial, combined into the row tile's
  accumulator (``memset`` to the op's identity) with ``tensor_tensor``. Loops: outer kept axes,
  row tiles, outer reduced axes, chunks.
- partition (sum only): when the innermost contiguous axis is kept and the reduced axes are
  outside it (the bias gradient ``sum(dim=0)`` of a row-major matrix), TensorE reduces over
  partitions: ``ones[K, 1].T @ x[K, N]`` accumulates [1, N] row sums in PSUM over K tiles.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.errors import Unsupported
from lowering.kir import KOp, ReduceKAttrs, ReduceOp
from lowering.tiling.layout import plan_rows
from lowering.tiling.pointwise import outer_loops
from lowering.tir.affine import Affine
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, Memory

ALU = {ReduceOp.SUM: AluOp.ADD, ReduceOp.MAX: AluOp.MAX, ReduceOp.MIN: AluOp.MIN,
       ReduceOp.PROD: AluOp.MULTIPLY}
# the accumulator starts at the identity of its op (-0.0: adding it keeps a sum of -0.0 negative)
IDENTITY = {ReduceOp.SUM: -0.0, ReduceOp.MAX: float("-inf"), ReduceOp.MIN: float("inf"),
            ReduceOp.PROD: 1.0}
FREE_MAX = 2048
F32 = DType.FP32


def tile_reduce(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, ReduceKAttrs)
    x, out = k.ins[0], k.outs[0]
    if x.numel == 0:
        raise Unsupported(",".join(k.origin) or "reduce", "reduction over an empty tensor")
    red_dims = k.attrs.dims
    out_strides = tuple(0 if d in red_dims else s for d, s in enumerate(out.strides))
    plan = plan_rows(x.shape, red_dims, [x.strides, out_strides], [x.offset, out.offset])
    if (k.attrs.op is ReduceOp.SUM and plan.rows > 1 and plan.row_strides[0] == 1
            and len(plan.red) == 1 and x.dtype.is_float):
        return _reduce_on_tensor_engine(b, k, plan)
    P = b.target.sbuf_partitions
    alu = ALU[k.attrs.op]
    *red_outer, (n, cst) = plan.red
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, 2)
        for r0, p in b.tiled(plan.rows, P, "r"):
            acc = b.tile("racc", Memory.SBUF, p, 1, F32).ap()
            b.memset(acc, IDENTITY[k.attrs.op])
            with ExitStack() as es2:
                base = bases[0] + r0 * plan.row_strides[0]
                for size, st in red_outer:
                    base = base + es2.enter_context(b.loop(size, "q")) * st[0]
                for c0, f in b.tiled(n, FREE_MAX, "c"):
                    t = b.tile("rx", Memory.SBUF, p, f, x.dtype, 3)
                    b.dma(t.ap(), hbm_ap(x.buffer, x.dtype, base + c0 * cst[0], p,
                                         plan.row_strides[0], ((f, cst[0]),)))
                    part = b.tile("rpart", Memory.SBUF, p, 1, F32).ap()
                    b.tensor_reduce(part, t.ap(), alu)
                    b.tensor_tensor(acc, acc, part, alu)
            _finish(b, k, acc, p, bases[1] + r0 * plan.row_strides[1], plan.row_strides[1])


def _finish(b: TirBuilder, k: KOp, acc: TAP, p: int, out_off: Affine, out_rs: int,
            free: int = 1) -> None:
    out = k.outs[0]
    res = acc
    if k.attrs.scale != 1.0 or res.dtype != out.dtype or b.buffers[res.buf].memory is Memory.PSUM:
        t = b.tile("rout", Memory.SBUF, p, free, out.dtype).ap()
        if k.attrs.scale != 1.0:
            b.tensor_scalar(t, res, AluOp.MULTIPLY, k.attrs.scale)
        else:
            b.tensor_copy(t, res)
        res = t
    if free == 1:
        dst = hbm_ap(out.buffer, out.dtype, out_off, p, out_rs, ())
    else:
        dst = hbm_ap(out.buffer, out.dtype, out_off, 1, 0, ((free, out_rs),))
    b.dma(dst, res)


def _reduce_on_tensor_engine(b: TirBuilder, k: KOp, plan) -> None:
    """Sum over partitions with TensorE: the kept contiguous axis runs along the free dim (N),
    the reduced axis along partitions (K); ones[K, 1] is the stationary operand."""
    x = k.ins[0]
    t = b.target
    KT, NT = t.pe_rows, t.moving_free_max
    (R, rst), = plan.red
    N = plan.rows
    ones = b.tile("ones", Memory.SBUF, KT, 1, x.dtype)
    b.memset(ones.ap(), 1.0)
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, 2)
        for n0, nt in b.tiled(N, NT, "n"):
            acc = b.tile("racc", Memory.PSUM, 1, nt, F32)
            for k0, kt in b.tiled(R, KT, "k"):
                mv = b.tile("rmov", Memory.SBUF, kt, nt, x.dtype, 3)
                b.dma(mv.ap(), hbm_ap(x.buffer, x.dtype, bases[0] + k0 * rst[0] + n0 * plan.row_strides[0],
                                      kt, rst[0], ((nt, plan.row_strides[0]),)))
                b.matmul(acc.ap(), ones.ap(kt), mv.ap(), start_when=(k0,))
            _finish(b, k, acc.ap(), 1, bases[1] + n0 * plan.row_strides[1], plan.row_strides[1], free=nt)
