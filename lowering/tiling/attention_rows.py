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
    m = max_c rowmax(scale * S_c)            VectorE/GpSimdE: one reduce per bank, one across
    P_c = exp(scale * S_c - m), l_c = sum    ScalarE, one activation per bank
    P^T_c = transpose(P_c) per 128 keys      TensorE -> bank (u, c) (the exp has read it) -> SBUF
    O = sum_c P^T_c.T @ V_c                  TensorE, one accumulation group in bank (u, last)
    out = epilogue(O / sum_c l_c)
Query block t+1's products, max and exp are issued before block t's transposes and second
products, so every in-order engine finds the next block's early work ahead of the one that
waits (as ``_items`` does for one-block heads).

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
from lowering.tiling.attention_steps import (F32, KB, LOWEST, QB, TINY, _Cols, _cols, _load_k,
                                             _load_v, _o_shares_bank, _pt_bytes, _score_tile,
                                             _store, _transpose_block, _v_rows)
from lowering.tiling.matmul import _Side
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder
from runtime_sim.isa import ActFunc, AluOp, EngineKind, Memory

MAX_KEY_BLOCKS = 4


def rows_fits(k: KOp, Sq: int, Sk: int, Dv: int, t, tp_banks: int) -> bool:
    """Whether the two-phase form applies: unmasked, more than one key block and at most as
    many as two parities of score banks (plus an output bank each unless it shares the last
    score bank) leave in PSUM, and more than one query block per head to pipeline."""
    a = k.attrs
    nk = -(-Sk // KB)
    per = nk + (0 if _o_shares_bank(a.p_dtype, Dv, t) else 1)
    return (not a.causal and 1 < nk <= MAX_KEY_BLOCKS and Sq > QB
            and 2 * per + tp_banks <= t.psum_banks)


def tile_rows(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, outer: tuple[Affine, ...], nh: int,
              Sq: int, D: int, Sk: int, Dv: int) -> None:
    """Every batch item of the innermost batch axis (``nh`` of them, inside the loops ``outer``;
    one when the attention has no batch axes: its index then meets no stride) as one pipeline
    of query blocks: K^T and V of
    item h in set h % 2, loaded (with item h+1's first query block's products, max and exp)
    while item h-1's last query block finishes, so no item boundary drains the engines. The
    item loop is unrolled by two (the K/V sets alternate)."""
    a = k.attrs
    dt, pdt = sq.ref.dtype, a.p_dtype
    V = k.ins[2]
    nd = -(-D // 128)
    kbs = [(i * KB, min(KB, Sk - i * KB)) for i in range(-(-Sk // KB))]
    nk = len(kbs)
    shares = _o_shares_bank(pdt, Dv, b.target)
    clamp = a.safe and a.score is not None
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

    def load_kv(h: Affine, w: int, k: bool = True, v: bool = True) -> None:
        bidx = outer + (h,)
        kts, vts = kv[w]
        for c, (k0, kw) in enumerate(kbs if k else ()):
            _load_k(b, sk, bidx, aff(k0), kw, D, dt, kts[c])
        for c, (k0, kw) in enumerate(kbs if v else ()):
            _load_v(b, V, bidx, aff(k0), kw, Dv, vts[c])

    def load_q(h: Affine, t: int, u: int) -> None:
        bidx = outer + (h,)
        q0, qr = blocks[t]
        for d0, dw in b.tiled(D, 128, "d"):
            sq.load(b, sets[u][4]["qt"], d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)

    def early(h: Affine, w: int, t: int, u: int, loaded: bool = False) -> None:
        bidx = outer + (h,)
        kts = kv[w][0]
        q0, qr = blocks[t]
        S, O, P, L, tmp = sets[u]
        qt = tmp["qt"]
        if not loaded:
            load_q(h, t, u)
        for c, (k0, kw) in enumerate(kbs):
            for d0, dw in b.tiled(D, 128, "dm"):
                b.matmul(S[c].ap(qr, dims=((1, kw),)), qt.ap(dw, elem_offset=d0 // 128 * qr, dims=((1, qr),)),
                         kts[c].ap(dw, elem_offset=d0 // 128 * kw, dims=((1, kw),)), start_when=(d0,))
        mb = tmp["mb"].ap(qr)
        srcs = []
        for c, (k0, kw) in enumerate(kbs):
            src, act_scale = S[c].ap(qr, dims=((1, kw),)), a.scale
            if a.score is not None:
                src = _score_tile(b, k, S[c], bidx, q0, qr, aff(k0), kw)
                act_scale = 1.0
            srcs.append((src, act_scale))
            # alternate VectorE / GpSimdE: the max is on the path to every exp of the block
            b.tensor_reduce(_cols(mb, c, 1), src, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                            engines=(EngineKind.VECTOR if c % 2 == 0 else EngineKind.GPSIMD,))
        act_scale = srcs[0][1]
        m = tmp["m"].ap(qr)
        b.tensor_reduce(m, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
        nm = tmp["nm"].ap(qr)
        if clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
            b.tensor_scalar(nm, m, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                            LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY, operand1=-act_scale)
        else:
            b.tensor_scalar(nm, m, AluOp.MULTIPLY, -act_scale)
        for c, (k0, kw) in enumerate(kbs):
            src, sc = srcs[c]
            b.activation(P[c].ap(qr, dims=((1, kw),)), src, ActFunc.EXP, scale=sc, bias_ap=nm,
                         reduce=AluOp.ADD, accum=_cols(L.ap(qr), c, 1))

    def late(h: Affine, w: int, t: int, u: int) -> None:
        bidx = outer + (h,)
        vts = kv[w][1]
        q0, qr = blocks[t]
        S, O, P, L, tmp = sets[u]
        # 1 / sum first, on GpSimdE (ScalarE's queue holds the next block's exps: a reciprocal
        # there would wait for them, and the last score bank for this block's output read)
        den = tmp["den"].ap(qr)
        b.tensor_reduce(den, L.ap(qr), AluOp.ADD, engines=(EngineKind.GPSIMD,))
        if clamp:
            b.tensor_scalar(den, den, AluOp.MAX, TINY, engines=(EngineKind.GPSIMD,))
        rl = tmp["rl"].ap(qr)
        b.tensor_scalar(rl, den, AluOp.DIVIDE, 1.0, reverse0=True, engines=(EngineKind.GPSIMD,))
        pts = [_transpose_block(b, k, S[c], P[c].ap(qr, dims=((1, kw),)), qr, kw, -(-kw // 128),
                                pt=tmp["pt"][c]) for c, (k0, kw) in enumerate(kbs)]
        for c, (k0, kw) in enumerate(kbs):
            for s0, sw in b.tiled(kw, 128, "pv"):
                sub = s0 // 128
                b.matmul(O.ap(qr), _cols(pts[c], sub * qr, qr, sw), _v_rows(vts[c], sub, s0, sw, Dv),
                         start_when=(s0 + k0,))
        _store(b, k, bidx, q0, qr, Dv, O.ap(qr), rl, tmp["w"])

    def item(h: Affine, hh: int, last: bool) -> None:
        """Item h (its K/V in set hh): every query block's late stage, each after the next
        block's early stage (the next item's first, with its K/V loads, unless ``last``)."""
        for t in range(T):
            u = (hh * T + t) % 2
            if t + 1 < T:
                early(h, hh, t + 1, (u + 1) % 2)
            elif not last:
                load_kv(h + 1, 1 - hh)
                early(h + 1, 1 - hh, 0, (u + 1) % 2)
            late(h, hh, t, u)

    # the first products wait for the first Q^T and the K^T blocks only: those loads go first
    load_q(aff(0), 0, 0)
    load_kv(aff(0), 0, v=False)
    early(aff(0), 0, 0, 0, loaded=True)
    load_kv(aff(0), 0, k=False)
    pairs = (nh - 1) // 2            # loop iterations: items 2i, 2i+1, each followed by another
    if pairs:
        with b.single_slot_loop(pairs, "h") as i:
            item(2 * i, 0, False)
            item(2 * i + 1, 1, False)
    for h in range(2 * pairs, nh):   # the rest, unrolled (the last one starts no successor)
        item(aff(h), h % 2, h == nh - 1)
