"""Tiling of SELECT kernels (argmax/argmin, max/min over a dim, topk, sort) on VectorE.

Rows (every axis but the selected one) go on partitions, 128 per tile; a whole row of C <= 16384
elements sits in the free dim of one fp32 ``work`` tile (padded with -inf to 8 columns), so each
row is read from HBM once. Per row tile, ``R = ceil(n / 8)`` rounds of

    v[:, 8r:8r+8] = max8(work)                       the 8 largest, descending (NaN first)
    i[:, 8r:8r+8] = nc_find_index8(work, v[8r:8r+8])  their first positions (equal values:
                                                       ascending positions)
    work = nc_match_replace8(work, v[8r:8r+8], -inf)  (only when R > 1) take them out

give the ``n`` largest values in descending order with their positions, ties in index order
(a stable sort). ``n`` is ``k`` for a descending selection and C for an ascending one.

Keys (``work``)
- largest / descending: the input; when R > 1, -inf is first raised to -FLT_MAX so that it
  stays above the -inf the replaced elements become. bf16/fp16 results round -FLT_MAX back to
  -inf exactly (no bf16/fp16 value is that large); fp32 results put -inf back where a row holds
  -inf (``_restore_ninf``). Limit: an fp32 row holding both -inf and -FLT_MAX orders those two
  values as equal (by index) and reports -inf for both (docs/ops.md says so).
- reduction-like minimum (min.dim, argmin: NaN is the result): ``-x``; the values are negated
  back.
- ascending order (sort ascending, topk largest=False: NaN is the largest value, so last): the
  row is read reversed (negative-stride DMA) and sorted descending in full; the ascending result
  is the descending one reversed, its positions mapped back by ``C - 1 - i``. Reading reversed
  makes ties come out in ascending original index after the reversal (still stable).

Costs: 2 (R = 1) or 3 VectorE passes over the row per round: a sort of C is ~3C^2/8 cycles per
row tile, a top-8 ~2C.

Invariants
- Every row's C elements are loaded exactly once; every output element is stored once.
- Positions are exact (int32 on the engine, below 16384; copied to int64 exactly).
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.errors import Unsupported
from lowering.kir import KOp, SelectKAttrs
from lowering.tiling.layout import plan_rows
from lowering.tiling.pointwise import outer_loops
from lowering.tiling.rowwise import fits
from lowering.tir.builder import ELEMENTWISE, TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.checks import SELECT8_MAX
from runtime_sim.isa import (AluOp, DType, EngineKind, FindIndex8Attrs, MatchReplace8Attrs,
                             Max8Attrs, Memory, Op)

F32, I32, I64 = DType.FP32, DType.INT32, DType.INT64
FLT_MAX = 3.4028234663852886e38
VEC = (EngineKind.VECTOR,)


def select_limit(C: int) -> str | None:
    """The row must fit one max8 pass: 1 <= C <= 16384 elements."""
    if not 1 <= C <= SELECT8_MAX:
        return f"the selected dim has {C} elements; the VectorE max8 search takes 1 to {SELECT8_MAX}"
    return None


def tile_select(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, SelectKAttrs)
    x = k.ins[0]
    outs = list(k.outs)
    vref = outs.pop(0) if a.has_values else None
    iref = outs.pop(0) if a.has_indices else None
    C = x.shape[a.dim]
    op = ",".join(k.origin) or "select"
    why = select_limit(C)
    if why:
        raise Unsupported(op, why)
    if any(o.numel == 0 for o in k.outs) or a.k == 0:
        return
    ascending = not a.largest and not a.nan_wins
    n = C if ascending else a.k
    R = -(-n // 8)
    W = max(C, 8)
    if not fits(b, W, 2 * x.dtype.itemsize + 4 + 2 * 8 * 8):
        raise Unsupported(op, f"a row of {C} elements and its {8 * R} results do not fit one SBUF partition")
    refs = [r for r in (vref, iref) if r is not None]
    zero_dim = [tuple(0 if d == a.dim else s for d, s in enumerate(r.strides)) for r in refs]
    plan = plan_rows(x.shape, (a.dim,), [x.strides] + zero_dim, [x.offset] + [r.offset for r in refs])
    cx = x.strides[a.dim]
    P = b.target.sbuf_partitions
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, 1 + len(refs))
        for r0, p in b.tiled(plan.rows, P, "r"):
            xb = bases[0] + r0 * plan.row_strides[0]
            xt = b.tile("sel_x", Memory.SBUF, p, C, x.dtype, 2).ap()
            if ascending:    # the row reversed: element C-1 first
                src = hbm_ap(x.buffer, x.dtype, xb + (C - 1) * cx, p, plan.row_strides[0], ((C, -cx),))
            else:
                src = hbm_ap(x.buffer, x.dtype, xb, p, plan.row_strides[0], ((C, cx),))
            b.dma(xt, src)
            work = b.tile("sel_work", Memory.SBUF, p, W, F32, 1)
            wrow = work.ap(dims=((1, C),))
            if W > C:
                b.memset(work.ap(elem_offset=C, dims=((1, W - C),)), float("-inf"))
            if not a.largest and a.nan_wins:
                b.tensor_scalar(wrow, xt, AluOp.MULTIPLY, -1.0)
            elif R > 1:
                b.tensor_scalar(wrow, xt, AluOp.MAX, -FLT_MAX)
            else:
                b.tensor_copy(wrow, xt, engines=ELEMENTWISE)
            v = b.tile("sel_v", Memory.SBUF, p, 8 * R, F32, 2)
            i = b.tile("sel_i", Memory.SBUF, p, 8 * R, I32, 2)
            with b.loop(R, "s") as s:
                vr = v.ap(elem_offset=s * 8, dims=((1, 8),))
                b.emit(Op.MAX8, vr, (work.ap(),), Max8Attrs(), engines=VEC)
                b.emit(Op.FIND_INDEX8, i.ap(elem_offset=s * 8, dims=((1, 8),)), (work.ap(), vr),
                       FindIndex8Attrs(), engines=VEC)
                if R > 1:
                    b.emit(Op.MATCH_REPLACE8, work.ap(), (work.ap(), vr), MatchReplace8Attrs(float("-inf")),
                           engines=VEC)
            # the stored block: the first k of the descending order, or (ascending) the last k
            lo = C - a.k if ascending else 0
            cols = ((1, a.k),)
            slot = 1
            if vref is not None:
                vals = v.ap(elem_offset=lo, dims=cols)
                if not a.largest and a.nan_wins:
                    neg = b.tile("sel_neg", Memory.SBUF, p, a.k, F32, 2).ap()
                    b.tensor_scalar(neg, vals, AluOp.MULTIPLY, -1.0)
                    vals = neg
                elif R > 1 and vref.dtype is F32:
                    vals = _restore_ninf(b, xt, vals, p, a.k)
                if vals.dtype != vref.dtype:
                    c = b.tile("sel_vout", Memory.SBUF, p, a.k, vref.dtype, 2).ap()
                    b.tensor_copy(c, vals)
                    vals = c
                _store(b, vref, plan, slot, bases, r0, p, a, vals, ascending)
                slot += 1
            if iref is not None:
                pos = b.tile("sel_iout", Memory.SBUF, p, a.k, I64, 2).ap()
                src_i = i.ap(elem_offset=lo, dims=cols)
                if ascending:        # positions in the reversed row -> original positions
                    b.tensor_scalar(pos, src_i, AluOp.MULTIPLY, -1.0, op1=AluOp.ADD, operand1=float(C - 1))
                else:
                    b.tensor_copy(pos, src_i, engines=ELEMENTWISE)
                _store(b, iref, plan, slot, bases, r0, p, a, pos, ascending)


def _restore_ninf(b: TirBuilder, xt: TAP, vals: TAP, p: int, k: int) -> TAP:
    """fp32 values: -FLT_MAX back to -inf in the rows that hold -inf."""
    isninf = b.tile("sel_isninf", Memory.SBUF, p, xt.dims[0][1], F32, 1).ap()
    b.tensor_scalar(isninf, xt, AluOp.IS_EQUAL, float("-inf"))
    has = b.tile("sel_has", Memory.SBUF, p, 1, F32, 1).ap()
    b.tensor_reduce(has, isninf, AluOp.MAX)
    mask = b.tile("sel_mask", Memory.SBUF, p, k, F32, 1).ap()
    b.tensor_scalar(mask, vals, AluOp.IS_EQUAL, -FLT_MAX, op1=AluOp.LOGICAL_AND, operand1=has)
    ninf = b.tile("sel_ninf", Memory.SBUF, p, k, F32, 1).ap()
    b.memset(ninf, float("-inf"))
    fixed = b.tile("sel_fixed", Memory.SBUF, p, k, F32, 1).ap()
    b.select(fixed, mask, ninf, vals)
    return fixed


def _store(b: TirBuilder, ref, plan, slot: int, bases, r0, p: int, a: SelectKAttrs, tile: TAP,
           ascending: bool) -> None:
    """Store the [p, k] block: in order, or (ascending) reversed along the dim."""
    st = ref.strides[a.dim] if ref.rank else 1
    base = bases[slot] + r0 * plan.row_strides[slot]
    if ascending:
        base = base + (a.k - 1) * st
        st = -st
    b.dma(hbm_ap(ref.buffer, ref.dtype, base, p, plan.row_strides[slot], ((a.k, st),)), tile)
