"""Tiling of row-wise kernels: SOFTMAX (and log-softmax) and LAYER_NORM, one pass over HBM.

Rows (every axis but the normalised ones) go on partitions, 128 per tile, in a loop over row
tiles (the partial tile peeled); a whole row sits in the free dim of one tile, so each row is
read from HBM once and written once.

softmax:     mx = reduce_max(x)                       VectorE tensor_reduce
             e, s = exp(x - mx), sum(e)                ScalarE activation, bias=-mx, reduce=add
             y = e * (1/s)  | log: y = x - mx - ln(s)  VectorE tensor_scalar (per-partition operands)
layer_norm:  statistics, then y = (x - mean) * rstd [* w] [+ b], the columns split between
             VectorE and ScalarE + GpSimdE by the cost table (``norm_split.py``: the engines,
             the two ways of computing the statistics and how the split is chosen).
  xn and the products are computed in the output dtype when it is a 2-byte float (the engines'
  fast modes; each step rounds once, as a bf16 program would), else in fp32.
Weight and bias are loaded once and reach every partition by a stride-0 DMA, or, where the
target's numbers favour it (trn1, 4-byte rows), by one row load and a TensorE broadcast
(``broadcast_row``). Statistics
outputs (mean, rstd) that nothing reads are not stored.

Rows whose tiles do not fit one SBUF partition are streamed in column chunks instead
(``rowwise_chunked.py``).
"""
from __future__ import annotations

import math
from contextlib import ExitStack

from lowering.errors import Unsupported
from lowering.kir import KOp, LayerNormKAttrs, SoftmaxKAttrs
from lowering.passes.residency import BUDGET_SHARE as RESIDENT_SHARE
import lowering.tiling.norm_split as norm_split
from lowering.tiling.layout import plan_rows
from lowering.tiling.norm_split import small
from lowering.tiling.pointwise import outer_loops
from lowering.tiling.rowwise_chunked import tile_layer_norm_chunked, tile_softmax_chunked
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from lowering.tir.plan import SBUF_ALIGN
from runtime_sim.costs import dma_tile_data_ns, instr_cost
from runtime_sim.isa import (AP, ActFunc, AluOp, DType, EngineKind, Instr, Memory, Op, Queue,
                             TensorCopyAttrs)
from runtime_sim.targets import Target

F32 = DType.FP32
BN_MAX = 512
SMALL_TILES = 16   # per-row statistics tiles a row-wise kernel takes per row tile, at most


def row_plan(k: KOp, red_dims: tuple[int, ...], operands, n_full: int):
    """Operands from index ``n_full`` on hold one value per row (reduced axes of size 1)."""
    x = k.ins[0]
    strides = [tuple(0 if d in red_dims and j >= n_full else s for d, s in enumerate(o.strides))
               for j, o in enumerate(operands)]
    plan = plan_rows(x.shape, red_dims, strides, [o.offset for o in operands])
    if len(plan.red) > 3:
        raise Unsupported(",".join(k.origin), f"normalised axes do not collapse to 3 strided axes "
                                              f"(got {len(plan.red)})")
    return plan, plan.red_size


def fits(b: TirBuilder, C: int, bytes_per_elem: int) -> bool:
    """Every tile of a single-tile row-wise kernel holds whole rows: do ``bytes_per_elem`` bytes
    per column fit the SBUF partition beside the resident tensors and the per-row statistics
    (``SMALL_TILES`` [p, <= 16] fp32 tiles of two slots, each slot rounded up to the planner's
    alignment)?"""
    # the resident tensors live at any kernel take at most the residency budget
    resident = min(sum(r.bytes_per_partition for r, _ in b.resident.values()),
                   int(b.target.sbuf_bytes_per_partition * RESIDENT_SHARE))
    small = SMALL_TILES * 2 * max(SBUF_ALIGN, 16 * 4)
    return C * bytes_per_elem + small + resident <= b.target.sbuf_bytes_per_partition


def broadcast_row(b: TirBuilder, w, dims, C: int, dtype: DType):
    """A [P, C] tile of ``dtype`` whose every partition holds the row ``w`` (``dims``: its
    (size, stride) axes), the cheaper way by the target's numbers (``pe_broadcast_pays``):
    - a stride-0 DMA writes the row P times over the DMA engines (P x C x itemsize bytes, on
      the weight stream's queue; on trn1 DMA runs at 0.48 of its nominal rate);
    - or the row is loaded once into one partition and spread over the partitions on TensorE,
      ``ones[1, P].T @ row[1, C]`` into PSUM (exact: one product per element), then copied out
      by ScalarE 512 columns at a time, while VectorE starts the statistics (GpSimdE cannot
      read PSUM). It pays on trn1; on trn2/trn3 the DMA is cheaper and the copies would sit on
      the norm's engines."""
    P = b.target.sbuf_partitions
    wt = b.tile("lnw", Memory.SBUF, P, C, dtype)
    if not pe_broadcast_pays(b.target, C, w.dtype.itemsize):
        raw = wt if dtype == w.dtype else b.tile("lnwd", Memory.SBUF, P, C, w.dtype)
        b.dma(raw.ap(), hbm_ap(w.buffer, w.dtype, w.offset, P, 0, dims))   # partition stride 0
        if raw is not wt:
            b.tensor_copy(wt.ap(), raw.ap())
        return wt
    row = b.tile("lnwr", Memory.SBUF, 1, C, w.dtype)
    b.dma(row.ap(), hbm_ap(w.buffer, w.dtype, w.offset, 1, 0, dims))
    ones = b.tile("lnones", Memory.SBUF, 1, P, w.dtype, 1)
    b.memset(ones.ap(), 1.0, engines=(EngineKind.GPSIMD,))
    bank = b.target.psum_bank_bytes // 4
    for c0, cw in b.tiled(C, bank, "wb"):
        ps = b.tile("lnwp", Memory.PSUM, P, bank, F32, 2)
        b.matmul(ps.ap(P, dims=((1, cw),)), ones.ap(1, dims=((1, P),)),
                 row.ap(1, elem_offset=c0, dims=((1, cw),)))
        b.tensor_copy(wt.ap(P, elem_offset=c0, dims=((1, cw),)), ps.ap(P, dims=((1, cw),)),
                      engines=(EngineKind.SCALAR,))
    return wt


def pe_broadcast_pays(t: Target, C: int, itemsize: int) -> bool:
    """The stride-0 DMA's data phase (every DMA engine writes its partitions' copies, each row
    one contiguous run; ``runtime_sim.costs.dma_tile_data_ns``) outlasts ScalarE's copies out of
    PSUM (one [128, <= 512] copy per PSUM bank of the row, ``runtime_sim.costs.instr_cost``).
    Both ways load the row by one DMA, so its fixed phase is left out of both."""
    run = C * itemsize
    dma_ns = dma_tile_data_ns(t.sbuf_partitions, run, run, t)
    full, rest = divmod(C, 512)
    copy_ns = full * _psum_copy_ns(t, 512) + (_psum_copy_ns(t, rest) if rest else 0.0)
    return dma_ns > copy_ns


def _psum_copy_ns(t: Target, n: int) -> float:
    """ScalarE's time to copy a [128, n] fp32 PSUM tile to SBUF."""
    P = t.sbuf_partitions
    src = AP("p", Memory.PSUM, 0, P, 0, ((1, n),), DType.FP32)
    dst = AP("s", Memory.SBUF, 0, P, 0, ((1, n),), DType.FP32)
    ins = Instr(Op.TENSOR_COPY, dst, (src,), TensorCopyAttrs())
    return instr_cost(ins, Queue(EngineKind.SCALAR), t).busy_ns


def free_of(plan, slot: int) -> tuple[tuple[int, int], ...]:
    return tuple((s, st[slot]) for s, st in plan.red)


def row_tiles(b: TirBuilder, plan, n_ops: int):
    """Yield (bases, r0, p) for every tile of up to 128 rows: loops over the outer kept axes and
    the full row tiles, then the partial tile."""
    P = b.target.sbuf_partitions
    with ExitStack() as es:
        bases = outer_loops(b, es, plan, n_ops)
        for r0, p in b.tiled(plan.rows, P, "r"):
            yield bases, r0, p


def load_rows(b: TirBuilder, plan, x, bases, r0, p: int, C: int, bufs: int = 3) -> TAP:
    src = hbm_ap(x.buffer, x.dtype, bases[0] + r0 * plan.row_strides[0], p, plan.row_strides[0],
                 free_of(plan, 0))
    view = b.resident_view(src, p)
    if view is not None:
        return view
    t = b.tile("x", Memory.SBUF, p, C, x.dtype, bufs).ap()
    b.dma(t, src)
    return t


def row_target(b: TirBuilder, plan, slot: int, ref, bases, r0, p: int) -> TAP | None:
    """Operand ``slot``'s rows in SBUF when that tensor stays there (compute into it)."""
    return b.resident_view(hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot],
                                  p, plan.row_strides[slot], free_of(plan, slot)), p)


def store_rows(b: TirBuilder, plan, slot: int, ref, bases, r0, p: int, tile: TAP, free=True) -> None:
    """Store a [p, C] (``free``) or [p, 1] tile to operand ``slot``'s rows."""
    b.dma(hbm_ap(ref.buffer, ref.dtype, bases[slot] + r0 * plan.row_strides[slot], p,
                 plan.row_strides[slot], free_of(plan, slot) if free else ()), tile)


def tile_softmax(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, SoftmaxKAttrs)
    x, out = k.ins[0], k.outs[0]
    if x.numel == 0:
        return
    plan, C = row_plan(k, (k.attrs.dim,), [x, out], 2)
    if not fits(b, C, 3 * x.dtype.itemsize + 2 * 4 + 2 * out.dtype.itemsize):
        return tile_softmax_chunked(b, k, plan)
    for bases, r0, p in row_tiles(b, plan, 2):
        xa = load_rows(b, plan, x, bases, r0, p, C)
        mx = small(b, p)
        b.tensor_reduce(mx, xa, AluOp.MAX)
        nmx = small(b, p)
        b.tensor_scalar(nmx, mx, AluOp.MULTIPLY, -1.0)
        e = b.tile("e", Memory.SBUF, p, C, F32).ap()
        s = small(b, p)
        b.activation(e, xa, ActFunc.EXP, bias_ap=nmx, reduce=AluOp.ADD, accum=s)
        target = row_target(b, plan, 1, out, bases, r0, p)
        y = target if target is not None else b.tile("y", Memory.SBUF, p, C, out.dtype).ap()
        if k.attrs.log:
            ls = small(b, p)
            b.activation(ls, s, ActFunc.LOG)
            b.tensor_scalar(y, xa, AluOp.SUBTRACT, mx, op1=AluOp.SUBTRACT, operand1=ls)
        else:
            rs = small(b, p)
            b.activation(rs, s, ActFunc.RECIPROCAL)
            b.tensor_scalar(y, e, AluOp.MULTIPLY, rs)
        if target is None:
            store_rows(b, plan, 1, out, bases, r0, p, y)


def bn_chunk(C: int) -> int | None:
    """Largest column count <= 512 that splits ``C`` into equal chunks (bn_aggr needs equal
    counts), or None when only tiny chunks would (then sums are cheaper)."""
    n = -(-C // BN_MAX)
    while n <= 4 * -(-C // BN_MAX):
        if C % n == 0:
            return C // n
        n += 1
    return None


def tile_layer_norm(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, LayerNormKAttrs)
    x = k.ins[0]
    y, mean, rstd = k.outs
    if x.numel == 0:
        return
    red = tuple(range(x.rank - a.normalized_ndim, x.rank))
    plan, C = row_plan(k, red, [x, y, mean, rstd], 2)
    P = b.target.sbuf_partitions
    prm = []      # (ref, its plan over x's axes with partition stride 0, is_weight)
    for j, flag, is_w in ((1, a.has_weight, True), (2 if a.has_weight else 1, a.has_bias, False)):
        if flag:
            w = k.ins[j]
            wst = [tuple(0 for _ in range(x.rank - a.normalized_ndim)) + w.strides]
            prm.append((w, plan_rows(x.shape, red, wst, [w.offset]), is_w))
    wdt = y.dtype if y.dtype.itemsize == 2 and y.dtype.is_float else F32
    ch = bn_chunk(C)
    ops = [AluOp.MULTIPLY if is_w else AluOp.ADD for _, _, is_w in prm]
    # bytes per column: the weight/bias rows (and their casts), the input slots, the scratch
    # row of the ScalarE statistics, then ``bufs`` slots of each intermediate and the result
    fixed = sum(w.dtype.itemsize + (wdt.itemsize if w.dtype != wdt else 0)
                for w in dict.fromkeys(w for w, _, _ in prm)) + 3 * x.dtype.itemsize
    per_buf = len(prm) * wdt.itemsize + y.dtype.itemsize
    split, bufs = None, 0
    outer = math.prod(n for n, _ in plan.outer)
    full, part = divmod(plan.rows, P)
    groups = [full, 1] * outer if part else [outer * full]
    for stats in (None, "bn"):        # the cheapest split; else one without the scratch row
        if stats == "bn" and ch is None:
            break
        sp = norm_split.choose(b, C, ch, x.dtype, wdt, y.dtype, ops, groups, stats)
        need = fixed + (x.dtype.itemsize if sp.stats == "act" else 0)
        bufs = next((n for n in (3, 2) if fits(b, C, need + n * per_buf)), 0)
        if bufs:
            split = sp
            break
    if split is None:
        return tile_layer_norm_chunked(b, k, plan, [(w, wp.red[0][1][0], is_w) for w, wp, is_w in prm])
    live = b.live
    params = []
    loaded: dict = {}
    for w, wplan, is_w in prm:
        op = AluOp.MULTIPLY if is_w else AluOp.ADD
        if w in loaded:          # the same view as weight and bias: load it once
            params.append((loaded[w], op))
            continue
        wt = broadcast_row(b, w, free_of(wplan, 0), C, wdt)
        loaded[w] = wt
        params.append((wt, op))
    b.note(f"layer_norm [{C}]: {split.describe(C)}")
    for bases, r0, p in row_tiles(b, plan, 4):
        xa = load_rows(b, plan, x, bases, r0, p, C)
        target = row_target(b, plan, 1, y, bases, r0, p)
        taken: list[TAP] = []

        def result() -> TAP:
            taken.append(target if target is not None else b.tile("ly", Memory.SBUF, p, C, y.dtype, bufs).ap())
            return taken[0]

        st = norm_split.row_tile(b, xa, p, C, ch, split, params, a.eps, wdt, result, bufs,
                                 pipelined=max(groups) > 1)
        if target is None:
            store_rows(b, plan, 1, y, bases, r0, p, taken[0])
        for slot, ref in ((2, mean), (3, rstd)):
            if ref.buffer not in live:
                continue
            val = st.mean(b, p) if slot == 2 else st.rs
            if val.dtype != ref.dtype:
                c = small(b, p, ref.dtype)
                b.tensor_copy(c, val)
                val = c
            store_rows(b, plan, slot, ref, bases, r0, p, val, free=False)
