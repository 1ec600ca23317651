"""Free-axis chunk sizes of streaming loop nests (DMA in -> compute -> DMA out), from the target.

A loop nest that streams ``M`` tiles of ``[p, f]`` (row tiles x chunks of a free axis of ``n``)
through loads, compute and stores is scored by its busiest resource, each charged its total work
plus the part of one tile's chain it cannot overlap:

- DMA engines: ``M x (loads + stores)`` of one tile (loads and stores share the engines), idle
  only for the first transfer's fixed phase;
- DMA queues: each transfer's queue spends one fixed phase per tile, so the last tile's loads
  issue ``(M - 1)`` fixed phases after the first, then its whole chain follows;
- the busiest compute engine: ``M x`` its time for one tile, plus the first tile's loads and
  the last tile's stores with their fixed costs and the rest of one tile's compute makespan;
- a partial last chunk (``n % f`` columns) runs after the loop, alone (its tiles reuse the
  loop's slots), once per row tile.

The data phase of one ``[p, f]`` transfer is the simulator's (``runtime_sim.costs.
dma_tile_data_ns``), and a transfer's fixed phase is ``Target.dma_transfer_ns``, on its queue,
as there: one DMA model. The compute estimate comes from the caller (the cost table,
``estimate.py``).

Small chunks pay a transfer's fixed phase and the minimum initiation interval on every tile;
large ones expose the first tile's loads and the last tile's stores around the compute.
``choose_chunk`` scores splits of the free axis into ``k`` chunks and returns the best.

``paced_pieces``: how many pieces a weight transfer is cut into so that the weight stream (one
in-order DMA queue, ``tir/schedule.py``) issues no faster than the DMA engines drain it. A queue
issues one transfer per fixed phase while the engines serve transfers in issue order, so a
stream of transfers whose data phase outlasts the fixed phase builds a backlog in the engines,
and any small transfer issued on another queue (a gather of a chain of small kernels, an output
store) waits behind all of it. Pieces whose data phase is the fixed phase keep the backlog to
about one piece at the same throughput.

``stream_loads`` counts a matmul's transfers into its streamed side's slots (``matmul.
_stream_ahead`` gives a decode step's streamed weights a slot for all but the last);
``row_by_transposes`` says when one resident row reaches [128, K/128] cheaper by TensorE
transposes than by one SBUF -> SBUF DMA (``matmul._Side._transpose_row``).

Invariants
- The returned chunk is in ``[1, min(n, f_max)]``.
- Scoring is pure arithmetic on the ``Target`` plus the caller's compute estimate; no program
  is built here.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from runtime_sim.costs import TensorLanes, TensorRamp, dma_tile_data_ns, instr_cost
from runtime_sim.isa import (AP, DmaAttrs, DType, EngineKind, Instr, Memory, Op, Queue, TensorCopyAttrs,
                             TransposeAttrs, dma_queue)
from runtime_sim.targets import Target

if TYPE_CHECKING:
    from lowering.tiling.matmul.plan import Blocking, MatmulShape


def chunk_candidates(n: int, f_max: int) -> list[int]:
    """Even splits of ``n`` into ``k`` chunks of at most ``f_max``: every ``k`` from the fewest
    chunks up to twice that, then doubling ``k``."""
    k0 = max(1, -(-n // max(1, f_max)))
    ks = set(range(k0, 2 * k0 + 1))
    k = 2 * k0
    while k < n:
        k *= 2
        ks.add(min(k, n))
    return sorted({-(-n // k) for k in ks})


def choose_chunk(t: Target, n: int, segments: list[tuple[int, int]], repeat: int,
                 streams: list[tuple[int, bool, bool]],
                 compute: Callable[[int], tuple[float, float]], f_max: int) -> int:
    """The free chunk for a free axis of ``n`` streamed over row tiles.

    ``segments``: (row tiles, partitions) run one after the other (a partial row tile reuses
    the full ones' slots, so it runs behind them), the sequence ``repeat`` times (outer loops);
    ``streams``: (itemsize, contiguous along the free axis, is_store) per transfer of a tile;
    ``compute(f)``: (busiest engine's work, makespan) in ns of one ``[p, f]`` tile."""
    fixed = t.dma_transfer_ns

    def parts(f: int, p: int) -> tuple[float, float, float, float]:
        """(loads, stores, busiest engine, makespan of the compute) of one tile of ``f`` columns."""
        loads = sum(dma_tile_data_ns(p, f * isz, f * isz if contig else isz, t)
                    for isz, contig, st in streams if not st)
        stores = sum(dma_tile_data_ns(p, f * isz, f * isz if contig else isz, t)
                     for isz, contig, st in streams if st)
        return (loads, stores) + compute(f)

    def alone(f: int, p: int) -> float:
        """One tile through the whole chain, overlapping nothing."""
        loads, stores, _, span = parts(f, p)
        return (loads + fixed if loads else 0.0) + span + (stores + fixed if stores else 0.0)

    def segment(f: int, tiles: int, p: int) -> float:
        full, tail = divmod(n, f)
        loads, stores, busiest, _ = parts(f, p)
        m = tiles * full
        one = alone(f, p)
        dma = m * (loads + stores) + fixed                 # idle only before and after
        queue = (m - 1) * fixed + one                       # one fixed phase per tile and queue
        eng = m * busiest + one - busiest                   # waits for the first load, last store
        # the partial chunk after the loop reuses the loop's slots: it runs behind it, alone
        return max(dma, queue, eng) + (tiles * alone(tail, p) if tail else 0.0)

    def score(f: int) -> float:
        return repeat * sum(segment(f, tiles, p) for tiles, p in segments if tiles)

    best = min(chunk_candidates(n, f_max), key=lambda f: (score(f), -f))
    assert 1 <= best <= max(1, min(n, f_max))
    return best


_OF_SIZE = {d.itemsize: d for d in reversed(list(DType))}
PACE_MIN = 0.85   # of a fixed phase: the least data phase of a piece (the weight stream keeps the
#                   engines at least this busy: tir/schedule.py STREAM_SHARE)


@functools.lru_cache(maxsize=1024)
def paced_pieces(t: Target, partitions: int, elems: int, itemsize: int, transpose: bool = False,
                 run: int = 0) -> int:
    """Equal pieces to cut an HBM->SBUF transfer of ``partitions`` x ``elems`` (runs of ``run``
    contiguous elements, default the whole row; ``transpose``: a DMA transpose) into: the
    nearest whole number of fixed phases in its data phase (the simulator's cost of the
    transfer), or fewer when those would be shorter than ``PACE_MIN`` of it; at least one
    (module docstring: a paced weight stream)."""
    d = _OF_SIZE[itemsize]
    r = run or elems
    src = (AP("h", Memory.HBM, 0, 1, 0, ((partitions, elems), (1, partitions)), d) if transpose else
           AP("h", Memory.HBM, 0, 1, 0, ((elems, partitions), (r, elems // r), (1, r)), d))
    ins = Instr(Op.DMA_COPY, AP("s", Memory.SBUF, 0, partitions, 0, ((1, elems),), d), (src,),
                DmaAttrs(transpose))
    c = instr_cost(ins, dma_queue(0), t)
    if c.issue_ns <= 0:
        return 1
    x = max(c.busy_ns, c.hbm_ns) / c.issue_ns
    n = max(1, round(x))
    if x / n < PACE_MIN:       # pieces too short to keep the engines busy: at least one phase
        n = max(1, int(x))
    return min(elems, n)


def stream_loads(shape: MatmulShape, c: Blocking) -> int:
    """Transfers into the streamed side's slots over the kernel (``_emit``'s ``str`` tiles, one
    per K tile of each group of each block; the transposed form's ``wst`` chunks of ``kb`` K
    tiles, matmul/transposed.py), full groups and chunks only (the transposed form: 0 when
    there is a partial one). A partial last group of the usual form (its tile aliases the
    full ones' slots, so it loads after them whatever the slots) is left out of the count,
    so that a one-row kernel with one (GPT-2's LM head, N = 50257) still streams ahead
    (``matmul._stream_ahead``; with only three slots the LM head's loads waited for the last
    layer's MLP)."""
    TK, TN, TM = 128, 512, 128
    Kt = -(-shape.K // TK)
    if c.swap:
        if shape.N % (c.group * 128) or Kt % c.kb or shape.K % TK:
            return 0
        return -(-shape.M // (c.block * 512)) * (shape.N // (c.group * 128)) * (Kt // c.kb)
    st, rt = (TN, TM) if c.resident == "A" else (TM, TN)
    F, R = (shape.N, shape.M) if c.resident == "A" else (shape.M, shape.N)
    return -(-R // (c.block * rt)) * (F // (c.group * st)) * Kt


@functools.lru_cache(maxsize=None)
def row_by_transposes(t: Target, Kt: int) -> bool:
    """One resident row's ``Kt`` K tiles go to [128, Kt] by TensorE transposes when those (on a
    cold engine: its power ramp from the start speed, ``costs.TensorRamp``; two at a time where
    TensorE has a background transpose lane, ``costs.TensorLanes``) and the copy out of PSUM
    take less than the SBUF -> SBUF DMA they replace: its fixed phase and its data phase (one
    element per run: ``Kt`` x 128 runs of 2 bytes), all priced by the simulator's cost table."""
    tr = Instr(Op.TRANSPOSE, AP("ps", Memory.PSUM, 0, 128, 0, ((1, 1),), DType.FP32),
               (AP("row", Memory.SBUF, 0, 1, 0, ((1, 128),), DType.BF16),), TransposeAttrs())
    one = instr_cost(tr, Queue(EngineKind.TENSOR), t).busy_ns
    ramp = TensorLanes(t, None, [True] * Kt) if t.background_transpose else TensorRamp(t, None)
    now = end = 0.0
    for i in range(Kt):
        s, b = ramp.step(now, i, one)
        end = max(end, s + b)
        now = ramp.free if isinstance(ramp, TensorLanes) else s + b
    cp = Instr(Op.TENSOR_COPY, AP("x", Memory.SBUF, 0, 128, 0, ((1, Kt),), DType.BF16),
               (AP("ps", Memory.PSUM, 0, 128, 0, ((1, Kt),), DType.FP32),), TensorCopyAttrs())
    copy = min(instr_cost(cp, Queue(e), t).busy_ns for e in (EngineKind.VECTOR, EngineKind.SCALAR))
    dma = Instr(Op.DMA_COPY, AP("x", Memory.SBUF, 0, 128, 0, ((1, Kt),), DType.BF16),
                (AP("row", Memory.SBUF, 0, 1, 0, ((1, 128), (128, Kt)), DType.BF16),), DmaAttrs(False))
    c = instr_cost(dma, dma_queue(0), t)
    return end + copy < c.issue_ns + c.busy_ns
