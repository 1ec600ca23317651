"""Fusion of the attention pattern into one ATTENTION kernel (kernel IR).

    S = Q @ KT [epilogue e1]      MATMUL over [*B, Sq, D] @ [*B, D, Sk]
    P = softmax(S, dim=-1)        SOFTMAX
   [P = where(any(S != -inf), P, 0)]   torch's _safe_softmax: a ne/any/where triple
    O = P @ V [epilogue e2]       MATMUL over [*B, Sq, Sk] @ [*B, Sk, Dv]

becomes ``O = attention(Q, KT, V)`` (``kir.AttentionKAttrs``) whose tiler keeps every score in
SBUF/PSUM (online softmax over key blocks). The operands may be produced by POINTWISE kernels
that only cast and scale a tensor (SDPA scales q and k by sqrt(scale) each, in fp32): the
kernel reads the tensor itself and folds the constants into the score scale.

Refused fusions keep the kernels as they are and record why (``why``, printed in the dump).

Invariants
- Every fused intermediate (S, P, the cast/scale copies) is a TEMP tensor that nothing else
  reads; the ATTENTION kernel computes the same values up to rounding: scores stay fp32 (eager
  rounds them to the input dtype between ops) and the probabilities are rounded to the value
  dtype for the second product (``p_dtype``).
- The epilogue of the first product must be a scale, a cast to a float type, or an expression
  of the product and full-shape loads (masks); it becomes the score expression.
"""
from __future__ import annotations

from lowering.kir import (ATTENTION_MAX_DV, AttentionKAttrs, EOp, Expr, KKind, KOp, KProgram,
                          ReduceOp, Role, TensorRef, contiguous_strides, one_batch_form, reindex_batch,
                          view_as)
from runtime_sim.isa import DType


def _readers(kp: KProgram) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, k in enumerate(kp.kernels):
        for r in k.ins:
            out.setdefault(r.buffer, []).append(i)
    return out


def _writers(kp: KProgram) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, k in enumerate(kp.kernels):
        for r in k.outs:
            out.setdefault(r.buffer, []).append(i)
    return out


def _whole(kp: KProgram, r: TensorRef) -> bool:
    return r.offset == 0 and r.is_contiguous() and r.numel == kp.buffers[r.buffer].numel


def _scaled_source(kp, readers, writers, ref: TensorRef, user: int):
    """If ``ref`` is the whole output of a POINTWISE ``c * cast(x)`` / ``cast(x)`` / ``x`` of a
    float tensor read only by kernel ``user``: (x viewed as ``ref``, c, producer index)."""
    ws = writers.get(ref.buffer, [])
    if (kp.buffers[ref.buffer].role is not Role.TEMP or len(ws) != 1
            or readers.get(ref.buffer) != [user]):
        return None
    p = kp.kernels[ws[0]]
    if p.kind is not KKind.POINTWISE or not _whole(kp, p.outs[0]):
        return None
    e, c = p.attrs.expr, 1.0
    if e.op is EOp.MUL:
        a, b = e.args
        if b.op is EOp.CONST:
            e, c = a, b.value
        elif a.op is EOp.CONST:
            e, c = b, a.value
        else:
            return None
    while e.op is EOp.CAST and e.args[0].dtype.is_float and e.dtype.itemsize >= e.args[0].dtype.itemsize:
        e = e.args[0]
    if e.op is not EOp.LOAD or not p.ins[e.index].dtype.is_float:
        return None
    src = view_as(p.ins[e.index], ref.shape) if p.ins[e.index].shape != ref.shape else p.ins[e.index]
    if src is None or ref.offset != 0 or ref.strides != contiguous_strides(ref.shape):
        return None
    return src, c, ws[0]


def _score_of(epi: Expr | None) -> tuple[float, Expr | None] | None:
    """The first product's epilogue as (scale, score expression): a scale and float casts fold
    into ``scale``; anything else stays an expression over ACC."""
    if epi is None:
        return 1.0, None
    e, c = epi, 1.0
    while True:
        if e.op is EOp.CAST and e.dtype.is_float:
            e = e.args[0]
        elif e.op is EOp.MUL and e.args[1].op is EOp.CONST:
            c *= e.args[1].value
            e = e.args[0]
        elif e.op is EOp.MUL and e.args[0].op is EOp.CONST:
            c *= e.args[0].value
            e = e.args[1]
        else:
            break
    if e.op is EOp.ACC:
        return c, None
    return 1.0, epi


def _index_affine(e: Expr, qa: int, ka: int) -> tuple[float, float, float] | None:
    """An expression of the query/key INDEX leaves (axes ``qa``, ``ka``) built from casts, adds,
    subtractions and products with constants, as (coefficient of q, of k, constant)."""
    if e.op is EOp.INDEX:
        return (1.0, 0.0, 0.0) if e.index == qa else (0.0, 1.0, 0.0) if e.index == ka else None
    if e.op is EOp.CONST:
        return (0.0, 0.0, e.value)
    if e.op is EOp.CAST:
        return _index_affine(e.args[0], qa, ka)
    if e.op in (EOp.ADD, EOp.SUB):
        a, b = (_index_affine(x, qa, ka) for x in e.args)
        if a is None or b is None:
            return None
        sg = 1.0 if e.op is EOp.ADD else -1.0
        return (a[0] + sg * b[0], a[1] + sg * b[1], a[2] + sg * b[2])
    if e.op is EOp.MUL:
        a, b = (_index_affine(x, qa, ka) for x in e.args)
        if a is None or b is None:
            return None
        if a[:2] == (0.0, 0.0):
            return (b[0] * a[2], b[1] * a[2], b[2] * a[2])
        if b[:2] == (0.0, 0.0):
            return (a[0] * b[2], a[1] * b[2], a[2] * b[2])
    return None


def _causal_offset(cond: Expr, qa: int, ka: int) -> int | None:
    """``cond`` true exactly when key ``k <= q + offset`` (integer indices): the offset."""
    while cond.op is EOp.AND:
        a, b = cond.args
        if b.op is EOp.CAST and b.args[0].op is EOp.CONST and b.args[0].value:
            cond = a
        elif a.op is EOp.CAST and a.args[0].op is EOp.CONST and a.args[0].value:
            cond = b
        else:
            return None
    if cond.op not in (EOp.LE, EOp.LT, EOp.GE, EOp.GT):
        return None
    x, y = (_index_affine(a, qa, ka) for a in cond.args)
    if x is None or y is None:
        return None
    cq, ck, c0 = x[0] - y[0], x[1] - y[1], x[2] - y[2]     # cond: cq q + ck k + c0 (op) 0
    if cond.op in (EOp.GE, EOp.GT):
        cq, ck, c0 = -cq, -ck, -c0
    if ck <= 0 or cq != -ck or (c0 / ck) != int(c0 / ck):
        return None
    off = -int(c0 / ck)                                     # k <= q + off  (or < for LT/GT)
    return off - 1 if cond.op in (EOp.LT, EOp.GT) else off


def _const(x: Expr):
    while x.op is EOp.CAST:
        x = x.args[0]
    return x.value if x.op is EOp.CONST else None


def _negated(cond: Expr) -> Expr | None:
    """``c`` when ``cond`` is ``not c`` (``eq(c, 0)`` or ``logical_not(c)``)."""
    if cond.op is EOp.LOGICAL_NOT:
        return cond.args[0]
    if cond.op is EOp.EQ and _const(cond.args[1]) == 0.0 and cond.args[0].dtype is DType.BOOL:
        return cond.args[0]
    return None


def _split_causal(score: Expr, rank: int) -> tuple[Expr | None, int] | None:
    """The causal forms the decompositions produce, as (unmasked score, offset):
    ``add(s, where(keep, 0, -inf))`` (SDPA's is_causal), ``where(keep, s, -inf)`` and
    ``where(not keep, -inf, s)`` (masked_fill with a tril mask), ``keep`` being k <= q + offset."""
    qa, ka = rank - 2, rank - 1
    if score.op is EOp.ADD:
        for s, m in (score.args, score.args[::-1]):
            if m.op is EOp.WHERE and _const(m.args[1]) == 0.0 and _const(m.args[2]) == float("-inf"):
                off = _causal_offset(m.args[0], qa, ka)
                if off is not None:
                    return s, off
    if score.op is EOp.WHERE:
        cond, t, f = score.args
        if _const(f) == float("-inf"):
            off = _causal_offset(cond, qa, ka)
            if off is not None:
                return t, off
        if _const(t) == float("-inf"):
            keep = _negated(cond)
            off = _causal_offset(keep, qa, ka) if keep is not None else None
            if off is not None:
                return f, off
    return None


def _is_not_neg_inf(e: Expr) -> bool:
    """``x != -inf`` in the forms the decompositions produce (``eq(eq(x, -inf), 0)``, ``ne``)."""
    if e.op is EOp.NE and e.args[0].op is EOp.LOAD and e.args[1].op is EOp.CONST:
        return e.args[1].value == float("-inf")
    if e.op is EOp.EQ and e.args[1].op is EOp.CONST and e.args[1].value == 0.0:
        inner = e.args[0]
        return (inner.op is EOp.EQ and inner.args[0].op is EOp.LOAD
                and inner.args[1].op is EOp.CONST and inner.args[1].value == float("-inf"))
    if e.op is EOp.LOGICAL_NOT:
        inner = e.args[0]
        return (inner.op is EOp.EQ and inner.args[0].op is EOp.LOAD
                and inner.args[1].op is EOp.CONST and inner.args[1].value == float("-inf"))
    return False


def _safe_fixup(kp, readers, writers, S: str, P: str, last: int):
    """The _safe_softmax triple on score buffer S and probabilities P: (kernel indices,
    output buffer of the where) or None."""
    ne = [i for i in readers.get(S, []) if kp.kernels[i].kind is KKind.POINTWISE
          and _is_not_neg_inf(kp.kernels[i].attrs.expr)]
    if len(ne) != 1:
        return None
    nk = kp.kernels[ne[0]]
    R = nk.outs[0].buffer
    red = readers.get(R, [])
    if len(red) != 1 or kp.kernels[red[0]].kind is not KKind.REDUCE:
        return None
    rk = kp.kernels[red[0]]
    if rk.attrs.op is not ReduceOp.MAX or rk.attrs.dims != (last,):
        return None
    A = rk.outs[0].buffer
    wh = readers.get(A, [])
    if len(wh) != 1 or readers.get(P) != wh:
        return None
    wk = kp.kernels[wh[0]]
    e = wk.attrs.expr if wk.kind is KKind.POINTWISE else None
    # where(any == 0, 0, P) or where(any, P, 0)
    if e is None or e.op is not EOp.WHERE:
        return None
    cond, t, f = e.args
    idx_p = next((j for j, r in enumerate(wk.ins) if r.buffer == P), None)
    idx_a = next((j for j, r in enumerate(wk.ins) if r.buffer == A), None)
    if idx_p is None or idx_a is None:
        return None

    def is_load(x, j):
        while x.op is EOp.CAST:
            x = x.args[0]
        return x.op is EOp.LOAD and x.index == j

    def is_zero(x):
        while x.op is EOp.CAST:
            x = x.args[0]
        return x.op is EOp.CONST and x.value == 0.0

    neg = cond.op is EOp.EQ and is_load(cond.args[0], idx_a) and is_zero(cond.args[1])
    pos = is_load(cond, idx_a)
    if not ((neg and is_zero(t) and is_load(f, idx_p)) or (pos and is_load(t, idx_p) and is_zero(f))):
        return None
    return [ne[0], red[0], wh[0]], wk.outs[0]


def fuse_attention(kp: KProgram, why: list[str] | None = None) -> bool:
    readers, writers = _readers(kp), _writers(kp)
    outputs = {r.buffer for r in kp.outputs}
    for si, sm in enumerate(kp.kernels):
        if sm.kind is not KKind.SOFTMAX or sm.attrs.log:
            continue
        X, Pref = sm.ins[0], sm.outs[0]
        last = X.rank - 1
        if sm.attrs.dim != last or not _whole(kp, X) or not _whole(kp, Pref):
            continue
        S, P = X.buffer, Pref.buffer
        w1 = writers.get(S, [])
        if len(w1) != 1 or kp.kernels[w1[0]].kind is not KKind.MATMUL or S in outputs or P in outputs:
            continue
        mi = w1[0]
        mm1 = kp.kernels[mi]
        if not _whole(kp, mm1.outs[0]):
            continue
        fix = None
        users_s = [u for u in readers.get(S, []) if u != si]
        p_users = readers.get(P, [])
        if users_s:
            fix = _safe_fixup(kp, readers, writers, S, P, last)
            if fix is None or set(users_s) != {fix[0][0]}:
                _why(why, sm, "the scores are read by something other than the softmax")
                continue
            P2 = fix[1]
            p_users = readers.get(P2.buffer, [])
            pbuf = P2
        else:
            pbuf = Pref
        if len(p_users) != 1 or kp.kernels[p_users[0]].kind is not KKind.MATMUL:
            _why(why, sm, "the probabilities are not read by exactly one matmul")
            continue
        m2i = p_users[0]
        mm2 = kp.kernels[m2i]
        if mm2.ins[0].buffer != pbuf.buffer or any(r.buffer == pbuf.buffer for r in mm2.ins[1:]):
            _why(why, sm, "the probabilities are not the first operand of the second matmul")
            continue
        if pbuf.buffer in outputs or mm2.ins[0].strides != contiguous_strides(mm2.ins[0].shape):
            continue
        sc = _score_of(mm1.attrs.epilogue)
        if sc is None:
            continue
        scale, score = sc
        causal, offset = False, 0
        if score is not None and not _has_loads(score):
            split = _split_causal(score, mm1.outs[0].rank)
            if split is not None:
                causal, offset = True, split[1]
                rest = _score_of(split[0])
                scale, score = rest if rest is not None else (1.0, split[0])
        q, k, v = mm1.ins[0], mm1.ins[1], mm2.ins[1]
        dead = [si, mi, m2i] + (fix[0] if fix else [])
        for j, ref in ((0, q), (1, k)):
            src = _scaled_source(kp, readers, writers, ref, mi)
            if src is not None:
                if j == 0:
                    q = src[0]
                else:
                    k = src[0]
                scale *= src[1]
                dead.append(src[2])
        vsrc = _scaled_source(kp, readers, writers, v, m2i)
        if vsrc is not None and vsrc[1] == 1.0:
            v = vsrc[0]
            dead.append(vsrc[2])
        if q.dtype != k.dtype or not q.dtype.is_float or not v.dtype.is_float:
            _why(why, sm, f"operand dtypes differ (q {q.dtype.value}, k {k.dtype.value})")
            continue
        if mm2.ins[2:]:
            _why(why, sm, "the second matmul's epilogue reads other tensors")
            continue
        if v.shape[-1] > ATTENTION_MAX_DV or 0 in q.shape or 0 in v.shape:
            _why(why, sm, f"value width {v.shape[-1]} is over {ATTENTION_MAX_DV} (an attention "
                          "kernel's output rows accumulate in one PSUM bank) or a side is empty: "
                          "the products and the softmax stay separate kernels")
            continue
        extra = tuple(mm1.ins[2:])
        out = mm2.outs[0]
        same = one_batch_form(out, (q, k, v) + extra)
        if same is None:
            _why(why, sm, "the operands' batch axes have no common form (a broadcast head axis "
                          "that cannot be merged)")
            continue
        out, (q, k, v, *rest) = same
        extra = tuple(rest)
        # the score and the epilogue index the products' own axes; the kernel indexes its batch
        # form's (grouped-query heads: [N*H, Sq, Sk] products, an [N, Hkv, G, Sq, Dv] kernel)
        score_shape = out.shape[:-2] + mm1.outs[0].shape[-2:]
        score_ok = score is None or reindex_batch(score, mm1.outs[0].shape, score_shape)
        epilogue = reindex_batch(mm2.attrs.epilogue or Expr(EOp.ACC), mm2.outs[0].shape, out.shape)
        if score_ok is None or epilogue is None:
            _why(why, sm, "an expression indexes batch axes that the operands' common batch "
                          "form does not have")
            continue
        score = None if score is None else score_ok
        p_dtype = v.dtype if v.dtype.itemsize <= 2 else DType.FP32
        attrs = AttentionKAttrs(scale, score, causal, offset, fix is not None, epilogue, p_dtype)
        origin = tuple(o for i in sorted(dead) for o in kp.kernels[i].origin)
        new = KOp(KKind.ATTENTION, (out,), (q, k, v) + extra, attrs, origin)
        bufs = {r.buffer for i in dead for r in kp.kernels[i].outs} - {out.buffer}
        kp.kernels[m2i] = new
        for i in sorted(set(dead) - {m2i}, reverse=True):
            del kp.kernels[i]
        for bname in bufs:
            if bname not in outputs and not any(r.buffer == bname for kk in kp.kernels for r in kk.ins):
                kp.buffers.pop(bname, None)
        return True
    return False


def _has_loads(e: Expr) -> bool:
    return e.op is EOp.LOAD or any(_has_loads(a) for a in e.args)


def _why(why: list[str] | None, k: KOp, reason: str) -> None:
    if why is not None:
        line = f"WhyNoFuse attention at {','.join(k.origin)}: {reason}"
        if line not in why:
            why.append(line)


def drop_dead_kernels(kp: KProgram) -> bool:
    """Remove kernels whose outputs are TEMP tensors nothing reads."""
    readers = _readers(kp)
    outputs = {r.buffer for r in kp.outputs}
    for i in range(len(kp.kernels) - 1, -1, -1):
        k = kp.kernels[i]
        if all(kp.buffers[r.buffer].role is Role.TEMP and r.buffer not in outputs
               and not readers.get(r.buffer) for r in k.outs):
            del kp.kernels[i]
            for r in k.outs:
                kp.buffers.pop(r.buffer, None)
            return True
    return False

