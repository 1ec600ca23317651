"""Tiling of REDUCE kernels.

Two strategies, chosen from the layout:
- free-axis: kept elements on partitions (128 rows per tile), the reduced axes along the free
  dim in chunks; VectorE ``tensor_reduce`` per chunk, ``tensor_tensor`` to combine chunks.
- partition (sum only): when the innermost contiguous axis is kept and the reduced axes are
  outside it (the bias gradient ``sum(dim=0)`` of a row-major matrix), TensorE reduces over
  partitions: ``ones[K, 1].T @ x[K, N]`` accumulates [1, N] row sums in PSUM over K tiles.
"""
from __future__ import annotations

import itertools

from lowering.kir import KOp, ReduceKAttrs, ReduceOp
from lowering.tiling.builder import TileBuilder
from lowering.tiling.layout import hbm_ap, plan_rows
from runtime_sim.isa import AP, AluOp, DType, Memory

ALU = {ReduceOp.SUM: AluOp.ADD, ReduceOp.MAX: AluOp.MAX, ReduceOp.MIN: AluOp.MIN}
FREE_MAX = 2048


def _red_chunks(red, free_max: int):
    """Yield (per-operand offset deltas, free (size, strides) axes) covering the reduced axes:
    the innermost axis chunked by ``free_max``; outer reduced axes looped."""
    *outer, inner = red
    n, st = inner
    for idx in itertools.product(*[range(s) for s, _ in outer]):
        base = [sum(i * o[1][k] for i, o in zip(idx, outer)) for k in range(len(st))]
        for c0 in range(0, n, free_max):
            yield tuple(bk + c0 * st[k] for k, bk in enumerate(base)), (min(free_max, n - c0), st)


def tile_reduce(b: TileBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, ReduceKAttrs)
    x, out = k.ins[0], k.outs[0]
    if x.numel == 0:
        raise_empty(k)
    red_dims = k.attrs.dims
    out_strides = tuple(0 if d in red_dims else s for d, s in enumerate(out.strides))
    plan = plan_rows(x.shape, red_dims, [x.strides, out_strides], [x.offset, out.offset])
    if (k.attrs.op is ReduceOp.SUM and plan.rows > 1 and plan.row_strides[0] == 1
            and len(plan.red) == 1 and x.dtype.is_float):
        return _reduce_on_tensor_engine(b, k, plan)
    P = b.target.sbuf_partitions
    pool_x = b.pool("rx", Memory.SBUF, 2, FREE_MAX * x.dtype.itemsize)
    small = b.pool("racc", Memory.SBUF, 6, 4 * 4)
    alu = ALU[k.attrs.op]
    for bases in plan.outer_offsets():
        for r0 in range(0, plan.rows, P):
            p = min(P, plan.rows - r0)
            acc = None
            for delta, (f, st) in _red_chunks(plan.red, FREE_MAX):
                t = b.tile(pool_x, p, f, x.dtype)
                src = hbm_ap(x.buffer, x.dtype, bases[0] + r0 * plan.row_strides[0] + delta[0],
                             p, plan.row_strides[0], ((f, st[0]),))
                b.dma(t.ap(), src)
                part = b.tile(small, p, 1, DType.FP32).ap()
                b.tensor_reduce(part, t.ap(), alu)
                if acc is None:
                    acc = part
                else:
                    nxt = b.tile(small, p, 1, DType.FP32).ap()
                    b.tensor_tensor(nxt, acc, part, alu)
                    acc = nxt
            _finish(b, k, small, acc, p, bases[1] + r0 * plan.row_strides[1], plan.row_strides[1])


def _finish(b: TileBuilder, k: KOp, pool, acc: AP, p: int, out_off: int, out_rs: int,
            free: int = 1) -> None:
    out = k.outs[0]
    res = acc
    if k.attrs.scale != 1.0 or res.dtype != out.dtype or res.memory is Memory.PSUM:
        t = b.tile(pool, p, free, out.dtype).ap()
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


def _reduce_on_tensor_engine(b: TileBuilder, k: KOp, plan) -> None:
    """Sum over partitions with TensorE: the kept contiguous axis runs along the free dim (N),
    the reduced axis along partitions (K); ones[K, 1] is the stationary operand."""
    x = k.ins[0]
    t = b.target
    KT, NT = t.pe_rows, t.moving_free_max
    (R, rst), = plan.red
    N = plan.rows
    ones_pool = b.pool("ones", Memory.SBUF, 1, 4)
    ones = b.tile(ones_pool, KT, 1, x.dtype)
    b.memset(ones.ap(), 1.0)
    mov = b.pool("rmov", Memory.SBUF, 4, NT * x.dtype.itemsize)
    psum = b.pool("racc", Memory.PSUM, 2, NT * 4)
    small = b.pool("rout", Memory.SBUF, 2, NT * 4)
    nk = -(-R // KT)
    for bases in plan.outer_offsets():
        for n0 in range(0, N, NT):
            nt = min(NT, N - n0)
            acc = b.tile(psum, 1, nt, DType.FP32)
            for ki in range(nk):
                k0 = ki * KT
                kt = min(KT, R - k0)
                mv = b.tile(mov, kt, nt, x.dtype)
                src = hbm_ap(x.buffer, x.dtype, bases[0] + k0 * rst[0] + n0 * plan.row_strides[0],
                             kt, rst[0], ((nt, plan.row_strides[0]),))
                b.dma(mv.ap(), src)
                b.matmul(acc.ap(), ones.ap(kt), mv.ap(), accumulate=ki > 0)
            _finish(b, k, small, acc.ap(), 1, bases[1] + n0 * plan.row_strides[1],
                    plan.row_strides[1], free=nt)


def raise_empty(k: KOp) -> None:
    from lowering.errors import Unsupported
    raise Unsupported(",".join(k.origin) or "reduce", "reduction over an empty tensor")
