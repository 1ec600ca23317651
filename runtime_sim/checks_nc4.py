"""Operand rules of the NeuronCore-v4 (trn3) instructions, part of ``checks``' static rules (see
its docstring): ``exponential`` (VectorE fast exponential), the MX matmul (``MatmulMxAttrs``, the
``perf_mode=mx`` branch of ``checks._r_matmul``) and ``quantize_mx``. Each raises EngineError on a
target without the feature (trn1/trn2), naming the instruction's constraint and the target, and
OperandError for operands against the NKI API's rules (ISA3 = aws-neuron-sdk@81ce03a
nki/api/nki/isa/__init__.py, with line numbers). Layouts: isa.MatmulMxAttrs, isa.QuantizeMxAttrs,
isa.ExponentialAttrs; docs/simulator.md section 8."""
from __future__ import annotations

from .checks_common import check_col, check_nsrcs, check_same_pf
from .errors import EngineError, OperandError
from .isa import (X4_ELEMENT, matmul_kmn, AP, EXP_ACCUM_DTYPES, EXP_DST_DTYPES, EXP_SRC_DTYPES, MX_EMAX, MX_PACK, MX_QUADRANT,
                  MX_SCALE_OFFSETS, DType, ExponentialAttrs, Instr, MatmulMxAttrs, Memory, Op, Queue,
                  QuantizeMxAttrs, mx_scale_rows)
from .targets import Target


def r_mx(ins: Instr, t: Target) -> None:
    """perf_mode=mx (isa.MatmulMxAttrs; NKI nc_matmul_mx, ISA3 = aws-neuron-sdk@81ce03a
    nki/api/nki/isa/__init__.py L714-826, trainium3_arch.rst L70-122)."""
    a = ins.attrs
    assert isinstance(a, MatmulMxAttrs)
    if not t.mx_matmul:
        raise EngineError(
            f"matmul perf_mode=mx (nc_matmul_mx, MXFP8 with E8M0 scales) is not available on {t.name} "
            f"({t.neuron_core}): \"Available only on NeuronCore-v4 and newer\" (ISA3 L717-719)")
    st, mv, sst, smv = ins.srcs
    for name, x in (("stationary", st), ("moving", mv)):
        _mx_data(x, f"matmul perf_mode=mx {name}")
    if st.partitions != mv.partitions:
        raise OperandError(f"matmul perf_mode=mx: stationary has {st.partitions} partitions, moving "
                           f"{mv.partitions} (ISA3 L779)")
    m = matmul_kmn(ins)[1]
    if m % 2:
        raise OperandError(f"matmul perf_mode=mx: the stationary's free size M={m} (x4 elements) must be "
                           f"even (ISA3 L781)")
    _mx_scale(st, sst, a.stationary_scale_offset, m, "matmul perf_mode=mx stationary_scale")
    _mx_scale(mv, smv, a.moving_scale_offset, matmul_kmn(ins)[2], "matmul perf_mode=mx moving_scale")


def _mx_data(x: AP, what: str, fp4: bool = True) -> None:
    """MX data in SBUF, P a multiple of 32 up to 128: fp8 [P, F, 4] with the x4 innermost, or an
    x4 dtype [P, F] (isa.X4_ELEMENT; MXFP4 only so, and not where ``fp4`` is False)."""
    ok = set(MX_EMAX) | ({DType.FP4_E2M1_X4} if fp4 else set())
    if x.dtype not in ok or x.memory is not Memory.SBUF:
        raise OperandError(f"{what} must be float8_e4m3fn or float8_e5m2 in SBUF (or the x4 types "
                           f"{sorted(d.value for d in ok if d in X4_ELEMENT)}), got {x.dtype.value} "
                           f"in {x.memory.value}")
    if x.dtype not in X4_ELEMENT and (not x.dims or x.dims[-1] != (1, MX_PACK)):
        raise OperandError(f"{what}: the innermost dim must be (1, {MX_PACK}), the x4 packing, got "
                           f"dims {x.dims}")
    if x.partitions % MX_QUADRANT:
        raise OperandError(f"{what}: partitions must be a multiple of {MX_QUADRANT} (up to 128), got "
                           f"{x.partitions} (ISA3 L779, L2784)")


def _mx_scale(data: AP, s: AP, offset: int, free: int, what: str) -> None:
    """An MX scale AP (isa.mx_scale_rows): uint8 in SBUF, from the data's first partition,
    reaching its last scale row, ``free`` elements per partition, offset 0/4/8/12."""
    if s.dtype is not DType.UINT8 or s.memory is not Memory.SBUF:
        raise OperandError(f"{what} must be uint8 (E8M0) in SBUF, got {s.dtype.value} in {s.memory.value}")
    if offset not in MX_SCALE_OFFSETS:
        raise OperandError(f"{what} offset must be one of {MX_SCALE_OFFSETS}, got {offset}")
    if s.partition_start != data.partition_start:
        raise OperandError(f"{what} must start on its data's first partition {data.partition_start} "
                           f"(scales sit in their group's quadrant), got {s.partition_start}")
    r0, n = mx_scale_rows(data.partitions, offset)[-1]
    if s.partitions < r0 + n:
        raise OperandError(f"{what} must reach row {r0 + n - 1} (scales of {data.partitions} partitions "
                           f"at offset {offset}), got {s.partitions} partitions")
    if s.free_size != free:
        raise OperandError(f"{what}: expected {free} scales per partition, got {s.free_size}")


def _r_exponential(ins: Instr, q: Queue, t: Target) -> None:
    """nki.isa.exponential (ISA3 = aws-neuron-sdk@81ce03a nki/api/nki/isa/__init__.py L2283-2345)."""
    a = ins.attrs
    assert isinstance(a, ExponentialAttrs) and ins.dst is not None
    if t.vector_exp_speedup <= 0:
        raise EngineError(
            f"exponential (VectorE fast exponential) is not available on {t.name} ({t.neuron_core}): "
            f"nki.isa.exponential is \"Available only on NeuronCore-v4 and newer\" (ISA3 L2287; "
            f"trainium3_arch.rst L179); use activation(exp) on ScalarE")
    check_nsrcs(ins, 1 + int(a.max_from_src) + int(a.init_from_src))
    src, dst = ins.srcs[0], ins.dst
    check_same_pf(dst, src, "exponential dst")
    if src.dtype not in EXP_SRC_DTYPES:
        raise OperandError(f"exponential src dtype {src.dtype.value} is not supported (ISA3 L2336: "
                           f"{sorted(x.value for x in EXP_SRC_DTYPES)})")
    if dst.dtype not in EXP_DST_DTYPES:
        raise OperandError(f"exponential dst dtype {dst.dtype.value} is not supported (ISA3 L2335: "
                           f"{sorted(x.value for x in EXP_DST_DTYPES)})")
    names = (["max_value"] if a.max_from_src else []) + (["reduce_init"] if a.init_from_src else [])
    for k, name in enumerate(names, start=1):
        check_col(ins.srcs[k], src.partitions, f"exponential {name}")
        if ins.srcs[k].dtype is not DType.FP32:
            raise OperandError(f"exponential {name} must be fp32 (ISA3 L2337, L2345), got "
                               f"{ins.srcs[k].dtype.value}")
    if ins.accum is None:
        if a.init_from_src or a.reduce_init != 0.0:
            raise OperandError("exponential reduce_init applies to a reduction: give accum (reduce_res), "
                               "or leave reduce_init 0 (ISA3 L2314)")
        return
    check_col(ins.accum, src.partitions, "exponential accum (reduce_res)")
    if ins.accum.dtype not in EXP_ACCUM_DTYPES:
        raise OperandError(f"exponential accum (reduce_res) must be a float type (ISA3 L2338), got "
                           f"{ins.accum.dtype.value}")


def _r_quantize_mx(ins: Instr, q: Queue, t: Target) -> None:
    """quantize_mx (isa.QuantizeMxAttrs; ISA3 L2741-2816, trainium3_arch.rst L157-174)."""
    a = ins.attrs
    assert isinstance(a, QuantizeMxAttrs) and ins.dst is not None
    if not t.mx_matmul:
        raise EngineError(
            f"quantize_mx (MXFP8 quantization) is not available on {t.name} ({t.neuron_core}): "
            f"\"Available only on NeuronCore-v4 and newer\" (ISA3 L2744-2746)")
    check_nsrcs(ins, 1)
    src, dst = ins.srcs[0], ins.dst
    if src.dtype not in (DType.BF16, DType.FP16) or src.memory is not Memory.SBUF:
        raise OperandError(f"quantize_mx src must be bfloat16 or float16 in SBUF (ISA3 L2763, L2767), "
                           f"got {src.dtype.value} in {src.memory.value}")
    if src.free_size % MX_PACK:
        raise OperandError(f"quantize_mx src free size must be a multiple of {MX_PACK}, got {src.free_size}")
    _mx_data(dst, "quantize_mx dst", fp4=False)     # MXFP8 only (ISA3 L2767)
    if dst.dtype in X4_ELEMENT:
        if (dst.partitions, dst.free_size * MX_PACK) != (src.partitions, src.free_size):
            raise OperandError(f"quantize_mx dst: expected [{src.partitions}, {src.free_size // MX_PACK}] "
                               f"x4 elements for src [{src.partitions}, {src.free_size}], got "
                               f"[{dst.partitions}, {dst.free_size}]")
    else:
        check_same_pf(dst, src, "quantize_mx dst")
    if dst.partition_start != src.partition_start:
        raise OperandError(f"quantize_mx dst must start on the src's partition {src.partition_start}, "
                           f"got {dst.partition_start}")
    if ins.accum is None:
        raise OperandError("quantize_mx writes its scales to accum (dst_scale): give it")
    _mx_scale(src, ins.accum, a.scale_offset, src.free_size // MX_PACK, "quantize_mx dst_scale (accum)")


NC4_RULES = {Op.EXPONENTIAL: _r_exponential, Op.QUANTIZE_MX: _r_quantize_mx}
