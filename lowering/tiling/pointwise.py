"""Tiling of POINTWISE kernels: load inputs by DMA, evaluate the expression, store by DMA.

Any shape and any strides (broadcast inputs have stride 0, outputs may be strided views such as
a slice of a ``cat``). The iteration space is laid out by ``layout.plan_2d``; the tile program is
a loop nest over its outer axes, row tiles of up to 128 partitions and free chunks, with the
partial row tile and chunk peeled after each loop. The chunk of a single free axis is scored as
a pipeline from the target's DMA and engine costs (``stream.py``), up to what the loop nest's
pools can hold in their share of SBUF. Input tiles rotate through three slots, intermediates
through two and results through three (a store holds its tile for the DMA latency), so the next
tile's loads overlap this tile's work.

- An input equal for every row (a row vector broadcast down the rows) is loaded once per chunk
  for all row tiles, to every partition (partition stride 0): the chunk loop then runs outside
  the row tiles.
- An input with one value per row (broadcast along the free axes) is loaded as a [p, 1] tile;
  the expression's sub-trees over such inputs run once per row and reach the full tiles as
  per-partition operands of ``tensor_scalar`` (``exprgen.py``).
- An input whose partition axis is the contiguous one (a transposed view being materialised)
  is loaded as its transpose with contiguous runs and turned on TensorE, in 128x128 blocks.
- A plain store of an SBUF-resident tensor (no compute) unrolls its outer loops (up to
  ``UNROLL_MAX`` iterations): each transfer its own instruction on its own queue.
"""
from __future__ import annotations

import functools
import itertools
import math
from contextlib import ExitStack
from dataclasses import replace

from lowering.kir import EOp, Expr, KOp, PointwiseAttrs
from lowering.tiling.estimate import profile, scratch
from lowering.tiling.exprgen import ExprGen
from lowering.tiling.layout import Region, plan_2d
from lowering.tiling.stream import choose_chunk
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import DType, Memory

SBUF_SHARE = 0.5    # of a partition for one loop nest's pools (resident tensors and neighbours)
MERGE_MAX = 2048    # free elements up to which small inner axes merge into a tile's free dims
MIN_FREE = 128      # free elements of a chunk at least, whatever the expression's pools
IN_BUFS = 3         # input slots: one loading, one being read, one for the next load
INTER_BUFS = 2      # intermediates: this tile's and the next one's
OUT_BUFS = 3        # results: one being computed, one held by its store for the DMA latency, one free
UNROLL_MAX = 32     # outer iterations up to which a resident tensor's store is unrolled


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
    per_elem = _bytes_per_elem(b, k)
    # small inner axes merge into a tile's free dims up to MERGE_MAX elements; a single free
    # axis is streamed in chunks of up to what the pools' SBUF share holds
    free_max = max(MIN_FREE, int(b.target.sbuf_bytes_per_partition * SBUF_SHARE) // per_elem)
    regions = plan_2d(out.shape, strides, offsets, free_max=min(MERGE_MAX, free_max))
    P = b.target.sbuf_partitions
    slot_of = {i: 1 + j for j, i in enumerate(used)}
    idx_slot = {a: 1 + len(used) + j for j, a in enumerate(idx_axes)}
    for reg in regions:
        trans = {i for i in used if _transposed_load(reg, slot_of[i], k.ins[i].dtype)}
        fmax = min(free_max, P) if trans else free_max
        # inputs equal for every row (a row vector broadcast down the rows) are loaded once
        # per chunk for all row tiles (when there are several): chunks outside, row tiles inside
        shared = {i for i in used if reg.rows >= 2 * P and reg.row_strides[slot_of[i]] == 0
                  and i not in trans and not b.is_resident(k.ins[i].buffer)}
        if len(reg.free) == 1:
            fmax = _chunk(b, k, reg, used, slot_of, trans, shared, fmax)
        # a store of an SBUF-resident tensor (DMA only): one transfer per outer index, unrolled,
        # so they take distinct queues and run together (a loop keeps one queue, whose
        # transfers complete one after the other: GPT-2's 12-head cache tensors, stored so,
        # held the next layer's weights out of their bytes)
        root = _copied_load(expr, out.dtype)
        unroll = (not shared and not trans and root is not None
                  and b.is_resident(k.ins[root.index].buffer) and not b.is_resident(out.buffer)
                  and 1 < math.prod(n for n, _ in reg.outer) <= UNROLL_MAX)
        for unrolled in (_unrolled_bases(reg) if unroll else (None,)):
            with ExitStack() as es:
                bases = unrolled or outer_loops(b, es, reg, len(strides))
                if shared:
                    for c0, fsz in chunks(b, reg, fmax):
                        pre = {i: _load_shared(b, k.ins[i], reg, bases[slot_of[i]], slot_of[i], c0, fsz)
                               for i in sorted(shared)}
                        for r0, p in b.tiled(reg.rows, P, "r"):
                            _tile(b, k, reg, bases, r0, p, c0, fsz, used, trans, slot_of, idx_slot, expr, pre)
                    continue
                for r0, p in b.tiled(reg.rows, P, "r"):
                    for c0, fsz in chunks(b, reg, fmax):
                        _tile(b, k, reg, bases, r0, p, c0, fsz, used, trans, slot_of, idx_slot, expr, {})


def _load_shared(b: TirBuilder, x, reg: Region, base: Affine, slot: int, c0, fsz):
    """Load the chunk of an input that every row shares, to all partitions (partition stride
    0): (tile, its free axes with their strides, the loaded non-broadcast axes)."""
    free = tuple((sz, st[slot]) for sz, (_, st) in zip(fsz, reg.free))
    compact = tuple(fs for fs in free if fs[1] != 0)
    P = b.target.sbuf_partitions
    t = b.tile(f"sh{slot}", Memory.SBUF, P, tuple(n for n, _ in compact) or 1, x.dtype, 2)
    b.dma(t.ap(), hbm_ap(x.buffer, x.dtype, base + c0 * reg.free[-1][1][slot], P, 0, compact))
    return t, free, compact


def _bytes_per_elem(b: TirBuilder, k: KOp) -> int:
    """SBUF bytes per free element of the loop nest's pools: every tile one row tile's
    expression takes (inputs, intermediates, casts, constants, the result) times its slots."""
    return _bytes_per_elem_of(b.target, *_signature(k))


def _signature(k: KOp) -> tuple[Expr, tuple[DType, ...], DType]:
    """What a tile's expression code depends on: the expression and the dtypes it reads and
    writes (never the shapes, views or buffers)."""
    return k.attrs.expr, tuple(r.dtype for r in k.ins), k.outs[0].dtype


@functools.lru_cache(maxsize=4096)
def _bytes_per_elem_of(t, expr: Expr, in_dtypes: tuple[DType, ...], out_dtype: DType) -> int:
    s = _scratch_tile(t, expr, in_dtypes, out_dtype, 1, 1)
    bufs = {"in": IN_BUFS, "y": OUT_BUFS}
    return sum(x.slot_bytes * bufs.get(x.name.rstrip("0123456789"), INTER_BUFS)
               for x in s.buffers.values() if x.memory is Memory.SBUF)


def _chunk(b: TirBuilder, k: KOp, reg: Region, used, slot_of, trans, shared, fmax: int) -> int:
    """The free chunk of a single-free-axis region, scored as a pipeline (``stream.py``)."""
    P = b.target.sbuf_partitions
    n, fst = reg.free[0]
    outer = math.prod(s for s, _ in reg.outer)
    full, part = divmod(reg.rows, P)
    if part:
        segments, repeat = [(full, P), (1, part)], outer
    else:
        segments, repeat = [(outer * full, P)], 1
    streams = []
    for i in used:
        x = k.ins[i]
        if b.is_resident(x.buffer) or i in shared:    # no transfer per tile
            continue
        st = fst[slot_of[i]]
        if st == 0:                    # broadcast along the free axis: one element per row
            continue
        streams.append((x.dtype.itemsize, st == 1 or i in trans, False))
    out = k.outs[0]
    if not b.is_resident(out.buffer):
        streams.append((out.dtype.itemsize, fst[0] == 1, True))
    memo: dict[int, tuple[float, float]] = {}
    rows = frozenset(i for i in used if fst[slot_of[i]] == 0 and i not in trans)

    def compute(f: int) -> tuple[float, float]:
        if f not in memo:
            memo[f] = _compute_ns(b, k, min(reg.rows, P), f, rows)
        return memo[f]

    return choose_chunk(b.target, n, segments, repeat, streams, compute, fmax)


def _scratch_tile(t, expr: Expr, in_dtypes: tuple[DType, ...], out_dtype: DType, p: int, f: int,
                  rows: frozenset = frozenset()) -> TirBuilder:
    """The expression of one [p, f] tile emitted into a scratch builder (for estimates);
    ``rows``: the inputs that hold one value per row."""
    with scratch(t) as s:
        def leaf(x: Expr) -> TAP:
            if x.op is EOp.LOAD:
                return s.tile(f"in{x.index}", Memory.SBUF, p, f, in_dtypes[x.index]).ap()
            tl = s.tile("idx", Memory.SBUF, p, f, x.dtype).ap()
            s.iota(tl, 0, 0, (1,))
            return tl

        def row_leaf(x: Expr) -> TAP | None:
            if x.op is EOp.LOAD and x.index in rows:
                return s.tile(f"in{x.index}", Memory.SBUF, p, 1, in_dtypes[x.index]).ap()
            return None

        ExprGen(s, p, (f,), leaf, row_leaf=row_leaf).tile_of(
            expr, out_dtype, out=s.tile("y", Memory.SBUF, p, f, out_dtype).ap())
    return s


@functools.lru_cache(maxsize=16384)
def _compute_ns_of(t, expr: Expr, in_dtypes: tuple[DType, ...], out_dtype: DType, p: int, f: int,
                   rows: frozenset) -> tuple[float, float]:
    """(busiest engine's work, makespan) in ns of the expression on one [p, f] tile: a pure
    function of its arguments, remembered (a model's layers repeat their expressions, and a
    partition tiled again after a residency change asks for the same ones)."""
    busy, span = profile(_scratch_tile(t, expr, in_dtypes, out_dtype, p, f, rows))
    return (max(busy.values(), default=0.0), span)


def _compute_ns(b: TirBuilder, k: KOp, p: int, f: int, rows: frozenset) -> tuple[float, float]:
    return _compute_ns_of(b.target, *_signature(k), p, f, rows)


def _copied_load(expr: Expr, dtype: DType) -> Expr | None:
    """The input load ``expr`` copies unchanged into ``dtype`` (same-dtype casts peeled), or
    None when it computes anything."""
    root = expr
    while root.op is EOp.CAST and root.args[0].dtype == root.dtype:
        root = root.args[0]
    return root if root.op is EOp.LOAD and root.dtype == dtype else None


def _unrolled_bases(reg: Region):
    """Each operand's base offset at every outer index (the outer loops unrolled)."""
    for idx in itertools.product(*(range(n) for n, _ in reg.outer)):
        yield [aff(x + sum(i * st[s] for i, (_, st) in zip(idx, reg.outer)))
               for s, x in enumerate(reg.bases)]


def _tile(b: TirBuilder, k: KOp, reg: Region, bases, r0, p: int, c0, fsz, used, trans, slot_of,
          idx_slot, expr, pre) -> None:
    out = k.outs[0]

    def off(slot: int) -> Affine:
        return bases[slot] + r0 * reg.row_strides[slot] + c0 * reg.free[-1][1][slot]

    def free_of(slot: int) -> tuple[tuple[int, int], ...]:
        return tuple((sz, st[slot]) for sz, (_, st) in zip(fsz, reg.free))

    tiles: dict[int, TAP] = {}
    per_row: dict[int, TAP] = {}      # inputs broadcast along every free axis: [p, 1]
    for i in used:
        s = slot_of[i]
        x = k.ins[i]
        if i in pre:                  # loaded once for all row tiles of this chunk
            t, free, compact = pre[i]
            tiles[i] = t.ap(p, dims=_broadcast_dims(free)) if len(compact) < len(free) else t.ap(p)
            if not compact:
                per_row[i] = t.ap(p)
            continue
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
            if all(st == 0 for st, _ in view.dims):
                per_row[i] = replace(view, dims=((1, 1),))
            continue
        compact = tuple(fs for fs in free if fs[1] != 0)
        t = b.tile(f"in{i}", Memory.SBUF, p, tuple(n for n, _ in compact) or 1, x.dtype, IN_BUFS)
        b.dma(t.ap(), hbm_ap(x.buffer, x.dtype, off(s), p, reg.row_strides[s], compact))
        tiles[i] = t.ap(dims=_broadcast_dims(free)) if len(compact) < len(free) else t.ap()
        if not compact:               # one value per row: expressions of it run once per row
            per_row[i] = t.ap()

    def leaf(x: Expr) -> TAP:
        if x.op is EOp.LOAD:
            return tiles[x.index]
        s = idx_slot[x.index]
        t = b.tile("idx", Memory.SBUF, p, fsz, x.dtype, 2).ap(dims=_contiguous_dims(fsz))
        b.iota(t, off(s), reg.row_strides[s], tuple(st for _, st in free_of(s)))
        return t

    gen = ExprGen(b, p, fsz, leaf, INTER_BUFS,
                  row_leaf=lambda x: per_row.get(x.index) if x.op is EOp.LOAD else None)
    dst = hbm_ap(out.buffer, out.dtype, off(0), p, reg.row_strides[0], free_of(0))
    target = b.resident_view(dst, p)
    if target is not None:            # the output stays in SBUF: compute it in place
        gen.tile_of(expr, out.dtype, out=target)
        return
    root = _copied_load(expr, out.dtype)
    if root is not None and root.index not in trans:
        b.dma(dst, gen.tile_of(expr, out.dtype))   # a copy: store the loaded tile itself
        return
    # a computed result goes into a tile of its own pool (a store holds it for the DMA
    # latency; also evacuates a PSUM result, which DMA cannot read)
    res = b.tile("y", Memory.SBUF, p, fsz, out.dtype, OUT_BUFS).ap(dims=_contiguous_dims(fsz))
    gen.tile_of(expr, out.dtype, out=res)
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
