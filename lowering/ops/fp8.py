"""fp8: ``torch._scaled_mm`` on TensorE (fp8 casts are ``_to_copy``, elementwise.py).

- ``aten._scaled_mm.default(a [M, K], b [K, N], scale_a, scale_b, bias=None, scale_result=None,
  out_dtype=None, use_fast_accum=False)``: ``out = (a @ b) * scale_a * scale_b (+ bias)`` rounded
  once to ``out_dtype`` (default: a's dtype). ``a`` / ``b`` are float8_e4m3fn or float8_e5m2 (b
  any layout: torch passes it column-major); scales are fp32, per tensor (one element) or
  row-wise (``scale_a [M, 1]``, ``scale_b [1, N]``); the bias has N elements.

Engine: TensorE ``matmul`` with fp8 stationary and moving tiles (K <= 128, M <= 128, N <= 512),
fp32 accumulation in PSUM over the K tiles; the scales, bias and cast form the epilogue, evaluated
on VectorE/ScalarE while PSUM is evacuated (``tiling/matmul/kernel.py``). Operands whose K axis is
contiguous are transposed on TensorE (DMA transpose handles 2-byte types only).

Numerics: fp8 values are exact in fp32, TensorE accumulates in fp32 as eager's CPU kernel does,
and the scaled result is rounded once (fp8 outputs: e4m3 saturates to +-448, as torch's
conversion does; ``runtime_sim.memory.cast_to``).

Cost: an fp8 matmul instruction is timed as a bf16 one. trn2/trn3 reach 2x (4x MX on trn3) only
in the double-row performance mode (two fp8 K rows packed per partition, K = 256 per
instruction), which the ISA here does not model (``runtime_sim/costs.py``); the roofline still
uses the target's fp8 peak (``Target.peak_flops_per_ns``), so the gap shows in the profile.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from lowering.errors import Unsupported
from lowering.kir import EOp, Expr, TensorRef
from lowering.lower_ctx import LowerCtx
from lowering.ops.common import torch_dtype_of
from lowering.ops.matmul import emit_matmul
from lowering.ops.views import apply_view
from lowering.registry_table import FLOAT_DTYPES, FP8_DTYPES, register
from runtime_sim.isa import DType

aten = torch.ops.aten
F32 = DType.FP32


def _val(arg: object):
    return arg.meta.get("val") if isinstance(arg, fx.Node) else None


def _check_scaled_mm(node: fx.Node) -> str | None:
    """a, b fp8 (e4m3fn/e5m2) 2-d; scales fp32, per tensor or row-wise (scale_a [M, 1],
    scale_b [1, N]); bias of N elements; no scale_result (an fp8-output rescale)."""
    a, b, sa, sb = (_val(x) for x in node.args[:4])
    if not all(isinstance(t, torch.Tensor) for t in (a, b, sa, sb)):
        return "operands must be tensors"
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES:
        return f"operands must be float8_e4m3fn/float8_e5m2, got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or b.dim() != 2:
        return f"operands must be 2-d, got ranks {a.dim()} and {b.dim()}"
    M, N = a.shape[0], b.shape[1]
    for name, s, ok in (("scale_a", sa, ((), (1,), (1, 1), (M, 1))),
                        ("scale_b", sb, ((), (1,), (1, 1), (1, N)))):
        if s.dtype != torch.float32:
            return f"{name} must be float32, got {s.dtype}"
        if tuple(s.shape) not in ok:
            return f"{name} of shape {list(s.shape)} (only per-tensor or row-wise scales)"
    scale_result = node.args[5] if len(node.args) > 5 else node.kwargs.get("scale_result")
    if scale_result is not None:
        return "scale_result is not supported"
    return None


def _broadcast(ref: TensorRef, view_shape: tuple[int, ...], shape: tuple[int, ...]) -> TensorRef:
    return apply_view(ref, torch_dtype_of(ref), lambda t: t.reshape(view_shape).expand(shape))


@register(aten._scaled_mm.default, dtypes=FLOAT_DTYPES | FP8_DTYPES, check=_check_scaled_mm)
def _scaled_mm(ctx: LowerCtx, node: fx.Node, a: TensorRef, b: TensorRef, scale_a: TensorRef,
               scale_b: TensorRef, bias: TensorRef | None = None, scale_result=None,
               out_dtype=None, use_fast_accum: bool = False) -> TensorRef:
    if a.dtype is not b.dtype:
        # TensorE takes one dtype for both operands; mixed e4m3 x e5m2 would need a cast that
        # loses bits (e5m2 has one fewer mantissa bit, e4m3 a smaller range)
        raise Unsupported(ctx.op, f"operands of two fp8 types ({a.dtype.value}, {b.dtype.value})")
    M, N = a.shape[0], b.shape[1]
    shape = (M, N)
    rows = lambda s: (M, 1) if s.numel == M and M > 1 else (1, 1)
    cols = lambda s: (1, N) if s.numel == N and N > 1 else (1, 1)
    extra = [_broadcast(scale_a, rows(scale_a), shape), _broadcast(scale_b, cols(scale_b), shape)]
    if bias is not None:
        extra.append(_broadcast(bias, (1, N), shape))

    def epilogue(acc: Expr, loads: list[Expr]) -> Expr:
        y = Expr(EOp.MUL, (Expr(EOp.MUL, (acc, loads[0]), F32), loads[1]), F32)
        if bias is not None:
            y = Expr(EOp.ADD, (y, loads[2]), F32)
        return y

    return emit_matmul(ctx, a, b, epilogue, tuple(extra))
