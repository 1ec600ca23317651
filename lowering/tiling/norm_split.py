"""Layer norm on one row tile, and how its work is split over the engines.

A row tile is ``[p, C]``: rows on partitions, a whole row along the free dim. The body computes
the row statistics, then ``y = (x - mean) * rstd [* w] [+ b]``. Two ways to get the statistics:

- ``bn``:  VectorE ``bn_stats`` over equal chunks of <= 512 columns, ``bn_aggr``, then
  ``rstd = (var + eps) ** -0.5`` (VectorE);
- ``act``: ScalarE ``sum(x)`` (activation with its fused free-axis reduce), then
  ``sum((x - mean)^2)`` the same way (two passes, centred: no cancellation), then
  ``rstd = rsqrt(ss / C + eps)`` (ScalarE).

The finishing work is split by columns, each part on engines of its own:

- columns ``[0, cv)``: ``xn = (x - mean) * rstd`` as VectorE tensor_scalars (per-partition
  operands; the fast mode for 2-byte types), then the weight/bias products on VectorE;
- columns ``[cv, C)``: ``xn = x * rstd + (-mean * rstd)`` on ScalarE (activation with
  per-partition scale and bias), then the weight/bias products on GpSimdE.

Each engine's share of a row tile waits only at its start (for the load or for the engine that
feeds it): no engine hands a tile to another and takes a result back within one row tile, so
successive row tiles pipeline over the engines. Pipelined row tiles cut each part in two
pieces; a row tile alone (latency-bound, e.g. GPT-2's [128, 768] norms) cuts it in pieces of
one partition's worth of columns, so a consuming matmul's transposes start on the first.

``choose`` scores the candidates -- each statistics way, ``cv`` on a grid of ``min_ii_cycles``
columns (narrower parts cost the minimum initiation interval anyway) -- by emitting one row tile
into a scratch builder and estimating from the simulator's cost table (``estimate.profile``):
the busiest engine's time per row tile for all but one row tile of each run of row tiles that
pipeline, plus one row tile's makespan per run. The split is a tiling decision, so the emitted instructions name
their engines; the schedule pass only orders them.

Invariants
- Every column of ``out`` is written exactly once per row tile, by one of the two parts.
- Statistics are fp32 [p, 1] tiles; ``xn`` and the products are computed in ``wdt``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

from lowering.tiling.estimate import profile, scratch
from lowering.tir.affine import Affine
from lowering.tir.builder import Tile, TirBuilder
from lowering.tir.ir import TAP
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

F32 = DType.FP32
V, S, G = EngineKind.VECTOR, EngineKind.SCALAR, EngineKind.GPSIMD


@dataclass(frozen=True)
class Split:
    stats: str      # "bn" (VectorE bn_stats) or "act" (ScalarE sums)
    cv: int         # columns [0, cv) finished on VectorE, the rest on ScalarE + GpSimdE

    def describe(self, C: int) -> str:
        st = "VectorE bn_stats/bn_aggr" if self.stats == "bn" else "ScalarE sum and centred sum of squares"
        parts = [f"[{a}, {z}) on {e}" for a, z, e in ((0, self.cv, "VectorE"),
                                                      (self.cv, C, "ScalarE + GpSimdE")) if z > a]
        return f"statistics by {st}; columns " + ", ".join(parts)


def small(b: TirBuilder, p: int, dtype: DType = F32, n: int = 1) -> TAP:
    return b.tile("st", Memory.SBUF, p, n, dtype).ap()


def col(t: TAP, start, n: int) -> TAP:
    """Columns ``[start, start + n)`` of a [p, m] tile access (``start`` may be affine)."""
    return replace(t, offset=t.offset + Affine.of(start) * t.dtype.itemsize, dims=((1, n),))


@dataclass(frozen=True)
class Stats:
    rs: TAP                 # rstd
    mu: TAP | None          # mean (bn) ...
    nmu: TAP | None         # ... or minus the mean (act)

    def mean(self, b: TirBuilder, p: int) -> TAP:
        if self.mu is not None:
            return self.mu
        assert self.nmu is not None
        m = small(b, p)
        b.tensor_scalar(m, self.nmu, AluOp.MULTIPLY, -1.0)
        return m


def row_tile(b: TirBuilder, xa: TAP, p: int, C: int, ch: int | None, split: Split,
             params: list[tuple[Tile, AluOp]], eps: float, wdt: DType, out: Callable[[], TAP],
             bufs: int = 2, pipelined: bool = True) -> Stats:
    """Emit layer norm of the rows ``xa`` [p, C] into ``out()`` [p, C] (taken once, after the
    intermediates); ``params`` are the weight/bias tiles [P, C] (already in ``wdt``) with the op
    that applies each; intermediates rotate through ``bufs`` slots. ``pipelined``: row tiles
    follow each other, so throughput counts more than one tile's instruction count."""
    st = _bn_stats(b, xa, p, C, ch, eps) if split.stats == "bn" else _act_stats(b, xa, p, C, eps)
    nmr = None
    if split.cv < C:                  # ScalarE's bias: -mean * rstd
        nmr = small(b, p)
        if st.mu is not None:
            b.tensor_scalar(nmr, st.mu, AluOp.MULTIPLY, st.rs, op1=AluOp.MULTIPLY, operand1=-1.0)
        else:
            b.activation(nmr, st.nmu, ActFunc.IDENTITY, scale_ap=st.rs)
    # full-width intermediates, then the result: each part writes its own columns
    mids = [b.tile("xn" if j == 0 else "lw", Memory.SBUF, p, C, wdt, bufs).ap() for j in range(len(params))]
    mids.append(out())
    g = b.target.min_ii_cycles
    for c0, n, eng in ((0, split.cv, V), (split.cv, C - split.cv, S)):
        if n <= 0:
            continue
        # pipelined row tiles: two column pieces, emitted stage by stage, so that no instruction
        # reads what the previous one of its engine wrote (the dependent-instruction penalty)
        # one row tile alone (latency-bound): pieces of one K tile (a partition's worth of
        # columns), the unit a consuming matmul's TensorE transposes read, so they start on the
        # first piece instead of waiting for the whole row
        if not pipelined:
            kt = b.target.sbuf_partitions
            pieces = [(a, min(kt, c0 + n - a)) for a in range(c0, c0 + n, kt)]
        elif n >= 2 * g:
            pieces = [(c0, n // 2), (c0 + n // 2, n - n // 2)]
        else:
            pieces = [(c0, n)]
        firsts = [col(mids[0], a, m) for a, m in pieces]
        if eng is V:
            op0, shift = (AluOp.SUBTRACT, st.mu) if st.mu is not None else (AluOp.ADD, st.nmu)
            for f, (a, m) in zip(firsts, pieces):
                b.tensor_scalar(f, col(xa, a, m), op0, shift, op1=AluOp.MULTIPLY, operand1=st.rs,
                                engines=(V,))
        else:
            for f, (a, m) in zip(firsts, pieces):
                b.activation(f, col(xa, a, m), ActFunc.IDENTITY, scale_ap=st.rs, bias_ap=nmr)
        cur = firsts
        for j, (wt, op) in enumerate(params):
            nxt = [col(mids[j + 1], a, m) for a, m in pieces]
            for d, c, (a, m) in zip(nxt, cur, pieces):
                b.tensor_tensor(d, c, col(wt.ap(p), a, m), op, engines=(V if eng is V else G,))
            cur = nxt
    return st


def _bn_stats(b: TirBuilder, xa: TAP, p: int, C: int, ch: int | None, eps: float) -> Stats:
    assert ch is not None
    n = C // ch
    rs = small(b, p)
    stats = small(b, p, F32, 2 * n)
    for j in range(n) if n <= 8 else ():
        b.bn_stats(col(stats, 2 * j, 2), col(xa, j * ch, ch))
    if n > 8:
        with b.loop(n, "s") as j:
            b.bn_stats(col(stats, j * 2, 2), col(xa, j * ch, ch))
    mv = small(b, p, F32, 2)
    b.bn_aggr(mv, stats)
    b.tensor_scalar(rs, col(mv, 1, 1), AluOp.ADD, eps, op1=AluOp.POW, operand1=-0.5)
    return Stats(rs, col(mv, 0, 1), None)


def _act_stats(b: TirBuilder, xa: TAP, p: int, C: int, eps: float) -> Stats:
    junk = b.tile("lsq", Memory.SBUF, p, C, xa.dtype, 1).ap()   # only the reductions are kept
    s = small(b, p)
    b.activation(junk, xa, ActFunc.IDENTITY, reduce=AluOp.ADD, accum=s)
    nmu = small(b, p)
    b.activation(nmu, s, ActFunc.IDENTITY, scale=-1.0 / C)
    ss = small(b, p)
    b.activation(junk, xa, ActFunc.SQUARE, bias_ap=nmu, reduce=AluOp.ADD, accum=ss)
    rs = small(b, p)
    b.activation(rs, ss, ActFunc.RSQRT, scale=1.0 / C, bias=eps)
    return Stats(rs, None, nmu)


def choose(b: TirBuilder, C: int, ch: int | None, xdt: DType, wdt: DType, ydt: DType,
           ops: list[AluOp], groups: list[int], stats_only: str | None = None) -> Split:
    """The split with the least estimated time for ``groups`` of row tiles run one group after
    the other (a partial row tile reuses the full ones' slots, so it runs behind them): per
    group of ``n``, ``n - 1`` times the busiest engine's work per row tile (the pipelined
    throughput) plus one row tile's makespan. Statistics by ``stats_only`` only, when given.
    Row tiles that never follow each other (every group of one, as a [128, 768] GPT-2 norm) are
    latency-bound: every ``cv`` on the grid is scored by the makespan (the two column parts run
    side by side). Memoised per arguments."""
    return _choose(b.target, C, ch, xdt, wdt, ydt, tuple(ops), tuple(groups), stats_only)


@functools.lru_cache(maxsize=256)
def _choose(t, C: int, ch: int | None, xdt: DType, wdt: DType, ydt: DType, ops: tuple,
            groups: tuple, stats_only: str | None) -> Split:
    P = t.sbuf_partitions
    g = t.min_ii_cycles
    pipelined = max(groups) > 1
    memo: dict[Split, tuple[dict[EngineKind, float], float]] = {}

    def prof(split: Split) -> tuple[dict[EngineKind, float], float]:
        if split not in memo:
            with scratch(t) as s:
                xa = s.tile("x", Memory.SBUF, P, C, xdt).ap()
                prm = [(s.tile(f"w{j}", Memory.SBUF, P, C, wdt), op) for j, op in enumerate(ops)]
                out = s.tile("y", Memory.SBUF, P, C, ydt).ap()
                row_tile(s, xa, P, C, ch, split, prm, 0.0, wdt, lambda: out, 2, pipelined)
            memo[split] = profile(s)
        return memo[split]

    def key(split: Split) -> tuple[float, float]:
        busy, span = prof(split)
        return (sum((n - 1) * max(busy.values()) + span for n in groups if n),
                sum(busy.values()))

    cands = []
    ways = (("bn",) if ch is not None else ()) + ("act",)
    for stats in ways if stats_only is None else (stats_only,):
        if not pipelined:      # by makespan: a grid of at most 33 min_ii multiples
            step = g * max(1, -(-C // (32 * g)))
            cands += [Split(stats, min(C, m * step)) for m in range(-(-C // step) + 1)]
            continue
        # VectorE's share grows with cv, the others' shrinks: bisect for the crossing
        lo, hi = 0, -(-C // g)
        while lo < hi:
            mid = (lo + hi) // 2
            busy = prof(Split(stats, min(C, mid * g)))[0]
            if busy.get(V, 0.0) >= max(busy.get(S, 0.0), busy.get(G, 0.0)):
                hi = mid
            else:
                lo = mid + 1
        cands += [Split(stats, cv) for cv in {min(C, max(0, lo - 1) * g), min(C, lo * g), 0, C}]
    return min(cands, key=lambda sp: (key(sp), sp.cv))
