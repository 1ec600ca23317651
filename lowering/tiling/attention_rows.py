"""Attention whose whole score row fits PSUM: an exact two-phase softmax per query block, no
running statistics (tiling/attention.py dispatches here).

When every key of a query block fits the score banks of one parity (``Sk <= 4 * 512`` keys in
four [128, 512] fp32 banks), a query block needs no online softmax: its scores stay in PSUM
while the row max is taken over all of them, so there is no rescale of the accumulator, no
exp factor and no statistics update per key block (the online form's [128, 1] and [128, Dv]
instructions per key block; at [8, 2048, 128] they were most of VectorE/GpSimdE's time and
sat on the critical path). Per batch index (a loop), K^T and V of every key block are loaded
once and stay in SBUF for all the query blocks; per query block t (parity u = t % 2, banks of
the two parities alternate):
    S_c = Q_t^T.T @ K^T_c                    TensorE -> PSUM bank (u, c), for every key block c
    m = max_c rowmax(scale * S_c)            VectorE/GpSimdE (``max_engines``): one reduce per
                                             bank, one across
    P_c = exp(scale * S_c - m), l_c = sum    ScalarE, one activation per bank
    P^T_c = transpose(P_c) per 128 keys      TensorE -> bank (u, c) (the exp has read it) -> SBUF
    O = sum_c P^T_c.T @ V_c                  TensorE, one accumulation group in bank (u, last)
    out = epilogue(O / sum_c l_c)
Query block t+1's products and row max are issued before block t's transposes, its exps after
them (so block t's PSUM -> SBUF copies of P^T never queue behind them on ScalarE/VectorE), then
block t's second products: every in-order engine finds the next block's early work ahead of the
one that waits (as ``_items`` does for one-block heads). With TensorE's background transposes
(NC-v4) block t's transposes sit between block t+1's products, where the background lane runs
them; with VectorE's fast exponential (NC-v4) some key blocks' exps run there (``exp_plan``).
Causal (``masks``): a query block takes the key blocks its last row sees only, the last one cut
at that row's diagonal, and the diagonal's bf16 mask goes into the scores on TensorE.

Invariants
- Every transpose of a block precedes its first second product: the output shares the last
  score bank behind the P^T pieces, and a transpose into a bank would close an accumulation
  group open there.
- PSUM: two parities x ``NK`` banks, one slot each (``rows_fits`` checks the budget).
- A row whose every score is -inf (only under a score expression) ends as 0 with ``safe``
  (m clamped to the lowest finite value, l to the smallest normal) or NaN, as eager.
"""
from __future__ import annotations

from lowering.kir import KOp
from lowering.tiling.attention_plan import cheapest_engine, dma_transposes, exp_plan, max_engines
from lowering.tiling.attention_steps import (F32, KB, LOWEST, QB, TINY, _Cols, _cols, _diag_offsets,
                                             _load_k, _load_v, _o_shares_bank, _pt_bytes, _score_tile,
                                             _store, _transpose_block, _v_rows)
from lowering.tiling.matmul import _Side
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import ELEMENTWISE, TirBuilder
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

MAX_KEY_BLOCKS = 4


def rows_fits(k: KOp, Sq: int, Sk: int, Dv: int, t, tp_banks: int) -> bool:
    """Whether the two-phase form applies: unmasked, more than one key block and at most as
    many as two parities of score banks (plus an output bank each unless it shares the last
    score bank) leave in PSUM, and more than one query block per head to pipeline."""
    a = k.attrs
    nk = -(-_seen(k, Sq, Sk) // KB)
    per = nk + (0 if _o_shares_bank(a.p_dtype, Dv, t) else 1)
    causal_ok = not a.causal or (a.causal_offset >= 0 and a.score is None)
    return (causal_ok and 1 < nk <= MAX_KEY_BLOCKS and Sq > QB
            and 2 * per + tp_banks <= t.psum_banks)


def _seen(k: KOp, Sq: int, Sk: int) -> int:
    """Keys any query sees (causal: up to the last query's diagonal)."""
    return min(Sk, Sq + k.attrs.causal_offset) if k.attrs.causal else Sk


def tile_rows(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, outer: tuple[Affine, ...], nh: int,
              Sq: int, D: int, Sk: int, Dv: int, masks: dict | None = None) -> None:
    """Every batch item of the innermost batch axis (``nh`` of them, inside the loops ``outer``;
    one when the attention has no batch axes: its index then meets no stride) as one pipeline
    of query blocks: K^T and V of
    item h in set h % 2, loaded (with item h+1's first query block's products, max and exp)
    while item h-1's last query block finishes, so no item boundary drains the engines. The
    item loop is unrolled by two (the K/V sets alternate). Causal (``masks``: the additive
    diagonal masks by offset): query block t takes only the key blocks its last row sees, the
    last one cut at that row's diagonal, and adds the mask of its offset to the block that
    crosses the diagonal before the max (every row sees at least one key: causal_offset >= 0)."""
    a = k.attrs
    dt, pdt = sq.ref.dtype, a.p_dtype
    V = k.ins[2]
    nd = -(-D // 128)
    Skv = _seen(k, Sq, Sk)
    kbs = tuple((i * KB, min(KB, Skv - i * KB)) for i in range(-(-Skv // KB)))
    nk = len(kbs)
    shares = _o_shares_bank(pdt, Dv, b.target)
    clamp = a.safe and a.score is not None
    # key blocks whose exp runs on VectorE's fast exponential (NC-v4); it has no scale operand,
    # so then K^T carries the scale
    nv, na = exp_plan(b.target, kbs, D, Dv, dt, pdt) if a.score is None else (0, 0)
    vexp = set(range(nv))
    dma_t = dma_transposes(b.target, kbs, D, Dv, dt, pdt, nv, na)
    if dma_t:
        b.note("attention: TensorE is the busiest engine of a query block: the first key block's "
               "P^T by DMA transposes (SBUF -> SBUF) in the query blocks that see every key block")
    if nv:
        b.note(f"attention: exps of key blocks 0..{nv - 1} of {nk} on VectorE's fast exponential "
               f"(K^T scaled by {a.scale:g} on load), P^T copies of blocks 0..{na - 1} on ScalarE; "
               "chosen by the cost model")
    prescale = bool(vexp) and a.scale != 1.0
    if prescale:   # the K^T scale on the engine the cost table prices cheapest for it
        scale_engine = cheapest_engine(b.target, lambda s, e: s.tensor_scalar(
            s.tile("k", Memory.SBUF, min(D, 128), nd * KB, dt, 1).ap(),
            s.tile("k2", Memory.SBUF, min(D, 128), nd * KB, dt, 1).ap(), AluOp.MULTIPLY, a.scale,
            engines=(e,)), ELEMENTWISE)
    interleave = b.target.background_transpose
    # (the output behind the last block's P^T pieces)
    o_col = _pt_bytes(-(-kbs[-1][1] // 128), pdt) // 4
    sets = []
    for u in range(2):
        S = [b.tile(f"rs{c}_{u}", Memory.PSUM, 128, KB, F32, 1) for c in range(nk)]
        O = (_Cols(S[-1], o_col, QB, Dv) if shares else b.tile(f"ro_{u}", Memory.PSUM, QB, Dv, F32, 1))
        P = [b.tile(f"rp{c}_{u}", Memory.SBUF, QB, KB, pdt, 1) for c in range(nk)]
        L = b.tile(f"rl_{u}", Memory.SBUF, QB, nk, F32, 1)
        # per parity also the query block's Q^T, statistics, P^T and output staging: a tile per
        # query block would leave the planner only short lifetimes to share bytes by, and every
        # sharing is a wait on another block's instructions
        tmp = {"qt": b.tile(f"rqt_{u}", Memory.SBUF, min(D, 128), nd * QB, dt, 1),
               "mb": b.tile(f"rmb_{u}", Memory.SBUF, QB, nk, F32, 1),
               "m": b.tile(f"rm_{u}", Memory.SBUF, QB, 1, F32, 1),
               "nm": b.tile(f"rnm_{u}", Memory.SBUF, QB, 1, F32, 1),
               "den": b.tile(f"rden_{u}", Memory.SBUF, QB, 1, F32, 1),
               "rl": b.tile(f"rrl_{u}", Memory.SBUF, QB, 1, F32, 1),
               "pt": [b.tile(f"rpt{c}_{u}", Memory.SBUF, min(kw, 128), -(-kw // 128) * QB, pdt, 1)
                      for c, (_, kw) in enumerate(kbs)],
               "w": b.tile(f"rw_{u}", Memory.SBUF, QB, Dv, k.outs[0].dtype, 1)}
        sets.append((S, O, P, L, tmp))
    kv = [([b.tile(f"rk{c}_{w}", Memory.SBUF, min(D, 128), nd * kw, dt, 1) for c, (_, kw) in enumerate(kbs)],
           [b.tile(f"rv{c}_{w}", Memory.SBUF, min(kw, 128), -(-kw // 128) * Dv, V.dtype, 1)
            for c, (_, kw) in enumerate(kbs)]) for w in range(2)]
    blocks = [(aff(q0), min(QB, Sq - q0)) for q0 in range(0, Sq, QB)]
    T = len(blocks)

    def visible(t: int) -> list[tuple[int, int, int, int | None]]:
        """(c, k0, kw, diagonal offset or None) of the key blocks query block t sees."""
        if masks is None:
            return [(c, k0, kw, None) for c, (k0, kw) in enumerate(kbs)]
        q0, qr = blocks[t][0].const, blocks[t][1]
        end = min(Skv, q0 + qr + a.causal_offset)
        out = []
        for c, (k0, kw) in enumerate(kbs):
            if k0 < end:
                kw = min(kw, end - k0)
                out.append((c, k0, kw, _diag_offsets(q0, qr, k0, kw, a.causal_offset)))
        return out
    if masks is not None:      # the bf16 masks go into the scores on TensorE: S += I^T @ mask
        ident = b.tile("rident", Memory.SBUF, QB, QB, DType.BF16)
        b.iota(ident.ap(), 0, -1, (1,))                              # c - p
        b.tensor_scalar(ident.ap(), ident.ap(), AluOp.IS_EQUAL, 0.0, engines=(EngineKind.GPSIMD,))

    def maxes_of(t: int) -> tuple[EngineKind, ...]:
        """The row-max engines of query block t (``max_engines``)."""
        pv = visible((t - 1) % T)
        prev = tuple(kw for c, _, kw, _ in pv if c not in by_dma(pv))
        return max_engines(b.target, prev, tuple(kw for _, _, kw, _ in visible(t)), D, Dv, dt,
                           pdt, EngineKind.SCALAR if na else EngineKind.VECTOR, nv)

    def by_dma(vis) -> set[int]:
        """The key blocks whose P^T a query block seeing ``vis`` takes by DMA transposes."""
        return {0} if dma_t and len(vis) == nk else set()

    def load_kv(h: Affine, w: int, k: bool = True, v: bool = True) -> None:
        bidx = outer + (h,)
        kts, vts = kv[w]
        for c, (k0, kw) in enumerate(kbs if k else ()):
            _load_k(b, sk, bidx, aff(k0), kw, D, dt, kts[c])
            if prescale:
                ka = kts[c].ap(min(D, 128), dims=((1, nd * kw),))
                b.tensor_scalar(ka, ka, AluOp.MULTIPLY, a.scale, engines=(scale_engine,))
        for c, (k0, kw) in enumerate(kbs if v else ()):
            _load_v(b, V, bidx, aff(k0), kw, Dv, vts[c])

    def load_q(h: Affine, t: int, u: int) -> None:
        bidx = outer + (h,)
        q0, qr = blocks[t]
        for d0, dw in b.tiled(D, 128, "d"):
            sq.load(b, sets[u][4]["qt"], d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)

    def early(h: Affine, w: int, t: int, u: int, nxt=None, between=None):
        """Query block t's products, row max and statistics; ``between(c)`` is called after
        key block c's product (the previous block's transposes, to run beside it). Returns the
        exps as a callable: the caller issues them after the previous block's transposes, whose
        PSUM -> SBUF copies would otherwise queue behind them on ScalarE/VectorE."""
        bidx = outer + (h,)
        kts = kv[w][0]
        q0, qr = blocks[t]
        S, O, P, L, tmp = sets[u]
        qt = tmp["qt"]
        mb = tmp["mb"].ap(qr)
        srcs = {}
        vis = visible(t)
        max_eng = maxes_of(t)
        for c, k0, kw, diag in vis:
            for d0, dw in b.tiled(D, 128, "dm"):
                b.matmul(S[c].ap(qr, dims=((1, kw),)), qt.ap(dw, elem_offset=d0 // 128 * qr, dims=((1, qr),)),
                         kts[c].ap(dw, elem_offset=d0 // 128 * kw, dims=((1, kw),)), start_when=(d0,))
            if diag is not None:    # hidden keys: columns from 1 - diag on
                c0 = max(0, 1 - diag)
                b.matmul(_cols(S[c].ap(qr), c0, kw - c0, qr), ident.ap(QB, dims=((1, qr),)),
                         _cols(masks[diag].ap(QB), c0, kw - c0, QB), start_when=(1,))
            if between is not None:
                between(c)
            if c == 0 and nxt is not None:
                # the next block's Q^T, a block ahead: its queue never holds it behind
                # transfers that wait for this block's exps
                load_q(nxt[0], nxt[1], 1 - u)
            src, act_scale = S[c].ap(qr, dims=((1, kw),)), (1.0 if prescale else a.scale)
            if a.score is not None:
                src = _score_tile(b, k, S[c], bidx, q0, qr, aff(k0), kw)
                act_scale = 1.0
            srcs[c] = (src, act_scale)
            # alternate VectorE / GpSimdE: the max is on the path to every exp of the block
            b.tensor_reduce(_cols(mb, c, 1), src, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                            engines=(max_eng[c],))
        act_scale = srcs[0][1]
        mb = _cols(mb, 0, len(vis))
        m = tmp["m"].ap(qr)
        nm = tmp["nm"].ap(qr)
        if vexp:
            # m for VectorE's exponential (it subtracts), -m for ScalarE's bias: side by side
            b.tensor_reduce(m, mb, AluOp.MAX, engines=(EngineKind.GPSIMD,))
            b.tensor_reduce(nm, mb, AluOp.MAX, negate=True, engines=(EngineKind.GPSIMD,))
        else:
            b.tensor_reduce(m, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
        if vexp:
            pass
        elif clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
            b.tensor_scalar(nm, m, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                            LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY, operand1=-act_scale)
        else:
            b.tensor_scalar(nm, m, AluOp.MULTIPLY, -act_scale)

        dmat = by_dma(vis)

        def exps() -> None:
            for c, k0, kw, _ in vis:
                src, sc = srcs[c]
                if c in vexp:
                    b.exponential(P[c].ap(qr, dims=((1, kw),)), src, m, accum=_cols(L.ap(qr), c, 1))
                else:
                    b.activation(P[c].ap(qr, dims=((1, kw),)), src, ActFunc.EXP, scale=sc, bias_ap=nm,
                                 reduce=AluOp.ADD, accum=_cols(L.ap(qr), c, 1))
                if c in dmat:   # P^T by DMA transposes: a block period ahead of its use
                    pt = tmp["pt"][c]
                    for s0 in range(0, kw, 128):   # unrolled: one queue each
                        sw = min(128, kw - s0)
                        b.dma(_cols(pt.ap(), s0 // 128 * qr, qr, sw),
                              _cols(P[c].ap(qr, dims=((1, kw),)), s0, sw), transpose=True)
        return exps

    def late(h: Affine, w: int, t: int, u: int):
        """Query block t's transposes (``tp(c)`` per key block) and the rest (``rest()``:
        1 / sum, second products, store), for the caller to place."""
        bidx = outer + (h,)
        vts = kv[w][1]
        q0, qr = blocks[t]
        S, O, P, L, tmp = sets[u]
        pts: list = [None] * nk
        vis = visible(t)
        width = {c: kw for c, _, kw, _ in vis}
        dmat = by_dma(vis)

        def tp(c: int) -> None:
            if c not in width or pts[c] is not None:
                return
            kw = width[c]
            if c in dmat:        # by DMA, issued with the exps
                pts[c] = tmp["pt"][c].ap(min(kw, 128), dims=((1, -(-kw // 128) * qr),))
                return
            eng = ((EngineKind.VECTOR, EngineKind.SCALAR) if not vexp else
                   (EngineKind.SCALAR,) if c < na else (EngineKind.VECTOR,))
            pts[c] = _transpose_block(b, k, S[c], P[c].ap(qr, dims=((1, kw),)), qr, kw,
                                      -(-kw // 128), pt=tmp["pt"][c], engines=eng)

        def rest() -> None:
            # 1 / sum on GpSimdE (ScalarE's queue holds the next block's exps: a reciprocal
            # there would wait for them, and the last score bank for this block's output read)
            den = tmp["den"].ap(qr)
            b.tensor_reduce(den, _cols(L.ap(qr), 0, len(vis)), AluOp.ADD, engines=(EngineKind.GPSIMD,))
            if clamp:
                b.tensor_scalar(den, den, AluOp.MAX, TINY, engines=(EngineKind.GPSIMD,))
            rl = tmp["rl"].ap(qr)
            b.tensor_scalar(rl, den, AluOp.DIVIDE, 1.0, reverse0=True, engines=(EngineKind.GPSIMD,))
            for c, k0, kw, _ in vis:
                for s0, sw in b.tiled(kw, 128, "pv"):
                    sub = s0 // 128
                    b.matmul(O.ap(qr), _cols(pts[c], sub * qr, qr, sw), _v_rows(vts[c], sub, s0, sw, Dv),
                             start_when=(s0 + k0,))
            _store(b, k, bidx, q0, qr, Dv, O.ap(qr), rl, tmp["w"])
        return tp, rest

    def item(h: Affine, hh: int, last: bool) -> None:
        """Item h (its K/V in set hh): every query block's late stage, each after the next
        block's early stage (the next item's first, with its K/V loads, unless ``last``)."""
        for t in range(T):
            u = (hh * T + t) % 2
            tp, rest = late(h, hh, t, u)
            # with background transposes, block t's transposes run beside block t+1's products
            between = tp if interleave else None
            exps = None
            if t + 1 < T:
                nxt = (h, t + 2) if t + 2 < T else None if last else (h + 1, 0)
                exps = early(h, hh, t + 1, (u + 1) % 2, nxt, between=between)
            elif not last:
                load_kv(h + 1, 1 - hh)
                exps = early(h + 1, 1 - hh, 0, (u + 1) % 2, (h + 1, 1), between=between)
            else:
                between = None
            for c in range(nk):     # (those no product of the next block ran beside)
                tp(c)
            if exps is not None:
                exps()
            rest()

    # the first products wait for the first Q^T and the K^T blocks only: those loads go first
    load_q(aff(0), 0, 0)
    load_kv(aff(0), 0, v=False)
    early(aff(0), 0, 0, 0, (aff(0), 1))()
    load_kv(aff(0), 0, k=False)
    pairs = (nh - 1) // 2            # loop iterations: items 2i, 2i+1, each followed by another
    if pairs:
        with b.single_slot_loop(pairs, "h") as i:
            item(2 * i, 0, False)
            item(2 * i + 1, 1, False)
    for h in range(2 * pairs, nh):   # the rest, unrolled (the last one starts no successor)
        item(aff(h), h % 2, h == nh - 1)
