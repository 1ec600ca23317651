"""The fusion rules of ``fusion.py`` that live on the kernel graph itself: pointwise into
pointwise (rule 1), pointwise into a matmul epilogue (2), copies into batched matmuls (4),
pointwise into an attention epilogue (6) and reading through copies (7). ``fusion.fuse`` runs
them with the rules of ``attention.py`` and ``patterns.py`` to a fixed point; ``fusion_why.py``
asks ``chain_plan`` and ``epilogue_plan`` again to explain a refusal.

Each rule is a function ``KProgram -> bool`` that changes the program in place and says whether
it did. ``readers_of`` / ``writers_of`` / ``drop_unused_inputs`` are the kernel-graph helpers the
rules share with ``fusion_why.py`` and ``patterns.py``.

Invariants
- A fused producer disappears only when every reader inlined it and it is not a graph output.
- Inlining never changes rounding: every expression node keeps the dtype of its ATen op.
- Expressions stay below ``MAX_EXPR`` nodes (recomputation is bounded).
"""
from __future__ import annotations

import math
from dataclasses import replace

from lowering.kir import (AttentionKAttrs, EOp, Expr, KKind, KOp, KProgram, MatmulKAttrs,
                          PointwiseAttrs, Role, TensorRef, contiguous_strides, has_index,
                          reindex_batch, view_as)

MAX_EXPR = 48
# rule 1's bound on recomputation: inlining repeats the producer's operations for every element
# its readers compute, materialising computes them once and adds one write and one read per
# reader element. With 4 or more operations and 8 times more reader elements than producer
# elements, inlining does at least 3x the work (4 ops x 8N against 4 ops x N + N + 8N reads).
RECOMPUTE_MIN_OPS = 4
RECOMPUTE_FACTOR = 8


def _kernels_by_buffer(kp: KProgram, side: str) -> dict[str, list[int]]:
    """buffer -> indices of the kernels that read it (``side="ins"``) or write it ("outs")."""
    out: dict[str, list[int]] = {}
    for i, k in enumerate(kp.kernels):
        for r in getattr(k, side):
            out.setdefault(r.buffer, []).append(i)
    return out


def readers_of(kp: KProgram) -> dict[str, list[int]]:
    return _kernels_by_buffer(kp, "ins")


def writers_of(kp: KProgram) -> dict[str, list[int]]:
    return _kernels_by_buffer(kp, "outs")


def _is_whole(kp: KProgram, ref: TensorRef) -> bool:
    return ref.offset == 0 and ref.is_contiguous() and ref.numel == kp.buffers[ref.buffer].numel


def _axis_map(view: TensorRef, src_shape: tuple[int, ...]) -> list[int | None] | None:
    """``view`` reads a contiguous tensor of ``src_shape``. For each axis of the view, return
    the producer axis it walks (None: broadcast, stride 0, or size 1), or None if the view is
    not such an axis-wise selection starting at element 0."""
    if view.offset != 0:
        return None
    cs = contiguous_strides(src_shape)
    out: list[int | None] = []
    used: set[int] = set()
    for n, st in zip(view.shape, view.strides):
        if n == 1 or st == 0:
            out.append(None)
            continue
        dx = next((a for a in range(len(src_shape)) if cs[a] == st and src_shape[a] >= n
                   and src_shape[a] > 1 and a not in used), None)
        if dx is None:
            return None
        used.add(dx)
        out.append(dx)
    return out


def _rebase(amap: list[int | None], shape: tuple[int, ...], inner: TensorRef) -> TensorRef:
    strides = tuple(0 if a is None else inner.strides[a] for a in amap)
    return TensorRef(inner.buffer, inner.dtype, shape, strides, inner.offset)


def _map_index(expr: Expr, amap: list[int | None]) -> Expr:
    """Producer INDEX(a) -> consumer INDEX(d) for the consumer axis walking a; 0 otherwise."""
    if expr.op is EOp.INDEX:
        d = next((d for d, a in enumerate(amap) if a == expr.index), None)
        return Expr(EOp.CONST, (), expr.dtype, 0, 0.0) if d is None else replace(expr, index=d)
    if not expr.args:
        return expr
    return replace(expr, args=tuple(_map_index(a, amap) for a in expr.args))


def _inline(consumer: KOp, j_list: list[int], producer: KOp) -> KOp | None:
    """Replace LOAD j (j in j_list, all reading the producer's output) in the consumer."""
    assert isinstance(producer.attrs, PointwiseAttrs)
    ins = list(consumer.ins)
    pexpr = producer.attrs.expr
    src_shape = producer.outs[0].shape
    subst: dict[int, Expr] = {}
    for j in j_list:
        view = consumer.ins[j]
        amap = _axis_map(view, src_shape)
        if amap is None:
            return None
        mapping: dict[int, int] = {}
        for pi in sorted(pexpr.loads()):
            mapping[pi] = len(ins)
            ins.append(_rebase(amap, view.shape, producer.ins[pi]))
        e = pexpr.map_loads(lambda x, m=mapping: replace(x, index=m[x.index]))
        subst[j] = _map_index(e, amap)
    if isinstance(consumer.attrs, PointwiseAttrs):
        expr = consumer.attrs.expr.map_loads(lambda x: subst.get(x.index, x))
        if expr.size() > MAX_EXPR:
            return None
        attrs = PointwiseAttrs(expr)
    else:
        return None
    return KOp(consumer.kind, consumer.outs, tuple(ins), attrs, consumer.origin + producer.origin)


def _indices_of(ins: tuple[TensorRef, ...], buf: str) -> list[int]:
    return [i for i, r in enumerate(ins) if r.buffer == buf]


def fuse_pointwise_chains(kp: KProgram) -> bool:
    """Inline every pointwise producer of a temporary into its pointwise readers, in one scan
    (after a fusion the scan goes on at the same position, with the reader maps rebuilt)."""
    readers, writers = readers_of(kp), writers_of(kp)
    outputs = {r.buffer for r in kp.outputs}
    changed = False
    pi = 0
    while pi < len(kp.kernels):
        why, new = chain_plan(kp, pi, readers, writers, outputs)
        pi += 1
        if why is not None:
            continue
        X = kp.kernels[pi - 1].outs[0].buffer
        for u, k in new.items():
            kp.kernels[u] = drop_unused_inputs(k)
        pi -= 1
        del kp.kernels[pi]
        del kp.buffers[X]
        readers, writers = readers_of(kp), writers_of(kp)
        changed = True
    return changed


def chain_plan(kp: KProgram, pi: int, readers, writers, outputs) -> tuple[str | None, dict]:
    """(None, {reader index: fused reader}) when kernel ``pi`` inlines into all its readers
    (rule 1), else (why not, {})."""
    prod = kp.kernels[pi]
    if prod.kind is not KKind.POINTWISE or len(prod.outs) != 1:
        return "the producer is not a single-output pointwise kernel", {}
    X = prod.outs[0].buffer
    if X in outputs:
        return f"%{X} is a graph output", {}
    if kp.buffers[X].role is not Role.TEMP:
        return f"%{X} is not a temporary", {}
    if len(writers.get(X, [])) != 1:
        return f"%{X} has {len(writers.get(X, []))} writers", {}
    if not _is_whole(kp, prod.outs[0]):
        return f"the producer writes a view of %{X}, not all of it", {}
    users = readers.get(X, [])
    if not users:
        return f"nothing reads %{X}", {}
    other = sorted({kp.kernels[u].kind.name.lower() for u in users} - {"pointwise"})
    if other:
        return (f"%{X} is read by a {'/'.join(other)} kernel (a pointwise producer is inlined "
                f"only into pointwise readers, all of them)"), {}
    ops = _operations(prod.attrs.expr)
    reads = sum(kp.kernels[u].outs[0].numel for u in set(users))
    # a function of the output coordinates alone (a causal mask from iota) stays inlined: the
    # attention tiler recognises such masks and skips whole key blocks by them
    if (prod.attrs.expr.loads() and ops >= RECOMPUTE_MIN_OPS
            and reads >= RECOMPUTE_FACTOR * kp.buffers[X].numel):
        return (f"computing %{X} once ({ops} operations on {kp.buffers[X].numel} elements) costs "
                f"less than recomputing it for its readers' {reads} elements"), {}
    new = {}
    for u in set(users):
        fused = _inline(kp.kernels[u], _indices_of(kp.kernels[u].ins, X), prod)
        if fused is None:
            return (f"{','.join(kp.kernels[u].origin)} reads %{X} through a view the producer "
                    f"cannot be re-indexed to, or the fused expression would exceed {MAX_EXPR} "
                    f"nodes"), {}
        new[u] = fused
    return None, new


def _operations(e: Expr) -> int:
    """Operations of an expression: its nodes that are not leaves (loads, constants, indices)."""
    return 0 if not e.args else 1 + sum(_operations(a) for a in e.args)


def drop_unused_inputs(k: KOp) -> KOp:
    """Drop inputs the expression no longer loads and merge equal views (a tensor the
    expression reads several times through the same view is loaded once per tile)."""
    if not isinstance(k.attrs, PointwiseAttrs):
        return k
    ins: list[TensorRef] = []
    remap: dict[int, int] = {}
    for old in sorted(k.attrs.expr.loads()):
        r = k.ins[old]
        if r not in ins:
            ins.append(r)
        remap[old] = ins.index(r)
    expr = k.attrs.expr.map_loads(lambda x: replace(x, index=remap[x.index]))
    return KOp(k.kind, k.outs, tuple(ins), PointwiseAttrs(expr), k.origin)


def fuse_matmul_epilogues(kp: KProgram) -> bool:
    readers, writers = readers_of(kp), writers_of(kp)
    outputs = {r.buffer for r in kp.outputs}
    for mi in range(len(kp.kernels)):
        why, fused, ui = epilogue_plan(kp, mi, readers, writers, outputs)
        if why is None:
            X = kp.kernels[mi].outs[0].buffer
            kp.kernels[mi] = fused
            del kp.kernels[ui]
            del kp.buffers[X]
            return True
    return False


def epilogue_plan(kp: KProgram, mi: int, readers, writers, outputs):
    """(None, fused matmul, consumer index) when matmul ``mi`` takes its pointwise consumer as
    its epilogue (rule 2), else (why not, None, None)."""
    mm = kp.kernels[mi]
    no = (None, None)
    if mm.kind is not KKind.MATMUL:
        return ("the producer is not a matmul",) + no
    X = mm.outs[0].buffer
    if X in outputs:
        return (f"%{X} is a graph output",) + no
    if kp.buffers[X].role is not Role.TEMP or len(writers.get(X, [])) != 1:
        return (f"%{X} is not a temporary with one writer",) + no
    users = sorted(set(readers.get(X, [])))
    if len(users) != 1:
        return (f"%{X} has {len(users)} readers (an epilogue takes the only one)",) + no
    c = kp.kernels[users[0]]
    js = _indices_of(c.ins, X)
    if c.kind is not KKind.POINTWISE or users[0] < mi:
        return (f"its reader is a {c.kind.name.lower()} kernel, not a pointwise one",) + no
    cout = c.outs[0]
    if not _is_whole(kp, cout) or cout.numel != mm.outs[0].numel:
        return ("the reader's output is not one element per matmul output element",) + no
    if any(c.ins[j].shape != cout.shape or not _is_whole(kp, c.ins[j]) for j in js):
        return (f"the reader takes %{X} through a view (a broadcast, slice or transpose)",) + no
    mm = _batch_split_for(mm, c, js)
    # matmul output is [B, M, N]; the consumer works on the same elements in its own shape
    out3 = TensorRef(cout.buffer, cout.dtype, mm.outs[0].shape, mm.outs[0].strides, 0)
    ins = list(mm.ins)
    remap: dict[int, int] = {}
    for ci, r in enumerate(c.ins):
        if ci in js:
            continue
        if r.shape != cout.shape or any(w > mi for w in writers.get(r.buffer, ())):
            return (f"the reader's other input %{r.buffer} is broadcast or written after the "
                    f"matmul",) + no
        r3 = _reshape_view(r, cout.shape, mm.outs[0].shape)
        if r3 is None:
            return (f"the reader's other input %{r.buffer} has no view over the matmul's axes",) + no
        remap[ci] = len(ins)
        ins.append(r3)
    mm_epi = mm.attrs.epilogue or Expr(EOp.ACC)
    cexpr = reindex_batch(c.attrs.expr, cout.shape, mm.outs[0].shape)
    if cexpr is None:
        return ("the reader indexes batch axes the matmul's epilogue does not have",) + no
    expr = cexpr.map_loads(lambda x: mm_epi if x.index in js else replace(x, index=remap[x.index]))
    if expr.size() > MAX_EXPR:
        return (f"the epilogue would exceed {MAX_EXPR} expression nodes",) + no
    return None, KOp(KKind.MATMUL, (out3,), tuple(ins), MatmulKAttrs(expr), mm.origin + c.origin), users[0]


def _batch_split_for(mm: KOp, c: KOp, js) -> KOp:
    """``mm`` with its one merged batch axis split into the consumer's leading axes when one of
    the consumer's other inputs has a view over the split axes only (a mask [N, 1, S, S]
    broadcast over the heads of scores [N*H, S, S]: stride 0 along H has no single stride over
    N*H), else ``mm`` unchanged. Any [Bt, X, Y] ref has one stride along Bt, so the split is a
    view of the same bytes."""
    shape3, cout = mm.outs[0].shape, c.outs[0]
    nb = cout.shape[:-2]
    if (len(shape3) != 3 or len(nb) < 2 or cout.shape[-2:] != shape3[1:]
            or math.prod(nb) != shape3[0]):
        return mm
    others = [r for ci, r in enumerate(c.ins) if ci not in js]
    if all(_reshape_view(r, cout.shape, shape3) is not None for r in others):
        return mm
    if any(_reshape_view(r, cout.shape, nb + shape3[1:]) is None for r in others):
        return mm
    return _with_split_batch(mm, nb) or mm


def _with_split_batch(mm: KOp, nb: tuple[int, ...], ins: dict[int, TensorRef] | None = None):
    """``mm`` with its one batch axis viewed as ``nb`` axes: its output and inputs by
    ``_split_batch`` (input j replaced by ``ins[j]`` where given), its epilogue reindexed; None
    when the epilogue indexes the merged batch axis (it has no single axis in the split form)."""
    epi = mm.attrs.epilogue
    if epi is not None:
        epi = reindex_batch(epi, mm.outs[0].shape, nb + mm.outs[0].shape[1:])
        if epi is None:
            return None
    ins = ins or {}
    return KOp(KKind.MATMUL, (_split_batch(mm.outs[0], nb),),
               tuple(ins[j] if j in ins else _split_batch(r, nb) for j, r in enumerate(mm.ins)),
               MatmulKAttrs(epi), mm.origin)


def _reshape_view(r: TensorRef, shape: tuple[int, ...], shape3: tuple[int, ...]) -> TensorRef | None:
    """View ``r`` (of ``shape``) as ``shape3`` (the matmul's [*B, M, N]) when PyTorch could."""
    if shape == shape3:
        return r
    return view_as(r, shape3)


def _split_batch(r: TensorRef, nb: tuple[int, ...]) -> TensorRef:
    """View the single batch axis of a [Bt, X, Y] ref as ``nb`` axes (uniform stride)."""
    sb = r.strides[0]
    inner = contiguous_strides(nb)
    return TensorRef(r.buffer, r.dtype, nb + r.shape[1:], tuple(sb * s for s in inner) + r.strides[1:],
                     r.offset)


def absorb_copies_into_matmul(kp: KProgram) -> bool:
    """A contiguous copy made only to give a batched matmul a mergeable batch axis (e.g. q, k, v
    after ``view(B, T, H, D).transpose(1, 2)``) is dropped: the matmul reads the strided source
    directly, with the copy's leading axes as its batch axes."""
    readers, writers = readers_of(kp), writers_of(kp)
    outputs = {r.buffer for r in kp.outputs}
    for mi, mm in enumerate(kp.kernels):
        if mm.kind is not KKind.MATMUL or mm.outs[0].rank != 3:
            continue
        nb: tuple[int, ...] | None = None
        repl: dict[int, tuple[int, TensorRef]] = {}
        for j in (0, 1):
            v = mm.ins[j]
            C = v.buffer
            ws = writers.get(C, [])
            if (C in outputs or kp.buffers[C].role is not Role.TEMP or len(ws) != 1
                    or readers.get(C) != [mi] or v.offset != 0
                    or v.strides != contiguous_strides(v.shape)):
                continue
            p = kp.kernels[ws[0]]
            if p.kind is not KKind.POINTWISE or not _is_whole(kp, p.outs[0]):
                continue
            e = p.attrs.expr
            src = p.outs[0]
            if e.op is not EOp.LOAD or e.dtype != src.dtype or p.ins[0].dtype != src.dtype:
                continue
            shp = src.shape
            if len(shp) < 4 or shp[-2:] != v.shape[1:] or math.prod(shp[:-2]) != v.shape[0]:
                continue
            if nb is not None and nb != shp[:-2]:
                continue
            nb = shp[:-2]
            repl[j] = (ws[0], p.ins[0])
        if not repl:
            continue
        split = _with_split_batch(mm, nb, {j: src for j, (_, src) in repl.items()})
        if split is None:
            continue
        kp.kernels[mi] = split
        for pi, _ in sorted(repl.values(), reverse=True):
            del kp.buffers[kp.kernels[pi].outs[0].buffer]
            del kp.kernels[pi]
        return True
    return False


def fuse_attention_epilogues(kp: KProgram) -> bool:
    """6. above: ``y = f(permute(attention(...)))`` -> ``attention(..., epilogue=f)`` writing y."""
    readers, writers = readers_of(kp), writers_of(kp)
    outputs = {r.buffer for r in kp.outputs}
    for ai, at in enumerate(kp.kernels):
        if at.kind is not KKind.ATTENTION or not isinstance(at.attrs, AttentionKAttrs):
            continue
        aout = at.outs[0]
        X = aout.buffer
        if (X in outputs or kp.buffers[X].role is not Role.TEMP or len(writers.get(X, [])) != 1
                or not _is_whole(kp, aout)):
            continue
        users = sorted(set(readers.get(X, [])))
        if len(users) != 1 or users[0] < ai:
            continue
        c = kp.kernels[users[0]]
        if c.kind is not KKind.POINTWISE or not isinstance(c.attrs, PointwiseAttrs):
            continue
        cout = c.outs[0]
        if (len(set(c.ins)) != 1 or c.ins[0].buffer != X or not _is_whole(kp, cout)
                or cout.numel != aout.numel or has_index(c.attrs.expr)):
            continue
        amap = _axis_map(c.ins[0], aout.shape)
        if amap is None:
            continue
        # a bijection: every attention axis of size > 1 walked by exactly one consumer axis
        strides = [0] * aout.rank
        walked = {a for a in amap if a is not None}
        if any(aout.shape[a] > 1 and a not in walked for a in range(aout.rank)):
            continue
        for d, a in enumerate(amap):
            if a is not None:
                if c.ins[0].shape[d] != aout.shape[a]:
                    break
                strides[a] = cout.strides[d]
        else:
            out = TensorRef(cout.buffer, cout.dtype, aout.shape, tuple(strides), cout.offset)
            expr = c.attrs.expr.map_loads(lambda x: at.attrs.epilogue)
            kp.kernels[ai] = KOp(KKind.ATTENTION, (out,), at.ins, replace(at.attrs, epilogue=expr),
                                 at.origin + c.origin)
            del kp.kernels[users[0]]
            del kp.buffers[X]
            return True
    return False


def _is_copy(k: KOp) -> bool:
    """A POINTWISE kernel whose output is exactly its one input (casts to the same dtype)."""
    if k.kind is not KKind.POINTWISE or not isinstance(k.attrs, PointwiseAttrs) or len(k.ins) != 1:
        return False
    e = k.attrs.expr
    while e.op is EOp.CAST and e.dtype == k.ins[0].dtype:
        e = e.args[0]
    return e.op is EOp.LOAD and k.outs[0].dtype == k.ins[0].dtype


def read_through_copies(kp: KProgram) -> bool:
    """7. above."""
    writers = writers_of(kp)
    for ci, c in enumerate(kp.kernels):
        if not _is_copy(c) or not _is_whole(kp, c.outs[0]):
            continue
        Y, src = c.outs[0].buffer, c.ins[0]
        if len(writers.get(Y, [])) != 1 or len(writers.get(src.buffer, [])) > 1 or \
                any(w > ci for w in writers.get(src.buffer, [])):
            continue
        for ai in range(ci + 1, len(kp.kernels)):
            at = kp.kernels[ai]
            if at.kind is not KKind.ATTENTION or all(r.buffer != Y for r in at.ins):
                continue
            ins = list(at.ins)
            for j, r in enumerate(at.ins):
                if r.buffer == Y:
                    amap = _axis_map(r, c.outs[0].shape)
                    if amap is None:
                        break
                    ins[j] = _rebase(amap, r.shape, src)
            else:
                kp.kernels[ai] = KOp(at.kind, at.outs, tuple(ins), at.attrs, at.origin)
                return True
    return False

