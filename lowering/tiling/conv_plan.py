"""The blocking of a CONV kernel (``tiling/conv.py``), chosen so that it fits SBUF: a pure
function of the convolution's sizes and the target's bytes per SBUF partition.

``plan_conv`` splits, in this order, whatever does not fit its share of a partition:
- the weights (``wT``, one stationary column block per (128-channel input chunk, product unit)):
  over *output-channel passes* of ``cob`` channels (a multiple of 128 when possible, fewer when
  even 128 columns exceed the share: a 16x16 patch embedding's 64 stacked units x 768 outputs);
  each pass re-reads the input;
- the weight rows loaded to be transposed: every input channel at once, else per 128; over
  groups of ``krows`` kernel rows (whole stacked units), fewer stacked rows per product when one
  unit's rows do not fit, and groups of ``kcols`` kernel columns when one row does not;
- the input tile (the output block's receptive field): first smaller output blocks (not below
  128 pixels, where a product's fixed cost starts to dominate), then one tile per 128-channel
  chunk instead of every chunk at once (``per_chunk``: loaded inside the output-channel loop,
  so once per 128 output channels; a dilated conv's halo on many channels), then smaller blocks
  down to one pixel, then fewer slots (``xbufs``).
The shares are fractions of the partition (``W_SHARE``, ``ROWS_SHARE``, ``X_SHARE``), never
shape constants. A convolution whose single kernel tap of weight rows, or single weight column per product,
or single-pixel input window does not fit is ``Unsupported`` (the registry's check asks the
same function for the smallest target, so such a node falls back before tiling starts).

Invariants
- ``nci * len(units) * cob * itemsize * wbufs <= part * W_SHARE``.
- ``xbufs * (tile + staging) <= part * X_SHARE`` for the chosen block, with ``tile`` holding
  ``1 if per_chunk else nci`` chunks of ``rin x cinw`` elements.
- ``units`` cover every kernel tap exactly once; ``krows`` is a multiple of ``stack`` (or ``Kh``);
  ``kcols < Kw`` only with ``krows == stack == 1``.
"""
from __future__ import annotations

from dataclasses import dataclass

from lowering.errors import Unsupported

P = 128
FREE_MAX = 512      # moving free size of one matmul = one fp32 PSUM bank
W_SHARE = 1 / 3     # of an SBUF partition for one pass's weights (all their slots)
ROWS_SHARE = 1 / 12  # for the weight rows being transposed (all their slots)
X_SHARE = 1 / 4     # for the input tiles and their staging rows (all their slots)
X_BUFS = 4          # input tile slots: the next block loads while this one computes
STAGE_ROW_BYTES = 2048   # input rows shorter than this are staged (a DMA chunk costs ~256 B)
MIN_FREE = 128      # smallest output block before input tiles go per chunk


@dataclass(frozen=True)
class ConvPlan:
    """``gpb`` groups packed per 128-row contraction (``cin`` -> ``cout`` channels per
    super-group, ``SG`` super-groups); ``nci`` chunks of 128 input channels; ``stack`` copies of
    the input tile ``pitch`` partitions apart; ``units`` (first kernel row, rows, kernel column)
    per product; output blocks ``R x Cw``; ``cob`` output channels per weight pass; weight rows
    loaded ``krows`` kernel rows of ``kcols`` columns at a time, of every input channel at once (``rows_all``) or per
    128-channel chunk; input tiles of one chunk (``per_chunk``) or all,
    ``xbufs`` slots."""

    gpb: int
    cin: int
    cout: int
    SG: int
    nci: int
    stack: int
    pitch: int
    units: tuple[tuple[int, int, int], ...]
    R: int
    Cw: int
    cob: int
    krows: int
    kcols: int
    rows_all: bool
    per_chunk: bool
    xbufs: int

    def kparts(self, rows: int, cc: int) -> int:
        """Contraction partitions of a product over ``rows`` stacked kernel rows."""
        return (rows - 1) * self.pitch + cc

    @property
    def parts(self) -> int:
        return min(self.kparts(self.stack, self.cin), P)

    @property
    def gaps(self) -> bool:
        return self.stack > 1 and self.pitch > self.cin

    @property
    def passes(self) -> int:
        return -(-self.cout // self.cob)


def groups_per_block(groups: int, cig: int, cog: int) -> int:
    """Groups packed into one 128-row contraction (1 when a group fills it already)."""
    cap = P // max(cig, cog)
    if groups == 1 or cap < 2:
        return 1
    return max(g for g in range(1, min(cap, groups) + 1) if groups % g == 0)


def blocks(Ho: int, Wo: int, free_max: int) -> tuple[int, int]:
    """Output block (rows, cols), rows*cols <= free_max, balanced so the tails are not tiny."""
    if Wo <= free_max:
        rmax = max(1, min(Ho, free_max // Wo))
        nb = -(-Ho // rmax)
        return -(-Ho // nb), Wo
    nb = -(-Wo // free_max)
    return 1, -(-Wo // nb)


def _units(Kh: int, Kw: int, stack: int) -> tuple[tuple[int, int, int], ...]:
    return tuple((kh0, min(stack, Kh - kh0), kw) for kh0 in range(0, Kh, stack) for kw in range(Kw))


def _balanced(total: int, most: int, unit: int) -> int:
    """A width <= ``most`` (a multiple of ``unit`` when ``most >= unit``) splitting ``total``
    into the fewest, most even passes."""
    if most >= unit:
        most = most // unit * unit
    n = -(-total // most)
    w = -(-total // n)
    return min(most, -(-w // unit) * unit) if most >= unit else w


def plan_conv(op: str, part: int, isz: int, *, Co: int, Cig: int, Kh: int, Kw: int,
              Ho: int, Wo: int, W: int, stride: tuple[int, int], dilation: tuple[int, int],
              groups: int, dgrad_taps: int = 0) -> ConvPlan:
    """The blocking of one CONV kernel for ``part`` bytes per SBUF partition and operands of
    ``isz`` bytes (see the module docstring); ``Unsupported`` naming the op, the part that does
    not fit, its bytes and the limit. ``dgrad_taps`` (a data gradient): the stationaries come from
    the forward weight's rows (``tiling/conv.py:_weights_dgrad``), ``cob * dgrad_taps`` elements
    per loaded row."""
    (sh, sw), (dh, dw) = stride, dilation
    G = groups
    Cog = Co // G
    gpb = groups_per_block(G, Cig, Cog)
    cin, cout, SG = gpb * Cig, gpb * Cog, G // gpb
    nci = -(-cin // P)
    pitch = 32 if cin <= 32 else 64 if cin <= 64 else cin
    stack = min(Kh, P // pitch) if nci == 1 else 1
    rows_b = int(part * ROWS_SHARE)
    cc = min(cin, P)
    # weight rows: whole stacked units per load (forward), fewer stacked rows if needed
    krows, kcols, rows_all = Kh, Kw, True
    if not dgrad_taps and cin * Kh * Kw * isz * 2 + (Cig * Kh * Kw * isz if gpb > 1 else 0) > rows_b:
        rows_all = False
        row = cc * Kw * isz * 2 + (Cig * Kw * isz if gpb > 1 else 0)     # one kernel row, all slots
        while stack > 1 and row * stack > rows_b:
            stack -= 1
        if row > rows_b:                         # one kernel row in column groups
            per_col = row // Kw
            kcols, krows = rows_b // per_col, 1
            if kcols < 1:
                raise Unsupported(op, f"weight rows of {cc} channels need {per_col} B per SBUF "
                                  f"partition for one kernel tap (limit {rows_b})")
        else:
            krows = max(stack, rows_b // row // stack * stack)
            krows = min(krows, -(-Kh // stack) * stack)
    units = _units(Kh, Kw, stack)
    # weights: output-channel passes
    w_b = int(part * W_SHARE)
    col = nci * len(units) * isz                 # bytes of one output channel's stationaries
    most = w_b // (col * (2 if SG > 1 else 1))
    if most < cout:
        most = w_b // (col * 2)                  # several passes: the next pass's weights load
    if dgrad_taps:                               # its rows tile holds cob * taps per partition
        ft = dgrad_taps * isz
        most = min(most, (rows_b - (Cog * ft if gpb > 1 else 0)) // (2 * ft))
    if most < 1:
        raise Unsupported(op, f"weights of {cin} input channels x {Kh * Kw} taps need "
                          f"{col * 2} B per SBUF partition for one output channel (limit {w_b})")
    cob = cout if most >= cout else _balanced(cout, most, P if most >= P else 1)
    if dgrad_taps and gpb > 1 and cob < cout:
        raise Unsupported(op, f"grouped data-gradient weight rows of {cout} channels x "
                          f"{dgrad_taps} taps need {cout * dgrad_taps * isz * 2} B per SBUF "
                          f"partition (limit {rows_b})")
    # input tiles
    x_b = int(part * X_SHARE)
    stage = W * isz < STAGE_ROW_BYTES

    def need(fm: int, chunks: int, bufs: int) -> tuple[int, int, int]:
        R, Cw = blocks(Ho, Wo, fm)
        rin, cinw = (R - 1) * sh + (Kh - 1) * dh + 1, (Cw - 1) * sw + (Kw - 1) * dw + 1
        per = chunks * rin * (cinw + (W if stage and Cw == Wo else 0)) * isz
        return per * bufs, R, Cw

    sizes = []
    fm = FREE_MAX
    while fm >= 1:
        sizes.append(fm)
        fm //= 2
    big = [s for s in sizes if s >= MIN_FREE]
    small = [s for s in sizes if s < MIN_FREE]
    order = [(s, False) for s in big] + ([(s, True) for s in sizes] if nci > 1 else []) \
        + [(s, False) for s in small]
    for bufs in (X_BUFS, 2):
        for fm, per_chunk in order:
            nb, R, Cw = need(fm, 1 if per_chunk else nci, bufs)
            if nb <= x_b:
                return ConvPlan(gpb, cin, cout, SG, nci, stack, pitch, units, R, Cw, cob, krows,
                                kcols, rows_all, per_chunk, bufs)
    nb, R, Cw = need(1, 1, 2)
    rin, cinw = (Kh - 1) * dh + 1, (Kw - 1) * dw + 1
    raise Unsupported(op, f"input window of {rin}x{cinw} for one output pixel needs {nb} B per "
                      f"SBUF partition (limit {x_b})")
