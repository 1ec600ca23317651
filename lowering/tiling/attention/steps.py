"""The steps of flash attention on one key block (tiling/attention/kernel.py composes them): K^T and
V loads, the first product, the online-softmax phases (row max on VectorE/GpSimdE, exp and row
sums on ScalarE, statistics updates), the P^T transposes through the score bank, the second
product with the accumulator update, and a query block's results (normalisation and epilogue).

Invariants
- Statistics tiles hold two slots (by key-block parity ``par``): a step reads slot ``par`` and
  writes slot ``1 - par``; the caller keeps parities consistent across steps.
- Scores live in a PSUM bank [128, 512] fp32 per query block and parity; the transposes of P
  reuse that bank once the exp has read it, and the second product's output shares it when
  ``_o_shares_bank``.
- Nothing here chooses queues or addresses: tiles and instructions only.
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import EOp, Expr, KOp
from lowering.tiling.exprgen import ExprGen
from lowering.tiling.matmul.kernel import _Side
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import ELEMENTWISE, TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

F32 = DType.FP32
QB, KB = 128, 512
LOWEST = -3.4028234663852886e38     # lowest finite fp32
TINY = 1.1754943508222875e-38       # smallest normal fp32
MDT = DType.BF16                    # the row maxes of scores in PSUM (``_half_max``)


def _diag_offsets(q0: int, qr: int, k0: int, kw: int, off: int) -> int | None:
    """For a static (query block, key block) pair: None when every key is visible to every
    query, else d = k0 - q0 - off (key c of the block is visible to query p iff c - p + d <= 0)."""
    if k0 + kw - 1 <= q0 + off:
        return None
    return k0 - q0 - off


def _mask_tile(b: TirBuilder, name: str, base: int, width: int, dt: DType, hidden: float):
    """An additive causal mask [128, width] of ``dt``: 0 where ``c - p + base <= 0`` (column c,
    partition p), ``hidden`` elsewhere; built on GpSimdE with its iota (the kernel's first
    VectorE work waits in VectorE's queue behind the previous kernel's PSUM evacuations, and
    these depend on nothing)."""
    t = b.tile(name, Memory.SBUF, QB, width, dt)
    pool = (EngineKind.GPSIMD,)
    b.iota(t.ap(), base, -1, (1,))                     # c - p + base
    b.tensor_scalar(t.ap(), t.ap(), AluOp.IS_LE, 0.0, op1=AluOp.SUBTRACT, operand1=1.0, engines=pool)
    b.tensor_scalar(t.ap(), t.ap(), AluOp.MULTIPLY, -hidden, engines=pool)   # 0 or hidden
    return t


def _half_max(b: TirBuilder, mx, src, half, kw: int, op: AluOp) -> None:
    """``mx`` = the row max (``op``: or min) of ``src`` [qr, kw], scores in PSUM, which GpSimdE
    cannot read: VectorE takes the elementwise max of the block's two halves into ``half`` in
    SBUF (one instruction streaming both: half the elements of a reduce over the block), GpSimdE
    the row max of that (``MDT``: a max near the true one gives the same softmax, as long as no
    exp overflows; bf16 rounding moves it by a fraction of a percent). An odd width: one
    VectorE reduce over the block."""
    h = kw // 2
    if kw % 2 == 0:
        b.tensor_tensor(_cols(half, 0, h), _cols(src, 0, h), _cols(src, h, h), op,
                        engines=(EngineKind.VECTOR,))
        b.tensor_reduce(mx, _cols(half, 0, h), op, engines=(EngineKind.GPSIMD,))
    else:
        b.tensor_reduce(mx, src, op, engines=(EngineKind.VECTOR,))


def _only_casts(e: Expr) -> bool:
    """The epilogue is ACC under casts to wider-or-final types: rounding once to the output
    dtype gives the same values."""
    while e.op is EOp.CAST:
        if not e.dtype.is_float or (e.args[0].op is EOp.CAST
                                    and e.args[0].dtype.itemsize < e.dtype.itemsize):
            return False
        e = e.args[0]
    return e.op is EOp.ACC


def _store(b: TirBuilder, k: KOp, bidx, q0: Affine, qr: int, Dv: int, o: TAP, rl: TAP,
           w=None, op: AluOp = AluOp.MULTIPLY, engines=ELEMENTWISE) -> None:
    """out rows [q0, q0 + qr) = epilogue(o op rl), o the unnormalised output (PSUM or SBUF), rl
    1 / the row sums (``op`` MULTIPLY) or the row sums (DIVIDE); ``w``: the staging tile
    [qr, Dv] of the output dtype to use when the epilogue is casts; ``engines``: those of the
    normalisation when it is the only instruction."""
    a, out = k.attrs, k.outs[0]
    dst = hbm_ap(out.buffer, out.dtype, _boff(out, bidx) + q0 * out.strides[-2], qr,
                 out.strides[-2], ((Dv, out.strides[-1]),))
    target = b.resident_view(dst, qr)
    if _only_casts(a.epilogue):      # normalise and round in one instruction
        w = target if target is not None else (w.ap(qr) if w is not None else
                                               b.tile("w", Memory.SBUF, qr, Dv, out.dtype).ap())
        b.tensor_scalar(w, o, op, rl, engines=engines)
        if target is None:
            b.dma(dst, w)
        return
    on = b.tile("on", Memory.SBUF, qr, Dv, F32).ap()
    b.tensor_scalar(on, o, op, rl)
    gen = ExprGen(b, qr, (Dv,), lambda x: on)
    if target is not None:
        gen.tile_of(a.epilogue, out.dtype, out=target)
        return
    b.dma(dst, gen.tile_of(a.epilogue, out.dtype))


class _Rows:
    """The first ``partitions`` rows of a tile (a partial query block in a full block's
    buffers), used where a tile is expected (``.ap()``)."""

    def __init__(self, tile, partitions: int):
        self.tile, self.p = tile, partitions

    def ap(self, partitions: int | None = None, **kw) -> TAP:
        return self.tile.ap(self.p if partitions is None else partitions, **kw)


class _Cols:
    """Columns ``[c0, c0 + n)`` of a PSUM tile, used where a tile is expected (``.ap()``)."""

    def __init__(self, tile, c0: int, partitions: int, n: int):
        self.tile, self.c0, self.p, self.n = tile, c0, partitions, n

    def ap(self, partitions: int | None = None, **kw) -> TAP:
        return _cols(self.tile.ap(), self.c0, self.n, self.p if partitions is None else partitions)


class _Part:
    """Partitions ``[p0, p0 + n)`` from column ``c0`` of a tile, used where a tile is expected
    (``.ap(n, elem_offset=, dims=)``)."""

    def __init__(self, tile, p0: int, c0: Affine):
        self.tile, self.p0, self.c0 = tile, p0, c0

    def ap(self, partitions: int, *, elem_offset=0, dims=None) -> TAP:
        return self.tile.ap(partitions, partition_start=self.p0, elem_offset=self.c0 + elem_offset, dims=dims)


def _early(b: TirBuilder, k: KOp, pipe, u: int, k0: Affine, kw: int, masks) -> None:
    """Row max, exp and statistics of one key block for every query block of the group, stage
    by stage across the blocks; statistics are read from slot ``u`` and written to the other
    (a key block's parity is its slot)."""
    st, blocks, S, P, AL, O, bidx, D, Dv = pipe
    ph1 = [_softmax_max(b, k, st[j], S[u][j], bidx, q0, qr, k0, kw, u, masks[j])
           for j, (q0, qr) in enumerate(blocks)]
    for j, (q0, qr) in enumerate(blocks):
        _softmax_exp(b, k, st[j], ph1[j], P[u][j], AL[u][j], qr, kw, u)


def _late(b: TirBuilder, k: KOp, pipe, u: int, vt, kw: int) -> None:
    """P^T transposes (into the free score bank), second products and accumulator updates of
    one key block for every query block of the group."""
    st, blocks, S, P, AL, O, bidx, D, Dv = pipe
    nsub = -(-kw // 128)
    pts = [_transpose_block(b, k, S[u][j], P[u][j].ap(qr, dims=((1, kw),)), qr, kw, nsub)
           for j, (q0, qr) in enumerate(blocks)]
    for j, (q0, qr) in enumerate(blocks):
        for s0, sw in b.tiled(kw, 128, "pv"):
            sub = s0 // 128
            b.matmul(O[u][j].ap(), _cols(pts[j], sub * qr, qr, sw), _v_rows(vt, sub, s0, sw, Dv),
                     start_when=(s0,))
    # interleaved across the blocks, so no instruction reads the previous one's result on the
    # same engine (the dependent-instruction penalty)
    for j in range(len(blocks)):
        b.tensor_scalar(st[j][3].ap(), st[j][3].ap(), AluOp.MULTIPLY, _cols(AL[u][j].ap(), 0, 1))
    for j in range(len(blocks)):
        b.tensor_tensor(st[j][3].ap(), st[j][3].ap(), O[u][j].ap(), AluOp.ADD)
    for j in range(len(blocks)):
        _softmax_update(b, st[j], AL[u][j], u)    # l' = l * a + sum (off the next block's path)


def _load_k(b: TirBuilder, sk: _Side, bidx, k0: Affine, kw: int, D: int, dt: DType, kt=None):
    """K^T [D, kw] of one key block (into ``kt`` when given)."""
    nd = -(-D // 128)
    kt = kt if kt is not None else b.tile("kt", Memory.SBUF, min(D, 128), nd * kw, dt, 2)
    # TensorE-transposed K: the block's rows in one DMA ([128 keys, D] per 128 keys), not one
    # [128, 128] transfer per transpose
    stage = sk.stage(b, sk.base(bidx), k0, kw, D, always=True)
    for d0, dw in b.tiled(D, 128, "dk"):
        sk.load(b, kt, d0 // 128 * kw, sk.base(bidx), d0, dw, k0, kw, stage)
    return kt


def _v_rows(vt, sub: Affine, s0: Affine, sw: int, Dv: int) -> TAP:
    """The [sw keys, Dv] operand of the second product for keys s0.. of the block."""
    return _cols(vt.ap(), sub * Dv, Dv, sw)


def _load_v(b: TirBuilder, V, bidx, k0: Affine, kw: int, Dv: int, vt=None, stride: int | None = None):
    """V [kw keys on partitions in 128-row pieces, Dv] of one key block (into ``vt`` when
    given, its pieces ``stride`` columns apart, default Dv). (Reading a resident V in place, as
    the matmul operand, measured slower on GPT-2 than this copy in the key-block loop; the
    short heads of ``attention._items`` read it in place, which measured faster there.)"""
    nsub = -(-kw // 128)
    vt = vt if vt is not None else b.tile("v", Memory.SBUF, min(kw, 128), nsub * Dv, V.dtype, 2)
    for s0, sw in b.tiled(kw, 128, "vs"):
        b.dma(vt.ap(sw, elem_offset=s0 // 128 * (stride or Dv), dims=((1, Dv),)),
              hbm_ap(V.buffer, V.dtype, _boff(V, bidx) + (k0 + s0) * V.strides[-2], sw,
                     V.strides[-2], ((Dv, V.strides[-1]),)))
    return vt


def _qk(b: TirBuilder, st, blocks, kt, S, kw: int, D: int) -> None:
    """S_j = Q_j^T.T @ K^T for every query block of the group (score banks [128, 512] fp32;
    the transposes of P reuse them)."""
    for j, (q0, qr) in enumerate(blocks):
        qt = st[j][0]
        for d0, dw in b.tiled(D, 128, "dm"):
            b.matmul(S[j].ap(qr, dims=((1, kw),)), qt.ap(dw, elem_offset=d0 // 128 * qr, dims=((1, qr),)),
                     kt.ap(dw, elem_offset=d0 // 128 * kw, dims=((1, kw),)), start_when=(d0,))


def _softmax_max(b: TirBuilder, k: KOp, state, s, bidx, q0: Affine, qr: int, k0: Affine, kw: int,
                 par: int, mask=None):
    """Phase 1 of an online-softmax step: -m' = min(-scale * rowmax, -m), into the other slot.
    Returns (score access, its scale)."""
    a = k.attrs
    nm = state[1]
    src, act_scale = s.ap(qr, dims=((1, kw),)), a.scale
    if a.score is not None:
        src = _score_tile(b, k, s, bidx, q0, qr, k0, kw)
        act_scale = 1.0
    if mask is not None:          # a causal diagonal block: hidden keys at -3.4e38
        sc = b.tile("cm", Memory.SBUF, qr, kw, F32).ap()
        b.tensor_tensor(sc, src, mask.ap(qr, dims=((1, kw),)), AluOp.ADD)
        src = sc
    mb = b.tile("mb", Memory.SBUF, qr, 1, F32).ap()
    b.tensor_reduce(mb, src, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
    b.tensor_scalar(nm[1 - par].ap(), mb, AluOp.MULTIPLY, -act_scale, op1=AluOp.MIN,
                    operand1=nm[par].ap())
    return src, act_scale


def _softmax_exp(b: TirBuilder, k: KOp, state, ph1, pt, alt, qr: int, kw: int, par: int):
    """Phase 2 (ScalarE): P = exp(scale * S - m') with its row sum, a = exp(m - m') (into
    columns 1 and 0 of ``alt``)."""
    src, act_scale = ph1
    nm = state[1]
    p = pt.ap(qr, dims=((1, kw),))
    b.activation(p, src, ActFunc.EXP, scale=act_scale, bias_ap=nm[1 - par].ap(), reduce=AluOp.ADD,
                 accum=_cols(alt.ap(), 1, 1))
    b.activation(_cols(alt.ap(), 0, 1), nm[par].ap(), ActFunc.EXP, scale=-1.0, bias_ap=nm[1 - par].ap())


def _softmax_update(b: TirBuilder, state, alt, par: int) -> None:
    """Phase 3: l' = l * a + sum, into the other slot (``alt`` holds a and the sum)."""
    l = state[2]
    b.tensor_scalar(l[1 - par].ap(), l[par].ap(), AluOp.MULTIPLY, _cols(alt.ap(), 0, 1),
                    op1=AluOp.ADD, operand1=_cols(alt.ap(), 1, 1))


def _o_shares_bank(pdt: DType, Dv: int, t) -> bool:
    """A key block's P^T transposes and the [128, Dv] fp32 output of its second product fit
    its score bank together (then a query block needs one bank per parity, not two)."""
    return _pt_bytes(KB // 128, pdt) + Dv * 4 <= t.psum_bank_bytes


def _ones_column(pdt: DType, Dv: int, t) -> bool:
    """Whether the two-phase path can take the row sums from its second product, V with a
    column of ones (P @ [V | 1] = [P V | sum P], one more moving column) instead of its exps'
    sums: when the output [128, Dv + 1] still fits a PSUM bank, sharing the last score bank
    whenever [128, Dv] would. Whether it does is the cost model's choice
    (``attention.plan.exp_plan``)."""
    return ((Dv + 1) * 4 <= t.psum_bank_bytes
            and _o_shares_bank(pdt, Dv + 1, t) == _o_shares_bank(pdt, Dv, t))


def _pt_bytes(nsub: int, pdt: DType) -> int:
    """PSUM bytes per partition the P^T transposes of a key block take at the start of its score
    bank (TensorE transposes write the probabilities' own dtype, exactly)."""
    return nsub * QB * pdt.itemsize


def _transpose_block(b: TirBuilder, k: KOp, s, p: TAP, qr: int, kw: int, nsub: int,
                     tdt: DType | None = None, pt=None,
                     engines=(EngineKind.VECTOR, EngineKind.SCALAR)) -> TAP:
    """P^T [keys, qr] per 128 keys, through the (now free) score bank into SBUF (``pt`` when
    given): the transposes write ``tdt`` (default: P's dtype) into the bank, one copy takes them
    all out when every piece has 128 keys."""
    pdt = k.attrs.p_dtype
    tdt = tdt or pdt
    pt = (pt.ap(min(kw, 128), dims=((1, nsub * qr),)) if pt is not None
          else b.tile("pt", Memory.SBUF, min(kw, 128), nsub * qr, pdt).ap())
    bank = s.ap()
    whole = replace(bank, dims=((1, nsub * qr),), partitions=min(kw, 128), dtype=tdt)
    for s0, sw in b.tiled(kw, 128, "ts"):
        tp = replace(bank, offset=bank.offset + aff(s0 // 128 * qr) * tdt.itemsize, dims=((1, qr),),
                     partitions=sw, dtype=tdt)
        b.transpose(tp, _cols(p, s0, sw))
        if kw % 128 or tdt is not pdt:
            # PSUM -> SBUF: VectorE's 2x copy mode or ScalarE (GpSimdE copies at 1x)
            b.tensor_copy(_cols(pt, s0 // 128 * qr, qr, sw), tp, engines=engines)
    if not kw % 128 and tdt is pdt:
        b.tensor_copy(pt, whole, engines=engines)
    return pt


def _score_tile(b: TirBuilder, k: KOp, s, bidx, q0: Affine, qr: int, k0: Affine, kw: int,
                p_axis: int | None = None, expr: Expr | None = None) -> TAP:
    """The score expression (and the causal mask) on one [qr, kw] block, in fp32 SBUF: keys
    along the free axis from ``k0``; on partitions ``qr`` consecutive indices of output axis
    ``p_axis`` (default: the queries, from ``q0``; a batch axis from its ``bidx`` entry, the
    query then fixed at ``q0``). ``expr``: an expression without ACC to evaluate instead of
    the score (``s`` is then unused)."""
    a = k.attrs
    out_rank = len(k.outs[0].shape)
    p_axis = out_rank - 2 if p_axis is None else p_axis
    acc = None
    if expr is None:
        acc = b.tile("sc", Memory.SBUF, qr, kw, F32).ap()
        b.tensor_scalar(acc, s.ap(qr, dims=((1, kw),)), AluOp.MULTIPLY, a.scale)
    loads: dict[int, TAP] = {}

    def leaf(x: Expr) -> TAP:
        if x.op is EOp.ACC:
            return acc
        if x.op is EOp.LOAD:
            if x.index not in loads:
                r = k.ins[x.index + 1]      # the first product's operand i is ins[i + 1]
                tl = b.tile(f"mask{x.index}", Memory.SBUF, qr, kw, r.dtype, 2)
                base = _boff(r, bidx) + q0 * r.strides[-2] + k0 * r.strides[-1]
                ps = r.strides[p_axis]
                if r.strides[-1] == 0 and kw > 1:
                    _row_broadcast(b, tl.ap(), r, base, qr, kw, x.index, ps)
                else:
                    b.dma(tl.ap(), hbm_ap(r.buffer, r.dtype, base, qr, ps, ((kw, r.strides[-1]),)))
                loads[x.index] = tl.ap()
            return loads[x.index]
        tl = b.tile("idx", Memory.SBUF, qr, kw, x.dtype, 2).ap()
        if x.index == p_axis:
            b.iota(tl, q0 if p_axis == out_rank - 2 else bidx[p_axis], 1, (0,))
        elif x.index == out_rank - 2:
            b.iota(tl, q0, 0, (0,))
        elif x.index == out_rank - 1:
            b.iota(tl, k0, 0, (1,))
        else:
            b.iota(tl, bidx[x.index], 0, (0,))
        return tl

    if expr is not None:
        return ExprGen(b, qr, (kw,), leaf).tile_of(expr, F32)
    res = acc
    if a.score is not None:
        res = ExprGen(b, qr, (kw,), leaf).tile_of(a.score, F32)
    return res


def _row_broadcast(b: TirBuilder, dst: TAP, r, base, qr: int, kw: int, i: int, ps: int) -> None:
    """``dst`` [qr, kw] of an operand equal along the key axis (a per-query value, e.g. position
    ids of a packed-sequence mask): one element per row by DMA (a stride-0 transfer would move
    it element by element, kw times), then copied along the row on GpSimdE (integer types take
    its exact path; an int64 row moves as its two int32 words). ``ps``: the partition stride."""
    col = b.tile(f"mrow{i}", Memory.SBUF, qr, 1, r.dtype, 2).ap()
    b.dma(col, hbm_ap(r.buffer, r.dtype, base, qr, ps, ((1, 1),)))
    if r.dtype is DType.INT64:
        w = DType.INT32
        b.tensor_copy(replace(dst, dims=((2, kw), (1, 2)), dtype=w),
                      replace(col, dims=((0, kw), (1, 2)), dtype=w), engines=(EngineKind.GPSIMD,))
    else:
        b.tensor_copy(dst, replace(col, dims=((0, kw),)),
                      engines=(EngineKind.GPSIMD,) if not r.dtype.is_float else
                      (EngineKind.VECTOR, EngineKind.GPSIMD))


def _finish(b: TirBuilder, k: KOp, state, par: int, bidx, q0: Affine, qr: int, Dv: int) -> None:
    a = k.attrs
    _, _, l, acc = state
    den = l[par].ap()        # (with ``safe`` it started at TINY, never 0: attention._l0)
    rl = b.tile("rl", Memory.SBUF, qr, 1, F32).ap()
    b.activation(rl, den, ActFunc.RECIPROCAL)
    _store(b, k, bidx, q0, qr, Dv, acc.ap(), rl)


def _cols(t: TAP, start, n: int, partitions: int | None = None) -> TAP:
    from dataclasses import replace
    return replace(t, offset=t.offset + aff(start) * t.dtype.itemsize, dims=((1, n),),
                   partitions=t.partitions if partitions is None else partitions)


def _boff(ref, bidx) -> Affine:
    return ref.offset + sum((i * s for i, s in zip(bidx, ref.strides[:-2])), aff(0))
