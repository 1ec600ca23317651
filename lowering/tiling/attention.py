"""Tiling of ATTENTION kernels: flash attention (online softmax over key blocks) on TensorE,
ScalarE and VectorE/GpSimdE; scores and probabilities never leave SBUF/PSUM.

Per batch index and group of ``J`` query blocks of 128 rows (J from the PSUM budget), with
Q^T [D, 128] loaded once per block and running statistics m (max), l (sum) and an fp32
accumulator O [128, Dv] in SBUF:
    for each key block of up to 512 keys:                    K^T [D, kw], V [kw, Dv] loaded once
        S = Q^T.T @ K^T                    TensorE -> PSUM [128, kw] (fp32; D > 128 accumulates)
        m' = max(m, scale * rowmax(S))     VectorE/GpSimdE
        P = exp(scale * S - m'), s = sum P ScalarE, one activation (p_dtype)
        a = exp(m - m'); l = l * a + s; m = m'
        P^T = transpose(P) per 128 keys    TensorE -> PSUM -> SBUF
        O' = P^T.T @ V                     TensorE, accumulated over the key sub-blocks
        O = O * a + O'
    out = epilogue(O / l)
The J query blocks of a group share every K/V load; a step of the key loop takes U key
blocks, computes all their products first and then each block's softmax, transposes and
second products, stage by stage across the group: TensorE works on the next key block's
products while the current one's softmax runs (the engines are in-order queues: without the
interleave TensorE would wait for every exp). J and U come from the PSUM budget.

m starts at the lowest finite fp32 value, so fully masked rows never compute inf - inf: their
sum stays 0 and O / l is 0 / 0 = NaN as in eager softmax, or 0 with ``safe`` (torch's
_safe_softmax) where l is clamped to the smallest normal fp32 first.
A ``score`` expression (masks, anything beyond a scale) is evaluated on each [128, kw] block
from the scaled product; ``causal`` masks keys past the query and skips key blocks entirely
past the block's last query.
"""
from __future__ import annotations

from contextlib import ExitStack

from lowering.errors import Unsupported
from lowering.kir import AttentionKAttrs, EOp, Expr, KOp
from lowering.tiling.exprgen import ExprGen
from lowering.tiling.matmul import _Side, _form
from lowering.tiling.matmul_plan import PE_T, RES_T, operand_form
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

F32 = DType.FP32
QB, KB = 128, 512
LOWEST = -3.4028234663852886e38     # lowest finite fp32
TINY = 1.1754943508222875e-38       # smallest normal fp32


def tile_attention(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, AttentionKAttrs)
    Q, KT, V = k.ins[:3]
    out = k.outs[0]
    *batch, Sq, D = Q.shape
    Sk, Dv = KT.shape[-1], V.shape[-1]
    if min(Sq, Sk, D, Dv) == 0:
        raise Unsupported(",".join(k.origin) or "attention", f"empty attention (Sq={Sq}, Sk={Sk}, D={D}, Dv={Dv})")
    if Dv > 512:
        raise Unsupported(",".join(k.origin) or "attention", f"value width Dv={Dv} > 512 (one PSUM bank)")
    t = b.target
    sq = _Side(Q, Q.strides[-1], Q.strides[-2], Sq, operand_form(Q.strides[-1], Q.strides[-2], Sq, Q.dtype, t), tp_bufs=1)
    sk = _Side(KT, KT.strides[-2], KT.strides[-1], Sk, _form(b, KT, KT.strides[-2], KT.strides[-1], Sk),
               tp_bufs=1)
    # PSUM: per query block and key block of a step one score bank (the probability
    # transposes reuse it once the exp has read it) and one output bank
    # score and output banks per query block: two of each for the two key-block parities of
    # the software pipeline, or (a single key block) two slots each so that consecutive groups
    # or batch items overlap
    per_q = 4
    # a K loaded through TensorE transposes needs a bank per load site of the loop body
    tp_banks = 4 if sk.form in (PE_T, RES_T) else 0
    J = max(1, min(4, (t.psum_banks - tp_banks) // per_q, -(-Sq // QB)))
    b.note(f"attention {'x'.join(map(str, batch))} x [{Sq}x{D}] keys {Sk} values {Dv}: Q {sq.form}, "
           f"K {sk.form}; {J} query blocks per group, key blocks of {KB} software-pipelined")
    masks = _causal_masks(b, k, Sq, Sk, J) if k.attrs.causal else None
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        if masks is None:
            for g0, gw in b.tiled(Sq, J * QB, "qg"):
                _group(b, k, sq, sk, bidx, g0, gw, D, Sk, Dv, None)
        else:   # causal: every group on its own, with the key blocks its queries can see
            for g in range(-(-Sq // (J * QB))):
                g0 = g * J * QB
                _group(b, k, sq, sk, bidx, aff(g0), min(J * QB, Sq - g0), D, Sk, Dv, masks)


def _diag_offsets(q0: int, qr: int, k0: int, kw: int, off: int) -> int | None:
    """For a static (query block, key block) pair: None when every key is visible to every
    query, else d = k0 - q0 - off (key c of the block is visible to query p iff c - p + d <= 0)."""
    if k0 + kw - 1 <= q0 + off:
        return None
    return k0 - q0 - off


def _causal_masks(b: TirBuilder, k: KOp, Sq: int, Sk: int, J: int) -> dict:
    """One additive mask tile [128, KB] (0 visible, -3e38 hidden) per distinct diagonal offset
    d, set once at the start of the kernel."""
    off = k.attrs.causal_offset
    ds = set()
    for g in range(-(-Sq // (J * QB))):
        for j in range(J):
            q0 = g * J * QB + j * QB
            if q0 >= Sq:
                break
            qr = min(QB, Sq - q0)
            for k0 in range(0, min(Sk, q0 + qr + off), KB):
                d = _diag_offsets(q0, qr, k0, min(KB, Sk - k0), off)
                if d is not None:
                    ds.add(d)
    out = {}
    for d in sorted(ds):
        t = b.tile(f"mask{len(out)}", Memory.SBUF, QB, KB, F32)
        b.iota(t.ap(), d, -1, (1,))                     # c - p + d
        b.tensor_scalar(t.ap(), t.ap(), AluOp.IS_LE, 0.0, op1=AluOp.SUBTRACT, operand1=1.0)
        b.tensor_scalar(t.ap(), t.ap(), AluOp.MULTIPLY, -LOWEST)   # 0 or -3.4e38
        out[d] = t
    return out


def _group(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, bidx, g0: Affine, gw: int, D: int, Sk: int,
           Dv: int, masks: dict | None) -> None:
    a = k.attrs
    V = k.ins[2]
    dt, pdt = sq.ref.dtype, a.p_dtype
    blocks = []                                   # (q0, rows) per query block of the group
    for j in range(-(-gw // QB)):
        blocks.append((g0 + j * QB, min(QB, gw - j * QB)))
    nd = -(-D // 128)
    st = []
    for j, (q0, qr) in enumerate(blocks):
        qt = b.tile(f"qt{j}", Memory.SBUF, min(D, 128), nd * qr, dt)
        for d0, dw in b.tiled(D, 128, "d"):
            sq.load(b, qt, d0 // 128 * qr,
                    sq.base(bidx), d0, dw, q0, qr)
        # running -max and sum in two slots each: a key block reads one and writes the other
        nm = [b.tile(f"nm{j}_{u}", Memory.SBUF, qr, 1, F32) for u in range(2)]
        l = [b.tile(f"l{j}_{u}", Memory.SBUF, qr, 1, F32) for u in range(2)]
        acc = b.tile(f"o{j}", Memory.SBUF, qr, Dv, F32)
        b.memset(nm[0].ap(), -LOWEST)
        b.memset(l[0].ap(), 0.0)
        b.memset(acc.ap(), 0.0)
        st.append((qt, nm, l, acc))
    # Software pipeline over key blocks. Block b's *early* stage (products S = Q K^T, row max,
    # exp, statistics) is issued before block b-1's *late* stage (P^T transposes, second
    # products, accumulator update), so every in-order engine finds the next block's early
    # work ahead of the previous block's late work. Score banks, probabilities and exp factors
    # live in two slots per query block (by block parity: the key loop is unrolled by two).
    if masks is not None:     # causal: only the keys the group's last query can see
        Sk = min(Sk, g0.const + gw + k.attrs.causal_offset)
    full, tail = divmod(Sk, KB)
    kbs = [(aff(i * KB), KB) for i in range(full)] + ([(aff(full * KB), tail)] if tail else [])
    nb = len(kbs)
    # per key block, per query block: the causal mask tile, or None when all keys are visible
    diag = [[None] * len(blocks) for _ in kbs]
    if masks is not None:
        for bi, (k0, kw) in enumerate(kbs):
            for j, (q0, qr) in enumerate(blocks):
                d = _diag_offsets(q0.const, qr, k0.const, kw, k.attrs.causal_offset)
                diag[bi][j] = masks[d] if d is not None else None
    clean = next((bi for bi, row in enumerate(diag) if any(m is not None for m in row)), nb)
    nu = 2 if nb > 1 else 1
    sb = 1 if nb > 1 else 2
    S = [[b.tile(f"s{j}_{u}", Memory.PSUM, 128, KB, F32, sb) for j in range(len(blocks))] for u in range(nu)]
    O = [[b.tile(f"op{j}_{u}", Memory.PSUM, qr, Dv, F32, sb) for j, (_, qr) in enumerate(blocks)]
         for u in range(nu)]
    P = [[b.tile(f"p{j}_{u}", Memory.SBUF, qr, KB, pdt, sb) for j, (_, qr) in enumerate(blocks)]
         for u in range(nu)]
    AL = [[b.tile(f"al{j}_{u}", Memory.SBUF, qr, 2, F32, sb) for j, (_, qr) in enumerate(blocks)]
          for u in range(nu)]            # per slot: the exp factor a and the block's row sum
    pipe = (st, blocks, S, P, AL, O, bidx, D, Dv)

    def early(bi, kw: int, u: int, k0: Affine) -> None:
        kt = _load_k(b, sk, bidx, k0, kw, D, dt)
        _qk(b, st, blocks, kt, S[u], kw, D)
        _early(b, k, pipe, u, k0, kw, diag[bi] if bi is not None else [None] * len(blocks))

    def late(u: int, k0: Affine, kw: int) -> None:
        vt = _load_v(b, V, bidx, k0, kw, Dv)
        _late(b, k, pipe, u, vt, kw)

    early(0, kbs[0][1], 0, kbs[0][0])
    # loop iterations: early 2i+1, late 2i, early 2i+2, late 2i+1 (full, unmasked blocks only)
    nclean = min(full, clean)
    L = (nclean - 1) // 2 if nclean >= 3 else 0
    if L:
        with b.loop(L, "kb") as i:
            early(None, KB, 1, (2 * i + 1) * KB)
            late(0, 2 * i * KB, KB)
            early(None, KB, 0, (2 * i + 2) * KB)
            late(1, (2 * i + 1) * KB, KB)
    for bi in range(2 * L, nb):                 # the rest, unrolled: block 2L's early stage is done
        if bi + 1 < nb:
            early(bi + 1, kbs[bi + 1][1], (bi + 1) % 2, kbs[bi + 1][0])
        late(bi % 2, kbs[bi][0], kbs[bi][1])
    for j, (q0, qr) in enumerate(blocks):
        _finish(b, k, st[j], nb % 2, bidx, q0, qr, Dv)


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
            b.matmul(O[u][j].ap(), _cols(pts[j], sub * qr, qr, sw), _cols(vt.ap(), sub * Dv, Dv, sw),
                     start_when=(s0,))
    # interleaved across the blocks, so no instruction reads the previous one's result on the
    # same engine (the dependent-instruction penalty)
    for j in range(len(blocks)):
        b.tensor_scalar(st[j][3].ap(), st[j][3].ap(), AluOp.MULTIPLY, _cols(AL[u][j].ap(), 0, 1))
    for j in range(len(blocks)):
        b.tensor_tensor(st[j][3].ap(), st[j][3].ap(), O[u][j].ap(), AluOp.ADD)
    for j in range(len(blocks)):
        _softmax_update(b, st[j], AL[u][j], u)    # l' = l * a + sum (off the next block's path)


def _load_k(b: TirBuilder, sk: _Side, bidx, k0: Affine, kw: int, D: int, dt: DType):
    """K^T [D, kw] of one key block."""
    nd = -(-D // 128)
    kt = b.tile("kt", Memory.SBUF, min(D, 128), nd * kw, dt, 2)
    for d0, dw in b.tiled(D, 128, "dk"):
        sk.load(b, kt, d0 // 128 * kw, sk.base(bidx), d0, dw, k0, kw)
    return kt


def _load_v(b: TirBuilder, V, bidx, k0: Affine, kw: int, Dv: int):
    """V [kw keys on partitions in 128-row pieces, Dv] of one key block."""
    nsub = -(-kw // 128)
    vt = b.tile("v", Memory.SBUF, min(kw, 128), nsub * Dv, V.dtype, 2)
    for s0, sw in b.tiled(kw, 128, "vs"):
        b.dma(vt.ap(sw, elem_offset=s0 // 128 * Dv, dims=((1, Dv),)),
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


def _transpose_block(b: TirBuilder, k: KOp, s, p: TAP, qr: int, kw: int, nsub: int) -> TAP:
    """P^T [keys, qr] per 128 keys, through the (now free) score bank into SBUF."""
    pt = b.tile("pt", Memory.SBUF, min(kw, 128), nsub * qr, k.attrs.p_dtype).ap()
    for s0, sw in b.tiled(kw, 128, "ts"):
        tp = _cols(s.ap(), s0 // 128 * qr, qr, sw)
        b.transpose(tp, _cols(p, s0, sw))
        # PSUM -> SBUF: VectorE's 2x copy mode or ScalarE (GpSimdE copies at 1x)
        b.tensor_copy(_cols(pt, s0 // 128 * qr, qr, sw), tp, engines=(EngineKind.VECTOR, EngineKind.SCALAR))
    return pt


def _score_tile(b: TirBuilder, k: KOp, s, bidx, q0: Affine, qr: int, k0: Affine, kw: int) -> TAP:
    """The score expression (and the causal mask) on one [qr, kw] block, in fp32 SBUF."""
    a = k.attrs
    out_rank = len(k.outs[0].shape)
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
                b.dma(tl.ap(), hbm_ap(r.buffer, r.dtype, _boff(r, bidx) + q0 * r.strides[-2]
                                      + k0 * r.strides[-1], qr, r.strides[-2], ((kw, r.strides[-1]),)))
                loads[x.index] = tl.ap()
            return loads[x.index]
        tl = b.tile("idx", Memory.SBUF, qr, kw, x.dtype, 2).ap()
        if x.index == out_rank - 2:
            b.iota(tl, q0, 1, (0,))
        elif x.index == out_rank - 1:
            b.iota(tl, k0, 0, (1,))
        else:
            b.iota(tl, bidx[x.index], 0, (0,))
        return tl

    res = acc
    if a.score is not None:
        res = ExprGen(b, qr, (kw,), leaf).tile_of(a.score, F32)
    return res


def _finish(b: TirBuilder, k: KOp, state, par: int, bidx, q0: Affine, qr: int, Dv: int) -> None:
    a = k.attrs
    out = k.outs[0]
    _, _, l, acc = state
    den = l[par].ap()
    if a.safe:
        d = b.tile("den", Memory.SBUF, qr, 1, F32).ap()
        b.tensor_scalar(d, den, AluOp.MAX, TINY)
        den = d
    rl = b.tile("rl", Memory.SBUF, qr, 1, F32).ap()
    b.activation(rl, den, ActFunc.RECIPROCAL)
    o = b.tile("on", Memory.SBUF, qr, Dv, F32).ap()
    b.tensor_scalar(o, acc.ap(), AluOp.MULTIPLY, rl)
    gen = ExprGen(b, qr, (Dv,), lambda x: o)
    dst = hbm_ap(out.buffer, out.dtype, _boff(out, bidx) + q0 * out.strides[-2], qr,
                 out.strides[-2], ((Dv, out.strides[-1]),))
    target = b.resident_view(dst, qr)
    if target is not None:            # the output stays in SBUF: computed straight into it
        gen.tile_of(a.epilogue, out.dtype, out=target)
        return
    b.dma(dst, gen.tile_of(a.epilogue, out.dtype))


def _cols(t: TAP, start, n: int, partitions: int | None = None) -> TAP:
    from dataclasses import replace
    return replace(t, offset=t.offset + aff(start) * t.dtype.itemsize, dims=((1, n),),
                   partitions=t.partitions if partitions is None else partitions)


def _boff(ref, bidx) -> Affine:
    return ref.offset + sum((i * s for i, s in zip(bidx, ref.strides[:-2])), aff(0))
