"""Tiling of POINTWISE kernels: load inputs by DMA, evaluate the expression, store by DMA.

Any shape and any strides (broadcast inputs have stride 0, outputs may be strided views such as
a slice of a ``cat``). The iteration space is laid out by ``layout.plan_2d``; row tiles of up to
128 partitions, free tiles of up to ``free_max`` elements (shrunk when the expression needs many
tiles at once). Pools have two slots per tile so the next tile's loads overlap this tile's work.
An input whose partition axis is the contiguous one (a transposed view being materialised) is
loaded as its transpose with contiguous runs and turned on TensorE, in 128x128 blocks.
"""
from __future__ import annotations

from lowering.kir import EOp, Expr, KOp, PointwiseAttrs
from lowering.tiling.builder import TileBuilder
from lowering.tiling.exprgen import ExprGen, count_intermediates
from lowering.tiling.layout import Region, hbm_ap, plan_2d
from runtime_sim.isa import AP, DType, Memory

TILE_BUDGET = 96 * 1024  # bytes per partition for one kernel's pools


def free_chunks(region: Region, free_max: int):
    """Yield (col_offset_elems, free_sizes) chunks of the region's free axes: a single free axis
    is split into chunks of ``free_max``; several free axes are taken whole."""
    if len(region.free) == 1:
        n = region.free[0][0]
        for c0 in range(0, n, free_max):
            yield c0, (min(free_max, n - c0),)
    else:
        yield 0, tuple(s for s, _ in region.free)


def index_axes(expr: Expr) -> list[int]:
    out: set[int] = set()

    def walk(x: Expr) -> None:
        if x.op is EOp.INDEX:
            out.add(x.index)
        for a in x.args:
            walk(a)

    walk(expr)
    return sorted(out)


def tile_pointwise(b: TileBuilder, k: KOp) -> None:
    assert isinstance(k.attrs, PointwiseAttrs)
    expr = k.attrs.expr
    out = k.outs[0]
    used = sorted(expr.loads())
    idx_axes = index_axes(expr)
    rank = out.rank
    strides = [out.strides] + [k.ins[i].strides for i in used] + \
        [tuple(1 if d == a else 0 for d in range(rank)) for a in idx_axes]
    offsets = [out.offset] + [k.ins[i].offset for i in used] + [0] * len(idx_axes)
    n_tiles = 2 * (len(used) + count_intermediates(expr))
    free_max = max(128, min(2048, TILE_BUDGET // (4 * n_tiles)))
    regions = plan_2d(out.shape, strides, offsets, free_max=free_max)
    if not regions:
        return
    in_pools = {i: b.pool(f"in{i}", Memory.SBUF, 2, free_max * k.ins[i].dtype.itemsize) for i in used}
    work = b.pool("work", Memory.SBUF, n_tiles, free_max * 4)
    P = b.target.sbuf_partitions
    slot_of = {i: 1 + j for j, i in enumerate(used)}
    idx_slot = {a: 1 + len(used) + j for j, a in enumerate(idx_axes)}

    tpools: dict[int, object] = {}
    tps = None
    for reg in regions:
        trans = {i for i in used if _transposed_load(reg, slot_of[i], k.ins[i].dtype)}
        for i in trans - set(tpools):
            tpools[i] = b.pool(f"tin{i}", Memory.SBUF, 2, P * k.ins[i].dtype.itemsize)
        if trans and tps is None:
            tps = b.pool("tps", Memory.PSUM, 2, P * 4)
        fmax = min(free_max, P) if trans else free_max
        for bases in reg.outer_offsets():
            for r0 in range(0, reg.rows, P):
                p = min(P, reg.rows - r0)
                for c0, fsz in free_chunks(reg, fmax):
                    def off(slot: int) -> int:
                        return (bases[slot] + r0 * reg.row_strides[slot]
                                + c0 * reg.free[-1][1][slot])

                    def free_of(slot: int) -> tuple[tuple[int, int], ...]:
                        return tuple((sz, st[slot]) for sz, (_, st) in zip(fsz, reg.free))

                    tiles: dict[int, AP] = {}
                    for i in used:
                        s = slot_of[i]
                        if i in trans:
                            # partition axis contiguous in HBM: load the transpose with
                            # contiguous runs, turn it on TensorE (no element-wise DMA)
                            x, f = k.ins[i], fsz[0]
                            rows = b.tile(tpools[i], f, p, x.dtype)
                            b.dma(rows.ap(), hbm_ap(x.buffer, x.dtype, off(s), f,
                                                    reg.free[0][1][s], ((p, 1),)))
                            tp = b.tile(tps, p, f, DType.FP32)
                            b.transpose(tp.ap(), rows.ap())
                            tiles[i] = tp.ap()
                            continue
                        # free axes the input broadcasts along (stride 0) are not loaded:
                        # the SBUF access pattern repeats the loaded values (stride 0)
                        free = free_of(s)
                        compact = tuple(fs for fs in free if fs[1] != 0)
                        t = b.tile(in_pools[i], p, tuple(n for n, _ in compact) or 1, k.ins[i].dtype)
                        src = hbm_ap(k.ins[i].buffer, k.ins[i].dtype, off(s), p,
                                     reg.row_strides[s], compact)
                        b.dma(t.ap(), src)
                        tiles[i] = t.ap(dims=_broadcast_dims(free)) if len(compact) < len(free) \
                            else t.ap()

                    def leaf(x: Expr, tiles=tiles, p=p, fsz=fsz, off=off, free_of=free_of) -> AP:
                        if x.op is EOp.LOAD:
                            return tiles[x.index]
                        s = idx_slot[x.index]
                        t = b.tile(work, p, fsz, x.dtype).ap(dims=_contiguous_dims(fsz))
                        steps = tuple(st for _, st in free_of(s))
                        b.iota(t, off(s), reg.row_strides[s], steps)
                        return t

                    gen = ExprGen(b, work, p, fsz, leaf)
                    res = gen.tile_of(expr, out.dtype)
                    if res.memory is Memory.PSUM:  # DMA does not read PSUM
                        ev = b.tile(work, p, fsz, out.dtype).ap()
                        b.tensor_copy(ev, res)
                        res = ev
                    dst = hbm_ap(out.buffer, out.dtype, off(0), p, reg.row_strides[0], free_of(0))
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
