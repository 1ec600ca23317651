"""Tiling of RESAMPLE kernels: separable sparse maps over the spatial axes of image planes
(pools, pads, nearest/bilinear upsampling and their backward; ``kir.ResampleKAttrs``).

Planes (every leading axis: N x C) go on partitions, 128 per tile, so every engine instruction
works on 128 planes at once; a plane's spatial block lies along the free axis. Per partition
tile and per block of output rows (along the outermost spatial axis, chosen so the block's
tiles fit their SBUF share):

    load the input rows the block reads (one DMA, contiguous per plane)
    [pre divisors: one VectorE/GpSimdE ``tensor_scalar`` divide per region of equal divisors]
    one pass per mapped axis, innermost first, each from the previous tile into a new one:
        the axis map is split into strided *runs* ``dst[o0 + k*so] (op)= w * src[i0 + k*si]``
        (``k < n``; each run is ONE engine instruction whose access patterns walk the other axes
        whole: a pool's kernel tap, a pad's border (reflection: a negative stride), a nearest or
        bilinear phase); the first entry of every output writes, the others accumulate:
          sum: tensor_copy / tensor_scalar(multiply), then tensor_tensor(add) (with a
               tensor_scalar(multiply) first when w != 1); outputs with no entry are memset to 0
          max: tensor_copy, then tensor_tensor(max); with indices also is_gt(src, acc) and a
               select of the candidate index (``iota``: the flat input index, GpSimdE)
    [post divisors: tensor_scalar divide per region, writing the output dtype]
    store the block (one DMA), and the int64 indices (tensor_copy cast, one DMA)

Separability: a max over a rectangular window is the max over rows of the max over columns,
and the first maximum in row-major order is the first row holding the maximum with that row's
first maximum: the index of the inner pass travels with its value through the outer passes.
A window sum likewise; divisors are per-position products of per-axis counts, so they divide
regions of the output (or of the input, for a backward).

Invariants
- Every output element is written by exactly one "write" run (or the memset) before any run
  accumulates into it; accumulation follows the map's class order, which for a max visits each
  output's entries in increasing input position (first maximum wins, strict ``is_gt``).
- Intermediate tiles are fp32 (one rounding at the end, eager's float accumulator) unless every
  map is a pure gather (pads, nearest: copies are exact) or the reduction is a max (exact in the
  input dtype).
- Index arithmetic is fp32, exact below 2**24 elements per plane (else ``Unsupported``).
- A block's tiles (all slots) fit ``BUDGET`` of an SBUF partition; no engine operand exceeds
  65536 elements; access-pattern strides fit int16 (else ``Unsupported``).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from lowering.errors import LoweringError, Unsupported
from lowering.kir import AxisMap, Divisors, KOp, ReduceOp, ResampleKAttrs, TensorRef
from lowering.tir.affine import Affine
from lowering.tir.builder import Tile, TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, Memory

F32 = DType.FP32
P = 128
BUDGET = 0.5          # of an SBUF partition for one block's tiles (all slots)
BUFS = 2              # slots per tile: the next partition tile loads while this one computes
FREE_LIMIT = 65536    # elements per engine operand
LOOKAHEAD = 16        # entries scanned for the next element of a strided run


@dataclass(frozen=True)
class Run:
    """``dst[o0 + k*so] <- w * src[i0 + k*si]`` for ``k < n`` along one axis."""

    o0: int
    so: int
    i0: int
    si: int
    n: int
    w: float


def arith_runs(items: list[tuple[int, int, float]]) -> list[Run]:
    """Cover ``items`` ((o, i, w), distinct o) by strided runs of equal weight, greedily: from
    the first uncovered output, the step to one of the next entries of equal weight that gives
    the longest run."""
    items = sorted(items)
    by_o = {o: (i, w) for o, i, w in items}
    if len(by_o) != len(items):
        raise LoweringError(f"strided runs need distinct outputs, got {items}")
    order = [o for o, _, _ in items]
    done: set[int] = set()
    out: list[Run] = []
    for k, o0 in enumerate(order):
        if o0 in done:
            continue
        i0, w0 = by_o[o0]
        best = Run(o0, 1, i0, 0, 1, w0)
        seen = 0
        for o1 in order[k + 1:]:
            if seen >= LOOKAHEAD:
                break
            if o1 in done or by_o[o1][1] != w0:
                continue
            seen += 1
            so, si = o1 - o0, by_o[o1][0] - i0
            n = 2
            while (o0 + n * so) in by_o and (o0 + n * so) not in done \
                    and by_o[o0 + n * so] == (i0 + n * si, w0):
                n += 1
            if n > best.n:
                best = Run(o0, so, i0, si, n, w0)
        done.update(o0 + j * best.so for j in range(best.n))
        out.append(best)
    return out


@dataclass(frozen=True)
class AxisPlan:
    n_out: int
    n_in: int
    writes: tuple[Run, ...]
    updates: tuple[tuple[Run, ...], ...]   # per class, in class order
    uncovered: bool                        # some output has no entry (sum: memset 0 first)


def plan_axis(m: AxisMap, lo: int, hi: int, ilo: int, n_in: int, is_max: bool, op: str) -> AxisPlan:
    """The runs of outputs ``[lo, hi)`` of ``m`` reading inputs rebased by ``ilo``."""
    per_o: dict[int, list[tuple[int, int, float]]] = defaultdict(list)
    for o, i, w, c in m.entries:
        if lo <= o < hi:
            per_o[o - lo].append((c, i - ilo, w))
    writes: dict[int, list] = defaultdict(list)
    upd: dict[tuple[int, int], list] = defaultdict(list)
    for o, es in per_o.items():
        es.sort()
        if is_max and any(b[1] <= a[1] for a, b in zip(es, es[1:])):
            raise LoweringError(f"{op}: max map visits output {o + lo} out of input order: {es}")
        c, i, w = es[0]
        writes[c].append((o, i, w))
        rep: dict[int, int] = defaultdict(int)      # several entries of one class: one layer each
        for c, i, w in es[1:]:
            upd[(c, rep[c])].append((o, i, w))
            rep[c] += 1
    wr = tuple(r for c in sorted(writes) for r in arith_runs(writes[c]))
    up = tuple(tuple(arith_runs(upd[c])) for c in sorted(upd))
    return AxisPlan(hi - lo, n_in, wr, up, len(per_o) < hi - lo)


def _identity(n: int) -> AxisMap:
    return AxisMap(n, n, tuple((o, o, 1.0, 0) for o in range(n)))


def _is_gather(m: AxisMap | None) -> bool:
    if m is None:
        return True
    outs = [o for o, _, w, _ in m.entries if w == 1.0]
    return len(outs) == len(m.entries) == m.n_out == len(set(outs))


# -- access patterns over a [partitions, *shape] tile ------------------------------------------

def _check_dims(dims, op: str) -> tuple[tuple[int, int], ...]:
    for st, sz in dims:
        if not -32768 <= st <= 32767 or sz > 65535:
            raise Unsupported(op, f"access pattern stride {st} / size {sz} exceeds the engines' "
                              f"int16 stride / uint16 size (plane too large for this kernel)")
    return tuple(dims) or ((1, 1),)


def axis_ap(t: Tile, shape: tuple[int, ...], p: int, axis: int, start: int, stride: int,
            count: int, op: str) -> TAP:
    """Positions ``start + k*stride`` (k < count) along ``axis``, every other axis whole."""
    inner = math.prod(shape[axis + 1:])
    outer = math.prod(shape[:axis])
    dims = []
    if outer > 1:
        dims.append((shape[axis] * inner, outer))
    if count > 1:
        dims.append((stride * inner, count))
    if inner > 1:
        dims.append((1, inner))
    return t.ap(p, elem_offset=start * inner, dims=_check_dims(dims, op))


def box_ap(t: Tile, shape: tuple[int, ...], p: int, box: tuple[tuple[int, int], ...], op: str) -> TAP:
    """The box ``[start, start + size)`` per axis."""
    off, dims = 0, []
    for a, (s0, n) in enumerate(box):
        st = math.prod(shape[a + 1:])
        off += s0 * st
        if n > 1:
            dims.append((st, n))
    return t.ap(p, elem_offset=off, dims=_check_dims(dims, op))


def regions(div: Divisors, shape_box: tuple[tuple[int, int], ...]):
    """Boxes (relative to ``shape_box``'s starts) of equal divisors, with the divisor per axis."""
    per_axis = []
    for a, (s0, n) in enumerate(shape_box):
        d = div.per_axis[a]
        groups: list[tuple[int, int, float]] = []
        for j in range(n):
            v = 1.0 if d is None else float(d[s0 + j])
            if groups and groups[-1][2] == v:
                g = groups[-1]
                groups[-1] = (g[0], g[1] + 1, v)
            else:
                groups.append((j, 1, v))
        per_axis.append(groups)
    out = [((), ())]
    for groups in per_axis:
        out = [(bx + ((g0, gn),), ds + (v,)) for bx, ds in out for g0, gn, v in groups]
    return out


def _divide(b: TirBuilder, dst: Tile, src: Tile, shape, p: int, div: Divisors, box0: int, op: str) -> None:
    """dst = src / divisor per region (``box0``: the block's first position along axis 0)."""
    full = tuple((box0 if a == 0 else 0, n) for a, n in enumerate(shape))
    for bx, ds in regions(div, full):
        d_ap, s_ap = box_ap(dst, shape, p, bx, op), box_ap(src, shape, p, bx, op)
        if div.each:
            vals = [v for v in ds if v != 1.0] or [1.0]
            first = True
            while vals:
                v0, v1 = vals[0], (vals[1] if len(vals) > 1 else None)
                vals = vals[2:]
                b.tensor_scalar(d_ap, s_ap if first else d_ap, AluOp.DIVIDE, v0,
                                op1=AluOp.DIVIDE if v1 is not None else None,
                                operand1=v1 if v1 is not None else 0.0)
                first = False
        else:
            b.tensor_scalar(d_ap, s_ap, AluOp.DIVIDE, math.prod(ds))


# -- the kernel -------------------------------------------------------------------------------

def plane_rows(ref: TensorRef, ns: int) -> tuple[int, int] | None:
    """(rows, row stride) of the leading axes of ``ref`` merged into one, or None."""
    lead = [(n, st) for n, st in zip(ref.shape[:-ns], ref.strides[:-ns]) if n != 1]
    if not lead:
        return 1, 0
    rows, st = lead[-1]
    for n, s in reversed(lead[:-1]):
        if s != st * rows:
            return None
        rows *= n
    return rows, st


@dataclass(frozen=True)
class _Kernel:
    op: str
    a: ResampleKAttrs
    ns: int
    sin: tuple[int, ...]
    sout: tuple[int, ...]
    maps: tuple[AxisMap, ...]          # identity where the kernel says None
    mapped: tuple[int, ...]            # axes with a map, innermost first
    vdt: DType                         # dtype of the pass tiles
    x: TensorRef
    y: TensorRef
    yi: TensorRef | None


def tile_resample(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, ResampleKAttrs)
    op = ",".join(k.origin) or "resample"
    x, y = k.ins[0], k.outs[0]
    ns = len(a.maps)
    sin, sout = tuple(x.shape[-ns:]), tuple(y.shape[-ns:])
    rx, ry = plane_rows(x, ns), plane_rows(y, ns)
    if rx is None or ry is None:
        raise LoweringError(f"{op}: the leading axes of {x} / {y} do not merge into one")
    rows = rx[0]
    if rows == 0 or math.prod(sout) == 0:
        return
    if math.prod(sin) == 0:
        raise Unsupported(op, f"resampling an empty input plane {list(sin)} to {list(sout)}")
    is_max = a.reduce is ReduceOp.MAX
    if a.indices and math.prod(sin) >= 1 << 24:
        raise Unsupported(op, f"indices of a {math.prod(sin)}-element plane (limit 2**24: fp32 index arithmetic)")
    maps = tuple(m if m is not None else _identity(n) for m, n in zip(a.maps, sin))
    mapped = tuple(ax for ax in reversed(range(ns)) if a.maps[ax] is not None)
    native = is_max or (a.pre is None and a.post is None and all(_is_gather(m) for m in a.maps))
    kern = _Kernel(op, a, ns, sin, sout, maps, mapped, x.dtype if native else F32, x, y,
                   k.outs[1] if a.indices else None)
    blocks = _blocks(b, kern)
    b.note(f"resample {list(sin)} -> {list(sout)} over {rows} planes ({a.reduce.value}"
           f"{', indices' if a.indices else ''}): passes along axes {list(mapped)}, "
           f"{len(blocks)} block(s) of {blocks[0][1] - blocks[0][0]} rows "
           f"({len(_group_blocks(kern, blocks))} loop(s)), tiles {kern.vdt.value}")
    groups = _group_blocks(kern, blocks)
    for r0, p in b.tiled(rows, P, "pl"):
        for gb in groups:
            with b.loop(gb.count, "rb") as v:
                _block(b, kern, r0, p, gb, gb.lo + v * gb.dlo, gb.ilo + v * gb.dilo, rx[1], ry[1])


@dataclass(frozen=True)
class BlockGroup:
    """``count`` blocks of output rows along axis 0 with one structure: block ``v`` covers
    outputs ``lo + v*dlo`` (``size`` of them) and reads inputs ``ilo + v*dilo`` (``isize``)."""

    lo: int
    size: int
    ilo: int
    isize: int
    count: int
    dlo: int
    dilo: int
    plan0: AxisPlan | None        # axis 0's runs, rebased to the block


def _block_key(kern: _Kernel, lo: int, hi: int):
    ilo, ihi = _in_range(kern, lo, hi)
    a = kern.a
    plan0 = (plan_axis(kern.maps[0], lo, hi, ilo, ihi - ilo, a.reduce is ReduceOp.MAX, kern.op)
             if 0 in kern.mapped else None)
    pre = a.pre.per_axis[0][ilo:ihi] if a.pre is not None and a.pre.per_axis[0] else None
    post = a.post.per_axis[0][lo:hi] if a.post is not None and a.post.per_axis[0] else None
    return (hi - lo, ihi - ilo, plan0, pre, post), lo, ilo


def _group_blocks(kern: _Kernel, blocks: list[tuple[int, int]]) -> list[BlockGroup]:
    """Consecutive blocks of equal structure whose rows advance by constant steps: one loop."""
    out: list[BlockGroup] = []
    last = None
    for lo, hi in blocks:
        key, _, ilo = _block_key(kern, lo, hi)
        g = out[-1] if out else None
        if g is not None and key == last and (g.count == 1 or (lo - g.lo == g.count * g.dlo
                                                               and ilo - g.ilo == g.count * g.dilo)):
            dlo = g.dlo if g.count > 1 else lo - g.lo
            dilo = g.dilo if g.count > 1 else ilo - g.ilo
            out[-1] = BlockGroup(g.lo, g.size, g.ilo, g.isize, g.count + 1, dlo, dilo, g.plan0)
        else:
            out.append(BlockGroup(lo, key[0], ilo, key[1], 1, 0, 0, key[2]))
        last = key
    return out


def _in_range(kern: _Kernel, lo: int, hi: int) -> tuple[int, int]:
    """Input positions [ilo, ihi) along axis 0 that outputs [lo, hi) read (empty: (0, 0))."""
    ii = [i for o, i, _, _ in kern.maps[0].entries if lo <= o < hi]
    return (min(ii), max(ii) + 1) if ii else (0, 0)


def _block_bytes(kern: _Kernel, lo: int, hi: int) -> tuple[int, int]:
    """(bytes per partition of one block's tiles, largest tile in elements)."""
    ilo, ihi = _in_range(kern, lo, hi)
    shape = (ihi - ilo,) + kern.sin[1:]
    tiles = [(math.prod(shape), kern.x.dtype.itemsize)]
    if kern.a.pre is not None:
        tiles.append((math.prod(shape), 4))
    vsz = kern.vdt.itemsize
    if kern.a.indices:
        tiles.append((math.prod(shape), 4))                       # iota of the input positions
    for ax in kern.mapped:
        shape = shape[:ax] + ((hi - lo) if ax == 0 else kern.sout[ax],) + shape[ax + 1:]
        n = math.prod(shape)
        tiles.append((n, vsz))
        tiles.append((n, 4))                                       # mask / weighted temp
        if kern.a.indices:
            tiles.append((n, 4))
    n_out = (hi - lo) * math.prod(kern.sout[1:])
    tiles.append((n_out, kern.y.dtype.itemsize))
    if kern.a.indices:
        tiles.append((n_out, 8))
    return sum(n * s for n, s in tiles) * BUFS, max(n for n, _ in tiles)


def _blocks(b: TirBuilder, kern: _Kernel) -> list[tuple[int, int]]:
    n0 = kern.sout[0]
    cap = b.target.sbuf_bytes_per_partition * BUDGET
    blk = n0
    while True:
        nb = -(-n0 // blk)
        blk = -(-n0 // nb)
        spans = [(j * blk, min(n0, (j + 1) * blk)) for j in range(nb)]
        worst = [_block_bytes(kern, lo, hi) for lo, hi in spans]
        if all(by <= cap and el <= FREE_LIMIT for by, el in worst):
            return spans
        if blk == 1:
            by, el = max(worst)
            raise Unsupported(kern.op, f"one output row of {list(kern.sout)} from {list(kern.sin)} "
                              f"needs {by} B per SBUF partition (limit {int(cap)}) or {el} elements "
                              f"per operand (limit {FREE_LIMIT})")
        blk = max(1, blk // 2)


def _block(b: TirBuilder, kern: _Kernel, r0: Affine, p: int, gb: BlockGroup, lo: Affine,
           ilo: Affine, rsx: int, rsy: int) -> None:
    """One block of output rows (``gb.size`` from ``lo``), reading inputs from ``ilo``."""
    a, op, x, y = kern.a, kern.op, kern.x, kern.y
    out_shape = (gb.size,) + kern.sout[1:]
    out_n = math.prod(out_shape)
    ysts = y.strides[-kern.ns:]
    yoff = y.offset + r0 * rsy + lo * ysts[0]
    yfree = tuple(zip(out_shape, ysts))
    if gb.isize == 0:                                # nothing reads: zeros
        z = b.tile("rs_zero", Memory.SBUF, p, out_n, y.dtype, BUFS)
        b.memset(z.ap(), 0.0)
        b.dma(hbm_ap(y.buffer, y.dtype, yoff, p, rsy, yfree), z.ap())
        return
    shape = (gb.isize,) + kern.sin[1:]
    xsts = x.strides[-kern.ns:]
    cur = b.tile("rs_in", Memory.SBUF, p, math.prod(shape), x.dtype, BUFS)
    b.dma(cur.ap(), hbm_ap(x.buffer, x.dtype, x.offset + r0 * rsx + ilo * xsts[0], p, rsx,
                           tuple(zip(shape, xsts))))
    if a.pre is not None:
        t = b.tile("rs_pre", Memory.SBUF, p, math.prod(shape), F32, BUFS)
        _divide(b, t, cur, shape, p, a.pre, gb.ilo, op)
        cur = t
    idx = None
    if a.indices:
        idx = b.tile("rs_iota", Memory.SBUF, p, math.prod(shape), F32, BUFS)
        flat = [math.prod(kern.sin[ax + 1:]) for ax in range(kern.ns)]
        dims = [(math.prod(shape[ax + 1:]), n) for ax, n in enumerate(shape)]
        keep = [j for j, (_, n) in enumerate(dims) if n > 1] or [0]
        b.iota(idx.ap(dims=_check_dims([dims[j] for j in keep], op)), ilo * flat[0], 0,
               tuple(flat[j] for j in keep))
    for ax in kern.mapped:
        m = kern.maps[ax]
        plan = (gb.plan0 if ax == 0
                else plan_axis(m, 0, m.n_out, 0, m.n_in, a.reduce is ReduceOp.MAX, op))
        dshape = shape[:ax] + (plan.n_out,) + shape[ax + 1:]
        cur, idx = _pass(b, kern, cur, idx, shape, dshape, ax, plan, p)
        shape = dshape
    res = cur
    if a.post is not None:
        res = b.tile("rs_out", Memory.SBUF, p, out_n, y.dtype, BUFS)
        _divide(b, res, cur, shape, p, a.post, gb.lo, op)
    elif cur.dtype is not y.dtype:
        res = b.tile("rs_out", Memory.SBUF, p, out_n, y.dtype, BUFS)
        b.tensor_copy(res.ap(), cur.ap())
    b.dma(hbm_ap(y.buffer, y.dtype, yoff, p, rsy, yfree), res.ap())
    if kern.yi is not None:
        yi = kern.yi
        it = b.tile("rs_idx64", Memory.SBUF, p, out_n, yi.dtype, BUFS)
        b.tensor_copy(it.ap(), idx.ap())
        ists = yi.strides[-kern.ns:]
        b.dma(hbm_ap(yi.buffer, yi.dtype, yi.offset + r0 * rsy + lo * ists[0], p, rsy,
                     tuple(zip(out_shape, ists))), it.ap())


def _pass(b: TirBuilder, kern: _Kernel, src: Tile, sidx: Tile | None, sshape, dshape, ax: int,
          plan: AxisPlan, p: int) -> tuple[Tile, Tile | None]:
    """One axis: ``dst = M @ src`` along ``ax`` (sum or max), run by run."""
    op, is_max = kern.op, kern.a.reduce is ReduceOp.MAX
    n = math.prod(dshape)
    dst = b.tile(f"rs_ax{ax}", Memory.SBUF, p, n, kern.vdt, BUFS)
    didx = b.tile(f"rs_ix{ax}", Memory.SBUF, p, n, F32, BUFS) if sidx is not None else None
    tmp = None
    if plan.uncovered:
        if is_max:
            raise LoweringError(f"{op}: a max map leaves outputs of axis {ax} without an entry")
        b.memset(dst.ap(), 0.0)

    def aps(r: Run, t: Tile):
        return (axis_ap(dst, dshape, p, ax, r.o0, r.so, r.n, op),
                axis_ap(t, sshape, p, ax, r.i0, r.si, r.n, op))

    for r in plan.writes:
        d, s = aps(r, src)
        if r.w == 1.0:
            b.tensor_copy(d, s)
        else:
            b.tensor_scalar(d, s, AluOp.MULTIPLY, r.w)
        if didx is not None:
            b.tensor_copy(axis_ap(didx, dshape, p, ax, r.o0, r.so, r.n, op),
                          axis_ap(sidx, sshape, p, ax, r.i0, r.si, r.n, op))
    for cls in plan.updates:
        for r in cls:
            d, s = aps(r, src)
            cnt = d.free_size
            if is_max:
                if didx is not None:
                    if tmp is None:
                        tmp = b.tile(f"rs_mask{ax}", Memory.SBUF, p, n, F32, BUFS)
                    mk = tmp.ap(p, dims=((1, cnt),))
                    b.tensor_tensor(mk, s, d, AluOp.IS_GT)
                    di = axis_ap(didx, dshape, p, ax, r.o0, r.so, r.n, op)
                    si = axis_ap(sidx, sshape, p, ax, r.i0, r.si, r.n, op)
                    b.select(di, mk, si, di)
                b.tensor_tensor(d, d, s, AluOp.MAX)
            elif r.w == 1.0:
                b.tensor_tensor(d, d, s, AluOp.ADD)
            else:
                if tmp is None:
                    tmp = b.tile(f"rs_w{ax}", Memory.SBUF, p, n, F32, BUFS)
                t = tmp.ap(p, dims=((1, cnt),))
                b.tensor_scalar(t, s, AluOp.MULTIPLY, r.w)
                b.tensor_tensor(d, d, t, AluOp.ADD)
    return dst, didx
