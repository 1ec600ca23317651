"""Tiling of POINTWISE kernels: load inputs by DMA, evaluate the expression, store by DMA.

Any shape and any strides (broadcast inputs have stride 0, outputs may be strided views such as
a slice of a ``cat``). The iteration space is laid out by ``layout.plan_2d``; the tile program is
a loop nest over its outer axes, row tiles of up to 128 partitions and free chunks of up to
``free_max`` elements (shrunk when the expression needs many tiles at once), with the partial
row tile and chunk peeled after each loop. Input tiles rotate through three slots and
intermediates through two, so the next tile's loads overlap this tile's work. An input whose
partition axis is the contiguous one (a transposed view being materialised) is loaded as its
transpose with contiguous runs and turned on TensorE, in 128x128 blocks.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.kir import EOp, Expr, KOp, PointwiseAttrs
from lowering.tiling.exprgen import ExprGen, count_intermediates
from lowering.tiling.layout import Region, plan_2d
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import DType, Memory

TILE_BUDGET = 48 * 1024  # bytes per partition for one tile shape (a loop nest may hold a few)
IN_BUFS = 3


def index_axes(expr: Expr) -> list[int]:
    out: set[int] = set()

    def walk(x: Expr) -> None:
        if x.op is EOp.INDEX:
            out.add(x.index)
        for a in x.args:
            walk(a)

    walk(expr)
    return sorted(out)


def chunks(b: TirBuilder, region: Region, free_max: int):
    """Yield (column offset, free sizes): one free axis in chunks of ``free_max`` (a loop and a
    tail); several free axes whole."""
    if len(region.free) == 1:
        yield from ((c0, (f,)) for c0, f in b.tiled(region.free[0][0], free_max, "c"))
    else:
        yield aff(0), tuple(s for s, _ in region.free)


def outer_loops(b: TirBuilder, es: ExitStack, region, n_ops: int) -> list[Affine]:
    """Open one loop per outer axis; return each operand's base offset (affine)."""
    bases = [aff(x) for x in region.bases]
    for size, st in region.outer:
        v = es.enter_context(b.loop(size, "o"))
        bases = [bk + v * st[k] for k, bk in enumerate(bases)]
    return bases


def tile_pointwise(b: TirBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, PointwiseAttrs)
    expr = k.attrs.expr
    out = k.outs[0]
    used = sorted(expr.loads())
    idx_axes = index_axes(expr)
    rank = out.rank
    strides = [out.strides] + [k.ins[i].strides for i in used] + \
        [tuple(1 if d == a else 0 for d in range(rank)) for a in idx_axes]
    offsets = [out.offset] + [k.ins[i].offset for i in used] + [0] * len(idx_axes)
    per_elem = sum(IN_BUFS * k.ins[i].dtype.itemsize for i in used) + \
        2 * 4 * count_intermediates(expr)
    free_max = max(128, min(2048, TILE_BUDGET // max(per_elem, 1)))
    regions = plan_2d(out.shape, strides, offsets, free_max=free_max)
    P = b.target.sbuf_partitions
    slot_of = {i: 1 + j for j, i in enumerate(used)}
    idx_slot = {a: 1 + len(used) + j for j, a in enumerate(idx_axes)}
    for reg in regions:
        trans = {i for i in used if _transposed_load(reg, slot_of[i], k.ins[i].dtype)}
        fmax = min(free_max, P) if trans else free_max
        with ExitStack() as es:
            bases = outer_loops(b, es, reg, len(strides))
            for r0, p in b.tiled(reg.rows, P, "r"):
                for c0, fsz in chunks(b, reg, fmax):
                    _tile(b, k, reg, bases, r0, p, c0, fsz, used, trans, slot_of, idx_slot, expr)


def _tile(b: TirBuilder, k: KOp, reg: Region, bases, r0, p: int, c0, fsz, used, trans, slot_of,
          idx_slot, expr) -> None:
    out = k.outs[0]

    def off(slot: int) -> Affine:
        return bases[slot] + r0 * reg.row_strides[slot] + c0 * reg.free[-1][1][slot]

    def free_of(slot: int) -> tuple[tuple[int, int], ...]:
        return tuple((sz, st[slot]) for sz, (_, st) in zip(fsz, reg.free))

    tiles: dict[int, TAP] = {}
    for i in used:
        s = slot_of[i]
        x = k.ins[i]
        if i in trans:
            # partition axis contiguous in HBM: load the transpose with contiguous runs,
            # turn it on TensorE (no element-wise DMA)
            f = fsz[0]
            rows = b.tile(f"tin{i}", Memory.SBUF, f, p, x.dtype, 2)
            b.dma(rows.ap(), hbm_ap(x.buffer, x.dtype, off(s), f, reg.free[0][1][s], ((p, 1),)))
            tp = b.tile("tps", Memory.PSUM, p, f, DType.FP32, 2)
            b.transpose(tp.ap(), rows.ap())
            tiles[i] = tp.ap()
            continue
        # free axes the input broadcasts along (stride 0) are not loaded: the SBUF access
        # pattern repeats the loaded values (stride 0)
        free = free_of(s)
        view = b.resident_view(hbm_ap(x.buffer, x.dtype, off(s), p, reg.row_strides[s], free), p)
        if view is not None:          # already in SBUF: read it where it is
            tiles[i] = view
            continue
        compact = tuple(fs for fs in free if fs[1] != 0)
        t = b.tile(f"in{i}", Memory.SBUF, p, tuple(n for n, _ in compact) or 1, x.dtype, IN_BUFS)
        b.dma(t.ap(), hbm_ap(x.buffer, x.dtype, off(s), p, reg.row_strides[s], compact))
        tiles[i] = t.ap(dims=_broadcast_dims(free)) if len(compact) < len(free) else t.ap()

    def leaf(x: Expr) -> TAP:
        if x.op is EOp.LOAD:
            return tiles[x.index]
        s = idx_slot[x.index]
        t = b.tile("idx", Memory.SBUF, p, fsz, x.dtype, 2).ap(dims=_contiguous_dims(fsz))
        b.iota(t, off(s), reg.row_strides[s], tuple(st for _, st in free_of(s)))
        return t

    gen = ExprGen(b, p, fsz, leaf)
    dst = hbm_ap(out.buffer, out.dtype, off(0), p, reg.row_strides[0], free_of(0))
    target = b.resident_view(dst, p)
    if target is not None:            # the output stays in SBUF: compute it in place
        gen.tile_of(expr, out.dtype, out=target)
        return
    res = gen.tile_of(expr, out.dtype)
    if b.buffers[res.buf].memory is Memory.PSUM:  # DMA does not read PSUM
        ev = gen.new(out.dtype)
        b.tensor_copy(ev, res)
        res = ev
    b.dma(dst, res)


def _transposed_load(reg: Region, slot: int, dtype: DType) -> bool:
    """Would the [rows, cols] load of this operand be element-strided while its transpose is
    contiguous? (partition axis stride 1, single free axis with a larger stride)"""
    return (len(reg.free) == 1 and reg.rows > 1 and reg.row_strides[slot] == 1
            and abs(reg.free[0][1][slot]) > 1 and dtype.is_float and dtype.itemsize in (2, 4))


def _broadcast_dims(free: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """SBUF dims reading a compact tile (the non-broadcast axes, contiguous) as the full
    ``free`` shape: stride 0 on the broadcast axes."""
    dims, acc = [], 1
    for n, st in reversed(free):
        if st == 0:
            dims.append((0, n))
        else:
            dims.append((acc, n))
            acc *= n
    return tuple(reversed(dims))


def _contiguous_dims(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    dims, acc = [], 1
    for n in reversed(sizes):
        dims.append((acc, n))
        acc *= n
    return tuple(reversed(dims))
