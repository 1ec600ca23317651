"""Matmul blocking: enumerate a few candidate loop structures, score each with the simulator's
own cost table, keep the fastest that fits SBUF and PSUM.

A candidate (``Blocking``) keeps one operand *resident* in SBUF, one block at a time, and
streams the other:
- ``resident="A"``: blocks of ``block`` stationary m-tiles (128 rows of A each) hold A^T for
  all of K; for every group of ``group`` moving n-tiles (512 columns of B each) the K tiles of B
  stream through, and every B tile meets the whole block (B is read once per block).
- ``resident="B"``: the mirror image (blocks of n-tiles of B, groups of m-tiles of A^T).
The PSUM accumulators of one group (block x group tiles, one bank each) stay in PSUM for the
whole K loop, so a block is at most ``psum_banks`` tiles. ``resident="C"`` keeps the output
block (``block`` m-tiles x ``group`` n-tiles) in SBUF as fp32 accumulators instead and streams
both operands in chunks of ``kacc`` K tiles (``matmul/outres.py``): bounded by SBUF, not PSUM.
A *transposed* candidate (``swap``, ``matmul/transposed.py``) computes ``out^T = B^T A^T``: B
tiles [128 k, 128 n] are the stationary operand and A^T tiles [128 k, <= 512 m] the moving one,
so an instruction costs its moving size M (at least the 64-cycle LoadStationary minimum) instead
of 512 columns of B; A^T stays resident (blocks of m-tiles of 512), B streams in groups of
n-tiles of 128 (``kb`` K tiles per load), each cell [128 n, m] accumulating in a PSUM bank of
its own, and the results go back to [m, n] by TensorE transposes (``out="pe"``) or by a DMA
storing them column-wise in element runs (``out="dma"``). A decode step (M = 8) pays 64 cycles
per [128 x 128] weight tile instead of 512 per [128 x 512]. It is a candidate only where that
saves TensorE time (``saves_tensor_time``). In every form, a resident block of a few rows comes
by one DMA of all of K when its per-K-tile transfers would each be bound by the DMA's fixed
phase (``whole_block``).

The score of a candidate is an estimate of its run time on the target, from the costs of one
instruction of each kind (``runtime_sim.costs.instr_cost``) times how often it runs: the busiest
of TensorE (matmuls, TensorE transposes), the DMA engines and HBM (every load and store, with
its descriptor cost spread over the queues) and the PSUM evacuation engines, plus the exposed
time when a block cannot be prefetched (single-buffered) and the pipeline fill. No shape is
special-cased: every choice falls out of the target description.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass, field, replace

from runtime_sim.costs import instr_cost
from runtime_sim.isa import (AP, ActivationAttrs, ActFunc, AluOp, DmaAttrs, DType, EngineKind,
                             Instr, MatmulAttrs, Memory, Op, Queue, TensorCopyAttrs,
                             TensorTensorAttrs, TransposeAttrs, dma_queue)
from runtime_sim.targets import Target

DIRECT, DMA_T, PE_T, STRIDED = "direct", "dma_transpose", "pe_transpose", "strided"
RES_T = "resident_transpose"
OUTRES_BANKS = 4    # resident="C": PSUM banks the cells of an m-tile take in turn (the m-tile loop reuses them)
SBUF_SHARE = 0.92   # of a partition for one matmul kernel (the rest: the neighbours' prefetched tiles)
AHEAD_SHARE = 0.5   # of that for the slots of weights loaded ahead (``cell_tail``, ``matmul._whole_weights``)
STAGE_SHARE = 0.5  # of that for the staged rows of TensorE-transposed operands (see staged)
TA, TB = 512, 128   # transposed form: A^T (moving) and B (stationary) tile widths
BANK = 512          # fp32 elements per partition of a PSUM bank (the transposed form's cell slot)


# a machine dtype of each element size (the probe's transfers cost by bytes, not by type): every
# size a tensor can have, 8-byte ones included (an int64 mask read by an epilogue)
_OF_SIZE: dict[int, DType] = {}
for _d in DType:
    _OF_SIZE.setdefault(_d.itemsize, _d)


def staged(form: str, F: int, K: int, isz: int, t: Target) -> bool:
    """A TensorE-transposed operand (PE_T) loads its rows once per block or group, all of K at
    a time ([128 rows, K] per DMA: K x itemsize bytes per partition, not a [128, 128] tile's 256
    bytes, which the DMA fixed cost dominates), when two slots of them fit ``STAGE_SHARE``."""
    return (form == PE_T and K > 128
            and stage_bytes(F, K, isz) * 2 <= STAGE_SHARE * SBUF_SHARE * t.sbuf_bytes_per_partition)


def stage_bytes(F: int, K: int, isz: int) -> int:
    return -(-F // 128) * K * isz


@dataclass(frozen=True)
class MatmulShape:
    batch: int
    M: int
    N: int
    K: int
    dtype: DType          # operand dtype
    out_dtype: DType
    a_form: str           # how A^T tiles [K, M] are obtained
    b_form: str           # how B tiles [K, N] are obtained
    epi_inputs: tuple[DType, ...] = ()   # full-shape epilogue inputs
    epi_tiles: int = 2    # SBUF tiles the epilogue evaluates per output tile
    no_outres: bool = False   # no resident="C" candidates (a row bias folded into PSUM)
    k_pack: int = 1       # K rows per partition of a K tile (2: fp8 double-row, matmul/fp8.py)
    no_swap: str = ""     # why the transposed form is refused ("" when it is a candidate)
    no_dma_out: str = ""  # why its short-run store (out="dma") is refused
    cast_only: bool = False  # the epilogue only casts the accumulator (no epilogue, or a cast)
    acc_cast: bool = False   # it reads the accumulator only through casts to the output type
    a_packed: bool = False   # A's rows lie back to back (K contiguous, rows K apart, K % 128 == 0)
    b_packed: bool = False   # B's columns lie back to back (the same for B^T: a linear's weight)
    a_ahead: bool = False    # A's loads may run ahead, during earlier kernels (a graph input
    #                          read by a kernel that does not open the program)
    b_ahead: bool = False    # the same for B


def _ktiles(s: MatmulShape) -> tuple[int, int]:
    """(matmuls per output tile along K, [<=128, F] operand loads per K extent): a double-row
    K tile of 256 is one matmul fed by two half loads."""
    km = -(-s.K // (128 * s.k_pack))
    return km, km * s.k_pack


@dataclass(frozen=True)
class Blocking:
    resident: str         # "A" or "B"
    block: int            # resident tiles per block (A: m-tiles of 128; B: n-tiles of 512)
    group: int            # streamed tiles per group (A-resident: n-tiles; B-resident: m-tiles)
    block_bufs: int       # 2: the next block loads while this one computes
    acc_bufs: int
    stream: bool = False  # K too long to keep a block: the resident side is loaded per K tile
    stream_bufs: int = 3  # slots of the streamed tiles (set from the DMA latency, see estimate)
    kacc: int = 0         # resident="C": K tiles per chunk
    swap: bool = False    # transposed form (module docstring): B stationary, A^T moving
    kb: int = 1           # transposed form: K tiles per streamed load of B
    out: str = ""         # transposed form: "pe" (transposed back on TensorE) or "dma" (short runs)
    whole: bool = False   # the resident block comes by one DMA of all of K (whole_block)
    a_form: str = ""      # transposed form: A^T made this way instead of the shape's a_form
    est_ns: float = 0.0
    detail: dict = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        d = ", ".join(f"{k}={v:.1f}" for k, v in self.detail.items())
        tr = (f" (transposed: B stationary, A^T moving{', A ' + self.a_form if self.a_form else ''}, "
              f"kb={self.kb}, out={self.out})") if self.swap else ""
        return (f"resident={self.resident}{tr}{' (streamed per K tile)' if self.stream else ''}"
                f"{' (K tiles in one DMA)' if self.whole else ''} "
                f"block={self.block} group={self.group} "
                f"{f'kacc={self.kacc} ' if self.kacc else ''}stream_bufs={self.stream_bufs} "
                f"block_bufs={self.block_bufs} acc_bufs={self.acc_bufs} est={self.est_ns / 1e3:.2f} us ({d})")


def operand_form(kstride: int, fstride: int, free: int, dtype: DType, t: Target) -> str:
    """How to get tiles [K on partitions, F on the free dim] of an operand whose K axis has
    stride ``kstride`` and F axis ``fstride`` in HBM."""
    if fstride == 1 or free == 1:
        return DIRECT
    if kstride == 1:
        if dtype.itemsize == 2 and dtype.is_float and t.dma_transpose_efficiency > 0:
            return DMA_T
        return PE_T
    return STRIDED


class _Probe:
    """Costs of one instruction of each kind, from the cost table."""

    def __init__(self, s: MatmulShape, t: Target):
        self.t = t
        isz = s.dtype.itemsize
        dt = s.dtype

        def sb(p, f, d=dt, mem=Memory.SBUF):
            return AP("p", mem, 0, p, 0, ((1, f),), d)

        def hbm(p, f, d=dt, stride=None):
            return AP("h", Memory.HBM, 0, 1, 0, ((f if stride is None else stride, p), (1, f)), d)

        pe, act, dve = Queue(EngineKind.TENSOR), Queue(EngineKind.SCALAR), Queue(EngineKind.VECTOR)
        self.mm = instr_cost(Instr(Op.MATMUL, sb(128, 512, DType.FP32, Memory.PSUM),
                                   (sb(128, 128), sb(128, 512)), MatmulAttrs(True)), pe, t).busy_ns
        self.tp = instr_cost(Instr(Op.TRANSPOSE, sb(128, 128, DType.FP32, Memory.PSUM),
                                   (sb(128, 128),), TransposeAttrs()), pe, t).busy_ns
        tcp = Instr(Op.TENSOR_COPY, sb(128, 128), (sb(128, 128, DType.FP32, Memory.PSUM),),
                    TensorCopyAttrs())
        self.tp_copy = min(instr_cost(tcp, q, t).busy_ns for q in (act, dve))
        # a transpose's round trip TensorE -> PSUM -> copy -> SBUF: what TensorE waits when the
        # products that read the copy come right after the transpose
        self.tp_trip = min(sum(instr_cost(tcp, q, t)[:2]) for q in (act, dve)) + sum(
            instr_cost(Instr(Op.TRANSPOSE, sb(128, 128, DType.FP32, Memory.PSUM), (sb(128, 128),),
                             TransposeAttrs()), pe, t)[1:2])
        ev = Instr(Op.TENSOR_COPY, sb(128, 512, s.out_dtype), (sb(128, 512, DType.FP32, Memory.PSUM),),
                   TensorCopyAttrs())
        evs = Instr(Op.ACTIVATION, sb(128, 512, s.out_dtype), (sb(128, 512, DType.FP32, Memory.PSUM),),
                    ActivationAttrs(ActFunc.IDENTITY))
        self.evac = [instr_cost(ev, dve, t).busy_ns, instr_cost(evs, act, t).busy_ns]
        add = Instr(Op.TENSOR_TENSOR, sb(128, 512, DType.FP32), (sb(128, 512, DType.FP32),
                    sb(128, 512, DType.FP32, Memory.PSUM)), TensorTensorAttrs(AluOp.ADD))
        self.acc_add = min(instr_cost(add, q, t).busy_ns for q in (dve, Queue(EngineKind.GPSIMD)))
        self.isz = isz
        self._dma: dict[tuple, tuple[float, float, float]] = {}
        self._pe: dict[tuple, float] = {}
        self._sb, self._pe_q, self._evq = sb, pe, (act, dve)

    def matmul(self, m: int, n: int) -> float:
        """TensorE busy time of one product with a stationary of ``m`` and a moving operand of
        ``n`` columns (c_matmul: ``max(min(64, m), n)`` cycles, the 64-cycle minimum being the
        LoadStationary of a new stationary every instruction)."""
        key = ("mm", m, n)
        c = self._pe.get(key)
        if c is None:
            sb = self._sb
            c = self._pe[key] = instr_cost(Instr(Op.MATMUL, sb(128, n, DType.FP32, Memory.PSUM),
                                                 (sb(128, m), sb(128, n)), MatmulAttrs(True)),
                                           self._pe_q, self.t).busy_ns
        return c

    def transpose(self, p: int, f: int, d: DType) -> float:
        """TensorE busy time of one transpose of a [p, f] SBUF tile of ``d`` into PSUM."""
        key = ("tp", p, f, d)
        c = self._pe.get(key)
        if c is None:
            sb = self._sb
            c = self._pe[key] = instr_cost(Instr(Op.TRANSPOSE, sb(f, p, DType.FP32, Memory.PSUM),
                                                 (sb(p, f, d),), TransposeAttrs()),
                                           self._pe_q, self.t).busy_ns
        return c

    def copy(self, p: int, f: int, d: DType, trip: bool = False) -> float:
        """Busy time of one [p, f] fp32 copy out of PSUM to ``d`` on the cheaper of ScalarE and
        VectorE; ``trip``: until it completes (its access latency included)."""
        key = ("cp", p, f, d, trip)
        c = self._pe.get(key)
        if c is None:
            sb = self._sb
            ins = Instr(Op.TENSOR_COPY, sb(p, f, d), (sb(p, f, DType.FP32, Memory.PSUM),),
                        TensorCopyAttrs())
            c = self._pe[key] = min(sum(instr_cost(ins, q, self.t)[:1 + trip]) for q in self._evq)
        return c

    def dma(self, p: int, f: int, isz: int, transpose: bool = False, run: int | None = None):
        """(engine time, HBM time, queue time: the fixed phase) of one [p, f] HBM->SBUF transfer."""
        key = (p, f, isz, transpose, run)
        c = self._dma.get(key)
        if c is None:
            d = _OF_SIZE[isz]
            if transpose:
                src = AP("h", Memory.HBM, 0, 1, 0, ((p, f), (1, p)), d)
                ins = Instr(Op.DMA_COPY, AP("s", Memory.SBUF, 0, p, 0, ((1, f),), d), (src,), DmaAttrs(True))
            else:
                r = f if run is None else run
                src = AP("h", Memory.HBM, 0, 1, 0, ((f * 4, p), (r * 2, f // r), (1, r)), d) if r < f \
                    else AP("h", Memory.HBM, 0, 1, 0, ((f, p), (1, f)), d)
                ins = Instr(Op.DMA_COPY, AP("s", Memory.SBUF, 0, p, 0, ((1, f),), d), (src,), DmaAttrs())
            k = instr_cost(ins, dma_queue(0), self.t)
            c = self._dma[key] = (k.busy_ns, k.hbm_ns, k.issue_ns)
        return c


def _load_cost(pr: _Probe, form: str, p: int, f: int, isz: int, n: float, K: int = 0):
    """(dma engine ns, hbm ns, descriptor ns, tensorE ns, evac ns) of ``n`` [p, f] operand loads
    (``K``: the contraction size, for staged rows; 0 when not staged)."""
    if form == PE_T and K:
        kt = -(-K // 128)
        rows = n / kt * -(-f // 128)                  # [128, K] row loads, one per 128 of f
        e, h, d = pr.dma(min(128, f), K, isz)
        nt = n * -(-f // 128) * -(-p // 128)
        return rows * e, rows * h, rows * d, nt * pr.tp, nt * pr.tp_copy
    if form == DMA_T:
        e, h, d = pr.dma(p, f, isz, transpose=True)
        return n * e, n * h, n * d, 0.0, 0.0
    if form in (PE_T, RES_T):
        nt = n * -(-f // 128) * -(-p // 128)
        if form == RES_T:
            return 0.0, 0.0, 0.0, nt * pr.tp, nt * pr.tp_copy
        e, h, d = pr.dma(p, f, isz)
        return n * e, n * h, n * d, nt * pr.tp, nt * pr.tp_copy
    e, h, d = pr.dma(p, f, isz, run=1 if form == STRIDED else None)
    return n * e, n * h, n * d, 0.0, 0.0


def whole_block(s: MatmulShape, c: Blocking, t: Target, pr: _Probe) -> bool:
    """The resident block comes by one DMA of all its K tiles (``matmul._Side.load_whole``)
    instead of one per K tile, when even that one transfer is bound by its fixed phase (its data
    phase no longer than the fixed one, ``runtime_sim.costs.c_dma``): the same bytes, the
    latency of one K tile's transfer, K/128 - 1 fixed phases fewer on its queue (a decode
    step's x^T [8192, 8]: 64 transfers, 38 us of fixed phases ahead of the weights on a shared
    queue, become one). A
    directly read block (``DIRECT``) is one strided DMA; one read by DMA transposes (``DMA_T``)
    needs its rows back to back in HBM (``MatmulShape.a_packed`` / ``b_packed``: viewed as
    [F * K/128, 128] rows, one 2-D transpose)."""
    if c.resident == "C" or c.stream or s.k_pack > 1 or s.K % 128 or s.K <= 128:
        return False
    if c.swap or c.resident == "A":
        form, packed, F = c.a_form or s.a_form, s.a_packed, min(s.M, c.block * (TA if c.swap else 128))
    else:
        form, packed, F = s.b_form, s.b_packed, min(s.N, c.block * 512)
    if not (form == DIRECT or (form == DMA_T and packed)):
        return False
    data, _, fixed, _, _ = _whole_cost(pr, form, F, s.K, s.dtype.itemsize, 1)
    return data <= fixed


def stream_whole(s: MatmulShape, c: Blocking, t: Target) -> bool:
    """The streamed side comes by one DMA of all its K tiles, read by every block
    (``matmul._Side.load_whole`` into one tile), instead of one transfer per K tile into
    ``stream_bufs`` slots: where it is one group of a few directly read rows or columns (a
    decode step's x^T, [768, 1]) whose per-K-tile transfers are each bound by the DMA's fixed
    phase (``whole_block``'s test) and lie on the chain of dependent kernels: GPT-2's
    attention output went to the projection in six [128, 1] copies, 0.6 us apart on one queue."""
    if c.resident not in ("A", "B") or c.swap or c.stream or s.k_pack > 1 or s.K % 128 or s.K <= 128:
        return False
    form, F, st = (s.b_form, s.N, 512) if c.resident == "A" else (s.a_form, s.M, 128)
    if form != DIRECT or F > c.group * st:
        return False
    data, _, fixed, _, _ = _whole_cost(_Probe(s, t), form, F, s.K, s.dtype.itemsize, 1)
    return data <= fixed


def _whole_cost(pr: _Probe, form: str, F: int, K: int, isz: int, n: int):
    """``_load_cost`` of ``n`` whole-block loads (``whole_block``)."""
    if form == DMA_T:
        e, h, d = pr.dma(128, F * (K // 128), isz, transpose=True)
    else:
        e, h, d = pr.dma(128, F * (K // 128), isz, run=F)
    return n * e, n * h, n * d, 0.0, 0.0


def estimate(s: MatmulShape, c: Blocking, t: Target, pr: _Probe) -> tuple[float, dict]:
    if c.resident == "C":
        return _estimate_outres(s, c, t, pr)
    if c.swap:
        return _estimate_transposed(s, c, t, pr)
    Mt, Nt = -(-s.M // 128), -(-s.N // 512)
    Km, Kt = _ktiles(s)
    isz = s.dtype.itemsize
    B = s.batch
    if c.resident == "A":
        nblocks = -(-Mt // c.block)
        ngroups = -(-Nt // c.group)
        res_f, str_f = min(c.block * 128, s.M), min(c.group * 512, s.N)
        res_form, str_form = s.a_form, s.b_form
    else:
        nblocks = -(-Nt // c.block)
        ngroups = -(-Mt // c.group)
        res_f, str_f = min(c.block * 512, s.N), min(c.group * 128, s.M)
        res_form, str_form = s.b_form, s.a_form
    group_mm = c.block * c.group * Km
    # loads per K extent: a direct operand loads both halves of a double-row K tile in one DMA
    rk, sk = (Km if f == DIRECT else Kt for f in (res_form, str_form))
    if s.k_pack > 1:
        res_f, str_f = (f * s.k_pack if form == DIRECT else f
                        for f, form in ((res_f, res_form), (str_f, str_form)))
    res_n, str_n = B * nblocks * rk, B * nblocks * ngroups * sk
    if c.stream:
        res_n = B * nblocks * ngroups * rk
    kp = min(128, -(-s.K // s.k_pack))
    r = _load_cost(pr, res_form, kp, res_f, isz, res_n,
                   s.K if not c.stream and staged(res_form, res_f, s.K, isz, t) else 0)
    if c.whole:
        res_n = B * nblocks
        r = _whole_cost(pr, res_form, res_f, s.K, isz, res_n)
    q = _load_cost(pr, str_form, kp, str_f, isz, str_n, s.K if staged(str_form, str_f, s.K, isz, t) else 0)
    n_out = B * Mt * Nt
    dma, oe = _dma_time(s, t, pr, r, q, n_out)
    pe = B * Mt * Nt * Km * pr.mm + r[3] + q[3]
    if str_form == PE_T:
        # the streamed side is transposed K tile by K tile right before its products: TensorE
        # waits for each tile's round trip through PSUM and the copy out of it (without it a
        # large trn1 matmul's estimate fell far below its simulated time). Rows resident in
        # SBUF (RES_T) are left out: the model-sized matmuls that take them measured slower
        # with it
        pe += str_n * -(-str_f // 128) * pr.tp_trip
    evac = (n_out * sum(pr.evac) / len(pr.evac) * max(1, s.epi_tiles) + r[4] + q[4]) / 2
    # exposed: the first block's first loads; single-buffered blocks wait for the previous block
    fill = 2 * t.dma_transfer_ns
    block_load = (r[0] / max(res_n, 1)) * rk
    group_time = group_mm * pr.mm
    exposed = 0.0
    if nblocks > 1 and c.block_bufs == 1:
        exposed = (nblocks - 1) * B * max(0.0, block_load - group_time)
    # a streamed tile is in flight for its whole DMA latency: with ``stream_bufs`` slots the
    # loads sustain at most stream_bufs transfers per latency
    lat = t.dma_transfer_ns
    q1 = q[0] / max(str_n, 1)
    dma = max(dma, str_n * (lat + q1) / max(1, c.stream_bufs))
    # every execution of one static transfer goes through its queue, whose descriptor
    # generation serialises them
    dma = max(dma, q[2], r[2])
    # unstaged TensorE-transposed loads: [128, 128] row tiles through two slots each, every
    # one in flight for the DMA latency
    for form, f, n, st in ((res_form, res_f, res_n, not c.stream and staged(res_form, res_f, s.K, isz, t)),
                           (str_form, str_f, str_n, staged(str_form, str_f, s.K, isz, t))):
        if form == PE_T and not st:
            e1 = pr.dma(kp, min(128, f), isz)[0]
            dma = max(dma, n * -(-f // 128) * (lat + e1) / 2)
    # fill: the first resident and streamed tiles; drain: the last group's epilogue
    fill = lat + r[0] / max(res_n, 1) + lat + q1
    cells = c.block * c.group
    drain = cells * (sum(pr.evac) / len(pr.evac) + oe) + lat
    total = max(pe, dma, evac) + exposed + fill + drain
    return total, {"pe": pe / 1e3, "dma": dma / 1e3, "evac": evac / 1e3, "exposed": exposed / 1e3,
                   "fill": fill / 1e3, "drain": drain / 1e3}


def paced_first_group(r, blocks: int, q, groups: int, group_pe: float) -> float:
    """What the first group of the first block loses to its resident block's loads (``r``: the
    costs of all of them, over ``blocks`` blocks): one static transfer, so one queue issuing
    one per max(fixed phase, data phase), and the products of K tile j wait for tile j; the
    group itself takes the longer of its products (``group_pe``) and its streamed loads (``q``
    over ``groups`` groups, on their own queue). K tiles of a few rows are bound by the fixed
    phase: 30 DMA transposes of x^T [128, 8] take 18 us, while the weights of a group of 384
    columns arrive in 6. Not counted for an operand whose loads run ahead during earlier
    kernels (``MatmulShape.a_ahead``: a model's weights on the weight stream).
    Only the transposed form's score counts it so far: in the usual form's, it reorders
    choices the simulator does not confirm (a resident A of a few rows against B streamed per K
    tile, measured slower on [8, 2100] @ [2100, 1500]), so that score is left as it was."""
    if blocks <= 0 or groups <= 0:
        return 0.0
    return max(0.0, max(r[0], r[2]) / blocks - max(group_pe, max(q[0], q[2]) / groups))


def _dma_time(s: MatmulShape, t: Target, pr: _Probe, r, q, n_out: int) -> tuple[float, float]:
    """(DMA time of the operand loads ``r``, ``q`` and the ``n_out`` output tiles with their
    epilogue inputs: the busiest of the engines, HBM and descriptor generation; one output
    tile's engine time)."""
    oe, oh, od = pr.dma(min(128, s.M), min(512, s.N), s.out_dtype.itemsize)
    epi = [pr.dma(min(128, s.M), min(512, s.N), d.itemsize) for d in s.epi_inputs]
    dma_e = r[0] + q[0] + n_out * (oe + sum(e for e, _, _ in epi))
    hbm = r[1] + q[1] + n_out * (oh + sum(h for _, h, _ in epi))
    desc = (r[2] + q[2] + n_out * (od + sum(d for _, _, d in epi))) / t.dma_engines
    return max(dma_e, hbm, desc), oe


def _estimate_outres(s: MatmulShape, c: Blocking, t: Target, pr: _Probe) -> tuple[float, dict]:
    """resident="C": A read once per n-block, B once per m-block, in [128, block] / [128, group]
    loads per K tile; one PSUM add (or the first chunk's copy) per cell and chunk; the epilogue
    from SBUF."""
    Mt, Nt, Kt = -(-s.M // 128), -(-s.N // 512), -(-s.K // 128)
    isz = s.dtype.itemsize
    B = s.batch
    nmb, nnb = -(-Mt // c.block), -(-Nt // c.group)
    af, bf = min(c.block * 128, s.M), min(c.group * 512, s.N)
    kp = min(128, s.K)
    kc = min(s.K, c.kacc * 128)       # TensorE-transposed sides load a chunk's rows at once
    a = _load_cost(pr, s.a_form, kp, af, isz, B * nmb * nnb * Kt, kc if s.a_form == PE_T else 0)
    q = _load_cost(pr, s.b_form, kp, bf, isz, B * nmb * nnb * Kt, kc if s.b_form == PE_T else 0)
    n_out = B * Mt * Nt
    dma, oe = _dma_time(s, t, pr, a, q, n_out)
    dma = max(dma, a[2], q[2])
    pe = B * Mt * Nt * Kt * pr.mm + a[3] + q[3]
    chunks = -(-Kt // c.kacc)
    evac = (n_out * chunks * pr.acc_add + n_out * sum(pr.evac) / len(pr.evac) * max(1, s.epi_tiles)
            + a[4] + q[4]) / 2
    lat = t.dma_transfer_ns
    # fill: the first chunk of both sides; drain: the last block's epilogue
    fill = lat + (a[0] + q[0]) / max(1, B * nmb * nnb * chunks)
    drain = c.block * c.group * (sum(pr.evac) / len(pr.evac) + oe) + lat
    total = max(pe, dma, evac) + fill + drain
    return total, {"pe": pe / 1e3, "dma": dma / 1e3, "evac": evac / 1e3, "fill": fill / 1e3,
                   "drain": drain / 1e3}


def _widths(n: int, step: int) -> list[tuple[int, int]]:
    """(width, count) of the tiles of ``n`` in steps of ``step``: the full ones and the tail."""
    full, rem = divmod(n, step)
    return [(w, c) for w, c in ((step, full), (rem, 1 if rem else 0)) if c]


def ev_dtype(s: MatmulShape) -> DType:
    """The transposed form's cells leave PSUM as this type for their TensorE transposes back:
    the output type when the epilogue only casts, or reads the accumulator only through casts
    to the output type (``acc_cast``: GPT-2's ``residual + cast(acc)`` and ``gelu(cast(acc))``
    once their biases are folded): the rounding it would do anyway, and a 2-byte transpose
    costs a quarter of an fp32 one; else fp32 (exact)."""
    o = s.out_dtype
    return o if (s.cast_only or s.acc_cast) and o.is_float and o.itemsize in (2, 4) else DType.FP32


def _estimate_transposed(s: MatmulShape, c: Blocking, t: Target, pr: _Probe) -> tuple[float, dict]:
    """The transposed form (``matmul/transposed.py``): per block of A^T, every group of B
    n-tiles streams through in chunks of ``kb`` K tiles; each product costs its own moving
    width (``_Probe.matmul``); the cells go back to [m, n] by TensorE transposes and the usual
    epilogue (``out="pe"``) or by the epilogue on [n, m] and element-run stores (``"dma"``)."""
    B, isz, osz = s.batch, s.dtype.itemsize, s.out_dtype.itemsize
    Mt, Nt, Kt = -(-s.M // TA), -(-s.N // TB), -(-s.K // 128)
    nblocks, ngroups = -(-Mt // c.block), -(-Nt // c.group)
    rw, sw = min(c.block * TA, s.M), min(c.group * TB, s.N)
    a_form = c.a_form or s.a_form
    kp = min(128, s.K)
    lat = t.dma_transfer_ns
    res_n = B * nblocks * Kt
    r = _load_cost(pr, a_form, kp, rw, isz, res_n, s.K if staged(a_form, rw, s.K, isz, t) else 0)
    if c.whole:
        res_n = B * nblocks
        r = _whole_cost(pr, a_form, rw, s.K, isz, res_n)
    chunks = -(-Kt // c.kb)
    if c.kb > 1:     # one DMA per chunk of kb K tiles: runs of the group's sw columns
        str_n = B * nblocks * ngroups * chunks
        e, h, d = pr.dma(kp, c.kb * sw, isz, run=sw)
        q = (str_n * e, str_n * h, str_n * d, 0.0, 0.0)
    else:
        str_n = B * nblocks * ngroups * Kt
        q = _load_cost(pr, s.b_form, kp, sw, isz, str_n, s.K if staged(s.b_form, sw, s.K, isz, t) else 0)
    mm = products_ns(s, pr, True)
    pe = mm + r[3] + q[3]
    if s.b_form == PE_T:     # transposed K tile by K tile right before its products
        pe += str_n * -(-sw // 128) * pr.tp_trip
    cells = B * Mt * Nt                      # [<=128 n, <=512 m] accumulators
    ev = ev_dtype(s)
    mchunks = B * sum(cm * -(-wm // 128) for wm, cm in _widths(s.M, TA))   # [<=128 m] row chunks
    if c.out == "pe":
        # per output tile [<=128 m, <=512 n]: one copy of its cells' columns out of PSUM, a
        # transpose per cell, the usual epilogue on the PSUM bank the transposes fill; one
        # store per group and 128 rows
        mc = min(128, s.M)
        n_epi = mchunks * -(-s.N // 512)
        per_out = min(4, Nt)
        copies = n_epi * pr.copy(128, per_out * mc, ev)
        pe += mchunks * Nt * pr.transpose(min(128, s.N), mc, ev)
        epi = n_epi * sum(pr.evac) / len(pr.evac) * max(1, s.epi_tiles)
        n_st = mchunks * ngroups
        o = pr.dma(mc, sw, osz)
        ins = [pr.dma(mc, min(512, s.N), d.itemsize) for d in s.epi_inputs]
        stall = pr.copy(128, per_out * mc, ev, trip=True)
        tail = -(-rw // 128) * (pr.copy(128, per_out * mc, ev) + per_out * pr.transpose(
            min(128, s.N), mc, ev) + -(-sw // 512) * sum(pr.evac) / len(pr.evac) * max(1, s.epi_tiles))
    else:
        # per cell: the epilogue on [n, m] (every instruction reading a [128, m] tile); one store
        # per group and m-tile, and any full-shape epilogue input per cell, in element runs
        n_epi = cells
        mw = min(TA, s.M)
        copies = 0.0
        epi = cells * pr.copy(min(128, s.N), mw, s.out_dtype) * max(1, s.epi_tiles)
        n_st = B * Mt * ngroups
        o = pr.dma(min(128, s.N), min(c.group, Nt) * mw, osz, run=1)
        ins = [pr.dma(min(128, s.N), mw, d.itemsize, run=1) for d in s.epi_inputs]
        stall = 0.0
        tail = -(-rw // TA) * min(c.group, Nt) * pr.copy(min(128, s.N), mw, s.out_dtype) * max(1, s.epi_tiles)
    dma_e = r[0] + q[0] + n_st * o[0] + n_epi * sum(x[0] for x in ins)
    hbm = r[1] + q[1] + n_st * o[1] + n_epi * sum(x[1] for x in ins)
    desc = (r[2] + q[2] + n_st * o[2] + n_epi * sum(x[2] for x in ins)) / t.dma_engines
    # every static transfer's executions go through one queue: the stores one per max(fixed,
    # data) phase
    dma = max(dma_e, hbm, desc, q[2], r[2], n_st * max(o[0], o[2]))
    q1 = q[0] / max(str_n, 1)
    dma = max(dma, str_n * (lat + q1) / max(1, c.stream_bufs))
    for form, f, n, st in ((a_form, rw, res_n, staged(a_form, rw, s.K, isz, t)),
                           (s.b_form, sw, str_n, staged(s.b_form, sw, s.K, isz, t))):
        if form == PE_T and not st:
            dma = max(dma, n * -(-f // 128) * (lat + pr.dma(kp, min(128, f), isz)[0]) / 2)
    evac = (copies + epi + r[4] + q[4]) / 2
    # exposed: single-buffered blocks wait for the previous block; every group's cells wait
    # for their copy out of PSUM before TensorE transposes them back
    nb = B * nblocks * ngroups
    group_mm = mm / max(1, nb)
    exposed = nb * stall + (0.0 if s.a_ahead else paced_first_group(r, B * nblocks, q, nb, group_mm))
    if c.out == "dma":
        # a store in element runs holds every DMA engine for its whole data phase: the next
        # group's streamed loads wait behind it, and TensorE waits for them (fp32 [200, 2100]
        # @ [2100, 1500] on trn3)
        exposed += n_st * o[0]
    if nblocks > 1 and c.block_bufs == 1:
        exposed += (nblocks - 1) * B * max(0.0, r[0] / max(1, B * nblocks) - group_mm)
    fill = lat + r[0] / max(res_n, 1) + lat + q1
    drain = tail + o[0] + lat
    total = max(pe, dma, evac) + exposed + fill + drain
    return total, {"pe": pe / 1e3, "dma": dma / 1e3, "evac": evac / 1e3, "exposed": exposed / 1e3,
                   "fill": fill / 1e3, "drain": drain / 1e3}


def stream_slots(s: MatmulShape, c: Blocking, t: Target, pr: _Probe) -> int:
    """Slots for the streamed tiles: enough transfers in flight to cover the DMA latency while
    TensorE works through one streamed tile (3 to 8)."""
    isz = s.dtype.itemsize
    if c.resident == "C":
        return 2
    if c.swap:
        sw = min(c.group * TB, s.N)
        data = pr.dma(min(128, s.K), c.kb * sw, isz, run=sw)[0]
        work = max(data, c.kb * c.block * c.group * pr.matmul(min(TB, s.N), min(TA, s.M)))
    else:
        str_f = min(c.group * 512, s.N) if c.resident == "A" else min(c.group * 128, s.M)
        data = pr.dma(min(128, s.K), str_f, isz)[0]
        work = max(data, c.block * c.group * pr.mm)
    lat = t.dma_transfer_ns
    return max(3, min(8, -(-int(lat + data) // max(1, int(work))) + 1))


def cell_tail(s: MatmulShape, c: Blocking, t: Target, ahead: int) -> int:
    """K tiles at the end of a group whose products run cell-major (``matmul/cells.py``; only
    where every K tile of both sides is in SBUF when the group starts): all of them when the
    resident operand is a weight the schedule loads ahead (``ahead``: weight-streaming kernels,
    ``tir.plan.WEIGHT_STREAMS_AHEAD``) and ``ahead`` kernels' weights of its size fit the share
    of SBUF a kernel leaves for them (``AHEAD_SHARE``): then its K tiles are loaded during the
    kernels before it, and each cell's epilogue runs under the next cell's products instead of
    all of them after the group's last product. Else none: a weight that streams in during the
    kernel's own products (Llama's 8 MiB projections on trn2) arrives K tile by K tile, and
    cell-major order would leave all but the first cell's products for after its last tile."""
    if not (s.b_ahead if c.resident == "B" else s.a_ahead):
        return 0
    per_partition = -(-s.K // 128) * (s.N if c.resident == "B" else s.M) * s.dtype.itemsize
    if per_partition * ahead > AHEAD_SHARE * SBUF_SHARE * t.sbuf_bytes_per_partition:
        return 0
    return -(-s.K // 128)


def footprint(s: MatmulShape, c: Blocking, t: Target) -> tuple[int, int]:
    """(SBUF bytes per partition, PSUM banks) of a candidate. A partial block, group or tile
    reuses the bytes of the full one (the builder's tail aliases; an SBUF tile under
    ``ALIAS_MIN_BYTES``, a few KiB, takes its own), so the full shapes count."""
    isz, osz = s.dtype.itemsize, s.out_dtype.itemsize
    Kt = _ktiles(s)[1]
    if c.resident == "C":
        rw, sw = min(s.M, c.block * 128), min(s.N, c.group * 512)
        sb = -(-rw // 128) * -(-sw // 512) * 512 * 4 + 2 * c.kacc * (rw + sw) * isz
        # (results are computed into their accumulator's bytes: only intermediates take tiles)
        sb += 4 * 512 * 4 * max(0, s.epi_tiles - 1) + sum(2 * 512 * d.itemsize for d in s.epi_inputs)
        tps = 0
        for form, F, slots in ((s.a_form, rw, 2), (s.b_form, sw, 1)):
            if form in (PE_T, RES_T):
                if form == PE_T:     # a chunk's rows (A: two slots, staged two chunks ahead)
                    sb += slots * -(-F // 128) * min(s.K, c.kacc * 128) * isz
                tps += 1             # one bank: matmul.outres.TP_BUFS slots of [128, 128]
        return sb, c.acc_bufs + tps
    if c.swap:
        return _footprint_transposed(s, c, t)
    if c.resident == "A":
        rw, sw = min(s.M, c.block * 128), min(s.N, c.group * 512)
        res_form, str_form, rt, st = s.a_form, s.b_form, 128, 512
    else:
        rw, sw = min(s.N, c.block * 512), min(s.M, c.group * 128)
        res_form, str_form, rt, st = s.b_form, s.a_form, 512, 128
    sb = (3 * s.k_pack * rw if c.stream else Kt * rw * c.block_bufs) * isz \
        + c.stream_bufs * s.k_pack * sw * isz
    sb += 4 * 512 * (osz + 4 * max(0, s.epi_tiles - 1)) + sum(2 * 512 * d.itemsize for d in s.epi_inputs)
    acc = -(-rw // rt) * -(-sw // st) * c.acc_bufs
    tps = 0
    for form, F, side_stream in ((res_form, rw, c.stream), (str_form, sw, False)):
        if form in (PE_T, RES_T):
            if form == PE_T and not side_stream and staged(form, F, s.K, isz, t):
                sb += 2 * stage_bytes(F, s.K, isz)
            elif form == PE_T:
                sb += 2 * 128 * isz
            tps += 2
    return sb, acc + tps


def _footprint_transposed(s: MatmulShape, c: Blocking, t: Target) -> tuple[int, int]:
    """The transposed form: A^T blocks of all of K, ``stream_bufs`` chunks of B, the epilogue's
    tiles; a PSUM bank per cell (``acc_bufs`` sets), two for the transposes back (``out="pe"``),
    two per TensorE-transposed operand."""
    isz, osz = s.dtype.itemsize, s.out_dtype.itemsize
    Kt = -(-s.K // 128)
    rw, sw = min(s.M, c.block * TA), min(s.N, c.group * TB)
    a_form = c.a_form or s.a_form
    sb = Kt * rw * c.block_bufs * isz + c.stream_bufs * c.kb * sw * isz
    if Kt % c.kb or s.K % 128:      # the partial last chunk's own two slots
        sb += 2 * c.kb * sw * isz
    tps = 0
    for form, F in ((a_form, rw), (s.b_form, sw)):
        if form in (PE_T, RES_T):
            sb += 2 * stage_bytes(F, s.K, isz) if form == PE_T and staged(form, F, s.K, isz, t) else \
                2 * 128 * isz if form == PE_T else 0
            tps += 2
    mw = min(TA, s.M)
    ins = sum(d.itemsize for d in s.epi_inputs)
    if c.out == "pe":     # the copies out of PSUM, the epilogue's tiles, a group's rows
        sb += 2 * 4 * min(128, s.M) * ev_dtype(s).itemsize + 2 * sw * osz
        sb += 4 * 512 * (osz + 4 * max(0, s.epi_tiles - 1)) + 2 * 512 * ins
        tps += 2
    else:                 # the epilogue's tiles, a group's columns of an m-tile
        sb += 4 * mw * (osz + 4 * max(0, s.epi_tiles - 1)) + 2 * mw * ins + 2 * c.group * mw * osz
    return sb, c.block * c.group * c.acc_bufs + tps


def _sizes(n: int) -> list[int]:
    """Block sizes to try for ``n`` tiles: its divisors (no partial block) and powers of two."""
    return sorted({d for d in range(1, n + 1) if n % d == 0 and d <= 64} | {min(n, 2 ** i) for i in range(7)})


def candidates(s: MatmulShape, t: Target) -> list[Blocking]:
    Mt, Nt = -(-s.M // 128), -(-s.N // 512)
    out = []
    for res, rt, st in (("A", Mt, Nt), ("B", Nt, Mt)):
        for blk in _sizes(rt):
            for grp in _sizes(st):
                if blk * grp > t.psum_banks:
                    continue
                for bb in (2, 1):
                    for ab in (2, 1):
                        out.append(Blocking(res, blk, grp, bb, ab))
                        if bb == 1:
                            out.append(Blocking(res, blk, grp, 1, ab, stream=True))
    out += transposed_candidates(s, t)
    Kt = -(-s.K // 128)
    if not s.no_outres and Kt > 2:       # output blocks past what PSUM holds at once
        for blk in sorted(set(_sizes(Mt)) | set(range(2, min(Mt, 32) + 1, 2))):
            for grp in range(1, min(Nt, 8) + 1):
                if blk * grp <= t.psum_banks // 2 or blk > 32:
                    continue
                # (chunks of at least four K tiles: two-tile chunks measured slower than their
                # estimate, their rows' 512-byte DMA runs and per-chunk adds)
                for kacc in sorted({min(Kt, 4), min(Kt, 8)}):
                    out.append(Blocking("C", blk, grp, 1, OUTRES_BANKS, kacc=kacc))
    return out


def bias_by_products(s: MatmulShape, c: Blocking, t: Target, n: int = 1, ahead: int = 3) -> bool:
    """Fold ``n`` row biases into PSUM (``matmul.fold_row_bias``: a ones-row product per output
    tile on TensorE, ``max(min(64, m), n)`` cycles like a K tile's product) rather than add each
    from a [128, N] broadcast tile when the tile leaves PSUM (``matmul._bias_bcast``: an add
    reading PSUM instead of a copy, and P x N bytes more to load). The broadcast tile is a
    weight load, streamed ahead with the kernel's weights (the memory plan keeps weights up to
    ``ahead`` weight-streaming kernels ahead), so its bytes are free where the weight stream
    keeps up with the compute: where the kernel's loads (its estimate, ``Blocking.detail``) take
    at most ``ahead - 1`` times its TensorE time, the weights of the next kernels load while it
    and the ones between compute. There, whichever leaves the busier of TensorE and the
    evacuation engines (evacuation spread over two engines) less busy; elsewhere the program
    waits for its weight stream, and the products cost no bytes."""
    pr = _Probe(s, t)
    cells = s.batch * -(-s.M // 128) * -(-s.N // 512)
    products = n * cells * pr.matmul(min(128, s.M), min(512, s.N))

    def sb(d, mem=Memory.SBUF):
        return AP("p", mem, 0, min(128, s.M), 0, ((1, min(512, s.N)),), d)

    add = Instr(Op.TENSOR_TENSOR, sb(s.out_dtype), (sb(DType.FP32, Memory.PSUM), sb(s.dtype)),
                TensorTensorAttrs(AluOp.ADD))
    adds = n * cells * max(0.0, instr_cost(add, Queue(EngineKind.VECTOR), t).busy_ns - min(pr.evac))
    pe, evac = c.detail.get("pe", 0.0) * 1e3, c.detail.get("evac", 0.0) * 1e3
    if c.detail.get("dma", 0.0) * 1e3 > (ahead - 1) * pe:
        return True
    return max(pe + products, evac) <= max(pe, evac + adds / 2)


def products_ns(s: MatmulShape, pr: _Probe, swap: bool) -> float:
    """TensorE time of every product of the usual form (A^T tiles [128 k, <= 128 m]
    stationary, B tiles [128 k, <= 512 n] moving) or of the transposed one."""
    if swap:
        tiles = ((wn, wm, cm * cn) for wm, cm in _widths(s.M, TA) for wn, cn in _widths(s.N, TB))
    else:
        tiles = ((wm, wn, cm * cn) for wm, cm in _widths(s.M, 128) for wn, cn in _widths(s.N, 512))
    return s.batch * _ktiles(s)[0] * sum(n * pr.matmul(st, mv) for st, mv, n in tiles)


def saves_tensor_time(s: MatmulShape, pr: _Probe) -> bool:
    """The transposed form is a candidate only where its products take less TensorE time than
    the usual form's (few rows, or a partial last m-tile: a product's cost is its moving size,
    so 8 rows stream 8 columns instead of 512); where they cost the same (M a multiple of 128)
    it would only add the transposes back."""
    return products_ns(s, pr, True) < products_ns(s, pr, False)


def transposed_candidates(s: MatmulShape, t: Target) -> list[Blocking]:
    """The transposed form's candidates (none when ``s.no_swap`` says why not, for fp8
    double-row K tiles, or where it saves no TensorE time: ``saves_tensor_time``): blocks of
    A^T m-tiles, groups of B n-tiles (a bank per cell), ``kb`` K tiles per load of a directly
    read B, each way back to [m, n], and an A^T made by DMA transposes alternatively made from
    its rows, loaded once and transposed on TensorE (``a_form``: one DMA for all of K instead of
    a fixed phase per K tile, which paces the first group: ``paced_first_group``)."""
    if s.no_swap or s.k_pack > 1 or not saves_tensor_time(s, _Probe(s, t)):
        return []
    Mt, Nt, Kt = -(-s.M // TA), -(-s.N // TB), -(-s.K // 128)
    kbs = [1] + ([k for k in (2, 4, 8) if k <= Kt] if s.b_form == DIRECT else [])
    outs = ["pe"] + ([] if s.no_dma_out else ["dma"])
    forms = [""] + ([PE_T] if s.a_form == DMA_T and staged(PE_T, min(s.M, TA), s.K, s.dtype.itemsize, t) else [])
    out = []
    for blk in _sizes(Mt):
        for grp in _sizes(Nt):
            if blk * grp > t.psum_banks:
                continue
            for bb in ((2, 1) if blk < Mt else (2,)):
                for ab in (2, 1):
                    for kb in kbs:
                        for o in outs:
                            for af in forms:
                                out.append(Blocking("A", blk, grp, bb, ab, swap=True, kb=kb,
                                                    out=o, a_form=af))
    return out


def choose_blocking(s: MatmulShape, t: Target) -> tuple[Blocking, list[Blocking]]:
    """The fastest candidate that fits, and every fitting candidate scored (for the dump). A
    function of the shape and the target alone, so remembered per process (a model's layers
    repeat the same few shapes)."""
    best, scored = _choose_blocking(s, t)
    return best, list(scored)


@functools.lru_cache(maxsize=1024)
def _choose_blocking(s: MatmulShape, t: Target) -> tuple[Blocking, tuple[Blocking, ...]]:
    pr = _Probe(s, t)
    cap = int(t.sbuf_bytes_per_partition * SBUF_SHARE)
    scored = []
    for c in candidates(s, t):
        c = replace(c, stream_bufs=stream_slots(s, c, t, pr))
        c = replace(c, whole=whole_block(s, c, t, pr))
        sb, banks = footprint(s, c, t)
        if sb > cap or banks > t.psum_banks:
            continue
        est, det = estimate(s, c, t, pr)
        scored.append(replace(c, est_ns=est, detail=det))
    if not scored:  # even one [128 x 512] tile of each side per K tile does not fit
        raise ValueError(f"no matmul blocking fits: M={s.M} N={s.N} K={s.K} {s.dtype.value}")
    scored.sort(key=lambda c: (c.est_ns, c.block_bufs == 1, -c.block, -c.group))
    return scored[0], tuple(scored)
