"""Matmul output cells: the operands of one product, the row-bias helpers (and ``acc_cast``:
does an epilogue read the accumulator only through casts to the output type), and the cell-major
order of a group's products (``emit_cells``).

A group of the usual form (``matmul._emit``) accumulates ``block x group`` output cells
([<= 128 m, <= 512 n], a PSUM bank each). Its products normally run K-major (for each K tile,
every cell), so that each streamed K tile is used by every cell as it arrives; then every cell
completes at the group's last K tile and all of their epilogues run after the last product,
one after another on the evacuation engines, while TensorE waits for the next kernel (GPT-2's
QKV projection on trn3: five [128, 512] bias adds after its last product).

When every K tile of both operands is in SBUF before the group's products start (a resident
block of all of K, and a streamed side transposed once up front, ``matmul.once.transpose_once``),
the products can run cell-major instead (for each cell, every K tile), and each cell's
epilogue runs as soon as its last product is done, under the next cell's products: only the
last cell's epilogue follows the group. The same products accumulate in the same order per
cell, so the values are the K-major order's, bit for bit.

Invariants
- A cell's accumulation group opens at its first K tile (``start_when``) and closes with its
  last product (a folded row bias's ones-row product comes last, as in the K-major order).
- Cell-major order is emitted only where ``cellwise`` says every K tile is in SBUF
  (``matmul.plan.cellwise`` prices it, ``matmul.plan.estimate``'s drain).
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import EOp, Expr, KOp
from lowering.tiling.matmul.plan import Blocking
from lowering.tiling.stream import paced_pieces
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import Tile, TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import AluOp, DType, EngineKind, Memory

TM, TN = 128, 512


def cell_operands(kp, c: Blocking, acc: Tile, blk, sblk, kt: int, koff, i0, iw: int, j0,
                  jw: int, rw: int, sw: int, rt: int, st: int, nr: int, ns: int
                  ) -> tuple[TAP, TAP, TAP]:
    """(destination, stationary, moving) of the product of K tile (``kt`` rows; the resident
    block's K tile at ``koff``) for the cell at resident offset ``i0`` and streamed offset
    ``j0``; ``kp``: the K packing (``matmul.fp8.KPack``)."""
    ia, ja = i0 // rt, j0 // st          # tile indices (affine)
    if c.resident == "A":
        cell = (ia * ns + ja) * TN
        return (acc.ap(iw, elem_offset=cell, dims=((1, jw),)), kp.ap(blk, kt, koff + i0, iw, rw),
                kp.ap(sblk, kt, j0, jw, sw))
    cell = (ja * nr + ia) * TN
    return (acc.ap(jw, elem_offset=cell, dims=((1, iw),)), kp.ap(sblk, kt, j0, jw, sw),
            kp.ap(blk, kt, koff + i0, iw, rw))


def cell_tile(c: Blocking, acc: Tile, r0, s0, i0, iw: int, j0, jw: int, rt: int, st: int,
              nr: int, ns: int) -> tuple[Affine, int, Affine, int, TAP]:
    """(m0, rows, n0, columns, accumulator) of one output cell of the group at ``r0, s0``."""
    ia, ja = i0 // rt, j0 // st
    if c.resident == "A":
        m0, mt, n0, nt = r0 + i0, iw, s0 + j0, jw
        cell = (ia * ns + ja) * TN
    else:
        m0, mt, n0, nt = s0 + j0, jw, r0 + i0, iw
        cell = (ja * nr + ia) * TN
    return m0, mt, n0, nt, acc.ap(mt, elem_offset=cell, dims=((1, nt),))


def emit_cells(b: TirBuilder, kp, c: Blocking, acc: Tile, blk, tall: Tile, F: int, ktiles,
               rw: int, sw: int, r0, s0, rt: int, st: int, nr: int, ns: int, rows: list[Tile],
               epilogue) -> None:
    """The group's products cell-major (module docstring): every K tile of the resident block
    ``blk`` and of the streamed side's transposed tile ``tall`` (K tile j at element ``j * F``)
    is in SBUF; ``ktiles()``: ``matmul._ktiles`` over K (``(j, k0, kt, kstep, start_when)``,
    K tile j of the block at ``kp.koff(k0, rw)``, or ``j * rw`` in K groups); ``rows``: the
    folded row biases (``bias_row``); ``epilogue(m0, mt, n0, nt, acc)``: one cell's epilogue."""
    ones = None
    if rows:
        ones = b.tile("ones", Memory.SBUF, 1, 128, rows[0].buf.dtype, 1)
        b.memset(ones.ap(), 1.0)
    for i0, iw in b.tiled(rw, rt, "i"):
        for j0, jw in b.tiled(sw, st, "j"):
            for j, k0, kt, ks, first in ktiles():
                koff = j * rw if ks > 1 else kp.koff(k0, rw)
                sblk = Slice(tall, j * F)
                dst, stat, mov = cell_operands(kp, c, acc, blk, sblk, kt, koff, i0, iw, j0, jw,
                                               rw, sw, rt, st, nr, ns)
                kp.matmul(b, dst, stat, mov, first)
            for row in rows:
                bias_product(b, ones, row, c, acc, r0, s0, i0, iw, j0, jw, rt, st, nr, ns)
            epilogue(*cell_tile(c, acc, r0, s0, i0, iw, j0, jw, rt, st, nr, ns))


class Slice:
    """Elements from ``off`` of every partition of a tile, used where a tile is expected."""

    def __init__(self, tile: Tile, off):
        self.tile, self.off = tile, off

    def ap(self, partitions: int | None = None, elem_offset=0, **kw) -> TAP:
        return self.tile.ap(partitions, elem_offset=self.off + elem_offset, **kw)


def bias_row(b: TirBuilder, k: KOp, fi: int, bidx) -> Tile:
    """The whole bias row of a folded row bias (``matmul.fold_row_bias``) in one partition,
    loaded once per batch index before the blocks: a few KiB at most, and no reload between
    the groups (a small load issued mid-kernel waits in the DMA engines' queues behind the next
    kernel's prefetched weights)."""
    x = k.ins[fi]
    N = k.ins[1].shape[-1]
    row = b.tile(f"bias{fi}", Memory.SBUF, 1, N, x.dtype, 2)
    b.dma(row.ap(), hbm_ap(x.buffer, x.dtype, boff(x, bidx), 1, 0, ((N, x.strides[-1]),)))
    return row


def bias_bcast(b: TirBuilder, k: KOp, fi: int, bidx, ahead: bool) -> Tile:
    """A row bias (``matmul.fold_row_bias``'s inputs) added when evacuating PSUM instead
    (``matmul.plan.bias_by_products``): the whole row on every partition of an m-tile, loaded
    once per batch index before the blocks by one DMA reading it with partition stride 0 (a
    weight, ``ahead``: it streams ahead with the kernel's weights, in paced pieces,
    ``stream.paced_pieces``), each output tile's epilogue reading its columns."""
    x = k.ins[fi]
    N = k.ins[1].shape[-1]
    P = min(TM, k.ins[0].shape[-2])
    t = b.tile(f"bias{fi}b", Memory.SBUF, P, N, x.dtype, 2)
    cw = -(-N // (paced_pieces(b.target, P, N, x.dtype.itemsize) if ahead else 1))
    for c0 in range(0, N, cw):
        w = min(cw, N - c0)
        b.dma(t.ap(P, elem_offset=c0, dims=((1, w),)),
              hbm_ap(x.buffer, x.dtype, boff(x, bidx) + c0 * x.strides[-1], P, 0, ((w, x.strides[-1]),)))
    return t


RESIDUAL_INDEX = -1   # the epilogue's LOAD index of ``residual_plus_bias``' sum (no kernel input)


def residual_plus_bias(b: TirBuilder, k: KOp, pre: dict, bidx) -> tuple[KOp, list[int]] | None:
    """An epilogue ``add(add(acc, bias), residual)`` (a projection's row bias, then the
    residual stream: a transformer block's output) as ``add(acc, bias + residual)``, with the sum
    in fp32 computed once per batch index, before the products, from the broadcast bias tile
    (``bias_bcast``, in ``pre``) and the residual's rows (resident in SBUF, else loaded): each
    output tile's evacuation is then one instruction reading PSUM, and no second add follows
    the last product on the way to the next kernel (a layer norm's statistics). The result
    rounds once where the unfused form rounds after the bias and again after the residual.
    One m-tile (M <= 128) of a full [M, N] residual; returns the kernel with that epilogue and
    its inputs (the sum under ``RESIDUAL_INDEX`` in ``pre``), or None."""
    e = k.attrs.epilogue
    if e is None or e.op is not EOp.ADD or len(e.args) != 2:
        return None
    inner, r = e.args if e.args[0].op is EOp.ADD else e.args[::-1]
    if inner.op is not EOp.ADD or len(inner.args) != 2 or r.op is not EOp.LOAD or r.index in pre:
        return None
    acc, bias = inner.args if inner.args[0].op is EOp.ACC else inner.args[::-1]
    if acc.op is not EOp.ACC or bias.op is not EOp.LOAD or bias.index not in pre:
        return None
    out, x = k.outs[0], k.ins[r.index]
    M, N = out.shape[-2], out.shape[-1]
    if M > TM or tuple(x.shape[-2:]) != (M, N) or x.strides[-2] == 0 or x.strides[-1] == 0:
        return None
    src = hbm_ap(x.buffer, x.dtype, boff(x, bidx), M, x.strides[-2], ((N, x.strides[-1]),))
    view = b.resident_view(src, M)
    if view is None:
        t = b.tile("resid", Memory.SBUF, M, N, x.dtype, 1)
        b.dma(t.ap(), src)
        view = t.ap()
    # on GpSimdE, idle while the products run (on VectorE it would sit between the epilogues of
    # the cells before); in fp32 (bf16 measured the same, and it rounds once more)
    rb = b.tile("rb", Memory.SBUF, M, N, DType.FP32, 1)
    b.tensor_tensor(rb.ap(), pre[bias.index].ap(M, dims=((1, N),)), view, AluOp.ADD,
                    engines=(EngineKind.GPSIMD,))
    pre[RESIDUAL_INDEX] = rb
    epi = Expr(EOp.ADD, (acc, Expr(EOp.LOAD, dtype=DType.FP32, index=RESIDUAL_INDEX)), e.dtype)
    return KOp(k.kind, k.outs, k.ins, replace(k.attrs, epilogue=epi), k.origin), [RESIDUAL_INDEX]


def bias_products(b: TirBuilder, row: Tile, c: Blocking, acc, r0, rw: int, s0, sw: int,
                  rt: int, st: int, nr: int, ns: int) -> None:
    """acc[cell] += ones[1, rows].T @ bias[1, cols] for every cell of the group: the row bias
    folded into the accumulation (see ``matmul.fold_row_bias``); ``row``: ``bias_row``."""
    ones = b.tile("ones", Memory.SBUF, 1, 128, row.buf.dtype, 1)
    b.memset(ones.ap(), 1.0)
    for i0, iw in b.tiled(rw, rt, "bi"):
        for j0, jw in b.tiled(sw, st, "bj"):
            bias_product(b, ones, row, c, acc, r0, s0, i0, iw, j0, jw, rt, st, nr, ns)


def bias_product(b: TirBuilder, ones: Tile, row: Tile, c: Blocking, acc, r0, s0, i0, iw: int,
                 j0, jw: int, rt: int, st: int, nr: int, ns: int) -> None:
    """The ones-row product of one cell (``bias_products``)."""
    ia, ja = i0 // rt, j0 // st
    if c.resident == "A":      # i: m-tiles, j: n-tiles
        b.matmul(acc.ap(iw, elem_offset=(ia * ns + ja) * TN, dims=((1, jw),)),
                 ones.ap(1, dims=((1, iw),)), row.ap(1, elem_offset=s0 + j0, dims=((1, jw),)),
                 start_when=(1,))
    else:                      # i: n-tiles, j: m-tiles
        b.matmul(acc.ap(jw, elem_offset=(ja * nr + ia) * TN, dims=((1, iw),)),
                 ones.ap(1, dims=((1, jw),)), row.ap(1, elem_offset=r0 + i0, dims=((1, iw),)),
                 start_when=(1,))


def boff(ref, bidx) -> Affine:
    """Element offset of batch index ``bidx`` (the leading axes) in ``ref``."""
    return ref.offset + sum((i * st for i, st in zip(bidx, ref.strides[:-2])), aff(0))


def acc_cast(epi: Expr | None, dt: DType) -> bool:
    """The epilogue reads the accumulator only as ``cast(acc)`` to ``dt`` (GPT-2's MLP:
    ``gelu(cast(acc))`` once its bias is folded): the accumulator may leave PSUM rounded to
    ``dt``, the rounding that cast does anyway (``matmul.plan.ev_dtype``)."""
    def acc(e: Expr) -> bool:       # the accumulator, or a cast of it to fp32 (its own type)
        return e.op is EOp.ACC or (e.op is EOp.CAST and e.dtype is DType.FP32 and acc(e.args[0]))

    if epi is None:
        return True
    if epi.op is EOp.CAST and acc(epi.args[0]):
        return epi.dtype == dt
    if acc(epi):
        return False
    return all(acc_cast(a, dt) for a in epi.args)
