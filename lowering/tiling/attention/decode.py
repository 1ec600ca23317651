"""Decode attention: one query per head (an LLM's decode step over its KV cache), every head of a
batch item at once, heads on partitions (tiling/attention/kernel.py dispatches here).

With one query row per head, the per-head flash-attention loop runs [1, 512] instructions whose
fixed costs dwarf their work. Here the H heads of a batch item share every instruction but the
products:
    Qm = blockdiag(q_0 .. q_{H-1})           [D, H x H] (head h's block: q_h in column h, else 0)
    S_c += Qm_h.T @ K_h^T[:, c]             TensorE, for every head h: row h of S_c [H, 512]
                                             gets head h's scores, the other rows + 0; heads of
                                             64 features two at a time (``paired``: head 2j on
                                             partitions 0-63, 2j+1 on 64-127, one product)
    m = rowmax(S), P = exp(scale S - m), l   one reduce per bank, one across; ScalarE per bank
    P^T_j = transpose(P[:, j])               [128 keys, H] per 128 keys, one copy out of PSUM
    by rows:    O[0, h] += P^T_j[:, h].T @ V_h[j]   head h's output row at its own columns;
                out[h] = O[0, h] / l_h               l^T [1, H] by one transpose, one multiply
    by columns: O^T[:, pair] += V_pair[j].T @ P^T_j[:, pair]   two heads' V stationary (Dv <= 64;
                one head up to 128), their two P^T columns moving: half the TensorE columns;
                out[h] = O^T[u Dv:, h] / l_h         1 / l on every partition by ones^T @ diag,
                                                     one transpose per half back to rows
    (``_columns`` prices both on the cost model, ``estimate.profile``)
An additive score term (ACC + X, X free of ACC: GPT-2's ``where(mask, 0, -inf)``) is evaluated
for every bank before the products (``_additive``), so only the add waits for the scores.
K^T comes by DMA transpose bank by bank (every head's first 512 keys, then the next 512), so
the first bank's products and score expression run while the rest arrive (instead of head by
head), the two heads of a pair by one DMA transpose over all
128 partitions (``_load_kt_pair``: half the transfers, every DMA engine); V of a head in one DMA
([128 keys, chunks x Dv]). With an additive term and a scale that is a power of two in fp32
(GPT-2's 1/8), the scale goes into the query blocks (exact) and each bank's score tile is one
add of the term to the products in PSUM; scores that come scaled take VectorE's exponential
where it is the faster engine (NC-v4).
A query row resident in SBUF (the QKV projection's output) reaches the pairs' [128, H/2] by one
TensorE transpose per pair (``_q_rows``), and an output row resident in SBUF (the next matmul's
input) is assembled by one transpose per pair into a PSUM row and one copy (``_resident_row``):
no SBUF -> SBUF DMA on the chain of dependent kernels, where it would wait behind the weight
stream on the in-order DMA engines. Work that depends only on the positions and the mask (the
position masks, the additive term, the query blocks' pattern) goes to GpSimdE where it can
(``_off_vector``), off the in-order VectorE that runs the score work.

New rows (``AttentionKAttrs.new_kv``, ``passes/decode_cache.py``): KT and V are the cache before
its one-row update, KN / VN the new rows, pos_k / pos_v their runtime positions. By value:
    s_new = Qm_h.T @ kn_h                    TensorE, [H, 1] (the products above with one key)
    S_c = select(key == pos_k, s_new, S_c)   before the score expression: the stale key's score
                                             never reaches the softmax
    P^T' = P^T * (key != pos_v)              the stale value row gets probability 0 ...
    p_new = onehot(pos_v).T @ P^T            [1, H]: each head's probability of key pos_v ...
    O[0, h] += p_new[h] * vn_h               ... which multiplies the new row instead
With the value rows only (``new_kv`` naming two inputs, VN and pos_v: the key cache is read
after its update, ``decode_cache.ENABLED == "values"``) the value half alone: no s_new, no key
selects, the scores as without new rows.
The masks depend only on the positions, so they and the cache loads wait for nothing the layer
computes. A stale value row must be finite (0 x inf is NaN): a static cache starts zeroed and
holds rows that earlier steps wrote.

Invariants
- Applies when ``decode_fits``: one query, 2-128 heads on the innermost batch axis, D <= 128,
  at most four key blocks of 512 (whole score rows in PSUM), an epilogue of casts only. A kernel
  with new rows that does not fit is an internal error (the pass asks ``new_rows_fit`` first).
- The products of the heads accumulate into one PSUM group per score bank: head 0 starts it,
  every other head adds zeros outside its own row, so each row holds exactly its head's sums.
- Score expressions see the same leaves as elsewhere: INDEX over the head axis varies along
  partitions, over the key axis along the free axis, the query index is 0.
"""
from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager

from lowering.errors import LoweringError
from lowering.kir import EOp, Expr, KOp
from lowering.tiling.attention.rows import MAX_KEY_BLOCKS
from lowering.tiling.attention.steps import (F32, KB, LOWEST, TINY, _boff, _cols, _only_casts, _Part,
                                             _row_broadcast, _score_tile)
from lowering.tiling.exprgen import ExprGen
from lowering.tiling.matmul.kernel import _Side
from lowering.tiling.matmul.plan import DMA_T, PE_T, RES_T, operand_form
from lowering.tir.affine import aff
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory, Op, SelectAttrs


@contextmanager
def _off_vector(b: TirBuilder, on: bool = True):
    """Inside: an instruction that GpSimdE can run goes to GpSimdE alone. For the work that
    depends on nothing the layer computes (the position masks, the additive score term, the
    query blocks' pattern): on the in-order VectorE it would sit between the previous kernels'
    epilogues and this kernel's score work, on the chain of dependent kernels."""
    if not on:
        yield
        return
    emit = b.emit

    def pinned(op, dst, srcs, attrs, *, engines, **kw):
        if EngineKind.GPSIMD in engines:
            engines = (EngineKind.GPSIMD,)
        return emit(op, dst, srcs, attrs, engines=engines, **kw)
    b.emit = pinned
    try:
        yield
    finally:
        del b.emit



def decode_fits(k: KOp, batch, Sq: int, Sk: int, D: int, Dv: int, sk: _Side, t) -> bool:
    """Whether ``tile_decode`` applies (module docstring, Invariants)."""
    ok = _fits(k, batch, Sq, Sk, D, Dv, sk.form, t)
    if not ok and k.attrs.new_kv is not None:
        raise LoweringError(f"attention {','.join(k.origin[:1])}: new cache rows (new_kv) but the "
                            f"decode tiler does not apply (batch {batch}, Sq={Sq}, Sk={Sk}, D={D})")
    return ok


def new_rows_fit(k: KOp, t) -> bool:
    """Whether ``tile_decode`` takes ``k``, an attention with ``new_kv`` set (the pass's check)."""
    Q, KT, V = k.ins[:3]
    rows = k.ins[k.attrs.new_kv:]
    KN, VN = rows[:2] if len(rows) == 4 else (KT, rows[0])
    *batch, Sq, D = Q.shape
    Sk, Dv = KT.shape[-1], V.shape[-1]
    return (min(Sq, Sk, D, Dv) > 0 and KN.dtype == KT.dtype == Q.dtype and VN.dtype == V.dtype
            and _fits(k, batch, Sq, Sk, D, Dv, operand_form(KT.strides[-2], KT.strides[-1], Sk,
                                                            KT.dtype, t), t))


def _fits(k: KOp, batch, Sq: int, Sk: int, D: int, Dv: int, form, t) -> bool:
    a = k.attrs
    if Sq != 1 or not batch or D > 128 or Dv > 512:
        return False
    H = batch[-1]
    if not 2 <= H <= 128 or not _only_casts(a.epilogue):
        return False
    if a.causal and a.causal_offset < Sk - 1:          # a causal query that does not see every key
        return False
    nk = -(-Sk // KB)
    per_bank = t.psum_bank_bytes // (Dv * 4)
    tp = 1 if form in (PE_T, RES_T) else 0           # K^T by TensorE transposes
    fix = 1 if a.new_kv is not None else 0           # the new key's scores and p_new
    banks = nk + -(-H // per_bank) + 2 + tp + fix    # scores, outputs, P^T, l^T
    nch = -(-Sk // 128)
    return (nk <= MAX_KEY_BLOCKS and banks <= t.psum_banks
            and nch * H * a.p_dtype.itemsize <= t.psum_bank_bytes)


def tile_decode(b: TirBuilder, k: KOp, sk: _Side) -> None:
    a = k.attrs
    Q, KT, V = k.ins[:3]
    out = k.outs[0]
    *batch, _, D = Q.shape
    Sk, Dv, H = KT.shape[-1], V.shape[-1], batch[-1]
    dt, pdt = Q.dtype, a.p_dtype
    t = b.target
    kbs = [(k0, min(KB, Sk - k0)) for k0 in range(0, Sk, KB)]
    nk, nch = len(kbs), -(-Sk // 128)
    per_bank = t.psum_bank_bytes // (Dv * 4)
    groups = [(h0, min(per_bank, H - h0)) for h0 in range(0, H, per_bank)]
    clamp = a.safe and a.score is not None
    new = a.new_kv is not None
    newk = new and len(k.ins) - a.new_kv == 4        # the key row too (else the value row only)
    if newk:
        KN, VN, PK, PV = k.ins[a.new_kv:a.new_kv + 4]
    elif new:
        VN, PV = k.ins[a.new_kv:a.new_kv + 2]
    b.note(f"attention decode: {H} heads of one query each over {Sk} keys, heads on partitions "
           f"(block-diagonal queries, {nk} score banks, outputs in {len(groups)} banks)")
    with ExitStack() as es:
        outer = tuple(es.enter_context(b.loop(n, "b")) for n in batch[:-1])
        # heads of at most 64 features alternate between partitions 0-63 and 64-127, so their
        # K^T transfers use every DMA engine; head h sits in half h % halves, slot h // halves
        halves = 2 if D <= 64 else 1
        P = 64 * (halves - 1) + D
        slots = -(-H // halves)
        # the two heads of a slot share each score product when they fill all 128 partitions
        # (D == 64: no partitions between the halves; ``_paired``)
        paired = halves == 2 and D == 64
        nq = slots if paired else H          # stationary blocks [P, H], one per product
        # Q^T of every head, then the blocks: eye[d, j, m] = (m == head of block j in half u)
        rows = _q_rows(b, k, outer, H, D, paired, t)
        if rows is not None:     # pair j's q [1, 128] -> column j of qtp (heads 2j, 2j+1)
            qtp = b.tile("dqT", Memory.PSUM, P, nq, F32, 1)
            for j, v in enumerate(rows):
                b.transpose(qtp.ap(P, elem_offset=j, dims=((1, 1),)), v)
        else:
            qt = b.tile("dq", Memory.SBUF, P, H, dt, 1)
        eye = b.tile("deye", Memory.SBUF, P, nq * H, dt, 1)
        qm = b.tile("dqm", Memory.SBUF, P, nq * H, dt, 1)
        # an additive score term takes scale S + X in one add when the scale is a power of two
        # (then q * scale is exact in the query blocks and S comes scaled from the products)
        qscale = _pow2(a.scale) if _additive(a.score) is not None and PRESCALE_Q else 1.0
        for u in range(halves):
            if rows is None:
                # every head's q in one DMA per half (features on partitions): one fixed phase,
                # not one per head
                b.dma(qt.ap(D, partition_start=64 * u, dims=((1, H),)),
                      hbm_ap(Q.buffer, Q.dtype, _boff(Q, outer + (aff(0),)), D, Q.strides[-1],
                             ((H, Q.strides[-3]),)))
            hh = dict(partition_start=64 * u)
            grid = dict(dims=((H, nq), (1, H)), **hh)
            # paired: block j holds head 2j + u in half u (j*2 + u - m); else head j (j - m)
            b.iota(eye.ap(D, **grid), u if paired else 0, 0, (2 if paired else 1, -1))
            if qscale != 1.0:       # the score scale in the query blocks (exact: a power of two)
                b.tensor_scalar(eye.ap(D, **hh), eye.ap(D, **hh), AluOp.IS_EQUAL, 0.0,
                                op1=AluOp.MULTIPLY, operand1=qscale)
            else:
                b.tensor_scalar(eye.ap(D, **hh), eye.ap(D, **hh), AluOp.IS_EQUAL, 0.0)
            q = (qt.ap(D, dims=((0, nq), (1, H)), **hh) if rows is None else
                 qtp.ap(D, dims=((1, nq), (0, H)), **hh))   # block j: its pair's column
            b.tensor_tensor(qm.ap(D, **grid), eye.ap(D, **grid), q, AluOp.MULTIPLY)
        if new:         # after the query blocks: GpSimdE makes both (the blocks' pattern first)
            with _off_vector(b, OFF_VECTOR):
                onek, onev, keepv = _position_masks(b, PK if newk else None, PV, H, Sk, pdt)
        if new:         # the new rows, before the cache loads on the DMA queues
            knt = b.tile("dkn", Memory.SBUF, P, slots, dt, 1) if newk else None
            for u in range(halves if newk else 0):
                n_u = len(range(u, H, halves))
                b.dma(knt.ap(D, partition_start=64 * u, dims=((1, n_u),)),
                      hbm_ap(KN.buffer, KN.dtype, _boff(KN, outer + (aff(u),)), D, KN.strides[-1],
                             ((n_u, halves * KN.strides[-3]),)))
            vn = b.tile("dvn", Memory.SBUF, 1, H * Dv, VN.dtype, 1)
            b.dma(vn.ap(dims=((Dv, H), (1, Dv))),
                  hbm_ap(VN.buffer, VN.dtype, _boff(VN, outer + (aff(0),)), 1, 0,
                         ((H, VN.strides[-3]), (Dv, VN.strides[-1]))))
        # an additive score term (a mask: ACC + X) on every bank before the products, so it
        # waits for nothing the products give (``_additive``); its loads before the cache's
        bias = _additive(a.score)
        if bias is not None:
            with _off_vector(b, OFF_VECTOR):
                bias = [_bias_tile(b, k, bias, outer + (aff(0),), H, k0, kw, len(batch) - 1)
                        for k0, kw in kbs]
        # the second products by columns or by rows (``_columns``)
        cols = _columns(t, H, Sk, Dv, new, V.dtype, pdt)
        kt = b.tile("dk", Memory.SBUF, P, slots * Sk, dt, 1)
        vt = b.tile("dv", Memory.SBUF, min(Sk, 128), H * nch * Dv, V.dtype, 1)
        # K^T bank by bank (every head's keys of the first bank first, so its products and
        # score expression run while the later banks arrive), then V
        # (paired heads of a DMA-transposed K^T: both heads of a slot in one transfer over all
        # 128 partitions, every DMA engine, half the transfers)
        pair_load = paired and sk.form == DMA_T and PAIRED_KT_LOADS
        for k0, kw in kbs:
            for h in range(H):
                if pair_load and kw > 1 and h % 2 == 1:
                    continue                     # loaded with head h - 1
                if pair_load and kw > 1 and h + 1 < H:
                    _load_kt_pair(b, sk, KT, kt, outer, h, Sk, k0, kw, D)
                    continue
                sk.load(b, _Part(kt, 64 * (h % halves), aff(0)), aff(h // halves * Sk + k0),
                        sk.base(outer + (aff(h),)), aff(0), D, aff(k0), kw)
        for h in range(H):
            _load_v_head(b, V, outer + (aff(h),), Sk, Dv, vt, h * nch * Dv)
        def block(j):   # (first partition, partitions, K^T slot) of stationary block j
            if paired:      # heads 2j and 2j + 1 (the last slot of an odd H: 2j alone)
                return 0, P if 2 * j + 1 < H else D, j
            return 64 * (j % halves), D, j // halves

        if new:         # the new key's scores s_new [H, 1], into column 0 of ``fx``
            fx = b.tile("dfx", Memory.PSUM, H, 1 + H, F32, 1)
        if newk:
            for j in range(nq):
                p0, pp, slot = block(j)
                b.matmul(fx.ap(dims=((1, 1),)),
                         qm.ap(pp, partition_start=p0, elem_offset=j * H, dims=((1, H),)),
                         knt.ap(pp, partition_start=p0, elem_offset=slot, dims=((1, 1),)),
                         start_when=(j,))
            sn = b.tile("dsn", Memory.SBUF, H, 1, F32, 1)
            b.tensor_copy(sn.ap(), fx.ap(dims=((1, 1),)))
        # scores: head h's row of each bank
        S = [b.tile(f"ds{c}", Memory.PSUM, H, KB, F32, 1) for c in range(nk)]
        for c, (k0, kw) in enumerate(kbs):
            for j in range(nq):
                p0, pp, slot = block(j)
                b.matmul(S[c].ap(dims=((1, kw),)),
                         qm.ap(pp, partition_start=p0, elem_offset=j * H, dims=((1, H),)),
                         kt.ap(pp, partition_start=p0, elem_offset=slot * Sk + k0, dims=((1, kw),)),
                         start_when=(j,))
        mb = b.tile("dmb", Memory.SBUF, H, nk, F32, 1).ap()
        srcs = []
        for c, (k0, kw) in enumerate(kbs):
            if newk:    # key pos_k: the new key's score, whatever the stale one is (per bank
                #         with its score expression: VectorE runs in order)
                sel = b.tile(f"dsel{c}", Memory.SBUF, H, KB, F32, 1)
                b.emit(Op.SELECT, sel.ap(dims=((1, kw),)),
                       (onek.ap(elem_offset=k0, dims=((1, kw),)), sn.ap(dims=((0, kw),)),
                        S[c].ap(dims=((1, kw),))), SelectAttrs(), engines=(EngineKind.VECTOR,))
                S[c] = sel
            src, act_scale = S[c].ap(dims=((1, kw),)), a.scale
            if bias is not None:        # scale S + X, as _score_tile computes ACC + X
                acc = S[c].ap(dims=((1, kw),))
                if qscale == 1.0:
                    acc = b.tile("dsc", Memory.SBUF, H, kw, F32, 1).ap()
                    b.tensor_scalar(acc, S[c].ap(dims=((1, kw),)), AluOp.MULTIPLY, a.scale)
                src = b.tile("dsb", Memory.SBUF, H, kw, F32, 1).ap()
                b.tensor_tensor(src, acc, bias[c], AluOp.ADD)
                act_scale = 1.0
            elif a.score is not None:
                src = _score_tile(b, k, S[c], outer + (aff(0),), aff(0), H, aff(k0), kw,
                                  p_axis=len(batch) - 1)
                act_scale = 1.0
            srcs.append((src, act_scale))
            b.tensor_reduce(_cols(mb, c, 1), src, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
        act_scale = srcs[0][1]
        m = b.tile("dm", Memory.SBUF, H, 1, F32, 1).ap()
        b.tensor_reduce(m, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
        nm = b.tile("dnm", Memory.SBUF, H, 1, F32, 1).ap()
        # VectorE's exponential where it is the faster one (NC-v4) and the scores come scaled:
        # exp(S - m) with the row sums, as ScalarE's exp(S + (-m)) with its reduce
        vexp = (VECTOR_EXP and t.vector_exp_speedup > 1 and act_scale >= 0
                and all(sc == 1.0 for _, sc in srcs))
        if vexp:
            if clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
                b.tensor_scalar(nm, m, AluOp.MAX, LOWEST)
            else:
                nm = m
        elif clamp:   # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
            b.tensor_scalar(nm, m, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                            LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY, operand1=-act_scale)
        else:
            b.tensor_scalar(nm, m, AluOp.MULTIPLY, -act_scale)
        P = b.tile("dp", Memory.SBUF, H, Sk, pdt, 1)
        L = b.tile("dl", Memory.SBUF, H, nk, F32, 1).ap()
        for c, (k0, kw) in enumerate(kbs):
            src, sc = srcs[c]
            if vexp:
                b.exponential(P.ap(elem_offset=k0, dims=((1, kw),)), src, nm, accum=_cols(L, c, 1))
            else:
                b.activation(P.ap(elem_offset=k0, dims=((1, kw),)), src, ActFunc.EXP, scale=sc,
                             bias_ap=nm, reduce=AluOp.ADD, accum=_cols(L, c, 1))
        # P^T per 128 keys, [128 keys, H] each, through one PSUM tile, one copy out
        tps = b.tile("dtp", Memory.PSUM, min(Sk, 128), nch * H, pdt, 1)
        pt = b.tile("dpt", Memory.SBUF, min(Sk, 128), nch * H, pdt, 1)
        for j in range(nch):
            w = min(128, Sk - j * 128)
            b.transpose(tps.ap(w, elem_offset=j * H, dims=((1, H),)),
                        P.ap(elem_offset=j * 128, dims=((1, w),)))
        if Sk % 128 == 0:
            b.tensor_copy(pt.ap(), tps.ap())
        else:
            for j in range(nch):
                w = min(128, Sk - j * 128)
                b.tensor_copy(pt.ap(w, elem_offset=j * H, dims=((1, H),)),
                              tps.ap(w, elem_offset=j * H, dims=((1, H),)))
        ptv = pt
        if new:     # value row pos_v: probability 0 in P^T', p_new [1, H] kept apart
            ptv = b.tile("dptm", Memory.SBUF, min(Sk, 128), nch * H, pdt, 1)
            for j0, jn, w in ([(0, nch, 128)] if Sk % 128 == 0 else
                              [(j, 1, min(128, Sk - j * 128)) for j in range(nch)]):
                b.tensor_tensor(ptv.ap(w, elem_offset=j0 * H, dims=((H, jn), (1, H))),
                                tps.ap(w, elem_offset=j0 * H, dims=((H, jn), (1, H))),
                                keepv.ap(w, elem_offset=j0, dims=((1, jn), (0, H))), AluOp.MULTIPLY)
            for j in range(nch):
                w = min(128, Sk - j * 128)
                b.matmul(fx.ap(1, elem_offset=1, dims=((1, H),)),
                         onev.ap(w, elem_offset=j, dims=((1, 1),)),
                         pt.ap(w, elem_offset=j * H, dims=((1, H),)), start_when=(j,))
            pn = b.tile("dpn", Memory.SBUF, 1, H, pdt, 1)
            b.tensor_copy(pn.ap(), fx.ap(1, elem_offset=1, dims=((1, H),)))
        den = b.tile("dden", Memory.SBUF, H, 1, F32, 1).ap()
        b.tensor_reduce(den, L, AluOp.ADD)
        if clamp:
            b.tensor_scalar(den, den, AluOp.MAX, TINY)
        rl = b.tile("drl", Memory.SBUF, H, 1, F32, 1).ap()
        b.activation(rl, den, ActFunc.RECIPROCAL)
        if cols:
            _products_by_columns(b, out, outer, H, Sk, Dv, vt, ptv, rl,
                                 (vn, pn) if new else None)
        else:
            _products_by_rows(b, out, outer, H, Sk, Dv, vt, ptv, rl, (vn, pn) if new else None)


def _q_rows(b: TirBuilder, k: KOp, outer, H: int, D: int, paired: bool, t):
    """The query row resident in SBUF (a decode step's QKV projection output) as one [1, 128]
    view per head pair, to reach [128, pairs] by TensorE transposes rather than SBUF -> SBUF
    DMAs (on the chain of dependent kernels, behind the weight stream on the in-order DMA
    engines); None where the heads are not paired, H is odd, the row is not resident, a pair
    is not 128 contiguous elements, or the PSUM banks are taken (``_fits``)."""
    Q, KT, V = k.ins[:3]
    if not (Q_BY_TRANSPOSES and paired and H % 2 == 0 and Q.strides[-1] == 1
            and Q.strides[-3] == D):
        return None
    a = k.attrs
    nk = -(-KT.shape[-1] // KB)
    per_bank = t.psum_bank_bytes // (V.shape[-1] * 4)
    fix = 1 if a.new_kv is not None else 0
    if nk + -(-H // per_bank) + 2 + fix + 1 > t.psum_banks:
        return None
    base = _boff(Q, outer + (aff(0),))
    views = [b.resident_view(hbm_ap(Q.buffer, Q.dtype, base + j * 2 * D, 1, 0, ((2 * D, 1),)), 1)
             for j in range(H // 2)]
    return None if any(v is None for v in views) else views


PAIRED_KT_LOADS = True
Q_BY_TRANSPOSES = True
OFF_VECTOR = True
PRESCALE_Q = True
VECTOR_EXP = True


def _pow2(x: float) -> float:
    """``x`` rounded to fp32 (as the engines apply a scale) when that is a power of two, else 1.0
    (no prescaling)."""
    if x <= 0:
        return 1.0
    p = 2.0 ** round(math.log2(x))
    return p if abs(x / p - 1.0) < 2.0 ** -25 else 1.0


def _load_kt_pair(b: TirBuilder, sk, KT, kt, outer, h: int, Sk: int, k0: int, kw: int,
                  D: int) -> None:
    """K^T of heads h (partitions 0-63) and h + 1 (64-127) for keys k0 .. k0+kw, slot h // 2, by
    one DMA transpose: the source [kw keys, 2 heads, D features] viewed as [kw, 2 D]."""
    src = hbm_ap(KT.buffer, KT.dtype, sk.base(outer + (aff(h),)) + k0 * sk.fstride, kw,
                 sk.fstride, ((2, KT.strides[-3]), (D, sk.kstride)))
    b.dma(kt.ap(2 * D, elem_offset=h // 2 * Sk + k0, dims=((1, kw),)), src, transpose=True)


def _uses_acc(x: Expr) -> bool:
    return x.op is EOp.ACC or any(_uses_acc(y) for y in x.args)


def _additive(score: Expr | None) -> Expr | None:
    """X when the score expression is ACC + X (or X + ACC; ACC possibly cast to fp32, which it
    is) and X does not use ACC (an additive mask, e.g. GPT-2's ``where(mask, 0, -inf)``), else
    None."""
    if score is None or score.op is not EOp.ADD or len(score.args) != 2:
        return None
    for acc, x in (score.args, score.args[::-1]):
        if acc.op is EOp.CAST and acc.dtype is DType.FP32 and len(acc.args) == 1:
            acc = acc.args[0]           # ACC is fp32: a cast to fp32 keeps it
        if acc.op is EOp.ACC and not _uses_acc(x):
            return x
    return None


def _bias_tile(b: TirBuilder, k: KOp, x: Expr, bidx, H: int, k0: int, kw: int, p_axis: int):
    """``x`` (no ACC in it) on the [H, kw] block of keys from ``k0`` in its own dtype: heads on
    partitions (output axis ``p_axis``), the query index 0; its LOAD and INDEX leaves as
    ``attention.steps._score_tile`` reads them."""
    out_rank = len(k.outs[0].shape)
    loads: dict[int, object] = {}

    def leaf(e: Expr):
        if e.op is EOp.LOAD:
            if e.index not in loads:
                r = k.ins[e.index + 1]
                tl = b.tile(f"dmask{e.index}", Memory.SBUF, H, kw, r.dtype, 1)
                base = _boff(r, bidx) + k0 * r.strides[-1]
                if r.strides[-1] == 0 and kw > 1:
                    _row_broadcast(b, tl.ap(), r, base, H, kw, e.index, r.strides[p_axis])
                else:
                    b.dma(tl.ap(), hbm_ap(r.buffer, r.dtype, base, H, r.strides[p_axis],
                                          ((kw, r.strides[-1]),)))
                loads[e.index] = tl.ap()
            return loads[e.index]
        assert e.op is EOp.INDEX, e.op
        tl = b.tile("didx", Memory.SBUF, H, kw, e.dtype, 1).ap()
        if e.index == p_axis:                        # the head: along partitions
            b.iota(tl, bidx[p_axis], 1, (0,))
        elif e.index == out_rank - 1:                # the key: along the free axis
            b.iota(tl, k0, 0, (1,))
        else:                                        # the query (0) or an outer batch index
            b.iota(tl, 0 if e.index == out_rank - 2 else bidx[e.index], 0, (0,))
        return tl

    return ExprGen(b, H, (kw,), leaf).tile_of(x)


def _columns(t, H: int, Sk: int, Dv: int, new: bool, vdt, pdt) -> bool:
    """Whether the second products go by columns (``_products_by_columns``: V of one or two
    heads stationary, their P^T columns moving, O^T [Dv per head, H] in one bank) rather than
    by rows (one head's P^T column stationary, its V moving, O [1, H Dv]): priced with the cost
    model (``estimate.profile``) on the same shapes."""
    if Dv > 128 or H * 4 > t.psum_bank_bytes:
        return False
    from lowering.tiling.estimate import profile, scratch
    w0, nch = min(Sk, 128), -(-Sk // 128)
    spans = []
    for fn in (_products_by_columns, _products_by_rows):
        with scratch(t) as sb:
            vt = sb.tile("dv", Memory.SBUF, w0, H * nch * Dv, vdt, 1)
            ptv = sb.tile("dpt", Memory.SBUF, w0, nch * H, pdt, 1)
            rl = sb.tile("drl", Memory.SBUF, H, 1, F32, 1).ap()
            o = sb.tile("out", Memory.SBUF, 1, 1, vdt, 1)
            extra = None
            if new:
                extra = (sb.tile("dvn", Memory.SBUF, 1, H * Dv, vdt, 1),
                         sb.tile("dpn", Memory.SBUF, 1, H, pdt, 1))
            fn(sb, _SbufOut(o, Dv), (), H, Sk, Dv, vt, ptv, rl, extra)
        spans.append(profile(sb)[1])
    return spans[0] < spans[1]


class _SbufOut:
    """A stand-in for the output TensorRef in ``_columns``'s scratch bodies."""
    def __init__(self, tile, Dv: int):
        self.tile, self.Dv = tile, Dv


def _store(b: TirBuilder, out, outer, h0: int, parts: int, pstride: int, dims, src) -> None:
    if isinstance(out, _SbufOut):          # scratch: transfers are not priced
        return
    b.dma(hbm_ap(out.buffer, out.dtype, _boff(out, outer + (aff(h0),)), parts, pstride, dims), src)


def _out_dtype(out):
    return out.tile.dtype if isinstance(out, _SbufOut) else out.dtype


def _products_by_rows(b: TirBuilder, out, outer, H: int, Sk: int, Dv: int, vt, ptv, rl,
                      extra) -> None:
    """O[0, h] += P^T_j[:, h].T @ V_h[j]: head h's output row at its own columns of its group's
    bank (V chunk j of head h at (h nch + j) Dv); out[h] = O[0, h] / l_h, 1 / l as a row."""
    t = b.target
    nch = -(-Sk // 128)
    per_bank = t.psum_bank_bytes // (Dv * 4)
    groups = [(h0, min(per_bank, H - h0)) for h0 in range(0, H, per_bank)]
    rlt_ps = b.tile("drlp", Memory.PSUM, 1, H, F32, 1)
    b.transpose(rlt_ps.ap(), rl)
    rlt = b.tile("drlt", Memory.SBUF, 1, H, F32, 1)
    b.tensor_copy(rlt.ap(), rlt_ps.ap())
    for g, (h0, hn) in enumerate(groups):
        o = b.tile(f"do{g}", Memory.PSUM, 1, per_bank * Dv, F32, 1)
        for h in range(h0, h0 + hn):
            for j in range(nch):
                w = min(128, Sk - j * 128)
                b.matmul(o.ap(elem_offset=(h - h0) * Dv, dims=((1, Dv),)),
                         ptv.ap(w, elem_offset=j * H + h, dims=((1, 1),)),
                         vt.ap(w, elem_offset=(h * nch + j) * Dv, dims=((1, Dv),)), start_when=(j,))
            if extra is not None:
                vn, pn = extra
                b.matmul(o.ap(elem_offset=(h - h0) * Dv, dims=((1, Dv),)),
                         pn.ap(1, elem_offset=h, dims=((1, 1),)),
                         vn.ap(1, elem_offset=h * Dv, dims=((1, Dv),)), start_when=(1,))
        wt = b.tile(f"dw{g}", Memory.SBUF, 1, per_bank * Dv, _out_dtype(out), 1)
        b.tensor_tensor(wt.ap(dims=((Dv, hn), (1, Dv))), o.ap(dims=((Dv, hn), (1, Dv))),
                        rlt.ap(elem_offset=h0, dims=((1, hn), (0, Dv))), AluOp.MULTIPLY)
        so = out.strides if not isinstance(out, _SbufOut) else (0, 0, 0)
        _store(b, out, outer, h0, 1, 0, ((hn, so[-3]), (Dv, so[-1])),
               wt.ap(dims=((Dv, hn), (1, Dv))))


def _products_by_columns(b: TirBuilder, out, outer, H: int, Sk: int, Dv: int, vt, ptv, rl,
                         extra) -> None:
    """O^T[u Dv + d, h] += V_{h}[j][:, d] . P^T_j[:, h] for the ``nh`` heads h = h0 + u of a
    block (V chunk j of head h at (h nch + j) Dv): one product
    per block and chunk streams nh columns with nh Dv stationary columns (the rows form streams
    Dv columns per head). Only column h of head h's partitions is kept; 1 / l reaches every
    partition by a product (ones^T @ diag(1 / l)); out[h, d] = O^T[u Dv + d, h] / l_h, per half
    u (heads u, u + nh, ...) transposed back to one row per head and stored row by row."""
    nch = -(-Sk // 128)
    nh = 2 if Dv in (32, 64) else 1
    P = nh * Dv
    ot = b.tile("dot", Memory.PSUM, P, H, F32, 1)
    for h0 in range(0, H, nh):
        hn = min(nh, H - h0)
        for j in range(nch):
            w = min(128, Sk - j * 128)
            b.matmul(ot.ap(hn * Dv, elem_offset=h0, dims=((1, hn),)),
                     vt.ap(w, elem_offset=(h0 * nch + j) * Dv, dims=((nch * Dv, hn), (1, Dv))),
                     ptv.ap(w, elem_offset=j * H + h0, dims=((1, hn),)), start_when=(j,))
        if extra is not None:
            vn, pn = extra
            b.matmul(ot.ap(hn * Dv, elem_offset=h0, dims=((1, hn),)),
                     vn.ap(1, elem_offset=h0 * Dv, dims=((1, hn * Dv),)),
                     pn.ap(1, elem_offset=h0, dims=((1, hn),)), start_when=(1,))
    # 1 / l on every partition: rlb[p, h] = sum_k ones[k, p] (k == h) / l_k
    ex = b.tile("dex", Memory.SBUF, H, H, F32, 1)
    b.iota(ex.ap(), 0, 1, (-1,))
    dg = b.tile("ddg", Memory.SBUF, H, H, F32, 1)
    b.tensor_scalar(dg.ap(), ex.ap(), AluOp.IS_EQUAL, 0.0, op1=AluOp.MULTIPLY, operand1=rl)
    ones = b.tile("d1", Memory.SBUF, H, P, F32, 1)
    b.memset(ones.ap(), 1.0)
    rlb = b.tile("drlb", Memory.PSUM, P, H, F32, 1)
    b.matmul(rlb.ap(), ones.ap(), dg.ap())
    slots = -(-H // nh)
    wt = b.tile("dw", Memory.SBUF, P, slots, _out_dtype(out), 1)
    so = out.strides if not isinstance(out, _SbufOut) else (0, 0, 0)
    row = _resident_row(b, out, outer, H, Dv) if nh == 2 and H % 2 == 0 else None
    for u in range(min(nh, H)):
        n_u = len(range(u, H, nh))
        hh = dict(partition_start=u * Dv)
        b.tensor_tensor(wt.ap(Dv, dims=((1, n_u),), **hh),
                        ot.ap(Dv, elem_offset=u, dims=((nh, n_u),), **hh),
                        rlb.ap(Dv, elem_offset=u, dims=((nh, n_u),), **hh), AluOp.MULTIPLY)
        if row is not None:
            continue
        # heads back on partitions (one row each), so the store moves whole rows
        tt = b.tile(f"dwt{u}", Memory.PSUM, n_u, Dv, wt.dtype, 1)
        b.transpose(tt.ap(), wt.ap(Dv, dims=((1, n_u),), **hh))
        rows = b.tile(f"dwr{u}", Memory.SBUF, n_u, Dv, wt.dtype, 1)
        b.tensor_copy(rows.ap(), tt.ap())
        _store(b, out, outer, u, n_u, nh * so[-3], ((Dv, so[-1]),), rows.ap())
    if row is not None:
        # an output row resident in SBUF (the next matmul's input): column j of ``wt`` (heads
        # 2j and 2j + 1) is the row's elements 2j Dv .. (2j + 2) Dv, so one transpose per pair
        # into one PSUM row and one copy into the resident row, no SBUF -> SBUF DMA (on the
        # chain, behind the weight stream on the in-order DMA engines)
        ps = b.tile("dwrow", Memory.PSUM, 1, H * Dv, wt.dtype, 1)
        for j in range(slots):
            b.transpose(ps.ap(1, elem_offset=j * P, dims=((1, P),)),
                        wt.ap(P, elem_offset=j, dims=((1, 1),)))
        b.tensor_copy(row, ps.ap())


def _resident_row(b: TirBuilder, out, outer, H: int, Dv: int):
    """The attention's output [*B, H, 1, Dv] as one SBUF row [1, H Dv] when it is resident and
    its heads lie back to back; else None (stored by DMA)."""
    if isinstance(out, _SbufOut) or not Q_BY_TRANSPOSES or out.strides[-1] != 1 \
            or out.strides[-3] != Dv:
        return None
    return b.resident_view(hbm_ap(out.buffer, out.dtype, _boff(out, outer + (aff(0),)), 1, 0,
                                  ((H * Dv, 1),)), 1)


def _load_v_head(b: TirBuilder, V, bidx, Sk: int, Dv: int, vt, off: int) -> None:
    """V of one head, [128 keys, chunk j at j * Dv], into ``vt`` from element ``off``: one DMA
    when every chunk has 128 keys."""
    base = _boff(V, bidx)
    nch = -(-Sk // 128)
    rs = V.strides[-2]
    if Sk % 128 == 0 and Sk > 128:
        b.dma(vt.ap(128, elem_offset=off, dims=((Dv, nch), (1, Dv))),
              hbm_ap(V.buffer, V.dtype, base, 128, rs, ((nch, 128 * rs), (Dv, V.strides[-1]))))
        return
    for j in range(nch):
        w = min(128, Sk - j * 128)
        b.dma(vt.ap(w, elem_offset=off + j * Dv, dims=((1, Dv),)),
              hbm_ap(V.buffer, V.dtype, base + j * 128 * rs, w, rs, ((Dv, V.strides[-1]),)))


def _position_masks(b: TirBuilder, PK, PV, H: int, Sk: int, pdt):
    """From the positions (int32, one element each): ``onek`` [H, Sk], 1 at key pos_k on every
    row; keys on partitions (key p + 128 c at [p, c]), ``onev`` and ``keepv`` [128, chunks], 1
    at key pos_v and 1 elsewhere. Compared in fp32 (exact for every key index). Without
    ``PK`` (the value row only) ``onek`` is None."""
    nch, w0 = -(-Sk // 128), min(Sk, 128)
    out = [] if PK is not None else [None]
    for name, r, p, steps in (("k", PK, H, (1,)), ("v", PV, w0, (128,))):
        if r is None:
            continue
        n = Sk if name == "k" else nch
        ix = b.tile(f"dix{name}", Memory.SBUF, p, n, F32, 1)
        b.iota(ix.ap(), 0, 0 if name == "k" else 1, steps)      # first: waits for nothing
        pi = b.tile(f"dp{name}i", Memory.SBUF, p, 1, r.dtype, 1)
        b.dma(pi.ap(), hbm_ap(r.buffer, r.dtype, r.offset, p, 0, ()))
        pf = b.tile(f"dp{name}", Memory.SBUF, p, 1, F32, 1)
        b.tensor_copy(pf.ap(), pi.ap())
        for op in ((AluOp.IS_EQUAL,) if name == "k" else (AluOp.IS_EQUAL, AluOp.NOT_EQUAL)):
            m = b.tile(f"d{op.value}{name}", Memory.SBUF, p, n, pdt, 1)
            b.tensor_scalar(m.ap(), ix.ap(), op, pf.ap(), engines=(EngineKind.VECTOR,))
            out.append(m)
    return tuple(out)
