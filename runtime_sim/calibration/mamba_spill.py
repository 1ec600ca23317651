"""``mamba_v2`` at a sequence length beyond one PSUM bank, and the evictions SBUF capacity forces
on it at seq >= 7168 (the tutorial's seq 8192 run: 53.33 ms, VectorE 58.93%, DMA rows
"qSyncSpillReload0" and "qVectorSpillReload0"; ``nki/guides/tutorials/fused_mamba.rst`` lines
741-769, and its scaling table, lines 863-926).

Program: ``mamba_v2`` as the source writes it (aws-neuron/nki-samples@6905a68
``src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py`` lines 97-168, the per-state body
of ``mamba.py``; deltaU hoisted as there, ``hoist=False`` computes it in every state as
written), with only what the sequence length forces:

- Broadcasts are SBUF tiles. ``B_i.broadcast_to((128, seq))`` returns "a new tile ... in SBUF,
  but can be also assigned to a PSUM tensor" (sdk@2.26 ``nki.language.broadcast_to``), and a PSUM
  tile holds at most ``nl.tile_size.psum_fmax`` = 512 fp32 per partition (one 2 KiB bank). A
  [128, seq > 512] tile cannot be a PSUM tile, so it lives in SBUF: each 512-column piece is a
  matmul into one of four rotating banks copied to the SBUF tile (``tensor_copy`` on VectorE, as
  the matmul kernels' ``nl.copy``), and the multiplies become VectorE ``tensor_tensor`` with both
  fp32 inputs in SBUF: 2N ("max(MIN_II, N) if one input in PSUM ... else 2N").
- SBUF placement by liveness. Every [128, seq] tensor, and each [1, seq] row B_i, C_i (4 seq
  bytes of every partition's address range, as every tile), holds one slot of 4 seq bytes per
  partition from its production to its last use; freed slots are reused oldest first. The slots
  are the SBUF left after the small buffers, at most two per live tensor (double buffering).

Working set (``live_sets``): delta, u (holding deltaU when hoisted) and scanC_accum are live
across the state loop. As written, with the per-state temporaries the largest live set is 7
slots (at the broadcast of B and at deltaBu: {delta, u, acc, dA, dU, B_i or dBu, Bb}); hoisted,
6 (no dU). Seven 24 KiB slots fit trn1's 192 KiB at seq 6144; at 7168 six fit, at 8192 five: as
written the evictions start at 7168 (u), hoisted at 8192 (delta). A hoisted u is no copy of HBM
data: evicting it costs a store and a reload.

Evictions (``spill_plan``), derived by one rule, not chosen against any figure: walking the
state's steps in order, wherever more tensors are live than slots, evict tensors that are live
there but not operands of that step, least traffic first (a tensor with a copy in HBM -- delta,
u, B_i, C_i -- costs one reload; any other a store and a reload), then the one used farthest
ahead; an evicted tensor is out of SBUF from its last use (or production) to its next use, and
is reloaded as early as a slot stays free until that use. An input evicted right after its load
is simply loaded later. Not modelled: the profile's "SBUF usage peaking at merely 50%"
(fused_mamba.rst line 768): the compiler's allocation was not a capacity-bound one.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..isa import SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, DmaAttrs, MatmulAttrs, Op, \
    TensorCopyAttrs, TensorTensorAttrs, TensorTensorScanAttrs, dma_queue
from .builder import tile
from .mamba import F32, P, Q_BIG, Q_SMALL, _Mamba

Q_SPILL = dma_queue(48)

# (step, tensors read, tensor written) per state, in the source's order (lines 137-162; the A_i
# load is a [128, 1] column, not a slot). The loop-carried tensors are produced before the state
# loop (delta, u: loads, lines 131-132; acc: nl.zeros, line 128).
STATE_STEPS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("exp", ("delta",), "dA"),
    ("load B", (), "B_i"),
    ("deltaU", ("delta", "u"), "dU"),
    ("bcast B", ("B_i",), "Bb"),
    ("deltaBu", ("dU", "Bb"), "dBu"),
    ("scan", ("dA", "dBu"), "scan"),
    ("load C", (), "C_i"),
    ("bcast C", ("C_i",), "Cb"),
    ("scanC", ("scan", "Cb"), "scC"),
    ("accumulate", ("acc", "scC"), "acc"),
)
CARRIED = ("delta", "u", "acc")
FROM_HBM = ("delta", "u", "B_i", "C_i")     # HBM holds a copy: a reload needs no store
ROWS = ("B_i", "C_i")                        # [1, seq]: 1/128 of a tile's bytes
# As compiled (mamba.py, "deltaU hoisted"): ``u`` holds deltaU from the channel tile's start (its
# only use), so the state body has no deltaU step and an evicted ``u`` needs a store.
HOISTED_STEPS = tuple((n, tuple("u" if r == "dU" else r for r in reads), w)
                      for n, reads, w in STATE_STEPS if n != "deltaU")
HOISTED_FROM_HBM = ("delta", "B_i", "C_i")


def _uses(t: str, steps=STATE_STEPS) -> list[int]:
    return [i for i, (_, r, w) in enumerate(steps) if t in r or t == w]


def live_sets(steps=STATE_STEPS) -> list[tuple[str, frozenset[str]]]:
    """The slot tensors in SBUF at each step of a state without evictions (operands included):
    carried ones throughout, temporaries from their production to their last use."""
    out = []
    for i, (name, _, _) in enumerate(steps):
        live = set(CARRIED)
        for _, _, t in steps:
            if t not in CARRIED:
                u = _uses(t, steps)
                if u[0] <= i <= u[-1]:
                    live.add(t)
        out.append((name, frozenset(live)))
    return out


@dataclass(frozen=True)
class Absence:
    """``tensor`` is out of SBUF after step ``after`` (its last use or production) until step
    ``until`` (in the next state when ``until <= after``), reloaded right after step ``reload``
    (counted from ``after`` onwards, may pass the end of the state: ``reload >= len(steps)``);
    stored after ``after`` first unless HBM holds a copy."""

    tensor: str
    after: int
    until: int
    reload: int
    store: bool


@dataclass(frozen=True)
class SpillPlan:
    slots: int                          # slots that fit SBUF beside the small buffers
    peak: int                           # most tensors live at one step without evictions
    over: tuple[str, ...]               # the steps where that live set exceeds the slots
    absences: tuple[Absence, ...]

    @property
    def spilled(self) -> tuple[str, ...]:
        return tuple(sorted({a.tensor for a in self.absences}))


def _traffic(t: str, seq: int, from_hbm=FROM_HBM) -> int:
    nbytes = seq * 4 * (1 if t in ROWS else P)
    return nbytes * (1 if t in from_hbm else 2)


def spill_plan(slots: int, seq: int = 8192, steps=STATE_STEPS, from_hbm=FROM_HBM) -> SpillPlan:
    """The evictions of the module docstring; raises if a step's operands alone exceed ``slots``."""
    n = len(steps)
    base = [set(s) for _, s in live_sets(steps)]
    peak = max(len(s) for s in base)
    over = tuple(steps[i][0] for i in range(n) if len(base[i]) > slots)
    live = [set(s) for s in base]
    absences: list[Absence] = []
    for i in range(n):
        ops = set(steps[i][1]) | {steps[i][2]}
        while len(live[i]) > slots:
            cands = []
            for t in live[i] - ops:
                us = _uses(t, steps)
                nxt = min((u for u in us if u > i), default=us[0] + n)       # next use (next state: + n)
                prv = max((u for u in us if u < i), default=us[-1] - n)      # previous use or production
                cands.append((_traffic(t, seq, from_hbm), -(nxt - i), t, prv, nxt))
            if not cands:
                raise ValueError(f"step {steps[i][0]!r} needs {len(live[i])} slots of {slots}: {sorted(live[i])}")
            _, _, t, prv, nxt = min(cands)
            for j in range(prv + 1, nxt):
                live[j % n].discard(t)
            absences.append(Absence(t, prv % n, nxt % n, prv, t not in from_hbm))
    placed = []
    for a in sorted(absences, key=lambda a: (a.after, a.tensor)):
        nxt = a.until + (n if a.until <= a.after else 0)
        r = nxt - 1                                       # latest possible: right before the use
        while r - 1 >= a.after and all(len(live[j % n]) < slots for j in range(r, nxt)):
            r -= 1
        for j in range(r + 1, nxt):
            live[j % n].add(a.tensor)
        if r > a.after:                                   # else a later eviction made room: none needed
            placed.append(Absence(a.tensor, a.after, a.until, r, a.store))
    assert all(len(s) <= slots for s in live), live
    return SpillPlan(slots, peak, over, tuple(placed))


def _variant(hoist: bool):
    return (HOISTED_STEPS, HOISTED_FROM_HBM) if hoist else (STATE_STEPS, FROM_HBM)


def _slots(b, seq: int, steps=STATE_STEPS) -> int:
    peak = max(len(s) for _, s in live_sets(steps))
    return min(b.sbuf_free() // (seq * 4), 2 * peak)


def plan_for(target, seq: int, max_slots: int | None = None, hoist: bool = True) -> SpillPlan:
    """The eviction plan ``mamba_v2_long`` derives for ``seq`` on ``target``."""
    steps, from_hbm = _variant(hoist)
    k = _Mamba(target, 1, seq, P, 1, seq)
    k.ring("A_i", 1)
    s = _slots(k.b, seq, steps)
    return spill_plan(min(s, max_slots or s), seq, steps, from_hbm)


class _Slots:
    """Fixed SBUF slots of ``free`` fp32 per partition; tensors hold one from production to last use."""

    def __init__(self, k: _Mamba, count: int, free: int) -> None:
        self.bufs = [k.b.sbuf(f"slot{i}", free * 4) for i in range(count)]
        self.free_list = list(self.bufs)
        self.of: dict[str, object] = {}

    def alloc(self, t: str):
        if not self.free_list:
            raise RuntimeError(f"no free slot for {t}: holding {sorted(self.of)}")
        self.of[t] = self.free_list.pop(0)
        return self.of[t]

    def free(self, t: str) -> None:
        self.free_list.append(self.of.pop(t))


def mamba_v2_long(target, batch: int = 1, seq: int = 8192, channels: int = 4096, state: int = 16, *,
                  max_slots: int | None = None, piece: int = 512, hoist: bool = True):
    """``mamba_v2`` for ``seq`` > 512 (see the module docstring). ``max_slots`` caps the slots
    (small functional tests of the seq 8192 eviction structure)."""
    k = _Mamba(target, batch, seq, channels, state, piece)
    steps, from_hbm = _variant(hoist)
    b, nt, n = k.b, channels // P, len(steps)
    r_a = k.ring("A_i", 1)
    ps = b.psum_banks("bcast", 4)
    nslots = _slots(b, seq, steps)
    plan = spill_plan(min(nslots, max_slots or nslots), seq, steps, from_hbm)
    sl = _Slots(k, plan.slots, seq)
    scratch = {t: b.hbm(f"spill_{t}", P, seq, F32, role="scratch") for t in plan.spilled if t not in from_hbm}
    last = {w: _uses(w, steps)[-1] for _, _, w in steps if w not in CARRIED}
    away_at_start = {a.tensor for a in plan.absences if a.reload >= n}   # absent across the state boundary
    nb = [0]

    def bank():
        nb[0] += 1
        return ps[nb[0] % 4]

    def whole(t: str):
        return tile(sl.of[t], F32, P, seq)

    def produce(t: str, bi: int, c: int, s: int, fresh: bool) -> None:
        """Bring t into a slot: a (re)load from HBM, the spill copy, or (acc, first time) zeros."""
        buf = sl.alloc(t)
        if t in ("delta", "u") and (fresh or t in from_hbm):
            q = Q_BIG if fresh else Q_SPILL
            src = (k.delta if t == "delta" else k.u).tile(bi * channels + c * P, P, 0, seq)
            b.emit(q, Op.DMA_COPY, whole(t), (src,), DmaAttrs())
            if t == "u" and hoist:                  # deltaU in place of u (HOISTED_STEPS)
                assert "delta" in sl.of, "deltaU needs delta in SBUF"
                multiply("u", "delta", "u")
        elif t in ROWS:
            hbm = k.B if t == "B_i" else k.C
            b.emit(Q_SMALL, Op.DMA_COPY, tile(buf, F32, 1, seq), (hbm.tile(bi * state + s, 1, 0, seq),), DmaAttrs())
        elif fresh:
            k.zero(buf, seq)
        else:
            b.emit(Q_SPILL, Op.DMA_COPY, whole(t), (scratch[t].tile(0, P, 0, seq),), DmaAttrs())

    def bcast_to_sbuf(dst, row) -> None:            # dst[128, seq] = broadcast(row): matmul + copy per piece
        for c0 in range(0, seq, piece):
            pb = tile(bank(), F32, P, piece)
            b.emit(TENSOR, Op.MATMUL, pb, (tile(k.ones, F32, 1, P), tile(row, F32, 1, piece, c0)), MatmulAttrs())
            b.emit(VECTOR, Op.TENSOR_COPY, tile(dst, F32, P, piece, c0), (pb,), TensorCopyAttrs())

    def multiply(dst: str, x: str, y: str, op=AluOp.MULTIPLY) -> None:
        b.emit(VECTOR, Op.TENSOR_TENSOR, whole(dst), (whole(x), whole(y)), TensorTensorAttrs(op))

    for bi in range(batch):
        for c in range(nt):
            for t in CARRIED:                       # lines 128-132 (deferred when evicted at the start)
                if t not in away_at_start:
                    produce(t, bi, c, 0, True)
            for s in range(state):
                first, final = s == 0, s == state - 1
                for i, (name, reads, wr) in enumerate(steps):
                    deferred = any(a.tensor == wr and a.after == i and a.tensor in from_hbm for a in plan.absences)
                    if wr not in CARRIED and not deferred and name not in ("load B", "load C"):
                        sl.alloc(wr)
                    if name == "exp":
                        A_i = tile(r_a[s % 2], F32, P, 1)
                        k.load_A(c, s, r_a[s % 2])
                        b.emit(SCALAR, Op.ACTIVATION, whole("dA"), (whole("delta"), A_i),
                               ActivationAttrs(ActFunc.EXP, scale_from_src=True))
                    elif name in ("load B", "load C"):
                        if not deferred:
                            produce(wr, bi, c, s, True)
                    elif name == "deltaU":
                        multiply("dU", "delta", "u")
                    elif name in ("bcast B", "bcast C"):
                        bcast_to_sbuf(sl.of[wr], sl.of[reads[0]])
                    elif name == "deltaBu":
                        multiply("dBu", reads[0], "Bb")
                    elif name == "scan":
                        b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, whole("scan"), (whole("dA"), whole("dBu")),
                               TensorTensorScanAttrs())
                    elif name == "scanC":
                        multiply("scC", "scan", "Cb")
                    else:
                        multiply("acc", "acc", "scC", AluOp.ADD)
                    for t in reads:                 # free each temporary after its last use
                        if t in last and last[t] == i:
                            sl.free(t)
                    for a in plan.absences:         # evictions after this step
                        if a.after != i or a.tensor not in sl.of:
                            continue
                        keep = a.tensor in CARRIED and final and a.until <= a.after
                        if a.tensor == "acc" and keep:
                            continue                # the last state's accumulator is the output
                        if a.store and not keep:
                            b.emit(Q_SPILL, Op.DMA_COPY, scratch[a.tensor].tile(0, P, 0, seq), (whole(a.tensor),),
                                   DmaAttrs())
                        sl.free(a.tensor)
                    if final:                       # carried inputs end with their last use
                        for t in ("delta", "u"):
                            if t in sl.of and _uses(t, steps)[-1] == i:
                                sl.free(t)
                    for a in plan.absences:         # reloads after this step
                        if a.reload % n != i:
                            continue
                        nxt_state = a.reload >= n or a.until <= a.after
                        if a.reload >= n and first and a.tensor in CARRIED and a.tensor in away_at_start \
                                and not sl.of.get(a.tensor):
                            produce(a.tensor, bi, c, s, True)      # the first production, deferred
                        elif a.reload < n and nxt_state and final:
                            continue                # no next state
                        elif a.reload >= n and first:
                            continue                # serves a use of the previous state
                        elif a.tensor not in sl.of:
                            produce(a.tensor, bi, c, s, False)
            k.store(bi, c, sl.of["acc"])
            for t in list(sl.of):
                sl.free(t)
    return b.program()
