"""Tiling of ATTENTION kernels: flash attention (online softmax over key blocks) on TensorE,
ScalarE and VectorE/GpSimdE; scores and probabilities never leave SBUF/PSUM.

Per batch index and group of ``J`` query blocks of 128 rows (J from the PSUM budget), with
Q^T [D, 128] loaded once per block and running statistics m (max), l (sum) and an fp32
accumulator O [128, Dv] in SBUF:
    for each key block of up to 512 keys:                    K^T [D, kw], V [kw, Dv] loaded once
        S = Q^T.T @ K^T                    TensorE -> PSUM [128, kw] (fp32; D > 128 accumulates)
        m' = max(m, scale * rowmax(S))     VectorE/GpSimdE
        P = exp(scale * S - m'), s = sum P ScalarE, one activation (p_dtype)
        a = exp(m - m'); l = l * a + s; m = m'
        P^T = transpose(P) per 128 keys    TensorE -> PSUM -> SBUF
        O' = P^T.T @ V                     TensorE, accumulated over the key sub-blocks
        O = O * a + O'
    out = epilogue(O / l)
The J query blocks of a group share every K/V load; a step of the key loop takes U key
blocks, computes all their products first and then each block's softmax, transposes and
second products, stage by stage across the group: TensorE works on the next key block's
products while the current one's softmax runs (the engines are in-order queues: without the
interleave TensorE would wait for every exp). J and U come from the PSUM budget.
Across groups (long sequences, ``_groups`` / ``_causal_groups``): group g+1's state, Q loads
and first key block are issued ahead of group g's last stage, on two alternating sets of group
state and one set of score banks shared by every group; the unrolled copies of each stage are
``TirBuilder._replica`` blocks (scheduled alike, as one loop body) with one slot per tile
(``_single_slot``). The steps on one key block are in ``attention/steps.py``.

m starts at the lowest finite fp32 value, so fully masked rows never compute inf - inf: their
sum stays 0 and O / l is 0 / 0 = NaN as in eager softmax, or 0 with ``safe`` (torch's
_safe_softmax) where l is clamped to the smallest normal fp32 first.
A ``score`` expression (masks, anything beyond a scale) is evaluated on each [128, kw] block
from the scaled product; ``causal`` masks keys past the query and skips key blocks entirely
past the block's last query.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import replace

import numpy as np

from lowering.errors import Unsupported
from lowering.kir import ATTENTION_MAX_DV, AttentionKAttrs, KOp
from lowering.tiling.attention.bias import bias_tiles, invariant_bias, pe_bias_tiles
from lowering.tiling.attention.decode import decode_fits, tile_decode
from lowering.tiling.attention.rows import rows_fits, tile_rows
from lowering.tiling.attention.steps import (F32, KB, LOWEST, QB, TINY, _Cols, _Part, _Rows, _boff, _cols,
                                             _diag_offsets, _early, _finish, _late, _load_k, _load_v, _mask_tile,
                                             _o_shares_bank, _pt_bytes, _qk, _score_tile, _store,
                                             _transpose_block, _v_rows)
from lowering.tiling.matmul.kernel import _Side
from lowering.tiling.matmul.prologue import ScaleBy
from lowering.tiling.matmul.plan import DMA_T, PE_T, RES_T, operand_form
from lowering.tir.affine import Affine, aff
from lowering.tir.builder import TirBuilder, hbm_ap
from lowering.tir.ir import TAP
from lowering.tir.pipelined import Stage, phases, pipelined
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory

PE_MASK = -2.0 ** 126   # a hidden key's score on TensorE: finite and exact in bf16
# the group pipelines' issue order per step (lowering/tir/pipelined.py): A(g) C(g-1) I(g+1) B(g)
# for full groups (the state and Q loads of the next group ahead of its first key block), and
# I(g) B(g-1) A(g) C(g-1) for causal groups, whose middles differ in length from group to group
# (scheduled each on its own)
GROUP_STAGES = (Stage("A", 0), Stage("C", 1), Stage("I", -1), Stage("B", 0))
CAUSAL_STAGES = (Stage("I", 0), Stage("B", 1, same_schedule=False), Stage("A", 0), Stage("C", 1))
# a group's key blocks: block b's early stage (products, row max, exp, statistics) before block
# b-1's late stage (P^T transposes, second products, accumulator update)
KEY_STAGES = (Stage("early", 0, same_schedule=False), Stage("late", 1, same_schedule=False))


def tile_attention(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, AttentionKAttrs)
    Q, KT, V = k.ins[:3]
    *batch, Sq, D = Q.shape
    Sk, Dv = KT.shape[-1], V.shape[-1]
    if min(Sq, Sk, D, Dv) == 0:
        raise Unsupported(",".join(k.origin) or "attention", f"empty attention (Sq={Sq}, Sk={Sk}, D={D}, Dv={Dv})")
    if Dv > ATTENTION_MAX_DV:
        raise Unsupported(",".join(k.origin) or "attention",
                          f"value width Dv={Dv} > {ATTENTION_MAX_DV} (one PSUM bank)")
    t = b.target
    # Q^T, K^T by DMA transposes even from SBUF-resident tensors: TensorE transposes would put
    # their PSUM copies on the VectorE/ScalarE queues the softmax keeps busy
    sq = _Side(Q, Q.strides[-1], Q.strides[-2], Sq, operand_form(Q.strides[-1], Q.strides[-2], Sq, Q.dtype, t), tp_bufs=1)
    sk = _Side(KT, KT.strides[-2], KT.strides[-1], Sk, operand_form(KT.strides[-2], KT.strides[-1], Sk, KT.dtype, t),
               tp_bufs=1)
    if decode_fits(k, batch, Sq, Sk, D, Dv, sk, t):     # one query per head: all heads at once
        tile_decode(b, k, sk)
        return
    # PSUM: per query block and key block of a step one score bank (the probability
    # transposes reuse it once the exp has read it) and one output bank
    # score and output banks per query block: two of each for the two key-block parities of
    # the software pipeline, or (a single key block) two slots each so that consecutive groups
    # or batch items overlap
    per_q = 2 if _o_shares_bank(Q.dtype if a.p_dtype is None else a.p_dtype, Dv, t) else 4
    # a K loaded through TensorE transposes needs a bank per load site of the loop body
    tp_banks = 4 if sk.form in (PE_T, RES_T) else 0
    J = max(1, min(4, (t.psum_banks - tp_banks) // per_q, -(-Sq // QB)))
    b.note(f"attention {'x'.join(map(str, batch))} x [{Sq}x{D}] keys {Sk} values {Dv}: Q {sq.form}, "
           f"K {sk.form}; {J} query blocks per group, key blocks of {KB} software-pipelined")
    sk_seen = min(Sk, Sq + k.attrs.causal_offset) if k.attrs.causal else Sk
    items = bool(batch) and batch[-1] > 1 and Sq <= 2 * QB and sk_seen <= KB
    rows = not items and rows_fits(k, Sq, Sk, Dv, t, tp_banks)
    # short heads, or whole rows, where every row sees a key: the mask is added on TensorE (see
    # _items), in bf16
    pe_mask = (items or rows) and a.score is None and a.causal_offset >= 0
    masks = (_causal_masks(b, k, Sq, Sk, J, *((DType.BF16, PE_MASK) if pe_mask else (F32, LOWEST)))
             if k.attrs.causal and not rows else None)
    if items:
        # one step per batch item: pipeline the items themselves (see _items)
        with ExitStack() as es:
            outer = tuple(es.enter_context(b.loop(n, "b")) for n in batch[:-1])
            tps = 2 if PE_T in (sq.form, sk.form) or RES_T in (sq.form, sk.form) else 0
            _items(b, k, sq, sk, outer, batch[-1], Sq, D, sk_seen, Dv, masks, t.psum_banks - tps,
                   pe_mask)
        return
    if rows:
        b.note(f"attention: whole score rows in PSUM ({-(-Sk // KB)} banks per query block), "
               "two-phase softmax, query blocks software-pipelined across heads"
               + ("; causal: each query block's visible key blocks only" if a.causal else ""))
        with ExitStack() as es:
            outer = tuple(es.enter_context(b.loop(n, "b")) for n in batch[:-1])
            tile_rows(b, k, sq, sk, outer, batch[-1] if batch else 1, Sq, D, Sk, Dv, PE_MASK)
        return
    with ExitStack() as es:
        bidx = tuple(es.enter_context(b.loop(n, "b")) for n in batch)
        if masks is None:
            shared = _groups(b, k, sq, sk, bidx, Sq, J, D, Sk, Dv)
            if shared is not None:
                if Sq % (J * QB):                   # the partial group after the pipelined ones
                    g0 = Sq - Sq % (J * QB)
                    _group(b, k, sq, sk, bidx, aff(g0), Sq - g0, D, Sk, Dv, None, shared)
            else:
                for g0, gw in b.tiled(Sq, J * QB, "qg"):
                    _group(b, k, sq, sk, bidx, g0, gw, D, Sk, Dv, None)
        else:   # causal: every group on its own, with the key blocks its queries can see
            # (one slot per tile and one set of score banks for all the groups: every group
            # has its own code, and its own banks would not fit PSUM side by side)
            shared = _key_bufs(b, k, _blocks(aff(0), min(J * QB, Sq)), 2)
            if not _causal_groups(b, k, sq, sk, bidx, Sq, J, D, Sk, Dv, masks, shared):
                def one(g: int, _u: int):
                    g0 = g * J * QB
                    return {"G": lambda: _group(b, k, sq, sk, bidx, aff(g0), min(J * QB, Sq - g0),
                                                D, Sk, Dv, masks, shared)}
                # the groups one after another (a pipeline of one stage), one slot per tile
                pipelined(b, -(-Sq // (J * QB)), (Stage("G", 0, same_schedule=False),), one,
                          depth=1, hint="cg", loop=False)


def _resident_v(b: TirBuilder, V, bidx, kw: int, Dv: int):
    """V [kw <= 128 keys, Dv] read in place from its SBUF-resident rows (no copy), or None."""
    if kw > 128:
        return None
    src = hbm_ap(V.buffer, V.dtype, _boff(V, bidx), kw, V.strides[-2], ((Dv, V.strides[-1]),))
    rv = b.resident_view(src, kw)
    return None if rv is None else _Ap(rv)


class _Ap:
    """An access pattern used where a tile is expected (``.ap(partitions, elem_offset, dims)``
    with elem_offset 0 and the pattern's own dims)."""

    def __init__(self, ap):
        self._ap = ap

    def ap(self, partitions=None, elem_offset=0, dims=None):
        assert elem_offset == 0
        return self._ap


def _identity(b: TirBuilder):
    """The identity [128, 128] in bf16 (GpSimdE), the stationary of ``S += I.T @ mask``."""
    ident = b.tile("ident", Memory.SBUF, QB, QB, DType.BF16)
    b.iota(ident.ap(), 0, -1, (1,))                              # c - p
    b.tensor_scalar(ident.ap(), ident.ap(), AluOp.IS_EQUAL, 0.0, engines=(EngineKind.GPSIMD,))
    return ident


def _causal_masks(b: TirBuilder, k: KOp, Sq: int, Sk: int, J: int, dt: DType = F32,
                  hidden: float = LOWEST) -> dict:
    """One additive mask tile [128, KB] of ``dt`` (0 visible, ``hidden`` hidden) per distinct
    diagonal offset d, set once at the start of the kernel."""
    off = k.attrs.causal_offset
    ds = set()
    for g in range(-(-Sq // (J * QB))):
        for j in range(J):
            q0 = g * J * QB + j * QB
            if q0 >= Sq:
                break
            qr = min(QB, Sq - q0)
            for k0 in range(0, min(Sk, q0 + qr + off), KB):
                d = _diag_offsets(q0, qr, k0, min(KB, Sk - k0), off)
                if d is not None:
                    ds.add(d)
    return {d: _mask_tile(b, f"mask{i}", d, KB, dt, hidden) for i, d in enumerate(sorted(ds))}


def _group(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, bidx, g0: Affine, gw: int, D: int, Sk: int,
           Dv: int, masks: dict | None, shared=None) -> None:
    """One group of query blocks on its own: state, key-block pipeline, results. ``shared``:
    the score banks etc. of pipelined groups before it (``_groups``), reused by its blocks."""
    blocks = _blocks(g0, gw)
    st = _state(b, blocks, D, Dv, sq.ref.dtype)
    _init(b, sq, bidx, st, blocks, D, l0=_l0(k))
    if masks is not None:     # causal: only the keys the group's last query can see
        Sk = min(Sk, g0.const + gw + k.attrs.causal_offset)
    kbs = _key_blocks(Sk)
    if shared is not None:      # two parities, one slot each: fits any number of key blocks
        bufs = tuple([[_Rows(t, qr) for t, (_, qr) in zip(row, blocks)] for row in x]
                     for x in shared)
    else:
        bufs = _key_bufs(b, k, blocks, len(kbs))
    first, middle, last = _steps(b, k, sk, (st, blocks) + bufs + (bidx, D, Dv), kbs,
                                 _diag(k, blocks, kbs, masks))
    first()
    middle()
    last()


def _groups(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, bidx, Sq: int, J: int, D: int, Sk: int,
            Dv: int):
    """The full groups of an unmasked attention, software-pipelined across groups: group g+1's
    state, Q loads and first key block (products, row max, exp) are issued before group g's last
    key block's second products and its results, so ScalarE starts the next group's exps while
    TensorE finishes the previous group (without it every group boundary drains the pipeline
    and ScalarE idles there). Two sets of group state alternate (the
    group loop is unrolled by two); score banks, probabilities and exp factors are shared by all
    groups, which needs an even number of key blocks (the next group's first block takes the
    parity-0 slots that the previous group's second-to-last block has released), and Q and K
    without TensorE transposes. Returns None (nothing emitted) when the shape does not allow
    it, else the shared buffers."""
    gw = J * QB
    G = Sq // gw
    kbs = _key_blocks(Sk)
    nb = len(kbs)
    if G < 2 or nb < 2 or nb % 2 or {sq.form, sk.form} & {PE_T, RES_T}:
        # (TensorE-transposed Q/K take a PSUM bank per load site: unrolled groups multiply
        # the sites past PSUM)
        return None
    dt = sq.ref.dtype
    tmpl = _blocks(aff(0), gw)
    bufs = _key_bufs(b, k, tmpl, nb)
    sets = [_state(b, tmpl, D, Dv, dt, tag=f"g{u}_") for u in range(2)]
    nomask = [[None] * J for _ in kbs]

    def body(g: int | Affine, u: int):
        """Group g's stages: I its state and Q loads, A its first key block, B the middle
        ones, C the last and the results (A, B, C from one ``_steps``, made at A)."""
        g = aff(g)
        made: list = []

        def part(j: int):
            def run() -> None:
                if not made:
                    made.append(_steps(b, k, sk, (sets[u], _blocks(g * gw, gw)) + bufs
                                       + (bidx, D, Dv), kbs, nomask))
                made[0][j]()
            return run
        return {"I": lambda: _init(b, sq, bidx, sets[u], _blocks(g * gw, gw), D, l0=_l0(k)),
                "A": part(0), "B": part(1), "C": part(2)}

    b.note(f"attention: {G} groups software-pipelined across groups")
    # I one group ahead (its DMA latency hidden); I(g+1) takes group g-1's set after C(g-1)
    pipelined(b, G, GROUP_STAGES, body, depth=2, hint="qg")
    return bufs


def _causal_groups(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, bidx, Sq: int, J: int, D: int,
                   Sk: int, Dv: int, masks: dict, shared) -> bool:
    """Causal groups (each with the key blocks its queries can see, so each its own code),
    pipelined across groups as ``_groups`` does, unrolled: group g+1's state and Q, then its
    first key block, are issued ahead of group g's last stage; block parities continue from
    group to group (``_steps``' p0). Full groups only (False: nothing emitted)."""
    gw = J * QB
    G = Sq // gw
    if G < 2 or Sq % gw or {sq.form, sk.form} & {PE_T, RES_T}:
        return False
    b.note(f"attention: {G} causal groups software-pipelined across groups")
    tmpl = _blocks(aff(0), gw)
    sets = [_state(b, tmpl, D, Dv, sq.ref.dtype, tag=f"c{u}_", bufs=1) for u in range(2)]
    steps, p0 = [], 0
    for g in range(G):
        blocks = _blocks(aff(g * gw), gw)
        kbs = _key_blocks(min(Sk, g * gw + gw + k.attrs.causal_offset))
        steps.append((blocks, p0, _steps(b, k, sk, (sets[g % 2], blocks) + shared + (bidx, D, Dv), kbs,
                                         _diag(k, blocks, kbs, masks), p0)))
        p0 = (p0 + len(kbs)) % 2

    def body(g: int, u: int):
        blocks, p, (first, middle, last) = steps[g]
        return {"I": lambda: _init(b, sq, bidx, sets[u], blocks, D, p, l0=_l0(k)),
                "A": first, "B": middle, "C": last}

    pipelined(b, G, CAUSAL_STAGES, body, depth=2, hint="cg", loop=False)
    return True


def _blocks(g0: Affine, gw: int) -> list:
    """(q0, rows) per query block of a group."""
    return [(g0 + j * QB, min(QB, gw - j * QB)) for j in range(-(-gw // QB))]


def _key_blocks(Sk: int) -> list:
    full, tail = divmod(Sk, KB)
    return [(aff(i * KB), KB) for i in range(full)] + ([(aff(full * KB), tail)] if tail else [])


def _state(b: TirBuilder, blocks, D: int, Dv: int, dt: DType, tag: str = "",
           bufs: int = 2) -> list:
    """Per query block: Q^T, running -max and sum in two slots each (a key block reads one and
    writes the other), the fp32 accumulator O; ``bufs`` slots per tile in a loop."""
    nd = -(-D // 128)
    st = []
    for j, (q0, qr) in enumerate(blocks):
        qt = b.tile(f"{tag}qt{j}", Memory.SBUF, min(D, 128), nd * qr, dt, bufs)
        nm = [b.tile(f"{tag}nm{j}_{u}", Memory.SBUF, qr, 1, F32, bufs) for u in range(2)]
        l = [b.tile(f"{tag}l{j}_{u}", Memory.SBUF, qr, 1, F32, bufs) for u in range(2)]
        acc = b.tile(f"{tag}o{j}", Memory.SBUF, qr, Dv, F32, bufs)
        st.append((qt, nm, l, acc))
    return st


def _l0(k: KOp) -> float:
    """The running sum's initial value: 0, or with ``safe`` the smallest normal fp32, so a row
    whose every key is hidden (or -inf) ends with 0 / TINY = 0 rather than 0 / 0; any other row's
    sum is at least 1 (its largest score gives exp(0)), which TINY does not change in fp32."""
    return TINY if k.attrs.safe else 0.0


def _init(b: TirBuilder, sq: _Side, bidx, st, blocks, D: int, p0: int = 0, l0: float = 0.0) -> None:
    """Q^T loads and the statistics' (slot ``p0``, the first key block's parity) and the
    accumulator's initial values (the running sum ``l0``, see ``_l0``)."""
    for (qt, nm, l, acc), (q0, qr) in zip(st, blocks):
        for d0, dw in b.tiled(D, 128, "d"):
            sq.load(b, qt, d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)
        b.memset(nm[p0].ap(), -LOWEST)
        b.memset(l[p0].ap(), l0)
        b.memset(acc.ap(), 0.0)


def _key_bufs(b: TirBuilder, k: KOp, blocks, nb: int):
    """Score banks, second-product outputs, probabilities and exp factors: two slots per query
    block, by key-block parity (one key block: one parity, two buffers so that consecutive
    groups overlap)."""
    pdt = k.attrs.p_dtype
    nu = 2 if nb > 1 else 1
    sb = 1 if nb > 1 else 2
    S = [[b.tile(f"s{j}_{u}", Memory.PSUM, 128, KB, F32, sb) for j in range(len(blocks))] for u in range(nu)]
    o0 = _pt_bytes(KB // 128, pdt) // 4        # fp32 column of the output behind the P^T
    Dv = k.ins[2].shape[-1]
    if _o_shares_bank(pdt, Dv, b.target):
        O = [[_Cols(S[u][j], o0, qr, Dv) for j, (_, qr) in enumerate(blocks)] for u in range(nu)]
    else:
        O = [[b.tile(f"op{j}_{u}", Memory.PSUM, qr, Dv, F32, sb) for j, (_, qr) in enumerate(blocks)]
             for u in range(nu)]
    P = [[b.tile(f"p{j}_{u}", Memory.SBUF, qr, KB, pdt, sb) for j, (_, qr) in enumerate(blocks)]
         for u in range(nu)]
    AL = [[b.tile(f"al{j}_{u}", Memory.SBUF, qr, 2, F32, sb) for j, (_, qr) in enumerate(blocks)]
          for u in range(nu)]            # per slot: the exp factor a and the block's row sum
    return S, P, AL, O


def _diag(k: KOp, blocks, kbs, masks: dict | None) -> list:
    """Per key block, per query block: the causal mask tile, or None when all keys are visible."""
    diag = [[None] * len(blocks) for _ in kbs]
    if masks is not None:
        for bi, (k0, kw) in enumerate(kbs):
            for j, (q0, qr) in enumerate(blocks):
                d = _diag_offsets(q0.const, qr, k0.const, kw, k.attrs.causal_offset)
                diag[bi][j] = masks[d] if d is not None else None
    return diag


def _steps(b: TirBuilder, k: KOp, sk: _Side, pipe, kbs, diag, p0: int = 0):
    """The key-block pipeline of one group (``KEY_STAGES`` on the tile IR's construct) as its
    three phases: the prologue (block 0's early stage), the steady state (every later block's
    early stage and every block's late stage but the last's; a loop over the full blocks before
    the first masked one) and the epilogue with the group's results (the last block's late
    stage, then ``_finish``), so that a group pipeline can issue them as its own stages.

    Block b's *early* stage (products S = Q K^T, row max, exp, statistics) is issued before
    block b-1's *late* stage (P^T transposes, second products, accumulator update), so every
    in-order engine finds the next block's early work ahead of the previous block's late work.
    Score banks, probabilities and exp factors live in two slots per query block (by block
    parity: the key loop is unrolled by two); block i takes slot (i + p0) % 2, so that a
    group pipelined behind another one starts on the slot its predecessor's last block left."""
    st, blocks, S, P, AL, O, bidx, D, Dv = pipe
    V, dt = k.ins[2], st[0][0].buf.dtype
    nb = len(kbs)
    full = sum(1 for _, kw in kbs if kw == KB)
    clean = next((bi for bi, row in enumerate(diag) if any(m is not None for m in row)), nb)

    def early(bi, kw: int, u: int, k0: Affine) -> None:
        u = (u + p0) % 2
        kt = _load_k(b, sk, bidx, k0, kw, D, dt)
        _qk(b, st, blocks, kt, S[u], kw, D)
        _early(b, k, pipe, u, k0, kw, diag[bi] if bi is not None else [None] * len(blocks))

    def late(u: int, k0: Affine, kw: int) -> None:
        u = (u + p0) % 2
        vt = _load_v(b, V, bidx, k0, kw, Dv)
        _late(b, k, pipe, u, vt, kw)

    def body(i: int | Affine, u: int):
        """Key block i's stages; in the loop (affine i) a full block without a mask."""
        if isinstance(i, int):
            (k0, kw), bi = kbs[i], i
        else:
            (k0, kw), bi = (i * KB, KB), None
        return {"early": lambda: early(bi, kw, u, k0), "late": lambda: late(u, k0, kw)}

    p = phases(b, nb, KEY_STAGES, body, depth=2, hint="kb", uniform=min(full, clean),
               one_slot=False)

    def last() -> None:
        p.epilogue()
        for j, (q0, qr) in enumerate(blocks):
            _finish(b, k, st[j], (nb + p0) % 2, bidx, q0, qr, Dv)

    return p.prologue, p.steady, last


def _items(b: TirBuilder, k: KOp, sq: _Side, sk: _Side, outer, n: int, Sq: int, D: int, kw: int,
           Dv: int, masks: dict | None, psum_free: int, pe_mask: bool = False) -> None:
    """Batch items (the innermost batch axis) that are one step each (all queries in one group,
    all keys in one block), software-pipelined ``U`` items deep: item t+1's P^T transposes, then
    item t+U-1's early stage (loads, products, row max, exp), then item t's second products and
    normalisation, every engine finding work of another item ahead of the one that waits
    (TensorE runs the next item's products while P^T is copied out of PSUM, and item t's P^T,
    transposed a step earlier into its set's tile, is in SBUF when its second products come).
    Under a causal mask where every row sees a key, the mask is added to the scores by TensorE
    (``S += I.T @ mask`` with the mask in bf16 at -2^126: exact, and the row max then reads
    PSUM directly instead of a VectorE pass writing the masked scores to SBUF).
    With one key block the softmax needs no running statistics: m = rowmax, P = exp(scale * S -
    scale * m) with its row sum l, out = (P @ V) / l straight from PSUM. Each of the U items in
    flight has its own statistics and probability tiles (item t uses set t % U) and, when
    scores, their transposes and the output fit one PSUM bank together, one bank per query
    block; the item loop is unrolled by U."""
    a = k.attrs
    dt, pdt = sq.ref.dtype, a.p_dtype
    blocks = [(aff(j * QB), min(QB, Sq - j * QB)) for j in range(-(-Sq // QB))]
    nd = -(-D // 128)
    # (fp32 transposes here, one copy per 128 keys: measured faster for these short blocks
    # than P's dtype and one copy)
    o_col = -(-_pt_bytes(-(-kw // 128), F32) // 4)     # fp32 column behind the P^T transposes
    shared = o_col * 4 + Dv * 4 <= b.target.psum_bank_bytes   # scores and output in one bank
    banks = len(blocks) * (1 if shared else 2)
    U = max(2, min(4, n, psum_free // banks))
    diag = [None] * len(blocks)
    if masks is not None:
        for j, (q0, qr) in enumerate(blocks):
            d = _diag_offsets(q0.const, qr, 0, kw, a.causal_offset)
            diag[j] = masks[d] if d is not None else None
    # a row with no visible key (its sum is 0) exists only under a score expression or a
    # causal offset that hides key 0 from the first queries
    clamp = a.safe and (a.score is not None or a.causal_offset < 0)
    # ``pe_mask`` (every row sees a key): the bf16 mask goes into the scores on TensorE
    # (S += I.T @ mask, exact: 0 or -2^126), so the row max reads PSUM and no VectorE pass adds it
    pe_mask = pe_mask and any(m is not None for m in diag)
    ident = _identity(b) if pe_mask else None
    b.note(f"attention: one query group and one key block per item; {n} items software-pipelined "
           f"{U} deep, scores and output {'in one PSUM bank' if shared else 'in two banks'} per block")
    sets = []
    for u in range(U):     # one slot per PSUM tile: the U sets are the budget's banks (``outer``
        # loops, e.g. grouped-query heads' [N, Hkv, G] batch, must not double them)
        S = [b.tile(f"s{j}_{u}", Memory.PSUM, 128, KB, F32, 1) for j in range(len(blocks))]
        O = [_Cols(S[j], o_col, qr, Dv) if shared
             else b.tile(f"op{j}_{u}", Memory.PSUM, qr, Dv, F32, 1) for j, (_, qr) in enumerate(blocks)]
        P = [b.tile(f"p{j}_{u}", Memory.SBUF, qr, KB, pdt) for j, (_, qr) in enumerate(blocks)]
        L = [b.tile(f"l{j}_{u}", Memory.SBUF, qr, 1, F32) for j, (_, qr) in enumerate(blocks)]
        PT = [b.tile(f"pt{j}_{u}", Memory.SBUF, min(kw, 128), -(-kw // 128) * qr, pdt, 1)
              for j, (_, qr) in enumerate(blocks)]
        sets.append((S, O, P, L, PT))

    # heads of 32 or 64, adjacent in memory (a fused QKV projection's output): Q^T and K^T of
    # two heads per DMA transpose ([rows, 2 x D] -> [2 x D, rows]: half the transfers, on twice
    # the engines), every pair loaded up front, one queue each; head t reads partitions
    # (t % 2) * D of pair t // 2 (32 and 64 are the partition starts a [D, .] access may take).
    # Rows resident in SBUF (the projection ran in this partition) are transposed on TensorE
    # instead, all pairs before the first product: TensorE is idle then and the copies out of
    # PSUM precede the softmax work on VectorE/ScalarE, where 12 SBUF -> SBUF DMA transposes
    # would share the DMA engines with the weight stream, served in issue order
    Q, KT = sq.ref, sk.ref
    prescale = False
    # a mask shared by every head (score = scale * S + bias): evaluated once, added per head
    bias_e = invariant_bias(k, len(outer) + 1)
    pairs = (sq.form == DMA_T and sk.form == DMA_T and D in (32, 64) and n % 2 == 0 and U % 2 == 0
             and len(blocks) == 1 and Q.strides[-3] == D * Q.strides[-1]
             and KT.strides[-3] == D * KT.strides[-2])
    if pairs:
        qr0 = blocks[0][1]
        qall = b.tile("qpairs", Memory.SBUF, 2 * D, n // 2 * qr0, dt)
        kall = b.tile("kpairs", Memory.SBUF, 2 * D, n // 2 * kw, dt)
        pe = b.is_resident(Q.buffer) and b.is_resident(KT.buffer) and qr0 <= 128 and kw <= 128
        lq, lk = (replace(sq, form=RES_T), replace(sk, form=RES_T)) if pe else (sq, sk)
        # a power-of-two scale <= 1 goes into Q^T as it leaves PSUM (exact), so the scores
        # come scaled, the row max comes negated from its reduce and is the exp's bias as it
        # is: one VectorE/GpSimdE instruction less per head on the softmax chain
        # (the scale as the engines hold it, in fp32: 1/sqrt(64) is 0.12500000000000003 in fp64)
        s32 = float(np.float32(a.scale))
        prescale = (pe and (a.score is None and not clamp or bias_e is not None) and 0 < s32 <= 1
                    and math.frexp(s32)[0] == 0.5)
        if prescale:
            lq = replace(lq, pro=ScaleBy(s32))
        # one PSUM bank of 4 transpose cells used in turn, so TensorE runs up to 4 transposes
        # ahead of their copies, which VectorE and ScalarE share
        tp = b.tile("pairT", Memory.PSUM, 2 * D, 4 * 128, F32, 1) if pe else None
        ce = (EngineKind.VECTOR, EngineKind.SCALAR) if pe else None

        def cell(c: int, w: int):
            return tp.ap(2 * D, elem_offset=c % 4 * 128, dims=((1, w),)) if pe else None
        def load_pairs() -> None:
            for hp in range(n // 2):      # unrolled: one queue per transfer (a loop keeps one)
                pb = outer + (aff(2 * hp),)
                lq.load(b, qall, aff(hp * qr0), lq.base(pb), aff(0), 2 * D, aff(0), qr0,
                        psum=cell(2 * hp, qr0), copy_engines=ce)
                lk.load(b, kall, aff(hp * kw), lk.base(pb), aff(0), 2 * D, aff(0), kw,
                        psum=cell(2 * hp + 1, kw), copy_engines=ce)
        how = "TensorE transpose of their SBUF-resident rows" if pe else "DMA transpose"
        b.note(f"attention: Q^T and K^T of two heads per {how}, {n // 2} pairs loaded ahead")

    # a bf16 bias (a boolean mask's 0 / -inf) goes into the scores on TensorE, as the causal
    # mask above: the row max and the exp then read PSUM, and no VectorE pass adds it
    pe_bias = (bias_e is not None and bias_e.dtype is DType.BF16 and not pe_mask
               and all(m is None for m in diag))
    btiles = okinv = None
    if pe_bias:
        btiles, okinv = pe_bias_tiles(b, k, bias_e, blocks, kw, len(outer) + 1, prescale, a.safe)
        clamp = False           # finite scores, row sums >= 1: okinv replaces rows without keys
        if ident is None:
            ident = _identity(b)
    elif bias_e is not None:
        btiles = bias_tiles(b, k, bias_e, blocks, kw, len(outer) + 1, prescale)
    if pairs:   # after the bias: its VectorE work runs while the heads' rows are computed
        load_pairs()
    if btiles is not None:
        b.note("attention: the score's bias is the same for every head: evaluated once per "
               f"query block, {'added on TensorE' if pe_bias else 'one add'} per head")

    def early(item: Affine, u: int) -> None:
        bidx = outer + (item,)
        S, O, P, L, _ = sets[u]
        qts = []
        if pairs:
            half = (item - u % 2) // 2
            qts.append((_Part(qall, u % 2 * D, half * blocks[0][1]),))
            kt = _Part(kall, u % 2 * D, half * kw)
        for j, (q0, qr) in enumerate(blocks if not pairs else ()):
            qt = b.tile(f"qt{j}", Memory.SBUF, min(D, 128), nd * qr, dt, 2)
            for d0, dw in b.tiled(D, 128, "d"):
                sq.load(b, qt, d0 // 128 * qr, sq.base(bidx), d0, dw, q0, qr)
            qts.append((qt,))
        if not pairs:
            kt = _load_k(b, sk, bidx, aff(0), kw, D, dt)
        _qk(b, qts, blocks, kt, S, kw, D)
        for j, (q0, qr) in enumerate(blocks):
            if diag[j] is not None and pe_mask:
                b.matmul(S[j].ap(qr, dims=((1, kw),)), ident.ap(QB, dims=((1, qr),)),
                         diag[j].ap(QB, dims=((1, kw),)), start_when=(1,))
        for j, (q0, qr) in enumerate(blocks):
            src, act_scale = S[j].ap(qr, dims=((1, kw),)), 1.0 if prescale else a.scale
            if pe_bias:
                b.matmul(src, ident.ap(qr, dims=((1, qr),)), btiles[j].ap(qr, dims=((1, kw),)),
                         start_when=(1,))
            elif btiles is not None:
                sc = b.tile("sb", Memory.SBUF, qr, kw, F32).ap()
                b.tensor_tensor(sc, src, btiles[j].ap(qr, dims=((1, kw),)), AluOp.ADD)
                src = sc
            elif a.score is not None:
                src = _score_tile(b, k, S[j], bidx, q0, qr, aff(0), kw)
                act_scale = 1.0
            if diag[j] is not None and not pe_mask:
                sc = b.tile("cm", Memory.SBUF, qr, kw, F32).ap()
                b.tensor_tensor(sc, src, diag[j].ap(qr, dims=((1, kw),)), AluOp.ADD)
                src = sc
            nm = b.tile("nm", Memory.SBUF, qr, 1, F32).ap()
            if prescale and not clamp:  # -max(scores) straight from the reduce
                b.tensor_reduce(nm, src, AluOp.MAX, negate=True)
                b.activation(P[j].ap(qr, dims=((1, kw),)), src, ActFunc.EXP, bias_ap=nm,
                             reduce=AluOp.ADD, accum=L[j].ap())
                continue
            mb = b.tile("mb", Memory.SBUF, qr, 1, F32).ap()
            b.tensor_reduce(mb, src, AluOp.MAX if act_scale >= 0 else AluOp.MIN)
            if clamp:     # a row of -inf: m = the lowest finite value, so exp gives 0, not NaN
                b.tensor_scalar(nm, mb, AluOp.MAX if act_scale >= 0 else AluOp.MIN,
                                LOWEST if act_scale >= 0 else -LOWEST, op1=AluOp.MULTIPLY,
                                operand1=-act_scale)
            else:
                b.tensor_scalar(nm, mb, AluOp.MULTIPLY, -act_scale)
            b.activation(P[j].ap(qr, dims=((1, kw),)), src, ActFunc.EXP, scale=act_scale, bias_ap=nm,
                         reduce=AluOp.ADD, accum=L[j].ap())

    def late_t(item: Affine, u: int) -> None:
        """Item ``item``'s P^T into its set's tiles: a step ahead of its second products."""
        S, O, P, L, PT = sets[u]
        nsub = -(-kw // 128)
        for j, (q0, qr) in enumerate(blocks):
            _transpose_block(b, k, S[j], P[j].ap(qr, dims=((1, kw),)), qr, kw, nsub, F32, pt=PT[j])

    def late(item: Affine, u: int, rls: list[tuple[TAP, AluOp]]) -> None:
        bidx = outer + (item,)
        S, O, P, L, PT = sets[u]
        vt = _resident_v(b, k.ins[2], bidx, kw, Dv) or _load_v(b, k.ins[2], bidx, aff(0), kw, Dv)
        pts = [PT[j].ap(min(kw, 128), dims=((1, -(-kw // 128) * qr),)) for j, (_, qr) in enumerate(blocks)]
        for j, (q0, qr) in enumerate(blocks):
            for s0, sw in b.tiled(kw, 128, "pv"):
                sub = s0 // 128
                b.matmul(O[j].ap(), _cols(pts[j], sub * qr, qr, sw), _v_rows(vt, sub, s0, sw, Dv),
                         start_when=(s0,))
        for j, (q0, qr) in enumerate(blocks):
            rl, op = rls[j]
            _store(b, k, bidx, q0, qr, Dv, O[j].ap(), rl, op=op)

    def recips(u: int) -> list[tuple[TAP, AluOp]]:
        """Per block, the normaliser of the item of set ``u`` and its op: its 1 / l on ScalarE
        (times the rows-with-keys flags under a TensorE bias), issued before the step's exps so
        that it never waits behind them, or l itself for a divide."""
        S, O, P, L, PT = sets[u]
        out = []
        for j, (q0, qr) in enumerate(blocks):
            den = L[j].ap()
            if clamp:
                d = b.tile("den", Memory.SBUF, qr, 1, F32).ap()
                b.tensor_scalar(d, den, AluOp.MAX, TINY)
                den = d
            if not pe_bias:     # O / l in the normalising instruction: no ScalarE hop
                out.append((den, AluOp.DIVIDE))
                continue
            rl = b.tile("rl", Memory.SBUF, qr, 1, F32).ap()
            b.activation(rl, den, ActFunc.RECIPROCAL, scale_ap=okinv[j])
            out.append((rl, AluOp.MULTIPLY))
        return out

    # with U >= 3 item t's P^T transposes come a step ahead of its second products (item t+1's
    # in step t), so TensorE never waits for a P^T copy between an item's transposes and the
    # next item's; with U = 2 item t+1's exp is issued in step t itself, so they stay in step t
    ahead = 1 if U >= 3 else 0

    def body(t: int | Affine, u: int):
        """Item t's stages; ``recips`` (its normalisers) is issued in the step of its ``late``,
        before the step's ``early``, and hands them over."""
        item, rls = aff(t), []
        return {"late_t": lambda: late_t(item, u), "recips": lambda: rls.extend(recips(u)),
                "early": lambda: early(item, u), "late": lambda: late(item, u, rls)}

    # step t: late_t(t + ahead), recips(t), early(t + U - 1), late(t); the prologue queues the
    # first U - 1 items' early stages before item 0's transposes
    stages = (Stage("late_t", -ahead, same_schedule=False), Stage("recips", 0, same_schedule=False),
              Stage("early", 1 - U, same_schedule=False), Stage("late", 0, same_schedule=False))
    pipelined(b, n, stages, body, depth=U, hint="it", one_slot=False, fill=True)
