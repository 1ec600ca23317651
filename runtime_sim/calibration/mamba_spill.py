"""``mamba_v2`` at a sequence length beyond one PSUM bank, and the spill plan SBUF capacity forces
on it: the tutorial's seq 8192 run (53.33 ms, VectorE 58.93%, DMA rows "qSyncSpillReload0" and
"qVectorSpillReload0"; ``nki/guides/tutorials/fused_mamba.rst``, "Increasing input seq_len size").

Program: the instruction sequence of ``mamba.mamba_v2`` (loops batch, channel tile, state; delta
and u loaded once per channel tile; deltaU hoisted out of the state loop, as in the seq 512 model
that reproduced the tutorial's 1.61 ms; per state one ScalarE exp, the TensorE broadcasts of B_i
and C_i, four VectorE instructions), with only the changes the sequence length forces:

- Broadcasts are SBUF tiles. ``B_i.broadcast_to((128, seq))`` returns "a new tile ... in SBUF,
  but can be also assigned to a PSUM tensor" (sdk@2.26 ``nki.language.broadcast_to``), and a PSUM
  tile holds at most ``nl.tile_size.psum_fmax`` = 512 fp32 per partition (one 2 KiB bank). At seq
  512 the broadcast fits one PSUM tile and the multiply reads it there (mamba.py, which reproduces
  1.61 ms); a [128, seq > 512] tile cannot be a PSUM tile, so it lives in SBUF: each 512-column
  piece is a matmul into one of four rotating banks (the largest matmul output) copied to the
  SBUF tile (``tensor_copy`` on VectorE, as the matmul kernels' ``nl.copy``; ``bcast_copy``), and
  the multiply is one VectorE ``tensor_tensor`` with both fp32 inputs in SBUF, 2N cycles instead
  of N ("max(MIN_II, N) if one input in PSUM ... else 2N"). ``bcast_home="psum"`` keeps the old
  reading of the pieces in PSUM, for comparison (0.67-0.74x of the scaling table).
- SBUF placement by liveness. Every [128, seq] tensor, and each [1, seq] row B_i, C_i (the same
  ``4 seq`` B on partition 0, which every full tile also uses), holds one slot of ``4 seq`` B
  per partition from its production to its last use; freed slots are reused oldest first. The
  slots are the SBUF left after the small buffers (ones row, A_i columns), at most two per live
  tensor (the double buffering of mamba.py's rings when it fits).

Working set (``live_sets``; "F" = one [128, seq] fp32 tensor): delta, deltaU and scanC_accum are
live across the whole state loop (u dies once deltaU is computed). Per state, at the broadcast
of B {delta, dU, acc, dA, B_i, Bb}, at the deltaBu step {delta, dU, acc, dA, Bb, dBu}, at the
scan {delta, dU, acc, dA, dBu, scan} and at the broadcast of C and the scanC step {delta, dU,
acc, scan, C_i or scC, Cb} are live: 6 F (the SBUF broadcast replaces its row once copied), which at seq 8192 is 196,608 B per
partition = all of trn1's SBUF (192 KiB), with the ones row and A_i still to place. Five slots
fit. So one 32 KiB tensor must be out of SBUF at those three steps, in every state.

Spill plan (``spill_plan``), derived, not chosen: a tensor can relieve those steps only if it is
live across them without being one of their operands: delta (read by the exp step only) or
scanC_accum (read and written by the accumulate step only). deltaU is an operand of the deltaBu
step, and the per-state temporaries are operands where they are live. Of the two, delta moves
less: it is never written in the loop, so it is stored once per channel tile after its load and
reloaded before each state's exp (15 x 4 MiB per channel tile); scanC_accum would need a store
and a reload per state (2 x 4 MiB). The plan therefore spills delta, and only delta: the store
right after the load (queue ``Q_SPILL``), the reload as early as a slot is free, i.e. after the
scanC step of the previous state (the last step at which the live set without delta fills all
slots). The spilled tensor is stored after its production and reloaded before each use; since
delta is also an input already in HBM, a compiler could skip the store (``remat=True``: reload
from the input).

The rest follows from five slots too: nothing is double-buffered, so the reload waits for the
scanC step to free a slot, the next exp waits for the reload, the deltaBu pieces for the slot
the exp frees, the C_i load for the slots the scan frees. Not modelled: the measured profile's
"SBUF usage peaking at merely 50%" (this plan uses 5 x 32 KiB + 640 B = 84%); the compiler's
allocation was not this one (docs/simulator.md, section 5).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..isa import SCALAR, TENSOR, VECTOR, ActFunc, ActivationAttrs, AluOp, DmaAttrs, MatmulAttrs, Op, \
    TensorCopyAttrs, TensorTensorAttrs, TensorTensorScanAttrs, dma_queue
from .builder import tile
from .mamba import F32, P, Q_SMALL, _Mamba

Q_SPILL = dma_queue(48)

# (step, tensors read, tensor written) per state, in the tutorial's order; the loop-carried
# tensors are produced before the state loop (delta: load; dU = delta * u; acc: memset).
STATE_STEPS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("exp", ("delta",), "dA"),
    ("load B", (), "B_i"),
    ("bcast B", ("B_i",), "Bb"),
    ("deltaBu", ("dU", "Bb"), "dBu"),
    ("scan", ("dA", "dBu"), "scan"),
    ("load C", (), "C_i"),
    ("bcast C", ("C_i",), "Cb"),
    ("scanC", ("scan", "Cb"), "scC"),
    ("accumulate", ("acc", "scC"), "acc"),
)
CARRIED = ("delta", "dU", "acc")
# The same state with the broadcasts read straight from PSUM (``bcast_home="psum"``: what a
# [128, seq] tile cannot do beyond one PSUM tile, kept to compare): no SBUF slot for them.
STATE_STEPS_PSUM_BCAST: tuple[tuple[str, tuple[str, ...], str], ...] = tuple(
    (n, tuple({"Bb": "B_i", "Cb": "C_i"}.get(t, t) for t in r), w) for n, r, w in STATE_STEPS
    if not n.startswith("bcast"))


def state_steps(bcast_home: str = "sbuf") -> tuple[tuple[str, tuple[str, ...], str], ...]:
    return STATE_STEPS if bcast_home == "sbuf" else STATE_STEPS_PSUM_BCAST


def live_sets(spilled: tuple[str, ...] = (), steps=STATE_STEPS) -> list[tuple[str, frozenset[str]]]:
    """The [seq]-long tensors in SBUF at each step of a state (operands included): carried ones
    throughout unless spilled (then only where they are operands), temporaries from their
    production to their last use."""
    out = []
    for i, (name, reads, wr) in enumerate(steps):
        live = {t for t in CARRIED if t not in spilled or t in reads or t == wr}
        for j, (_, _, t) in enumerate(steps):
            if t in CARRIED:
                continue
            last = max((k for k, (_, r, _) in enumerate(steps) if t in r), default=j)
            if j <= i <= last:
                live.add(t)
        out.append((name, frozenset(live)))
    return out


def _traffic(t: str, steps=STATE_STEPS) -> int:
    """Transfers per state if ``t`` is spilled: a reload per state, plus a store if the state loop writes it."""
    return 1 + any(w == t for _, _, w in steps)


@dataclass(frozen=True)
class SpillPlan:
    slots: int                          # [128, seq] slots that fit SBUF beside the small buffers
    peak: int                           # most tensors live at one step without spilling
    over: tuple[str, ...]               # the steps where the live set exceeds the slots
    spilled: tuple[str, ...]            # the tensors stored to HBM and reloaded before each use
    reload_after: str | None            # the step after which a spilled tensor is reloaded


def spill_plan(slots: int, steps=STATE_STEPS) -> SpillPlan:
    """The least-traffic set of loop-carried tensors whose eviction brings every step within
    ``slots``, and where their reloads go; raises if no such set exists."""
    live = live_sets(steps=steps)
    peak = max(len(s) for _, s in live)
    over = tuple(n for n, s in live if len(s) > slots)
    if not over:
        return SpillPlan(slots, peak, (), (), None)
    operands = {t for n, r, w in steps if n in over for t in (*r, w)}
    cands = sorted((t for t in CARRIED if t not in operands), key=lambda t: (_traffic(t, steps), t))
    spilled = tuple(cands[:peak - slots])
    if any(len(s) > slots for _, s in live_sets(spilled, steps)):
        raise ValueError(f"no spill of loop-carried tensors fits {slots} slots (live: {live})")
    # a reload occupies a slot from the end of the last step that has none to spare
    full = [n for n, s in live_sets(spilled, steps) if len(s) + 1 > slots]
    return SpillPlan(slots, peak, over, spilled, full[-1] if full else None)


def _plan(b, seq: int, spill: bool, max_slots: int | None, steps=STATE_STEPS) -> tuple[int, SpillPlan]:
    """Slots to allocate and the spill plan, from the SBUF the builder has left (its real buffer sizes)."""
    peak = max(len(s) for _, s in live_sets(steps=steps))
    fit = b.sbuf_free() // (seq * 4)
    slots = min(fit, 2 * peak, max_slots or fit)
    plan = spill_plan(slots, steps) if spill else SpillPlan(slots, peak, (), (), None)
    if set(plan.spilled) - {"delta"}:
        raise NotImplementedError(f"spill plan {plan.spilled}: only a spilled delta is emitted")
    return (slots if plan.spilled else max(slots, peak)), plan   # no spill: what the working set needs


def plan_for(target, seq: int, max_slots: int | None = None, bcast_home: str = "sbuf") -> SpillPlan:
    """The spill plan ``mamba_v2_long`` derives for ``seq`` on ``target``."""
    k = _Mamba(target, 1, seq, P, 1, seq)
    k.ring("A_i", 1)
    return _plan(k.b, seq, True, max_slots, state_steps(bcast_home))[1]


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
                  spill: bool = True, max_slots: int | None = None, remat: bool = False, piece: int = 512,
                  bcast_home: str = "sbuf", bcast_copy=VECTOR):
    """``mamba_v2`` for ``seq`` > 512 (see the module docstring). ``spill=False`` builds the
    program without spilling (its slots may exceed SBUF: ``program()`` then raises);
    ``max_slots`` caps the slots (small functional tests of the seq 8192 structure)."""
    k = _Mamba(target, batch, seq, channels, state, piece)
    b, nt = k.b, channels // P
    r_a = k.ring("A_i", 1)
    ps = b.psum_banks("bcast", 4)
    steps = state_steps(bcast_home)
    slots, plan = _plan(b, seq, spill, max_slots, steps)
    sl = _Slots(k, slots, seq)
    spill_hbm = b.hbm("spill_delta", P, seq, F32, role="scratch") if plan.spilled and not remat else None
    last = {w: max(i for i, (_, r, _) in enumerate(steps) if w in r) for _, _, w in steps if w != "acc"}
    nb = [0]

    def bank():
        nb[0] += 1
        return ps[nb[0] % 4]

    def bcast_mul(dst, src, row) -> None:           # dst = src * broadcast(row), piece by piece
        for c0 in range(0, seq, piece):
            pb = tile(bank(), F32, P, piece)
            b.emit(TENSOR, Op.MATMUL, pb, (tile(k.ones, F32, 1, P), tile(row, F32, 1, piece, c0)), MatmulAttrs())
            b.emit(VECTOR, Op.TENSOR_TENSOR, tile(dst, F32, P, piece, c0), (tile(src, F32, P, piece, c0), pb),
                   TensorTensorAttrs(AluOp.MULTIPLY))

    def bcast_to_sbuf(dst, row) -> None:            # dst[128, seq] = broadcast(row): matmul + evacuation per piece
        for c0 in range(0, seq, piece):
            pb = tile(bank(), F32, P, piece)
            b.emit(TENSOR, Op.MATMUL, pb, (tile(k.ones, F32, 1, P), tile(row, F32, 1, piece, c0)), MatmulAttrs())
            d = tile(dst, F32, P, piece, c0)
            if bcast_copy is SCALAR:
                b.emit(SCALAR, Op.ACTIVATION, d, (pb,), ActivationAttrs(ActFunc.COPY))
            else:
                b.emit(bcast_copy, Op.TENSOR_COPY, d, (pb,), TensorCopyAttrs())

    def whole(t: str):                              # the [128, seq] tile of tensor t's slot
        return tile(sl.of[t], F32, P, seq)

    def reload_delta(bi: int, c: int) -> None:
        src = k.delta.tile(bi * channels + c * P, P, 0, seq) if remat else spill_hbm.tile(0, P, 0, seq)
        sl.alloc("delta")
        b.emit(Q_SPILL, Op.DMA_COPY, whole("delta"), (src,), DmaAttrs())

    for bi in range(batch):
        for c in range(nt):
            acc = sl.alloc("acc")
            k.zero(acc, seq)
            k.load_rows(k.delta, bi * channels + c * P, sl.alloc("delta"))
            if "delta" in plan.spilled and not remat:
                b.emit(Q_SPILL, Op.DMA_COPY, spill_hbm.tile(0, P, 0, seq), (whole("delta"),), DmaAttrs())
            k.load_rows(k.u, bi * channels + c * P, sl.alloc("u"))
            sl.alloc("dU")
            b.emit(VECTOR, Op.TENSOR_TENSOR, whole("dU"), (whole("delta"), whole("u")),
                   TensorTensorAttrs(AluOp.MULTIPLY))
            sl.free("u")
            for s in range(state):
                final = s == state - 1
                for i, (name, reads, wr) in enumerate(steps):
                    if wr != "acc":
                        sl.alloc(wr)
                    if name == "exp":
                        A_i = tile(r_a[s % 2], F32, P, 1)
                        b.emit(Q_SMALL, Op.DMA_COPY, A_i, (k.A.column(c * P, P, s),), DmaAttrs())
                        b.emit(SCALAR, Op.ACTIVATION, whole("dA"), (whole("delta"), A_i),
                               ActivationAttrs(ActFunc.EXP, scale_from_src=True))
                    elif name in ("load B", "load C"):
                        hbm = k.B if name == "load B" else k.C
                        b.emit(Q_SMALL, Op.DMA_COPY, tile(sl.of[wr], F32, 1, seq),
                               (hbm.tile(bi * state + s, 1, 0, seq),), DmaAttrs())
                    elif name in ("bcast B", "bcast C"):
                        bcast_to_sbuf(sl.of[wr], sl.of[reads[0]])
                    elif name == "deltaBu" and bcast_home == "sbuf":
                        b.emit(VECTOR, Op.TENSOR_TENSOR, whole("dBu"), (whole("dU"), whole("Bb")),
                               TensorTensorAttrs(AluOp.MULTIPLY))
                    elif name == "scanC" and bcast_home == "sbuf":
                        b.emit(VECTOR, Op.TENSOR_TENSOR, whole("scC"), (whole("scan"), whole("Cb")),
                               TensorTensorAttrs(AluOp.MULTIPLY))
                    elif name == "deltaBu":
                        bcast_mul(sl.of["dBu"], sl.of["dU"], sl.of["B_i"])
                    elif name == "scan":
                        b.emit(VECTOR, Op.TENSOR_TENSOR_SCAN, whole("scan"), (whole("dA"), whole("dBu")),
                               TensorTensorScanAttrs())
                    elif name == "scanC":
                        bcast_mul(sl.of["scC"], sl.of["scan"], sl.of["C_i"])
                    else:
                        b.emit(VECTOR, Op.TENSOR_TENSOR, whole("acc"), (whole("acc"), whole("scC")),
                               TensorTensorAttrs(AluOp.ADD))
                    for t in reads:                       # free each tensor after its last use
                        carried_done = final or t in plan.spilled
                        if (t in last and last[t] == i) or (t in ("delta", "dU") and carried_done):
                            sl.free(t)
                    if name == plan.reload_after and "delta" in plan.spilled and not final:
                        reload_delta(bi, c)
            k.store(bi, c, acc)
            sl.free("acc")
    return b.program()
