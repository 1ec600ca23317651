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
from dataclasses import replace

from lowering.errors import Unsupported
from lowering.kir import AttentionKAttrs, EOp, Expr, KOp
from lowering.tiling.exprgen import ExprGen
from lowering.tiling.matmul import _Side
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
    # Q^T, K^T by DMA transposes even from SBUF-resident tensors: TensorE transposes would put
    # their PSUM copies on the VectorE/ScalarE queues the softmax keeps busy (GPT-2: 1160 us
    # against 1100 us with DMA transposes)
    sq = _Side(Q, Q.strides[-1], Q.strides[-2], Sq, operand_form(Q.strides[-1], Q.strides[-2], Sq, Q.dtype, t), tp_bufs=1)
    sk = _Side(KT, KT.strides[-2], KT.strides[-1], Sk, operand_form(KT.strides[-2], KT.strides[-1], Sk, KT.dtype, t),
               tp_bufs=1)
    # PSUM: per query block and key block of a step one score bank (the probability
    # transposes reuse it once the exp has read it) and one output bank
    # score and output banks per query block: two of each for the two key-block parities of
    # the software pipeline, or (a single key block) two slots each so that consecutive groups
    # or batch items overlap
    per_q = 2 if _o_shares_bank(Q.dtype if a.p_dtype is None else a.p_dtype, Dv, t) else 4
    # a K loaded through TensorE transposes needs a bank per load site of the loop body
    tp_banks = 4 if sk.form in (PE_T, RES_T) else 0
    J = max(1, min(4, (t.psum_banks - tp_banks) // per_q, -(-Sq // QB)))
    b.note(f"attention {'x'.join(map(str, batch))} x [{Sq}x{D}] keys {Sk} values {Dv}: Q {sq.form}, "
           f"K {sk.form}; {J} query blocks per group, key blocks of {KB} software-pipelined")
    masks = _causal_masks(b, k, Sq, Sk, J) if k.attrs.causal else None
    sk_seen = min(Sk, Sq + k.attrs.causal_offset) if k.attrs.causal else Sk
    if batch and batch[-1] > 1 and Sq <= 2 * QB and sk_seen <= KB:
        # one step per batch item: pipeline the items themselves (see _items)
        with ExitStack() as es:
            outer = tuple(es.enter_context(b.loop(n, "b")) for n in batch[:-1])
            tps = 2 if PE_T in (sq.form, sk.form) or RES_T in (sq.form, sk.form) else 0
            _items(b, k, sq, sk, outer, batch[-1], Sq, D, sk_seen, Dv, masks, t.psum_banks - tps)
        return
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
    o0 = _pt_bytes(KB // 128, pdt) // 4        # fp32 column of the output behind the P^T
    if _o_shares_bank(pdt, Dv, b.target):
        O = [[_Cols(S[u][j], o0, qr, Dv) for j, (_, qr) in enumerate(blocks)] for u in range(nu)]
    else:
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


def _items(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, outer, n: int, Sq: int, D: int, kw: int,
           Dv: int, masks: dict | None, psum_free: int) -> None:
    """Batch items (the innermost batch axis) that are one step each (all queries in one group,
    all keys in one block), software-pipelined ``U`` items deep: item t+U-1's early stage (loads,
    products, row max, exp) is issued before item t's late stage (P^T, second products,
    normalisation), every engine finding work of another item ahead of the one that waits.
    With one key block the softmax needs no running statistics: m = rowmax, P = exp(scale * S -
    scale * m) with its row sum l, out = (P @ V) / l straight from PSUM. Each of the U items in
    flight has its own statistics and probability tiles (item t uses set t % U) and, when
    scores, their transposes and the output fit one PSUM bank together, one bank per query
    block; the item loop is unrolled by U."""
    a = k.attrs
    dt, pdt = sq.ref.dtype, a.p_dtype
    blocks = [(aff(j * QB), min(QB, Sq - j * QB)) for j in range(-(-Sq // QB))]
    nd = -(-D // 128)
    # (fp32 transposes here, one copy per 128 keys: measured faster for these short blocks
    # than P's dtype and one copy, GPT-2 1099 against 1133 us)
    o_col = -(-_pt_bytes(-(-kw // 128), F32) // 4)     # fp32 column behind the P^T transposes
    shared = o_col * 4 + Dv * 4 <= b.target.psum_bank_bytes   # scores and output in one bank
    banks = len(blocks) * (1 if shared else 2)
    U = max(2, min(4, n, psum_free // banks))
    diag = [None] * len(blocks)
    if masks is not None:
        for j, (q0, qr) in enumerate(blocks):
            d = _diag_offsets(q0.const, qr, 0, kw, a.causal_offset)
            diag[j] = masks[d] if d is not None else None
    # a row with no visible key (its sum is 0) exists only under a score expression or a
    # causal offset that hides key 0 from the first queries
    clamp = a.safe and (a.score is not None or a.causal_offset < 0)
    b.note(f"attention: one query group and one key block per item; {n} items software-pipelined "
           f"{U} deep, scores and output {'in one PSUM bank' if shared else 'in two banks'} per block")
    sets = []
    for u in range(U):
        S = [b.tile(f"s{j}_{u}", Memory.PSUM, 128, KB, F32) for j in range(len(blocks))]
        O = [_Cols(S[j], o_col, qr, Dv) if shared else b.tile(f"op{j}_{u}", Memory.PSUM, qr, Dv, F32)
             for j, (_, qr) in enumerate(blocks)]
        P = [b.tile(f"p{j}_{u}", Memory.SBUF, qr, KB, pdt) for j, (_, qr) in enumerate(blocks)]
        L = [b.tile(f"l{j}_{u}", Memory.SBUF, qr, 1, F32) for j, (_, qr) in enumerate(blocks)]
        sets.append((S, O, P, L))

    def early(item: Affine, u: int) -> None:
        bidx = outer + (item,)
        S, O, P, L = sets[u]
        qts = []
        for j, (q0, qr) in enumerate(blocks):
            qt = b.tile(f"qt{j}", Memory.SBUF, min(D, 128), nd * qr, dt, 2)
            for d0, dw in b.tiled(D, 128, "d"):
                sq.load(b, qt, d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)
            qts.append((qt,))
        kt = _load_k(b, sk, bidx, aff(0), kw, D, dt)
        _qk(b, qts, blocks, kt, S, kw, D)
        for j, (q0, qr) in enumerate(blocks):
            src, act_scale = S[j].ap(qr, dims=((1, kw),)), a.scale
            if a.score is not None:
                src = _score_tile(b, k, S[j], bidx, q0, qr, aff(0), kw)
                act_scale = 1.0
            if diag[j] is not None:
                sc = b.tile("cm", Memory.SBUF, qr, kw, F32).ap()
                b.tensor_tensor(sc, src, diag[j].ap(qr, dims=((1, kw),)), AluOp.ADD)
                src = sc
            mb = b.tile("mb", Memory.SBUF, qr, 1, F32).ap()
            b.tensor_reduce(mb, src, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
            nm = b.tile("nm", Memory.SBUF, qr, 1, F32).ap()
            if clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
                b.tensor_scalar(nm, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                                LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY,
                                operand1=-act_scale)
            else:
                b.tensor_scalar(nm, mb, AluOp.MULTIPLY, -act_scale)
            b.activation(P[j].ap(qr, dims=((1, kw),)), src, ActFunc.EXP, scale=act_scale, bias_ap=nm,
                         reduce=AluOp.ADD, accum=L[j].ap())

    def late(item: Affine, u: int) -> None:
        bidx = outer + (item,)
        S, O, P, L = sets[u]
        vt = _load_v(b, k.ins[2], bidx, aff(0), kw, Dv)
        nsub = -(-kw // 128)
        pts = [_transpose_block(b, k, S[j], P[j].ap(qr, dims=((1, kw),)), qr, kw, nsub, F32)
               for j, (q0, qr) in enumerate(blocks)]
        for j, (q0, qr) in enumerate(blocks):
            for s0, sw in b.tiled(kw, 128, "pv"):
                sub = s0 // 128
                b.matmul(O[j].ap(), _cols(pts[j], sub * qr, qr, sw), _v_rows(vt, sub, s0, sw, Dv),
                         start_when=(s0,))
        for j, (q0, qr) in enumerate(blocks):
            den = L[j].ap()
            if clamp:
                d = b.tile("den", Memory.SBUF, qr, 1, F32).ap()
                b.tensor_scalar(d, den, AluOp.MAX, TINY)
                den = d
            rl = b.tile("rl", Memory.SBUF, qr, 1, F32).ap()
            b.activation(rl, den, ActFunc.RECIPROCAL)
            _store(b, k, bidx, q0, qr, Dv, O[j].ap(), rl)

    for t in range(min(U - 1, n)):
        early(aff(t), t)
    Lp = (n - U + 1) // U if n >= U else 0
    if Lp:
        with b.loop(Lp, "it") as i:
            for r in range(U):
                early(U * i + r + U - 1, (r + U - 1) % U)
                late(U * i + r, r)
    for t in range(U * Lp, n):               # the rest, unrolled
        if t + U - 1 < n:
            early(aff(t + U - 1), (t + U - 1) % U)
        late(aff(t), t % U)


def _only_casts(e: Expr) -> bool:
    """The epilogue is ACC under casts to wider-or-final types: rounding once to the output
    dtype gives the same values."""
    while e.op is EOp.CAST:
        if not e.dtype.is_float or (e.args[0].op is EOp.CAST
                                    and e.args[0].dtype.itemsize < e.dtype.itemsize):
            return False
        e = e.args[0]
    return e.op is EOp.ACC


def _store(b: TirBuilder, k: KOp, bidx, q0: Affine, qr: int, Dv: int, o: TAP, rl: TAP) -> None:
    """out rows [q0, q0 + qr) = epilogue(o * rl), o the unnormalised output in PSUM."""
    a, out = k.attrs, k.outs[0]
    dst = hbm_ap(out.buffer, out.dtype, _boff(out, bidx) + q0 * out.strides[-2], qr,
                 out.strides[-2], ((Dv, out.strides[-1]),))
    target = b.resident_view(dst, qr)
    if _only_casts(a.epilogue):      # normalise and round in one instruction
        w = target if target is not None else b.tile("w", Memory.SBUF, qr, Dv, out.dtype).ap()
        b.tensor_scalar(w, o, AluOp.MULTIPLY, rl)
        if target is None:
            b.dma(dst, w)
        return
    on = b.tile("on", Memory.SBUF, qr, Dv, F32).ap()
    b.tensor_scalar(on, o, AluOp.MULTIPLY, rl)
    gen = ExprGen(b, qr, (Dv,), lambda x: on)
    if target is not None:
        gen.tile_of(a.epilogue, out.dtype, out=target)
        return
    b.dma(dst, gen.tile_of(a.epilogue, out.dtype))


class _Cols:
    """Columns ``[c0, c0 + n)`` of a PSUM tile, used where a tile is expected (``.ap()``)."""

    def __init__(self, tile, c0: int, partitions: int, n: int):
        self.tile, self.c0, self.p, self.n = tile, c0, partitions, n

    def ap(self, *args, **kw) -> TAP:
        return _cols(self.tile.ap(), self.c0, self.n, self.p)


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


def _load_k(b: TirBuilder, sk: _Side, bidx, k0: Affine, kw: int, D: int, dt: DType):
    """K^T [D, kw] of one key block."""
    nd = -(-D // 128)
    kt = b.tile("kt", Memory.SBUF, min(D, 128), nd * kw, dt, 2)
    for d0, dw in b.tiled(D, 128, "dk"):
        sk.load(b, kt, d0 // 128 * kw, sk.base(bidx), d0, dw, k0, kw)
    return kt


def _v_rows(vt, sub: Affine, s0: Affine, sw: int, Dv: int) -> TAP:
    """The [sw keys, Dv] operand of the second product for keys s0.. of the block."""
    return _cols(vt.ap(), sub * Dv, Dv, sw)


def _load_v(b: TirBuilder, V, bidx, k0: Affine, kw: int, Dv: int):
    """V [kw keys on partitions in 128-row pieces, Dv] of one key block. (Reading a resident
    V in place, as the matmul operand, measured slower on GPT-2 than this copy: 1170 vs 1100 us.)"""
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


def _o_shares_bank(pdt: DType, Dv: int, t) -> bool:
    """A key block's P^T transposes and the [128, Dv] fp32 output of its second product fit
    its score bank together (then a query block needs one bank per parity, not two)."""
    return _pt_bytes(KB // 128, pdt) + Dv * 4 <= t.psum_bank_bytes


def _pt_bytes(nsub: int, pdt: DType) -> int:
    """PSUM bytes per partition the P^T transposes of a key block take at the start of its score
    bank (TensorE transposes write the probabilities' own dtype, exactly)."""
    return nsub * QB * pdt.itemsize


def _transpose_block(b: TirBuilder, k: KOp, s, p: TAP, qr: int, kw: int, nsub: int,
                     tdt: DType | None = None) -> TAP:
    """P^T [keys, qr] per 128 keys, through the (now free) score bank into SBUF: the transposes
    write ``tdt`` (default: P's dtype) into the bank, one copy takes them all out when every
    piece has 128 keys."""
    pdt = k.attrs.p_dtype
    tdt = tdt or pdt
    pt = b.tile("pt", Memory.SBUF, min(kw, 128), nsub * qr, pdt).ap()
    bank = s.ap()
    whole = replace(bank, dims=((1, nsub * qr),), partitions=min(kw, 128), dtype=tdt)
    for s0, sw in b.tiled(kw, 128, "ts"):
        tp = replace(bank, offset=bank.offset + aff(s0 // 128 * qr) * tdt.itemsize, dims=((1, qr),),
                     partitions=sw, dtype=tdt)
        b.transpose(tp, _cols(p, s0, sw))
        if kw % 128 or tdt is not pdt:
            # PSUM -> SBUF: VectorE's 2x copy mode or ScalarE (GpSimdE copies at 1x)
            b.tensor_copy(_cols(pt, s0 // 128 * qr, qr, sw), tp, engines=(EngineKind.VECTOR, EngineKind.SCALAR))
    if not kw % 128 and tdt is pdt:
        b.tensor_copy(pt, whole, engines=(EngineKind.VECTOR, EngineKind.SCALAR))
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
