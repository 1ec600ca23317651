"""Decode attention reads the KV cache before its one-row update (kernel IR -> kernel IR, after
``update_inputs_in_place``).

A decode step writes its new key and value rows into the static cache (two SCATTER kernels, one
row per head at the runtime position ``cache_position``), then attends over the whole cache. In
that order the attention's cache loads (3 MB per layer for gpt2-small over 1024 tokens) wait
for the scatters, which wait for the QKV projection: the loads sit on the layer's critical path.
Every cache row but the one being written is the same before and after the update, so here the
attention reads the cache as it was, plus the new rows themselves and the two positions
(``AttentionKAttrs.new_kv``; the decode tiler puts the new rows in by value at run time), and the
scatters move after it. Its cache loads then depend on nothing the layer computes and overlap
the kernels before it::

    C_k[i, pos_k, :] = kn[i]             O = attention(Q, C_k^T, C_v, *extra, kn, vn, pos_k, pos_v)
    C_v[i, pos_v, :] = vn[i]       ->    C_k[i, pos_k, :] = kn[i]
    O = attention(Q, C_k^T, C_v, *extra) C_v[i, pos_v, :] = vn[i]

Invariants
- Applies to an ATTENTION kernel that the decode tiler takes with the new rows
  (``attention.decode.decode_fits``) whose KT and V buffers (two different ones) were last
  written, before it, by a SCATTER each (``_row_update``): not accumulating; one index value for
  every lookup (the index view's axes of size > 1 have stride 0); its table a ``(*I, V, D)`` view
  whose lookups are the attention's batch items in row-major order (lookup t's row slice starts
  where the attention's batch item t does, with the same key and feature strides, and the
  attention reads keys ``0 .. Sk-1 <= V-1``); its data re-viewable as ``[*B, 1, D]``.
- No kernel between a scatter and the attention touches the scatter's cache or writes its data
  or index, and the attention reads each cache only through its KT (resp. V): so the data and
  index still hold the same values at the attention, and moving the scatters to just after it
  (in their order) lets every other kernel see the same bytes as before; the attention sees the
  old rows everywhere but at the positions, where it takes the new rows.
- ``ENABLED``: True (both rows, as above; the default, see there), False (off) or
  ``"values"``: the value cache alone is read before its update (``new_kv`` names two
  inputs, ``(VN, pos_v)``; the key cache's scatter stays before the attention and its loads
  after it), so the attention's key half costs nothing extra (no new key's scores, no selects
  on the score rows) while its value loads leave the chain.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from lowering.kir import KKind, KOp, KProgram, ScatterKAttrs, TensorRef, view_as

MAX_ITEMS = 4096
# On (both rows): with every load of a one-row kernel's streamed weights in a slot of its own
# (tiling/matmul._stream_ahead), the weight stream runs through the attention, the out
# projection and the norm, where the DMA engines idled, and on measured faster than off and
# than "values". With all-but-the-last slots it measured slower than off, as it did before
# every slot was ahead: after the QKV projection the in-order VectorE runs the position masks,
# the mask term and the new-key selects, longer per layer than the cache loads it takes off
# the chain.
# tir/analysis.weight_loads counts the cache loads as prefetchable (the cache is written only
# after them) and tir/plan.py gives their tiles an early lifetime (CACHE_STREAMS_AHEAD); that
# alone left on slower than off, whatever the lifetime, because (1) the attention's compute
# after the QKV projection (q -> scores -> new-key select -> score mask -> softmax ->
# products) takes longer than its compute after the cache loads without the pass, so hiding
# the 3 MB of loads saves little; (2) the early cache loads share the DMA engines with the
# weight stream and delay the projection's small loads behind them on the in-order engines
# (tir/schedule.py's queue choice, not this pass).
# With the query and output rows by TensorE transposes (tiling/attention/decode.py), before
# every slot was ahead, both modes still measured slower than off on decode_gpt2 (figures in
# the commit message): the weight stream's backlog on the in-order DMA engines and the early
# cache loads delay the chain's small transfers, and the score selects on 12 partitions sit on
# VectorE's chain. (The figures of these measurements: docs/decisions.md.)
ENABLED: bool | str = True   # False, "values" or True (module docstring)


def _touches(k: KOp, name: str) -> bool:
    return any(r.buffer == name for r in k.ins + k.outs)


def _writes(k: KOp, name: str) -> bool:
    return any(r.buffer == name for r in k.outs)


def _bases(shape, strides, offset) -> list[int] | None:
    n = math.prod(shape)
    if n > MAX_ITEMS:
        return None
    return [offset + sum(i * s for i, s in zip(idx, strides))
            for idx in itertools.product(*(range(d) for d in shape))]


def _row_update(kp: KProgram, a: int, x: TensorRef, key_axis: int, feat_axis: int, batch):
    """(scatter index, new rows [*B, 1, F], position [1]) when the last writer of ``x``'s
    buffer before kernel ``a`` is a one-row update that the rewrite may read past (module
    docstring); else None. ``x`` is the attention's view of the cache with keys on ``key_axis``
    and features on ``feat_axis``."""
    s = next((j for j in range(a - 1, -1, -1) if _writes(kp.kernels[j], x.buffer)), None)
    if s is None:
        return None
    sc = kp.kernels[s]
    if sc.kind is not KKind.SCATTER or not isinstance(sc.attrs, ScatterKAttrs) or sc.attrs.accumulate:
        return None
    data, index = sc.ins
    table = sc.outs[0]
    n = sc.attrs.axis
    if (table.buffer != x.buffer or table.rank != n + 2 or data.buffer == table.buffer
            or index.buffer == table.buffer or data.shape != index.shape + table.shape[n + 1:]):
        return None
    if any(st != 0 for d, st in zip(index.shape, index.strides) if d > 1):
        return None                                           # not one position for every row
    F, Sk = x.shape[feat_axis], x.shape[key_axis]
    if (table.strides[n] != x.strides[key_axis] or table.strides[n + 1] != x.strides[feat_axis]
            or table.shape[n + 1] != F or Sk > table.shape[n]):
        return None
    tb = _bases(table.shape[:n], table.strides[:n], table.offset)
    xb = _bases(batch, x.strides[:len(batch)], x.offset)
    if tb is None or tb != xb:                                # lookup t is batch item t
        return None
    rows = view_as(data, tuple(batch) + (1, F))
    if rows is None:
        return None
    for j in range(s + 1, a + 1):          # the attention itself: checked by the caller
        o = kp.kernels[j]
        if (j < a and _touches(o, x.buffer)) or _writes(o, data.buffer) or _writes(o, index.buffer):
            return None
    return s, rows, TensorRef(index.buffer, index.dtype, (1,), (1,), index.offset)


def attend_before_cache_update(kp: KProgram, target) -> list[str]:
    """Apply the rewrite wherever it holds (module docstring); returns one line per attention
    rewritten."""
    from lowering.tiling.attention.decode import new_rows_fit
    done: list[str] = []
    if not ENABLED:
        return done
    both = ENABLED is True
    a = 0
    while a < len(kp.kernels):
        k = kp.kernels[a]
        if k.kind is not KKind.ATTENTION or k.attrs.new_kv is not None or len(k.ins) < 3:
            a += 1
            continue
        Q, KT, V = k.ins[:3]
        batch = Q.shape[:-2]
        ku = vu = None
        if KT.buffer != V.buffer and Q.shape[-2] == 1 and batch:
            vu = _row_update(kp, a, V, V.rank - 2, V.rank - 1, batch)
            if both:
                ku = _row_update(kp, a, KT, KT.rank - 1, KT.rank - 2, batch)
        if (vu is None or (both and ku is None)
                or any(r.buffer in (KT.buffer, V.buffer) for r in (Q,) + k.ins[3:])):
            a += 1
            continue
        sv, vn, pv = vu
        if both:
            sk, kn, pk = ku
            rows, scat = (kn, vn, pk, pv), (sk, sv)
        else:
            rows, scat = (vn, pv), (sv,)
        new = KOp(k.kind, k.outs, k.ins + rows, replace(k.attrs, new_kv=len(k.ins)), k.origin)
        if not new_rows_fit(new, target):
            a += 1
            continue
        moved = [kp.kernels[j] for j in sorted(scat)]
        rest = [o for j, o in enumerate(kp.kernels[:a]) if j not in scat]
        kp.kernels[:a + 1] = rest + [new] + moved
        read = f"%{KT.buffer}, %{V.buffer} before their row updates" if both else \
            f"%{V.buffer} before its row update (%{KT.buffer} after)"
        done.append(f"{','.join(k.origin[:1]) or 'attention'} reads {read}")
        a = len(rest) + 1 + len(moved)
    return done

