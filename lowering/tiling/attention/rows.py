"""Attention whose whole score row fits PSUM: an exact two-phase softmax per query block, no
running statistics (tiling/attention/kernel.py dispatches here).

When every key of a query block fits the score banks of one parity (``Sk <= 4 * 512`` keys in
four [128, 512] fp32 banks), a query block needs no online softmax: its scores stay in PSUM
while the row max is taken over all of them, so there is no rescale of the accumulator, no
exp factor and no statistics update per key block (the online form's [128, 1] and [128, Dv]
instructions per key block; at [8, 2048, 128] they were most of VectorE/GpSimdE's time and
sat on the critical path). Per batch index (a loop), K^T and V of every key block are loaded
once and stay in SBUF for all the query blocks; per query block t (parity u = t % 2, banks of
the two parities alternate):
    S_c = Q_t^T.T @ K^T_c                    TensorE -> PSUM bank (u, c), for every key block c
    m = max_c rowmax(scale * S_c)            VectorE (GpSimdE cannot read PSUM): one reduce per
                                             bank; -scale * m in one ScalarE instruction
    P_c = exp(scale * S_c - m)               ScalarE, one activation per bank (with its row sum
                                             l_c only without the ones column)
    P^T_c = transpose(P_c) per 128 keys      TensorE -> bank (u, c) (the exp has read it) -> SBUF;
                                             on trn2 a unit's first bank, a full key block, by
                                             SBUF -> SBUF DMA transposes (``dma_transposes``)
    [O | l] = sum_c P^T_c.T @ [V_c | 1]      TensorE, one accumulation group in bank (u, last);
                                             the ones column gives the row sum (``_ones_column``,
                                             when ``exp_plan`` takes it)
    out = epilogue(O / l)                    one instruction, dividing by the sum
Query block t+1's products and row max are issued before block t's transposes, its exps after
them (so block t's PSUM -> SBUF copies of P^T never queue behind them on ScalarE/VectorE), then
block t's second products: every in-order engine finds the next block's early work ahead of the
one that waits (as ``_items`` does for one-block heads). With TensorE's background transposes
(NC-v4) block t's transposes sit between block t+1's products, where the background lane runs
them; with VectorE's fast exponential (NC-v4) some key blocks' exps run there (``exp_plan``).
Causal: a query block takes the key blocks its last row sees only, the last one cut at that
row's diagonal, and a bf16 mask goes into the diagonal block's scores on TensorE, over the
(at most 127) columns from its first hidden one: a [128, 128] window tile per distinct offset
of the diagonal inside it, usually one for the whole kernel. The
pipeline's step is a *unit* (``_units``): consecutive query blocks whose key blocks fit one
parity's score banks together (causal rows of one key block go four at a time, of two key
blocks two at a time), each row with its own statistics, in the banks after the previous
row's; a lone short row would leave TensorE idle for the latency of its softmax chain. Odd
batch items take their units in reverse order (long rows end one item and start the next).

Invariants
- Every transpose of a block precedes its first second product: the output shares the last
  score bank behind the P^T pieces, and a transpose into a bank would close an accumulation
  group open there.
- PSUM: two parities x ``NK`` banks, one slot each (``rows_fits`` checks the budget); a unit's
  rows take consecutive banks of its parity, each row's output behind the P^T pieces of its
  last bank (so multi-row units only when the output shares a score bank).
- Every PSUM writer is a TensorE instruction, so a bank's accumulation groups follow TensorE's
  program order: a unit's transposes, then each row's second products in turn.
- A row whose every score is -inf (only under a score expression) ends as 0 with ``safe``
  (m clamped to the lowest finite value, l to the smallest normal) or NaN, as eager.
"""
from __future__ import annotations

from lowering.kir import KOp
from lowering.tiling.attention.plan import (block_busy, dma_transposes, exp_plan, norm_engine,
                                            spare_engine)
from lowering.tiling.attention.steps import (F32, KB, LOWEST, MDT, QB, TINY, _Cols, _cols, _diag_offsets, _half_max,
                                             _load_k, _load_v, _mask_tile, _o_shares_bank,
                                             _pt_bytes, _score_tile, _store, _transpose_block, _v_rows)
from lowering.tiling.matmul.kernel import _Side
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import ELEMENTWISE, TirBuilder
from lowering.tir.pipelined import Stage, pipelined
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

MAX_KEY_BLOCKS = 4
# a row of units (every item's units in its order, items one after another), step t: unit t's
# late stage, the next item's K/V loads placed at unit t, unit t+1's products and row max
# beside unit t's transposes, unit t's remaining transposes, unit t+1's exps, unit t's rest
ROW_STAGES = tuple(Stage(n, lag, same_schedule=False)
                   for n, lag in (("L", 0), ("KV", 0), ("E", -1), ("TP", 0), ("X", -1), ("R", 0)))


def rows_fits(k: KOp, Sq: int, Sk: int, Dv: int, t, tp_banks: int) -> bool:
    """Whether the two-phase form applies: unmasked or causal without a score expression (every
    row sees a key), more than one key block and at most as
    many as two parities of score banks (plus an output bank each unless it shares the last
    score bank) leave in PSUM, and more than one query block per head to pipeline."""
    a = k.attrs
    nk = -(-_seen(k, Sq, Sk) // KB)
    per = nk + (0 if _o_shares_bank(a.p_dtype, Dv, t) else 1)
    causal_ok = not a.causal or (a.causal_offset >= 0 and a.score is None)
    return (causal_ok and 1 < nk <= MAX_KEY_BLOCKS and Sq > QB
            and 2 * per + tp_banks <= t.psum_banks)


def _units(seen: list[int], nk: int, shares: bool) -> list[list[int]]:
    """Consecutive query blocks packed into units that share one parity's ``nk`` score banks
    (the blocks of a unit see ``seen[t]`` key blocks each, at most ``nk`` together): short
    causal rows go through the pipeline together, so a unit's TensorE work covers the latency
    of its softmax chain. One block per unit when the output takes a bank of its own."""
    units: list[list[int]] = []
    for t, n in enumerate(seen):
        if units and shares and sum(seen[x] for x in units[-1]) + n <= nk:
            units[-1].append(t)
        else:
            units.append([t])
    return units


def _bank_widths(kbs, units, visible) -> list[int]:
    """The widest key block any row of any unit puts in each bank."""
    w = [0] * len(kbs)
    for un in units:
        s = 0
        for t in un:
            for _, _, kw, _ in visible(t):
                w[s] = max(w[s], kw)
                s += 1
    return w


def _seen(k: KOp, Sq: int, Sk: int) -> int:
    """Keys any query sees (causal: up to the last query's diagonal)."""
    return min(Sk, Sq + k.attrs.causal_offset) if k.attrs.causal else Sk


def tile_rows(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, outer: tuple[Affine, ...], nh: int,
              Sq: int, D: int, Sk: int, Dv: int, hidden: float) -> None:
    """Every batch item of the innermost batch axis (``nh`` of them, inside the loops ``outer``;
    one when the attention has no batch axes: its index then meets no stride) as one pipeline
    of units of query blocks (``_units``): K^T and V of
    item h in set h % 2, loaded (with item h+1's first unit's products, max and exp)
    while item h-1's last unit finishes, so no item boundary drains the engines. The
    item loop is unrolled by two (the K/V sets alternate). Causal: query block t takes only
    the key blocks its last row sees, the last one cut at that row's diagonal, and adds a bf16
    mask (0 or ``hidden``) to the columns of the block that crosses the diagonal from its first
    hidden one on, before the max (every row sees at least one key: causal_offset >= 0)."""
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
    nv, na, ones = exp_plan(b.target, kbs, D, Dv, dt, pdt, vector=a.score is None)
    vexp = set(range(nv))
    # with ``ones`` the row sums from the second product (V with a column of ones): no exp
    # sums them, which costs ScalarE an initiation interval per exp, and no instruction adds a
    # row's sums up; VectorE's exponential sums for free (both by ``exp_plan``)
    Dw = Dv + 1 if ones else Dv
    if nv:
        b.note(f"attention: exps of key blocks 0..{nv - 1} of {nk} on VectorE's fast exponential "
               f"(K^T scaled by {a.scale:g} on load), P^T copies of blocks 0..{na - 1} on ScalarE; "
               "chosen by the cost model")
    prescale = bool(vexp) and a.scale != 1.0
    if prescale:   # the K^T scale (one key block per unit, see ``item``) where it least
        # lengthens a unit's busiest engine
        busy = block_busy(b.target, kbs, D, Dv, dt, pdt, nv, na, ones, tensor=False, close=True)

        def one_scale(s: TirBuilder, e: EngineKind) -> None:
            x = s.tile("k", Memory.SBUF, min(D, 128), nd * KB, dt, 1).ap()
            s.tensor_scalar(x, x, AluOp.MULTIPLY, a.scale, engines=(e,))
        scale_engine = spare_engine(b.target, busy, one_scale, ELEMENTWISE + (EngineKind.SCALAR,))
    interleave = b.target.background_transpose
    # scores in PSUM: their row maxes by ``_half_max`` (VectorE, then GpSimdE)
    halves = a.score is None
    blocks = [(aff(q0), min(QB, Sq - q0)) for q0 in range(0, Sq, QB)]

    def visible(t: int) -> list[tuple[int, int, int, int | None]]:
        """(c, k0, kw, diagonal offset or None) of the key blocks query block t sees."""
        if not a.causal:
            return [(c, k0, kw, None) for c, (k0, kw) in enumerate(kbs)]
        q0, qr = blocks[t][0].const, blocks[t][1]
        end = min(Skv, q0 + qr + a.causal_offset)
        out = []
        for c, (k0, kw) in enumerate(kbs):
            if k0 < end:
                kw = min(kw, end - k0)
                out.append((c, k0, kw, _diag_offsets(q0, qr, k0, kw, a.causal_offset)))
        return out
    units = _units([len(visible(t)) for t in range(len(blocks))], nk, shares)
    rows = max(len(un) for un in units)
    if rows > 1:
        b.note(f"attention: short causal rows in units of up to {rows} query blocks sharing a "
               f"parity's {nk} score banks ({len(units)} units per item)")
    sets = []
    for u in range(2):
        S = [b.tile(f"rs{c}_{u}", Memory.PSUM, 128, KB, F32, 1) for c in range(nk)]
        P = [b.tile(f"rp{c}_{u}", Memory.SBUF, QB, KB, pdt, 1) for c in range(nk)]
        # per parity and row of a unit also the query block's Q^T, statistics, P^T and output
        # staging: a tile per query block would leave the planner only short lifetimes to share
        # bytes by, and every sharing is a wait on another block's instructions
        tmp = [{"qt": b.tile(f"rqt{j}_{u}", Memory.SBUF, min(D, 128), nd * QB, dt, 1),
                "mb": b.tile(f"rmb{j}_{u}", Memory.SBUF, QB, nk, MDT if halves else F32, 1),
                # per bank the elementwise max of the scores' two halves (``_half_max``)
                "mh": b.tile(f"rmh{j}_{u}", Memory.SBUF, QB, nk * KB // 2, MDT, 1) if halves else None,
                "l": None if ones else b.tile(f"rl{j}_{u}", Memory.SBUF, QB, nk, F32, 1),
                "m": b.tile(f"rm{j}_{u}", Memory.SBUF, QB, 1, F32, 1),
                "nm": b.tile(f"rnm{j}_{u}", Memory.SBUF, QB, 1, F32, 1),
                "den": b.tile(f"rden{j}_{u}", Memory.SBUF, QB, 1, F32, 1),
                "o": None if shares else b.tile(f"ro{j}_{u}", Memory.PSUM, QB, Dw, F32, 1),
                "w": b.tile(f"rw{j}_{u}", Memory.SBUF, QB, Dv, k.outs[0].dtype, 1)}
               for j in range(rows)]
        PT = [b.tile(f"rpt{c}_{u}", Memory.SBUF, min(kw, 128), -(-kw // 128) * QB, pdt, 1)
              for c, kw in enumerate(_bank_widths(kbs, units, visible))]
        sets.append((S, P, PT, tmp))
    kv = [([b.tile(f"rk{c}_{w}", Memory.SBUF, min(D, 128), nd * kw, dt, 1) for c, (_, kw) in enumerate(kbs)],
           [b.tile(f"rv{c}_{w}", Memory.SBUF, min(kw, 128), -(-kw // 128) * Dw, V.dtype, 1)
            for c, (_, kw) in enumerate(kbs)]) for w in range(2)]
    NU = len(units)

    def rows_of(i: int) -> list[tuple[int, int, list]]:
        """(query block, first bank, visible key blocks) of each row of unit i."""
        out, s0 = [], 0
        for t in units[i]:
            vis = visible(t)
            out.append((t, s0, vis))
            s0 += len(vis)
        return out
    if a.causal:      # the bf16 masks go into the scores on TensorE: S += I^T @ mask
        # the columns from a diagonal block's first hidden one, c0 = max(0, 1 - d), on: at most
        # 127 (the last row sees the block's last column), hidden where c0 + x - p + d > 0; one
        # [128, 128] tile per distinct c0 + d = max(d, 1), usually one for every block
        masks = {e: _mask_tile(b, f"rmask{e}", e, QB, DType.BF16, hidden)
                 for e in sorted({max(d, 1) for t in range(len(blocks)) for *_, d in visible(t)
                                  if d is not None})}
        ident = b.tile("rident", Memory.SBUF, QB, QB, DType.BF16)
        b.iota(ident.ap(), 0, -1, (1,))                              # c - p
        b.tensor_scalar(ident.ap(), ident.ap(), AluOp.IS_EQUAL, 0.0, engines=(EngineKind.GPSIMD,))
    # the ones of V, once (V loads skip them): after the masks, which the first products need
    for c, (_, kw) in enumerate(kbs if ones else ()):
        for w in range(2):
            b.memset(kv[w][1][c].ap(min(kw, 128), elem_offset=Dv, dims=((Dw, -(-kw // 128)),)), 1.0)

    def widths(i: int) -> tuple[int, ...]:
        return tuple(kw for _, _, vis in rows_of(i) for _, _, kw, _ in vis)

    def by_dma(i: int) -> set[int]:
        """The banks whose P^T unit i takes by DMA transposes (its first ones)."""
        return set(range(dma_transposes(b.target, widths(i), len(units[i]), D, Dv, dt, pdt, nv, na,
                                                  ones)))

    ndma = [len(by_dma(i)) for i in range(NU)]
    if any(ndma):
        more = sum(1 for n in ndma if n > 1)
        b.note(f"attention: {sum(1 for n in ndma if n)} of {NU} units take their first bank's P^T by "
               "DMA transposes (SBUF -> SBUF)" + (f", {more} also the next bank's" if more else "")
               + ": it lowers their busiest engine (TensorE's transposes, VectorE's copy) and the "
               "DMA queues keep up; chosen by the cost model")

    def load_kv(h: Affine, w: int, k: bool = True, v: bool = True, cs=None) -> None:
        """K^T (``k``) and V (``v``) of item h into set w: key blocks ``cs`` (default all)."""
        bidx = outer + (h,)
        kts, vts = kv[w]
        cs = range(nk) if cs is None else cs
        for c in cs if k else ():
            k0, kw = kbs[c]
            _load_k(b, sk, bidx, aff(k0), kw, D, dt, kts[c])
            if prescale:
                ka = kts[c].ap(min(D, 128), dims=((1, nd * kw),))
                b.tensor_scalar(ka, ka, AluOp.MULTIPLY, a.scale, engines=(scale_engine,))
        for c in cs if v else ():
            k0, kw = kbs[c]
            _load_v(b, V, bidx, aff(k0), kw, Dv, vts[c], Dw)

    def load_q(h: Affine, i: int, u: int, rows=None) -> None:
        """Q^T of unit i's rows (``rows``: default all) of item h into parity u's tiles."""
        bidx = outer + (h,)
        for j, t in enumerate(units[i]):
            if rows is not None and j not in rows:
                continue
            q0, qr = blocks[t]
            for d0, dw in b.tiled(D, 128, "d"):
                sq.load(b, sets[u][3][j]["qt"], d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)

    def early(h: Affine, w: int, i: int, u: int, nxt=None, between=None, before_m=None):
        """Unit i's products, row maxes and statistics; ``between(s)`` is called after bank s's
        product (the previous unit's transposes, to run beside it). Returns the exps as a
        callable: the caller issues them after the previous unit's transposes, whose PSUM ->
        SBUF copies would otherwise queue behind them on ScalarE/VectorE."""
        bidx = outer + (h,)
        kts = kv[w][0]
        S, P, PT, tmp = sets[u]
        srcs = {}
        urows = rows_of(i)
        for j, (t, s0, vis) in enumerate(urows):
            q0, qr = blocks[t]
            qt = tmp[j]["qt"]
            for x, (c, k0, kw, diag) in enumerate(vis):
                s = s0 + x
                for d0, dw in b.tiled(D, 128, "dm"):
                    b.matmul(S[s].ap(qr, dims=((1, kw),)), qt.ap(dw, elem_offset=d0 // 128 * qr, dims=((1, qr),)),
                             kts[c].ap(dw, elem_offset=d0 // 128 * kw, dims=((1, kw),)), start_when=(d0,))
                if diag is not None:    # hidden keys: columns from 1 - diag on
                    c0 = max(0, 1 - diag)
                    b.matmul(_cols(S[s].ap(qr), c0, kw - c0, qr), ident.ap(QB, dims=((1, qr),)),
                             _cols(masks[max(diag, 1)].ap(QB), 0, kw - c0, QB), start_when=(1,))
                if between is not None:
                    between(s)
                if s == 0 and nxt is not None:
                    # the next unit's Q^T, a unit ahead: its queue never holds it behind
                    # transfers that wait for this unit's exps
                    load_q(nxt[0], nxt[1], 1 - u)
                src, act_scale = S[s].ap(qr, dims=((1, kw),)), (1.0 if prescale else a.scale)
                if a.score is not None:
                    src = _score_tile(b, k, S[s], bidx, q0, qr, aff(k0), kw)
                    act_scale = 1.0
                srcs[s] = (src, act_scale)
                # (a row of one key block without VectorE's exps: its max is the row's)
                mx = tmp[j]["m"].ap(qr) if len(vis) == 1 and not vexp else _cols(tmp[j]["mb"].ap(qr), x, 1)
                op = AluOp.MAX if act_scale >= 0 else AluOp.MIN
                if halves:
                    _half_max(b, mx, src, _cols(tmp[j]["mh"].ap(qr), x * KB // 2, kw // 2), kw, op)
                else:   # an SBUF score tile: either engine
                    b.tensor_reduce(mx, src, op, engines=(EngineKind.VECTOR, EngineKind.GPSIMD))
        if before_m is not None:
            before_m()
        for j, (t, s0, vis) in enumerate(urows):
            qr = blocks[t][1]
            act_scale = srcs[s0][1]
            mb = _cols(tmp[j]["mb"].ap(qr), 0, len(vis))
            m = tmp[j]["m"].ap(qr)
            nm = tmp[j]["nm"].ap(qr)
            if vexp:
                # m for VectorE's exponential (it subtracts), -m for ScalarE's bias: side by side
                b.tensor_reduce(m, mb, AluOp.MAX, engines=(EngineKind.GPSIMD,))
                b.tensor_reduce(nm, mb, AluOp.MAX, negate=True, engines=(EngineKind.GPSIMD,))
            elif len(vis) > 1 and not clamp:
                # -scale * max on ScalarE, in one instruction just ahead of the row's exps:
                # min(-scale * mb) (the maxes, or with a negative scale the minima) into nm
                b.activation(mb, mb, ActFunc.COPY, scale=-act_scale, reduce=AluOp.MIN, accum=nm)
                continue
            elif len(vis) > 1:
                b.tensor_reduce(m, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
            if vexp:
                pass
            elif clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
                b.tensor_scalar(nm, m, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                                LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY, operand1=-act_scale)
            else:
                b.tensor_scalar(nm, m, AluOp.MULTIPLY, -act_scale)

        dmat = by_dma(i)

        def exps() -> None:
            for j, (t, s0, vis) in enumerate(urows):
                qr = blocks[t][1]
                m, nm = tmp[j]["m"].ap(qr), tmp[j]["nm"].ap(qr)
                for x, (c, k0, kw, _) in enumerate(vis):
                    s = s0 + x
                    src, sc = srcs[s]
                    acc = {} if ones else {"accum": _cols(tmp[j]["l"].ap(qr), x, 1)}
                    pc = P[s].ap(qr, dims=((1, kw),))
                    if s in vexp:
                        b.exponential(pc, src, m, **acc)
                    elif s in dmat and ones:
                        # P^T by DMA transposes: the exp per 128 keys, each piece's transfer
                        # right behind it (its fixed phase starts that much earlier)
                        for s1 in range(0, kw, 128):   # unrolled: one queue each
                            sw = min(128, kw - s1)
                            b.activation(_cols(pc, s1, sw), _cols(src, s1, sw), ActFunc.EXP, scale=sc,
                                         bias_ap=nm)
                            b.dma(_cols(PT[s].ap(), s1 // 128 * qr, qr, sw), _cols(pc, s1, sw), transpose=True)
                        continue
                    else:
                        b.activation(pc, src, ActFunc.EXP, scale=sc, bias_ap=nm,
                                     reduce=AluOp.ADD if acc else None, **acc)
                    if s in dmat:   # P^T by DMA transposes: a unit period ahead of its use
                        for s1 in range(0, kw, 128):   # unrolled: one queue each
                            sw = min(128, kw - s1)
                            b.dma(_cols(PT[s].ap(), s1 // 128 * qr, qr, sw), _cols(pc, s1, sw), transpose=True)
        return exps

    def late(h: Affine, w: int, i: int, u: int, nxt: int):
        """Unit i's transposes (``tp(s)`` per bank) and the rest (``rest()``: 1 / sum, second
        products, store), for the caller to place; unit ``nxt``'s exps go ahead of the rest."""
        bidx = outer + (h,)
        vts = kv[w][1]
        S, P, PT, tmp = sets[u]
        pts: list = [None] * nk
        urows = rows_of(i)
        bank = {s0 + x: (blocks[t][1], kw) for t, s0, vis in urows for x, (_, _, kw, _) in enumerate(vis)}
        dmat = by_dma(i)

        def tp(s: int) -> None:
            if s not in bank or pts[s] is not None:
                return
            qr, kw = bank[s]
            if s in dmat:        # by DMA, issued with the exps
                pts[s] = PT[s].ap(min(kw, 128), dims=((1, -(-kw // 128) * qr),))
                return
            eng = ((EngineKind.VECTOR, EngineKind.SCALAR) if a.score is not None else
                   (EngineKind.SCALAR,) if s < na else (EngineKind.VECTOR,))
            pts[s] = _transpose_block(b, k, S[s], P[s].ap(qr, dims=((1, kw),)), qr, kw,
                                      -(-kw // 128), pt=PT[s], engines=eng)

        summed = []

        def sums() -> None:
            """The row sums of a row's exps (several key blocks) on GpSimdE (ScalarE's queue holds
            the next unit's exps: an instruction there would wait for them), once: for the caller
            to issue between GpSimdE's last row max of the next unit and its m (no instruction
            then reads what the one before it wrote, the dependent-instruction penalty)."""
            if ones or summed:
                return
            summed.append(True)
            for j, (t, s0, vis) in enumerate(urows):
                if len(vis) > 1:
                    qr = blocks[t][1]
                    b.tensor_reduce(tmp[j]["den"].ap(qr), _cols(tmp[j]["l"].ap(qr), 0, len(vis)), AluOp.ADD,
                                    engines=(EngineKind.GPSIMD,))

        def rest() -> None:
            for j, (t, s0, vis) in enumerate(urows):
                q0, qr = blocks[t]
                # the output (and with ``ones`` the row sum, its last column) behind the P^T
                # pieces of the row's last bank
                last = s0 + len(vis) - 1
                O = (_Cols(S[last], _pt_bytes(-(-bank[last][1] // 128), pdt) // 4, QB, Dw) if shares
                     else tmp[j]["o"])
                # in the order their P^T lands: the first DMA-transposed bank (its exp is the
                # unit's first), the TensorE-transposed ones, the other DMA banks (their
                # transfers queue behind the first's on every DMA engine)
                dm = [x for x in range(len(vis)) if s0 + x in dmat]
                xs = dm[:1] + [x for x in range(len(vis)) if x not in dm] + dm[1:]
                for x in xs:
                    c, k0, kw, _ = vis[x]
                    for s1, sw in b.tiled(kw, 128, "pv"):
                        sub = s1 // 128
                        b.matmul(O.ap(qr), _cols(pts[s0 + x], sub * qr, qr, sw),
                                 _v_rows(vts[c], sub, s1, sw, Dw), start_when=(s1 if x == xs[0] else 1,))
                if ones:
                    den = _cols(O.ap(qr), Dv, 1)
                else:   # the sums on GpSimdE (ScalarE's queue holds the next unit's exps: an
                    # instruction there would wait for them); one key block's sum is the row's
                    sums()
                    den = tmp[j]["den"].ap(qr) if len(vis) > 1 else _cols(tmp[j]["l"].ap(qr), 0, 1)
                if clamp:
                    # GpSimdE unless the sum is in PSUM (the ones column), which it cannot read
                    b.tensor_scalar(tmp[j]["den"].ap(qr), den, AluOp.MAX, TINY,
                                    engines=(EngineKind.GPSIMD, EngineKind.VECTOR))
                    den = tmp[j]["den"].ap(qr)
                _store(b, k, bidx, q0, qr, Dv, _cols(O.ap(qr), 0, Dv), den, tmp[j]["w"], op=AluOp.DIVIDE,
                       engines=(norm_engine(b.target, widths(nxt), D, Dv, dt, pdt, nv, ones),))
        return tp, sums, rest

    def order(hh: int) -> list[int]:
        """The units of an item in set hh in the order they run: odd items reversed, so an
        item's last unit and the next item's first are alike (long rows end one item and start
        the next, short rows likewise), and with an even number of items the kernel drains
        after the short rows."""
        return list(range(NU))[::-1 if hh % 2 else 1]

    N, depth = nh * NU, 2 * NU       # units of every item in a row; one trip: two items
    box: dict[int, tuple] = {}       # slot -> (tp, sums) of the unit whose late stage ran last

    def unit(g: int | Affine, slot: int):
        """(item, K/V set, position in the item's order, unit id) of unit ``g`` of the row."""
        hh, p = slot // NU % 2, slot % NU
        return (g - slot) // depth * 2 + slot // NU, hh, p, order(hh)[p]

    def body(g: int | Affine, slot: int):
        """Unit g's stages (step t: L(t) KV(t) E(t+1) TP(t) X(t+1) R(t)): its late stage (L:
        transposes and the rest, made, TP and R issue them), the next item's K^T and V loads
        placed at this unit (KV), its early stage (E: products beside the previous unit's
        transposes, row max and statistics) and exps (X)."""
        h, hh, p, i = unit(g, slot)
        u, last = slot % 2, isinstance(h, int) and h == nh - 1   # the loop holds no last item
        h = aff(h)
        at: dict = {}
        nxt_id = order(hh)[p + 1] if p + 1 < NU else order(1 - hh)[0]

        def late_stage() -> None:
            at["late"] = late(h, hh, i, u, nxt_id)
            box[slot] = at["late"][:2]

        def kv_stage() -> None:
            if last:
                return
            if prescale:
                # the next item's K^T (scaled on load) and V: one key block per unit from the
                # first, so each scale takes one instruction's room in its engine's queue
                cs = tuple(c for c in range(nk) if min(c, NU - 1) == p)
                if cs:
                    load_kv(h + 1, 1 - hh, cs=cs)
            elif p == NU - 1:
                # the next item's K^T and V ahead of its first products, with the last unit
                load_kv(h + 1, 1 - hh)

        def early_stage() -> None:
            if isinstance(g, int) and g == 0:
                # the first products wait for the first Q^T and the K^T blocks only: those
                # loads go first, the first row's Q^T and the first K^T block ahead of the rest
                load_q(aff(0), 0, 0, rows=(0,))
                load_kv(aff(0), 0, v=False, cs=(0,))
                load_q(aff(0), 0, 0, rows=tuple(range(1, len(units[0]))))
                load_kv(aff(0), 0, v=False, cs=tuple(range(1, nk)))
                at["exps"] = early(aff(0), 0, 0, 0, (aff(0), 1 % NU))
                return
            tp, sums = box[(slot - 1) % depth]
            # with background transposes, the previous unit's transposes run beside this
            # unit's products
            nh2, _, _, ni = unit(g + 1, (slot + 1) % depth)
            nxt = None if isinstance(g, int) and g + 1 >= N else (nh2, ni)
            at["exps"] = early(h, hh, i, u, nxt, between=tp if interleave else None,
                               before_m=sums)

        def tp_stage() -> None:
            tp = at["late"][0]
            for s in range(nk):     # (those no product of the next unit ran beside)
                tp(s)

        def exps_stage() -> None:
            at["exps"]()
            if isinstance(g, int) and g == 0:
                load_kv(aff(0), 0, k=False)

        return {"L": late_stage, "KV": kv_stage, "E": early_stage, "TP": tp_stage,
                "X": exps_stage, "R": lambda: at["late"][2]()}

    pipelined(b, N, ROW_STAGES, body, depth=depth, hint="h")
