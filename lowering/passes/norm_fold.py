"""Norm-affine folding: a layer norm's weight and bias move into the matmuls that read its output
(kernel IR -> kernel IR, after fusion).

``y = xn * w + b`` (``xn = (x - mean) * rstd``) read only as the A operand of matmuls, along
their K axis, is the same as those matmuls reading ``xn`` with ``A'[m, k] = xn[m, k] * w[k] +
b[k]``: K sits on partitions in every A^T tile TensorE takes, so ``w`` and ``b`` become
per-partition operands of the instruction that makes the tile (the copy out of PSUM after a
TensorE transpose, ``MatmulKAttrs.a_scale`` / ``a_shift``), which costs what the plain copy
costs. The layer norm then stops after ``xn``: no stride-0 loads of ``w`` and ``b`` over the
128 partitions, no two passes over the rows on the critical path between a residual add and
the next matmul (GPT-2's pre-norm blocks: ln_1 -> c_attn, ln_2 -> c_fc, ln_f -> lm_head).

Invariants
- A layer norm is folded only when its ``y`` is a temporary whose every reader is a matmul
  reading it once, as ``ins[0]`` (A) through a view whose innermost axis is the normalised
  axis, contiguous (``A[..., k]`` is ``y[..., k]``), and its ``mean`` / ``rstd`` outputs are
  unread; otherwise the program is unchanged.
- ``y`` keeps its name and dtype (it now holds ``xn``, rounded as ``y`` was); ``w`` and ``b``
  are appended to each reader's ``ins`` (epilogue indices are unchanged).
"""
from __future__ import annotations

from dataclasses import replace

from lowering.kir import KKind, KOp, KProgram, LayerNormKAttrs, MatmulKAttrs, Role, TensorRef


def _reads(k: KOp, name: str) -> list[int]:
    return [i for i, r in enumerate(k.ins) if r.buffer == name]


def _along_k(a: TensorRef, C: int) -> bool:
    """Is ``A[..., k]`` element ``k`` of a row of a row-major [*, C] tensor?"""
    return (a.shape[-1] == C and (a.strides[-1] == 1 or C == 1) and a.offset % C == 0
            and all(st % C == 0 for n, st in zip(a.shape[:-1], a.strides[:-1]) if n > 1))


def fold_norm_affine(kp: KProgram) -> int:
    """Fold every foldable layer-norm affine (module docstring); returns how many."""
    folded = 0
    for li, ln in enumerate(kp.kernels):
        a = ln.attrs
        if ln.kind is not KKind.LAYER_NORM or not isinstance(a, LayerNormKAttrs):
            continue
        if a.normalized_ndim != 1 or not (a.has_weight or a.has_bias):
            continue
        y = ln.outs[0]
        C = ln.ins[0].shape[-1]
        if kp.buffers[y.buffer].role is not Role.TEMP or not y.is_contiguous():
            continue
        stats = {o.buffer for o in ln.outs[1:]}
        if any(r.buffer in stats for k in kp.kernels for r in k.ins) \
                or any(r.buffer in stats for r in kp.outputs):
            continue
        readers = [(j, k) for j, k in enumerate(kp.kernels) if _reads(k, y.buffer)]
        if not readers or not all(
                k.kind is KKind.MATMUL and isinstance(k.attrs, MatmulKAttrs)
                and not k.attrs.prologue_inputs
                and _reads(k, y.buffer) == [0] and _along_k(k.ins[0], C)
                and k.ins[0].dtype.is_float and k.ins[0].dtype.itemsize >= 2
                for _, k in readers):
            continue
        w = ln.ins[1] if a.has_weight else None
        bias = ln.ins[1 + a.has_weight] if a.has_bias else None
        if any(v is not None and (v.shape != (C,)) for v in (w, bias)):
            continue
        for j, k in readers:
            ins = list(k.ins)
            sc = sh = None
            if w is not None:
                sc = len(ins)
                ins.append(w)
            if bias is not None:
                sh = len(ins)
                ins.append(bias)
            kp.kernels[j] = KOp(k.kind, k.outs, tuple(ins),
                                replace(k.attrs, a_scale=sc, a_shift=sh), k.origin)
        kp.kernels[li] = KOp(ln.kind, ln.outs, ln.ins[:1],
                             replace(a, has_weight=False, has_bias=False), ln.origin)
        folded += 1
    return folded
