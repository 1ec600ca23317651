"""What each instruction computes: ONE table, ``SEMANTICS: Op -> function(instr, memory, engine)``.

Conventions (the executable spec of the ISA)
- Vector, Scalar and GpSimd compute in fp32: sources are converted to fp32 on input and the
  result is rounded once to the destination dtype (``memory.cast_to``: round-to-nearest-even for
  floats via ml_dtypes; float -> int truncates toward zero, NaN -> 0, saturates). Transcendental
  functions are evaluated in float64 and rounded to fp32 (a correctly rounded fp32 library).
- Shapes: element-wise ops pair elements by (partition, position in the row-major order of the
  free axes); destination and sources need the same partition count and the same number of free
  elements, but their free shapes may differ.
- ``dma_copy``: element i of the source goes to element i of the destination in the row-major
  order of each AP's shape ``(partitions, *sizes)``; both sides have one dtype (DMA never casts;
  bytes are copied exactly). With ``transpose`` the 2-D views ``(first axis, rest)`` (HBM drops
  its single partition axis) are transposed.
- ``matmul``: ``dst[M, N] = stationary[K, M].T @ moving[K, N]`` computed in fp32 (bf16/fp8
  products are exact in fp32, sums are fp32, in K order); ``accumulate=False`` overwrites the PSUM bytes,
  ``True`` adds to them (and they must have been written by a matmul). A bf16 destination
  (NC-v4, trainium3_arch.rst "BF16 Matmul Results in PSUM" L129-141): the fp32 result is rounded
  to bf16 (RNE) "immediately before the write"; accumulating upcasts the bf16 PSUM values to fp32,
  adds at fp32 and rounds the sum to bf16 (RNE) on the write back. The guide's other rounding
  mode, stochastic rounding, is not modelled (no instruction selects it).
  ``perf_mode=double_row``
  (fp8): operands ``[P, 2, M]`` / ``[P, 2, N]``, the sum runs over both P and the packed axis
  (K = 2P), in (p, j) order, fp32 as above.
- ``transpose``: ``dst[F, P] = src[P, F].T``, exact (values are copied, then stored in the dst
  dtype). On TensorE the result counts as a matmul write of PSUM.
- ``activation``: ``y = func(x * scale + bias)`` (affine in fp32); bias/scale are constants or
  [P, 1] source APs in the order (bias, scale); with ``reduce`` the fp32 ``y`` is reduced over all
  free axes into ``accum`` [P, 1]. ``identity`` and ``copy`` both return ``x * scale + bias``.
  GELU (erf form) is ``0.5 x (1 + erf(x / sqrt 2))``, GELU_TANH is
  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, SiLU ``x * sigmoid(x)``, as torch defines.
  ARCTAN is ``arctan(z)`` on its valid input range ``[-pi/2, pi/2]`` (nki.api.shared.rst: outside
  it the hardware "may produce invalid results"; the bound is fp32's pi/2); outside that range the simulator returns NaN,
  so a program that relies on it fails its tests instead of passing on a value the engine
  would not give. NaN inputs propagate.
- ``tensor_tensor_scan``: per partition, along the row-major flattened free axis,
  ``y[i] = (src0[i] op0 y[i-1]) op1 src1[i]``, ``y[-1]`` = the constant ``initial`` or the [P, 1]
  third source; every step rounds to fp32 (the recurrence stays inside the engine).
- ALU ops (``tensor_tensor``, ``tensor_scalar``): ``bypass(a, b) = a``; ``subtract = a - b``;
  ``divide = a / b`` (IEEE); ``pow = a ** b``; ``mod`` = floor modulo (sign of the divisor, like
  ``torch.remainder``); comparisons and logical ops (non-zero is true) yield 1.0 / 0.0;
  ``abs_max = max(|a|, |b|)``. ``tensor_scalar`` computes ``(x op0 c0) op1 c1``; ``reverse``
  swaps the operands of that step (``c op x``); operands are constants or [P, 1] sources.
- Integer ALU (GpSimdE; nki.isa.tensor_tensor: "When all input/output tiles are int32 or uint32,
  the operation defaults to GpSimd Engine, which uses native integer arithmetic. This ensures
  exact results for all 32-bit integer values"): a ``tensor_tensor``, ``tensor_scalar`` or
  ``select`` on GpSimdE whose sources are all int32/int8/uint8/bool, whose destination is an
  integer type and whose constants are integers computes in 32-bit two's complement: every step
  wraps to int32 (as torch's int32 arithmetic does), comparisons and logical ops give 0 / 1,
  ``divide`` truncates toward zero and ``mod`` is floor modulo; by zero they give -1 and the
  dividend (ASSUMED: RISC-V's M-extension rule, the hardware's is unpublished). The int32
  result is then stored in the destination dtype. ``select`` then copies the chosen values
  exactly. Anything else (VectorE, a float source or destination, int64 sources) takes the fp32
  path above. int64 has no ALU datapath: programs compute it as two int32 words.
- Bitvec ops (``bitwise_and/or/xor``, ``logical_shift_left/right``, ``arith_shift_right``; any
  of VectorE/GpSimdE): integer sources only (else OperandError), computed on their 32-bit
  patterns; a shift by an amount outside [0, 31] gives 0 (logical) or the sign fill (arith), as
  torch's shifts by >= the width do.
- Reductions (``tensor_reduce``, activation ``reduce``): add, multiply, max, min (NaN
  propagates), abs_max, logical and/or/xor; ``tensor_reduce`` reduces the innermost ``num_axes``
  free axes and ``negate`` negates the result.
- ``iota``: int64 ``base + p * partition_step + sum(i_j * steps[j])`` (p counts from the AP's
  first partition; missing steps are 0), then stored in the dst dtype.
- ``select``: ``where(src0 != 0, src1, src2)``. ``memset``: every element = value.
- ``tensor_copy``: same dtype -> exact copy; int -> int exact (saturating); otherwise through fp32.
- ``bn_stats``: [P, 2] = (mean, population variance) of the free elements; ``bn_aggr``: combine
  k (mean, var) pairs of equal counts: mean = avg(mean_i), var = avg(var_i + (mean_i - mean)^2).
  NKI's layout (``BnStatsNkiAttrs`` / ``BnAggrNkiAttrs``, nki.isa.bn_stats): [P, 6] = (count,
  mean, variance * count) of the even-indexed then the odd-indexed elements (an empty half:
  0, 0, 0; ASSUMED, the docs do not say); bn_aggr of k such triples: N = sum n_i, mean =
  sum n_i mean_i / N, var = (sum M2_i + sum n_i (mean_i - mean)^2) / N (Chan et al.).
- ``dma_gather`` / ``dma_scatter`` (indirect DMA; operand layout in isa.py): lookups in row-major
  ``(p, i)`` order of the index AP; every lookup value must lie in ``[0, V)`` of the table's
  indexed dim, else BoundsError naming the value, the lookup and the bound (nothing is written).
  Bytes are copied exactly (no cast). Gather reads only the rows it looks up (a never-written
  row is an uninitialised read; the rest of the table is not read). Scatter writes the rows in
  lookup order, so with duplicate indices the last lookup wins; with ``accumulate`` each lookup
  reads its row, adds in fp32 and rounds to the table dtype before the next one (NKI
  ``dst_rmw_op=add``; DMA compute is fp32), and the row must have been written before.
- ``max8`` / ``nc_find_index8`` / ``nc_match_replace8`` (VectorE, per partition, over the
  row-major flattened free elements, fp32): max8 writes the 8 largest values in descending order
  with NaN above +inf; find_index8 writes, for each of the 8 vals, the position of its first
  match (NaN matches NaN; the k-th of equal vals gets the k-th match; no match: -1, the all-ones
  int32 sentinel); match_replace8 copies the data with those matched positions set to ``imm``.
  The NaN rules are ASSUMED (isa.py); they are what torch's topk/argmax orders.
- ``rand_philox`` (GpSimdE): Philox4x32-10 words of per-element counters, scaled to [0, 1)
  (isa.RandPhiloxAttrs); uint32 arithmetic in numpy uint64, exact.
- ``exponential`` (VectorE, NC-v4; isa.ExponentialAttrs): ``z = src - max_value`` in fp32 (each
  subtraction rounded to fp32), ``y = exp(z)`` (float64, rounded to fp32), stored in dst's dtype;
  with ``accum``, ``acc = reduce_init; acc += y[j]`` for j in order along the free axis, every
  add rounded to fp32 (the arch guide's sequential loop), then stored in accum's dtype. The sum
  reads the fp32 ``y`` the engine computes, not dst rounded to a narrower dtype (the docs'
  pseudo-code does not say; the engine "performs the computation in float32 precision
  internally", ISA3 L2305).
- MX matmul (``MatmulMxAttrs``, NC-v4): each fp8 operand ``[P, F, 4]`` is multiplied by its
  group's E8M0 scale ``2^(s - 127)`` in fp32 (255: NaN), then the fp32 matmul over K = (p, j)
  in (p, j) order, as above (AWS's golden model does the same, mx_cpu_utils.py L112-183).
- ``quantize_mx`` (VectorE, NC-v4; isa.QuantizeMxAttrs): per group of 8 partitions x 4 values,
  the scale of ISA3 L2790-2812 and ``dst = RNE(v / X)`` (exact division by a power of two, then
  one rounding to the fp8 type). AWS's golden ``quantize_mx_golden`` uses OCP's scale (half the
  documented one, mx_cpu_utils.py L84) unless given ``custom_mx_max_exp``: the API text is
  followed.
- ``sem``: nothing.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .isa import (ALU_INT_DTYPES, AP, X4_ELEMENT, BITVEC_OPS, DType, ActFunc, ActivationAttrs, AluOp, BnAggrNkiAttrs,
                  BnStatsNkiAttrs, DmaAttrs, DmaScatterAttrs, EngineKind,
                  ExponentialAttrs, Instr, IotaAttrs, MatchReplace8Attrs, MatmulAttrs, MatmulMxAttrs,
                  MemsetAttrs, MX_EMAX, MX_GROUP_PARTITIONS, MX_PACK, Op, QuantizeMxAttrs,
                  mx_scale_rows,
                  RandPhiloxAttrs, TensorReduceAttrs,
                  TensorScalarAttrs, TensorTensorAttrs, TensorTensorScanAttrs, indirect_layout,
                  matmul_kmn)
from .checks import BoundsError, OperandError, dma_2d
from .memory import MachineMemory, cast_to

F32 = np.float32


# ---- erf in float64 (numpy has none; no scipy dependency) -----------------------------------

def erf64(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-15 relative: a positive power series for |x| <= 2, the Laplace continued
    fraction of erfc beyond."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    out = np.empty_like(a)
    small = a <= 2.0
    xs = a[small]
    if xs.size:
        x2 = 2.0 * xs * xs
        t = xs.copy()
        s = xs.copy()
        n = 1
        while True:
            t *= x2 / (2 * n + 1)
            s += t
            n += 1
            if n % 8 == 0 and not np.any(t > 1e-17 * s):
                break
        out[small] = 2.0 / math.sqrt(math.pi) * np.exp(-xs * xs) * s
    if xs.size != a.size:
        xl = np.minimum(a[~small], 30.0)
        f = xl.copy()
        for k in range(50, 0, -1):
            f = xl + (k / 2.0) / f
        out[~small] = 1.0 - np.exp(-xl * xl) / math.sqrt(math.pi) / f
    out = np.copysign(out, x)
    out[np.isnan(x)] = np.nan
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_HALF_PI_F32 = float(np.float32(math.pi / 2))   # the fp32 pi/2 (just above pi/2) is in range

ACT_FUNCS: dict[ActFunc, Callable[[np.ndarray], np.ndarray]] = {
    ActFunc.IDENTITY: lambda x: x,
    ActFunc.COPY: lambda x: x,
    ActFunc.EXP: np.exp,
    ActFunc.LOG: np.log,
    ActFunc.TANH: np.tanh,
    ActFunc.SIGMOID: _sigmoid,
    ActFunc.RELU: lambda x: np.where(x > 0, x, np.where(np.isnan(x), x, 0.0)),
    ActFunc.GELU: lambda x: 0.5 * x * (1.0 + erf64(x / math.sqrt(2.0))),
    ActFunc.GELU_TANH: lambda x: 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))),
    ActFunc.SILU: lambda x: x * _sigmoid(x),
    ActFunc.SQRT: np.sqrt,
    ActFunc.RSQRT: lambda x: 1.0 / np.sqrt(x),
    ActFunc.RECIPROCAL: lambda x: 1.0 / x,
    ActFunc.SQUARE: lambda x: x * x,
    ActFunc.ABS: np.abs,
    ActFunc.SIGN: lambda x: (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype),  # sign(nan) = 0
    ActFunc.ERF: erf64,
    ActFunc.SIN: np.sin,
    ActFunc.COS: np.cos,
    ActFunc.NEG: np.negative,
    ActFunc.ARCTAN: lambda x: np.where(np.abs(x) <= _HALF_PI_F32, np.arctan(x), np.nan),
}


def _b(x: np.ndarray) -> np.ndarray:
    return x.astype(F32)


ALU: dict[AluOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    AluOp.BYPASS: lambda a, b: np.array(np.broadcast_to(a, np.broadcast_shapes(np.shape(a), np.shape(b))), dtype=F32),
    AluOp.ADD: np.add,
    AluOp.SUBTRACT: np.subtract,
    AluOp.MULTIPLY: np.multiply,
    AluOp.DIVIDE: np.divide,
    AluOp.MAX: np.maximum,
    AluOp.MIN: np.minimum,
    AluOp.POW: np.power,
    AluOp.MOD: np.mod,
    AluOp.IS_EQUAL: lambda a, b: _b(a == b),
    AluOp.NOT_EQUAL: lambda a, b: _b(a != b),
    AluOp.IS_GT: lambda a, b: _b(a > b),
    AluOp.IS_GE: lambda a, b: _b(a >= b),
    AluOp.IS_LT: lambda a, b: _b(a < b),
    AluOp.IS_LE: lambda a, b: _b(a <= b),
    AluOp.LOGICAL_AND: lambda a, b: _b((a != 0) & (b != 0)),
    AluOp.LOGICAL_OR: lambda a, b: _b((a != 0) | (b != 0)),
    AluOp.LOGICAL_XOR: lambda a, b: _b((a != 0) ^ (b != 0)),
    AluOp.ABS_MAX: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
}

def _bitvec_on_float(a, b):
    raise OperandError("bitvec ALU ops take integer sources only (32-bit patterns)")


for _op in BITVEC_OPS:
    ALU[_op] = _bitvec_on_float


# ---- the 32-bit integer ALU: int64 numpy arrays holding int32 values ---------------------------

def wrap32(x: np.ndarray) -> np.ndarray:
    """Two's complement wraparound of int64 values to the int32 range."""
    return ((np.asarray(x, dtype=np.int64) + 2 ** 31) & 0xFFFFFFFF) - 2 ** 31


def _idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    nz = b != 0
    q = np.full(a.shape, -1, dtype=np.int64)
    aa, bb = a[nz], b[nz]
    q[nz] = np.sign(aa) * np.sign(bb) * (np.abs(aa) // np.abs(bb))    # toward zero
    return q


def _imod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    nz = b != 0
    r = a.copy()
    r[nz] = np.mod(a[nz], b[nz])                                      # sign of the divisor
    return r


def _shift(a: np.ndarray, b: np.ndarray, kind: str) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    ok = (b >= 0) & (b < 32)
    s = np.where(ok, b, 0)
    if kind == "shl":
        return np.where(ok, wrap32(a << s), 0)
    if kind == "lsr":
        return np.where(ok, (a & 0xFFFFFFFF) >> s, 0)
    return a >> np.where(ok, s, 31)                                   # arithmetic: sign fill


def _i(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.int64)


INT_ALU: dict[AluOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    AluOp.BYPASS: lambda a, b: np.broadcast_arrays(a, b)[0].copy(),
    AluOp.ADD: np.add, AluOp.SUBTRACT: np.subtract, AluOp.MULTIPLY: np.multiply,
    AluOp.DIVIDE: _idiv, AluOp.MOD: _imod, AluOp.MAX: np.maximum, AluOp.MIN: np.minimum,
    AluOp.IS_EQUAL: lambda a, b: _i(a == b), AluOp.NOT_EQUAL: lambda a, b: _i(a != b),
    AluOp.IS_GT: lambda a, b: _i(a > b), AluOp.IS_GE: lambda a, b: _i(a >= b),
    AluOp.IS_LT: lambda a, b: _i(a < b), AluOp.IS_LE: lambda a, b: _i(a <= b),
    AluOp.LOGICAL_AND: lambda a, b: _i((a != 0) & (b != 0)),
    AluOp.LOGICAL_OR: lambda a, b: _i((a != 0) | (b != 0)),
    AluOp.LOGICAL_XOR: lambda a, b: _i((a != 0) ^ (b != 0)),
    AluOp.ABS_MAX: lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    AluOp.BITWISE_AND: np.bitwise_and, AluOp.BITWISE_OR: np.bitwise_or,
    AluOp.BITWISE_XOR: np.bitwise_xor,
    AluOp.LOGICAL_SHIFT_LEFT: lambda a, b: _shift(a, b, "shl"),
    AluOp.LOGICAL_SHIFT_RIGHT: lambda a, b: _shift(a, b, "lsr"),
    AluOp.ARITH_SHIFT_RIGHT: lambda a, b: _shift(a, b, "asr"),
}
INT_ALU_OPS = frozenset(INT_ALU)


def _int_constant(c: float) -> bool:
    return math.isfinite(c) and float(c).is_integer() and -2 ** 31 <= c < 2 ** 32


def int_alu(ins: Instr, eng: EngineKind) -> bool:
    """Does this tensor_tensor / tensor_scalar / select use the 32-bit integer ALU?"""
    dst = ins.dst
    if dst is None:
        return False
    a = ins.attrs
    ops = ()
    if isinstance(a, TensorTensorAttrs):
        ops = (a.op,)
    elif isinstance(a, TensorScalarAttrs):
        ops = (a.op0,) if a.op1 is None else (a.op0, a.op1)
    srcs = ins.srcs[1:] if ins.op is Op.SELECT else ins.srcs
    ints = all(s.dtype in ALU_INT_DTYPES for s in srcs)
    if any(o in BITVEC_OPS for o in ops):
        if not ints or dst.dtype.is_float:
            raise OperandError(f"bitvec {'/'.join(o.value for o in ops)} takes int32/int8/uint8/bool "
                               f"operands, got {[s.dtype.value for s in srcs]} -> {dst.dtype.value}")
        return True
    if eng is not EngineKind.GPSIMD or not ints or dst.dtype.is_float:
        return False
    if isinstance(a, TensorScalarAttrs):
        consts = ([] if a.operand0_from_src else [a.operand0]) + (
            [] if a.op1 is None or a.operand1_from_src else [a.operand1])
        if not all(_int_constant(c) for c in consts):
            return False
    return all(o in INT_ALU_OPS for o in ops)


def _irows(m: MachineMemory, a: AP) -> np.ndarray:
    return m.read(a).reshape(a.partitions, -1).astype(np.int64)


def _iconst(c: float) -> np.int64:
    return np.int64(wrap32(np.int64(int(c))))


REDUCE: dict[AluOp, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    AluOp.ADD: lambda x, ax: np.sum(x, axis=ax, dtype=F32),
    AluOp.MULTIPLY: lambda x, ax: np.prod(x, axis=ax, dtype=F32),
    AluOp.MAX: lambda x, ax: np.max(x, axis=ax),
    AluOp.MIN: lambda x, ax: np.min(x, axis=ax),
    AluOp.ABS_MAX: lambda x, ax: np.max(np.abs(x), axis=ax),
    AluOp.LOGICAL_AND: lambda x, ax: _b(np.all(x != 0, axis=ax)),
    AluOp.LOGICAL_OR: lambda x, ax: _b(np.any(x != 0, axis=ax)),
    AluOp.LOGICAL_XOR: lambda x, ax: _b(np.sum(x != 0, axis=ax) % 2 == 1),
}


def _rows(m: MachineMemory, a: AP) -> np.ndarray:
    """fp32 [P, F] view of a source."""
    return m.read_f32(a).reshape(a.partitions, -1)


def _dst(ins: Instr) -> AP:
    assert ins.dst is not None
    return ins.dst


# ---- one function per op --------------------------------------------------------------------

def dma_copy(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    src, dst = ins.srcs[0], _dst(ins)
    x = m.read(src)
    assert isinstance(ins.attrs, DmaAttrs)
    if ins.attrs.transpose:
        x = x.reshape(dma_2d(src)).T
    m.write(dst, np.ascontiguousarray(x).reshape(-1))


def matmul(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    st, mv = ins.srcs[:2]
    dst = _dst(ins)
    k, mm, nn = matmul_kmn(ins)
    if isinstance(ins.attrs, MatmulMxAttrs):
        # [P, F, 4] fp8 dequantized in fp32, then the (p, j) rows of K in (p, j) order
        a = ins.attrs
        s = _mx_operand(m, st, ins.srcs[2], a.stationary_scale_offset).reshape(k, mm)
        v = _mx_operand(m, mv, ins.srcs[3], a.moving_scale_offset).reshape(k, nn)
    else:
        # double_row: [P, 2, F] -> [2P, F] rows (p, j) in (p, j) order; every (p, j) pair is one
        # K row of the contraction (the sum does not depend on which logical row it is)
        s = m.read_f32(st).reshape(k, mm)
        v = m.read_f32(mv).reshape(k, nn)
    # einsum's own C loop, not BLAS: sequential fp32 sums over K like the PE array, and no BLAS
    # thread pool (OpenBLAS threads on small tiles were 100x slower on a busy 2-core host)
    r = np.einsum("km,kn->mn", s, v, optimize=False)
    assert isinstance(ins.attrs, MatmulAttrs)
    if ins.attrs.accumulate:
        m.check_accumulate(dst)
        r = m.read_f32(dst).reshape(r.shape) + r
    m.write(dst, r, by_matmul=True)


def _mx_scale_aps(data: AP, scale: AP, offset: int) -> list[AP]:
    """The rows of an MX scale AP that hold scales (one AP per quadrant; isa.mx_scale_rows)."""
    return [AP(scale.buffer, scale.memory, scale.partition_start + r0, n, scale.byte_offset,
               scale.dims, scale.dtype) for r0, n in mx_scale_rows(data.partitions, offset)]


def _mx_factor(s: np.ndarray) -> np.ndarray:
    """E8M0 exponents (uint8) -> fp32 scale factors 2^(s - 127); 255 is NaN (OCP MX v1.0)."""
    e = s.astype(np.int64)
    return np.where(e == 255, np.nan, np.ldexp(1.0, e - 127)).astype(F32)


def _mx_operand(m: MachineMemory, data: AP, scale: AP, offset: int) -> np.ndarray:
    """MX data [P, F, 4] times its group's scale, in fp32 (as AWS's golden model
    nc_matmul_mx_golden, nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py L112-183: dequantize
    each operand to fp32, then an fp32 matmul); returns [P, 4, F] (K rows in (p, j) order)."""
    x = _unpack_x4(m.read(data), data.dtype) if data.dtype in X4_ELEMENT else \
        m.read_f32(data).reshape(data.partitions, -1, MX_PACK)
    rows = np.concatenate([m.read(a).reshape(a.partitions, -1) for a in _mx_scale_aps(data, scale, offset)])
    f = np.repeat(_mx_factor(rows), MX_GROUP_PARTITIONS, axis=0)          # [P, F]
    with np.errstate(all="ignore"):
        return np.ascontiguousarray((x * f[:, :, None]).astype(F32).transpose(0, 2, 1))


def _unpack_x4(raw: np.ndarray, dt) -> np.ndarray:
    """x4 elements [P, ...] (isa.X4_ELEMENT) -> fp32 [P, F, 4]: value j of an element is byte
    j (fp8, little-endian) or bits [4j, 4j + 4) (fp4, as AWS's pack_mx_data_into_x4 packs).
    ASSUMED: an fp4 code means its OCP E2M1 value; NC-v4 converts MXFP4 to MXFP8 "using any
    arbitrary programmer-defined mapping" (neuron-core-v4.rst L132) and no API sets another."""
    p = raw.shape[0]
    if dt is DType.FP4_E2M1_X4:
        w = raw.reshape(p, -1, 1).astype(np.uint16)
        nib = ((w >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 0xF).astype(np.uint8)
        return nib.view(X4_ELEMENT[dt]).astype(F32)
    return np.ascontiguousarray(raw).reshape(p, -1).view(np.uint8).reshape(p, -1, MX_PACK) \
        .view(X4_ELEMENT[dt]).astype(F32)


def quantize_mx(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    """isa.QuantizeMxAttrs. ASSUMED where the docs are silent: a group holding NaN or +-inf gets
    the NaN scale (255) and NaN data; a scale below 2^-127 is clamped to 2^-127 (the smallest
    E8M0 value, as for an all-zero group)."""
    a = ins.attrs
    assert isinstance(a, QuantizeMxAttrs) and ins.accum is not None
    src, dst = ins.srcs[0], _dst(ins)
    p = src.partitions
    x = m.read_f32(src).reshape(p // MX_GROUP_PARTITIONS, MX_GROUP_PARTITIONS, -1, MX_PACK)
    amax = np.abs(x).max(axis=(1, 3))                                     # [groups, F / 4]
    bad = ~np.isfinite(amax)
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(np.where(bad | (amax == 0), 1.0, amax.astype(np.float64))))
    sb = e - (MX_EMAX[dst.dtype] - 1) + 127
    sb = np.where(amax == 0, 0, np.clip(sb, 0, 254))
    sb = np.where(bad, 255, sb).astype(np.int64)
    f = np.repeat(_mx_factor(sb), MX_GROUP_PARTITIONS, axis=0)            # [P, F / 4]
    with np.errstate(all="ignore"):
        q = x.reshape(p, -1, MX_PACK) / f[:, :, None]                      # exact: powers of two
    if dst.dtype in X4_ELEMENT:         # four fp8 values (RNE) packed into each element
        e4 = (dst.dtype is DType.FP8_E4M3_X4)
        q8 = cast_to(q.astype(F32), DType.FP8_E4M3 if e4 else DType.FP8_E5M2)
        m.write(dst, np.ascontiguousarray(q8).view(np.uint8).reshape(p, -1).view(np.uint32))
    else:
        m.write(dst, q.astype(F32))
    k = 0
    for s_ap in _mx_scale_aps(src, ins.accum, a.scale_offset):
        m.write(s_ap, sb[k:k + s_ap.partitions])
        k += s_ap.partitions


def transpose(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    src = ins.srcs[0]
    x = m.read(src).reshape(src.partitions, -1)
    m.write(_dst(ins), np.ascontiguousarray(x.T), by_matmul=eng is EngineKind.TENSOR)


def activation(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, ActivationAttrs)
    x = _rows(m, ins.srcs[0])
    k = 1
    bias: np.ndarray | F32 = F32(a.bias)
    scale: np.ndarray | F32 = F32(a.scale)
    if a.bias_from_src:
        bias = _rows(m, ins.srcs[k])
        k += 1
    if a.scale_from_src:
        scale = _rows(m, ins.srcs[k])
    with np.errstate(all="ignore"):
        # an identity affine step is skipped, so -0.0 keeps its sign (x + 0.0 would be +0.0)
        plain = not (a.bias_from_src or a.scale_from_src) and a.scale == 1.0 and a.bias == 0.0
        z = x if plain else x * scale + bias
        y = ACT_FUNCS[a.func](z.astype(np.float64)).astype(F32)
        m.write(_dst(ins), y)
        if a.reduce is not None and ins.accum is not None:
            m.write(ins.accum, REDUCE[a.reduce](y, (1,)))


def tensor_tensor(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, TensorTensorAttrs)
    if int_alu(ins, eng):
        r = wrap32(INT_ALU[a.op](_irows(m, ins.srcs[0]), _irows(m, ins.srcs[1])))
        m.write(_dst(ins), r)
        return
    x, y = _rows(m, ins.srcs[0]), _rows(m, ins.srcs[1])
    with np.errstate(all="ignore"):
        m.write(_dst(ins), ALU[a.op](x, y).astype(F32, copy=False))


def tensor_tensor_scan(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, TensorTensorScanAttrs)
    x, y = _rows(m, ins.srcs[0]), _rows(m, ins.srcs[1])
    prev = _rows(m, ins.srcs[2])[:, 0] if a.initial_from_src else np.full(x.shape[0], a.initial, F32)
    f0, f1 = ALU[a.op0], ALU[a.op1]
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        for i in range(x.shape[1]):     # sequential along the free axis, fp32 at every step
            prev = f1(f0(x[:, i], prev).astype(F32, copy=False), y[:, i]).astype(F32, copy=False)
            out[:, i] = prev
    m.write(_dst(ins), out)


def _step(x: np.ndarray, op: AluOp, c: np.ndarray | F32, reverse: bool) -> np.ndarray:
    f = ALU[op]
    return (f(c, x) if reverse else f(x, c)).astype(F32, copy=False)


def tensor_scalar(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, TensorScalarAttrs)
    if int_alu(ins, eng):
        _tensor_scalar_int(ins, m, a)
        return
    x = _rows(m, ins.srcs[0])
    k = 1
    c0: np.ndarray | F32 = F32(a.operand0)
    if a.operand0_from_src:
        c0 = _rows(m, ins.srcs[k])
        k += 1
    with np.errstate(all="ignore"):
        y = _step(x, a.op0, c0, a.reverse0)
        if a.op1 is not None:
            c1: np.ndarray | F32 = _rows(m, ins.srcs[k]) if a.operand1_from_src else F32(a.operand1)
            y = _step(y, a.op1, c1, a.reverse1)
    m.write(_dst(ins), y)


def _tensor_scalar_int(ins: Instr, m: MachineMemory, a: TensorScalarAttrs) -> None:
    x = _irows(m, ins.srcs[0])
    k = 1
    c0 = _iconst(a.operand0)
    if a.operand0_from_src:
        c0 = _irows(m, ins.srcs[k])
        k += 1
    f = INT_ALU[a.op0]
    y = wrap32(f(c0, x) if a.reverse0 else f(x, c0))
    if a.op1 is not None:
        c1 = _irows(m, ins.srcs[k]) if a.operand1_from_src else _iconst(a.operand1)
        f = INT_ALU[a.op1]
        y = wrap32(f(c1, y) if a.reverse1 else f(y, c1))
    m.write(_dst(ins), y)


def tensor_reduce(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, TensorReduceAttrs)
    src = ins.srcs[0]
    x = m.read_f32(src)
    axes = tuple(range(x.ndim - a.num_axes, x.ndim))
    with np.errstate(all="ignore"):
        r = REDUCE[a.op](x, axes).astype(F32, copy=False)
        if a.negate:
            r = -r
    m.write(_dst(ins), r)


def tensor_copy(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    src, dst = ins.srcs[0], _dst(ins)
    if src.dtype is dst.dtype or (not src.dtype.is_float and not dst.dtype.is_float):
        x = m.read(src)
    else:
        x = m.read_f32(src)
    m.write(dst, x.reshape(-1))


def memset(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, MemsetAttrs)
    dst = _dst(ins)
    m.write(dst, np.full(dst.num_elements, a.value, dtype=F32 if dst.dtype.is_float else np.float64))


def iota(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, IotaAttrs)
    dst = _dst(ins)
    v = np.full(dst.shape, a.base, dtype=np.int64)
    v += (np.arange(dst.partitions, dtype=np.int64) * a.partition_step).reshape((-1,) + (1,) * len(dst.dims))
    _add_free_steps(v, dst, a.steps)
    m.write(dst, v)


def _add_free_steps(v: np.ndarray, dst: AP, steps: tuple[int, ...]) -> None:
    """``v[p, i_0..] += sum(i_j * steps[j])`` in place (missing steps are 0)."""
    for j, (_, sz) in enumerate(dst.dims):
        step = steps[j] if j < len(steps) else 0
        if step:
            shape = [1] * (len(dst.dims) + 1)
            shape[j + 1] = sz
            v += (np.arange(sz, dtype=np.int64) * step).reshape(shape)


def select(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    if int_alu(ins, eng):
        c = _rows(m, ins.srcs[0])
        m.write(_dst(ins), np.where(c != 0, _irows(m, ins.srcs[1]), _irows(m, ins.srcs[2])))
        return
    c, x, y = (_rows(m, s) for s in ins.srcs)
    m.write(_dst(ins), np.where(c != 0, x, y))


def bn_stats(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    x = _rows(m, ins.srcs[0]).astype(np.float64)
    if isinstance(ins.attrs, BnStatsNkiAttrs):
        out = []
        for h in (x[:, 0::2], x[:, 1::2]):
            n = h.shape[1]
            mean = h.mean(axis=1) if n else np.zeros(len(x))
            m2 = ((h - mean[:, None]) ** 2).sum(axis=1)
            out += [np.full(len(x), float(n)), mean, m2]
        m.write(_dst(ins), np.stack(out, axis=1).astype(F32))
        return
    mean = x.mean(axis=1)
    var = ((x - mean[:, None]) ** 2).mean(axis=1)
    m.write(_dst(ins), np.stack([mean, var], axis=1).astype(F32))


def bn_aggr(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    s = _rows(m, ins.srcs[0]).astype(np.float64)
    if isinstance(ins.attrs, BnAggrNkiAttrs):
        n, mu, m2 = s[:, 0::3], s[:, 1::3], s[:, 2::3]
        tot = n.sum(axis=1)
        with np.errstate(all="ignore"):
            mean = (n * mu).sum(axis=1) / tot
            var = (m2.sum(axis=1) + (n * (mu - mean[:, None]) ** 2).sum(axis=1)) / tot
        m.write(_dst(ins), np.stack([mean, var], axis=1).astype(F32))
        return
    means, vars_ = s[:, 0::2], s[:, 1::2]
    mean = means.mean(axis=1)
    var = (vars_ + (means - mean[:, None]) ** 2).mean(axis=1)
    m.write(_dst(ins), np.stack([mean, var], axis=1).astype(F32))


def _lookups(m: MachineMemory, table: AP, index: AP) -> tuple[list[AP], int]:
    """The row AP of every lookup, in (p, i) order, and the row's element count; raises
    BoundsError (nothing touched yet) when a lookup value is outside the indexed dim."""
    lock, (vst, bound), row = indirect_layout(table, index)
    idx = m.read(index).reshape(-1).astype(np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= bound))
    if bad.size:
        j = int(bad[0])
        where = tuple(int(c) for c in np.unravel_index(j, index.shape))
        raise BoundsError(f"index value {int(idx[j])} of lookup {where} (partition "
                          f"{index.partition_start + where[0]} of {index.buffer}) is outside the "
                          f"bound [0, {bound}) of the table's indexed dim ({table}); "
                          f"{bad.size} of {idx.size} lookups are out of range")
    base = np.zeros(index.shape, dtype=np.int64)
    for axis, (st, sz) in enumerate(lock):
        if st:
            shape = [1] * len(lock)
            shape[axis] = sz
            base += (np.arange(sz, dtype=np.int64) * st).reshape(shape)
    offs = base.reshape(-1) + idx * vst
    isz = table.dtype.itemsize
    dims = row if row else ((1, 1),)
    n = 1
    for _, sz in dims:
        n *= sz
    aps = [AP(table.buffer, table.memory, 0, 1, table.byte_offset + int(o) * isz, dims, table.dtype)
           for o in offs]
    return aps, n


def dma_gather(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    table, index = ins.srcs
    aps, n = _lookups(m, table, index)
    rows: dict[int, np.ndarray] = {}
    out = np.empty((len(aps), n), dtype=table.dtype.np)
    for j, a in enumerate(aps):
        r = rows.get(a.byte_offset)
        if r is None:
            r = rows[a.byte_offset] = m.read(a).reshape(-1)
        out[j] = r
    m.write(_dst(ins), out.reshape(-1))


def dma_scatter(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    data, index = ins.srcs
    table = _dst(ins)
    assert isinstance(ins.attrs, DmaScatterAttrs)
    aps, n = _lookups(m, table, index)
    x = m.read(data).reshape(len(aps), n)
    if not ins.attrs.accumulate:
        for j, a in enumerate(aps):
            m.write(a, x[j])
        return
    xf = x.astype(F32)
    for j, a in enumerate(aps):
        m.write(a, m.read_f32(a).reshape(-1) + xf[j])


def max8(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    x = _rows(m, ins.srcs[0])
    # ascending sort puts NaN last; reversed, NaN comes first, then the values descending
    m.write(_dst(ins), np.sort(x, axis=1)[:, ::-1][:, :8])


def _matches(data: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found [P, 8], position [P, 8]) of each val's match: the k-th of equal vals (in val order)
    takes the k-th equal data element; NaN equals NaN."""
    nan_d, nan_v = np.isnan(data), np.isnan(vals)
    eq = (data[:, None, :] == vals[:, :, None]) | (nan_d[:, None, :] & nan_v[:, :, None])
    same = (vals[:, :, None] == vals[:, None, :]) | (nan_v[:, :, None] & nan_v[:, None, :])
    rank = np.tril(same, k=-1).sum(axis=2)          # equal vals before this one
    hit = eq & (np.cumsum(eq, axis=2) == (rank + 1)[:, :, None])
    return hit.any(axis=2), hit.argmax(axis=2)


def find_index8(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    found, pos = _matches(_rows(m, ins.srcs[0]), _rows(m, ins.srcs[1]))
    m.write(_dst(ins), np.where(found, pos, -1).astype(np.int64))


def match_replace8(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, MatchReplace8Attrs)
    data = _rows(m, ins.srcs[0]).copy()
    found, pos = _matches(data, _rows(m, ins.srcs[1]))
    p, j = np.nonzero(found)
    data[p, pos[p, j]] = F32(a.imm)
    m.write(_dst(ins), data)


PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_U32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10: ``ctr`` [..., 4] and ``key`` [..., 2] uint32 values (any integer dtype)
    -> [..., 4] uint32 words (Random123's philox4x32 with 10 rounds)."""
    c = [np.asarray(ctr[..., j], dtype=np.uint64) & _U32 for j in range(4)]
    k = [np.asarray(key[..., j], dtype=np.uint64) & _U32 for j in range(2)]
    for r in range(10):
        if r:
            k = [(k[0] + np.uint64(PHILOX_W[0])) & _U32, (k[1] + np.uint64(PHILOX_W[1])) & _U32]
        p0 = c[0] * np.uint64(PHILOX_M[0])
        p1 = c[2] * np.uint64(PHILOX_M[1])
        hi0, lo0 = p0 >> np.uint64(32), p0 & _U32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _U32
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
    return np.stack(c, axis=-1).astype(np.uint32)


def rand_philox(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, RandPhiloxAttrs)
    dst = _dst(ins)
    key = m.read(ins.srcs[0]).reshape(dst.partitions, 2).astype(np.int64) & 0xFFFFFFFF
    base = m.read(ins.srcs[1]).reshape(dst.partitions).astype(np.int64)
    e = np.broadcast_to(base.reshape((-1,) + (1,) * len(dst.dims)), dst.shape).copy()
    _add_free_steps(e, dst, a.steps)
    e = e.reshape(dst.partitions, -1).astype(np.uint64)
    blk = e >> np.uint64(2)
    ctr = np.stack([blk & _U32, blk >> np.uint64(32), np.zeros_like(blk), np.zeros_like(blk)], -1)
    words = philox4x32_10(ctr, np.broadcast_to(key[:, None, :], blk.shape + (2,)))
    w = np.take_along_axis(words, (e & np.uint64(3)).astype(np.int64)[..., None], -1)[..., 0]
    u = (w.astype(np.uint64) >> np.uint64(32 - a.bits)).astype(np.float64) * 2.0 ** -a.bits
    m.write(dst, u.astype(F32))


def exponential(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    a = ins.attrs
    assert isinstance(a, ExponentialAttrs)
    x = _rows(m, ins.srcs[0])
    mx = _rows(m, ins.srcs[1]) if a.max_from_src else F32(a.max_value)
    with np.errstate(all="ignore"):
        z = (x - mx).astype(F32, copy=False)
        y = np.exp(z.astype(np.float64)).astype(F32)
        m.write(_dst(ins), y)
        if ins.accum is not None:     # reduce_init, when a source, is the last one
            init = _rows(m, ins.srcs[-1]) if a.init_from_src else np.full((y.shape[0], 1), a.reduce_init, F32)
            # add.accumulate is a sequential fp32 loop (np.sum would add pairwise)
            acc = np.add.accumulate(np.concatenate([init, y], axis=1), axis=1, dtype=F32)[:, -1:]
            m.write(ins.accum, acc)


def sem(ins: Instr, m: MachineMemory, eng: EngineKind) -> None:
    return None


SEMANTICS: dict[Op, Callable[[Instr, MachineMemory, EngineKind], None]] = {
    Op.DMA_COPY: dma_copy, Op.MATMUL: matmul, Op.TRANSPOSE: transpose,
    Op.ACTIVATION: activation, Op.TENSOR_TENSOR: tensor_tensor,
    Op.TENSOR_TENSOR_SCAN: tensor_tensor_scan, Op.TENSOR_SCALAR: tensor_scalar,
    Op.TENSOR_REDUCE: tensor_reduce, Op.TENSOR_COPY: tensor_copy, Op.MEMSET: memset,
    Op.IOTA: iota, Op.SELECT: select, Op.BN_STATS: bn_stats, Op.BN_AGGR: bn_aggr,
    Op.DMA_GATHER: dma_gather, Op.DMA_SCATTER: dma_scatter, Op.MAX8: max8,
    Op.FIND_INDEX8: find_index8, Op.MATCH_REPLACE8: match_replace8,
    Op.RAND_PHILOX: rand_philox, Op.EXPONENTIAL: exponential, Op.QUANTIZE_MX: quantize_mx, Op.SEM: sem,
}
assert set(SEMANTICS) == set(Op), "every op needs a semantics function"
