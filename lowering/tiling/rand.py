"""Tiling of RAND kernels: counter-based random numbers on GpSimdE (``rand_philox``).

The output (contiguous, ``n`` elements) is laid out as rows of ``F`` consecutive elements on
partitions (128 rows per tile) and a last partial row. The Philox key (two int32 seed words) is
loaded once, broadcast to every partition by a stride-0 DMA; per row tile an ``iota`` gives each
partition its first counter (row * F), and one ``rand_philox`` fills the tile.

normal (Box-Muller, counters e and n + e):
    l = ln(1 - u1)                  ScalarE activation(log, scale=-1, bias=1)   (1 - u1 in (0, 1])
    r = sqrt(-2 l)                  ScalarE activation(sqrt, scale=-2)
    c = cos(2 pi u2 - pi)           ScalarE activation(cos, scale=2 pi, bias=-pi) (argument in [-pi, pi))
    z = r * c                       VectorE/GpSimdE tensor_tensor, rounded to the output dtype
  |z| <= sqrt(-2 ln 2**-24) = 5.77 (the 24-bit uniforms bound the tail).

Invariants
- Element e of the output depends only on the key and e (not on the tiling): the same seed
  gives the same tensor on every target.
- Uniform values have as many random bits as the output's significand (fp32 24, fp16 11,
  bf16 8), so rounding never reaches 1.0.
"""
from __future__ import annotations

import math

from lowering.errors import Unsupported
from lowering.kir import KOp, RandKAttrs
from lowering.tir.builder import TirBuilder, hbm_ap
from runtime_sim.isa import ActFunc, AluOp, DType, EngineKind, Memory, Op, RandPhiloxAttrs

F32, I32 = DType.FP32, DType.INT32
ROW = 512
BITS = {DType.FP32: 24, DType.FP16: 11, DType.BF16: 8}
COUNTER_MAX = 2 ** 31


def tile_rand(b: TirBuilder, k: KOp) -> None:
    a = k.attrs
    assert isinstance(a, RandKAttrs)
    seed, out = k.ins[0], k.outs[0]
    n = out.numel
    if n == 0:
        return
    if (2 if a.normal else 1) * n >= COUNTER_MAX:
        raise Unsupported(",".join(k.origin) or "rand", f"{n} random elements: the int32 counters "
                                                        f"take fewer than {COUNTER_MAX // (2 if a.normal else 1)}")
    P = b.target.sbuf_partitions
    key = b.tile("rng_key", Memory.SBUF, P, 2, I32, 1)
    b.dma(key.ap(), hbm_ap(seed.buffer, I32, seed.offset, P, 0, ((2, 1),)))
    F = min(ROW, n)
    rows, tail = divmod(n, F)
    for r0, p in b.tiled(rows, P, "r"):
        _fill(b, a, key, out, r0 * F, p, F, n)
    if tail:
        _fill(b, a, key, out, rows * F, 1, tail, n)


def _uniform(b: TirBuilder, key, base, p: int, f: int, step: int, dtype: DType):
    ctr = b.tile("rng_ctr", Memory.SBUF, p, 1, I32).ap()
    b.iota(ctr, base, step, ())
    u = b.tile("rng_u", Memory.SBUF, p, f, dtype).ap()
    b.emit(Op.RAND_PHILOX, u, (key.ap(p), ctr), RandPhiloxAttrs((1,), BITS.get(dtype, 24)),
           engines=(EngineKind.GPSIMD,))
    return u


def _fill(b: TirBuilder, a: RandKAttrs, key, out, base, p: int, f: int, n: int) -> None:
    """Rows ``[base / f, base / f + p)`` of ``f`` elements each (``p`` = 1: the tail)."""
    if not a.normal:
        res = _uniform(b, key, base, p, f, f, out.dtype)
    else:
        u1 = _uniform(b, key, base, p, f, f, F32)
        u2 = _uniform(b, key, base + n, p, f, f, F32)
        ln = b.tile("rng_ln", Memory.SBUF, p, f, F32).ap()
        b.activation(ln, u1, ActFunc.LOG, scale=-1.0, bias=1.0)
        r = b.tile("rng_r", Memory.SBUF, p, f, F32).ap()
        b.activation(r, ln, ActFunc.SQRT, scale=-2.0)
        c = b.tile("rng_c", Memory.SBUF, p, f, F32).ap()
        b.activation(c, u2, ActFunc.COS, scale=2 * math.pi, bias=-math.pi)
        res = b.tile("rng_z", Memory.SBUF, p, f, out.dtype, 3).ap()
        b.tensor_tensor(res, r, c, AluOp.MULTIPLY)
    b.dma(hbm_ap(out.buffer, out.dtype, out.offset + base, p, f, ((f, 1),)), res)
