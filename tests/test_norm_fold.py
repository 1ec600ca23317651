"""A layer norm's affine folded into the matmuls that read it (lowering/passes/norm_fold.py,
lowering/tiling/matmul/prologue.py).

Checked: values match eager through the simulator over tile edges (M, K, N not multiples of
the tile sizes, and K groups), on the targets whose A^T tiles come by TensorE transpose (trn1),
by DMA transpose or from SBUF-resident rows (trn2/trn3), in bf16 and fp32; the layer norm no
longer loads its weight and bias over the partitions; the prologue is what makes the result
right (without it the same program is wrong); a norm whose output has another reader, or whose
statistics are read, is not folded; the pass itself on hand-built kernel IR.
"""
from __future__ import annotations

import pytest
import torch

import neuron_compiler
from lowering.kir import (HbmTensor, KKind, KOp, KProgram, LayerNormKAttrs, MatmulKAttrs, Role,
                          TensorRef)
from lowering.passes.norm_fold import fold_norm_affine
from lowering.tiling.matmul import prologue as matmul_prologue
from neuron_compiler.runtime import PROGRAM_CACHE
from neuron_compiler.testing import assert_ran_on_device
from runtime_sim import loops
from runtime_sim.isa import DType, Op


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class _NormLinear(torch.nn.Module):
    def __init__(self, C, N, bias=True, also_return_norm=False):
        super().__init__()
        self.ln = torch.nn.LayerNorm(C, bias=bias)
        self.fc = torch.nn.Linear(C, N)
        self.also = also_return_norm
        torch.nn.init.normal_(self.ln.weight, 1.0, 0.5)
        if bias:
            torch.nn.init.normal_(self.ln.bias, 0.0, 0.5)

    def forward(self, x):
        h = self.ln(x + 1.0)
        y = self.fc(h)
        return (y, h) if self.also else y


def _run(m, x, target):
    c = torch.compile(m, backend="neuron", options={"target": target})
    with torch.no_grad():
        with neuron_compiler.profile() as p:
            y = c(x)
    assert_ran_on_device(p)
    (rec,) = p._parts.values()
    return y, rec.compiled


def _instrs(cg):
    return [i for st in cg.program.streams.values() for i in loops.materialize(st)]


def _folded(cg) -> bool:
    """The layer norm loads no weight rows over the partitions and a matmul's A^T tiles are made
    by tensor_scalar with per-partition operands."""
    ins = _instrs(cg)
    gain_rows = [i for i in ins if i.op is Op.DMA_COPY and ".lnw" in i.dst.buffer]
    pro = [i for i in ins if i.op is Op.TENSOR_SCALAR and ":matmul:" in i.tag
           and i.attrs.operand0_from_src]
    return not gain_rows and bool(pro)


CASES = [("trn1", torch.bfloat16, 130, 200, 300, 3e-2), ("trn2", torch.bfloat16, 130, 200, 300, 3e-2),
         ("trn3", torch.bfloat16, 70, 768, 200, 3e-2), ("trn2", torch.float32, 130, 200, 300, 1e-4),
         ("trn1", torch.float32, 300, 384, 130, 1e-4),      # K groups of 3 (the grouped columns)
         ("trn1", torch.bfloat16, 100, 768, 768, 3e-2),     # K groups, two blocks
         ("trn2", torch.bfloat16, 64, 128, 200, 3e-2),      # one K tile: one row, no DMA transpose
         ("trn2", torch.bfloat16, 130, 256, 300, 3e-2)]     # two K tiles: DMA-transposed columns


@pytest.mark.parametrize("target,dtype,M,C,N,tol", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_folded_norm_matches_eager(target, dtype, M, C, N, tol, bias):
    torch.manual_seed(0)
    m = _NormLinear(C, N, bias).to(dtype).eval()
    x = torch.randn(M, C, dtype=dtype)
    y, cg = _run(m, x, target)
    with torch.no_grad():
        ref = m(x)
    assert _folded(cg)
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())
    with pytest.raises(AssertionError):     # the tolerance can fail: half the result does
        torch.testing.assert_close((y * 0.5).float(), ref.float(), rtol=tol,
                                   atol=tol * ref.float().abs().max().item())


class _ResidualNormLinear(torch.nn.Module):
    """A pre-norm block's join: the norm reads a residual sum made in the same partition (its
    rows stay in SBUF), so the matmul's A^T tiles come by TensorE transposes with plain K tiles."""

    def __init__(self, C, N):
        super().__init__()
        self.fc0 = torch.nn.Linear(C, C)
        self.ln = torch.nn.LayerNorm(C)
        self.fc = torch.nn.Linear(C, N)
        torch.nn.init.normal_(self.ln.weight, 1.0, 0.5)
        torch.nn.init.normal_(self.ln.bias, 0.0, 0.5)

    def forward(self, x):
        return self.fc(self.ln(x + self.fc0(x)))


@pytest.mark.parametrize("target,C,by_dma", [("trn3", 768, True), ("trn2", 768, True),
                                              ("trn3", 128, False), ("trn1", 768, False)])
def test_scale_columns_by_dma_transpose(target, C, by_dma, monkeypatch):
    """The norm's weight/bias columns for plain K tiles (``APrologue._transposed``) come by one
    DMA transpose of their [Kt, 128] rows where the target has 2-byte DMA transposes and there
    are two or more whole rows (one row is a vector: ALBERT's 128-wide embedding norm); else by
    a TensorE transpose and a copy out of PSUM. Values match eager either way."""
    seen = []
    orig = matmul_prologue.APrologue._transposed

    def spy(*a, **kw):
        seen.append(a[1])
        return orig(*a, **kw)
    monkeypatch.setattr(matmul_prologue.APrologue, "_transposed", staticmethod(spy))
    torch.manual_seed(0)
    m = _ResidualNormLinear(C, 300).to(torch.bfloat16).eval()
    x = torch.randn(128, C, dtype=torch.bfloat16)
    y, cg = _run(m, x, target)
    with torch.no_grad():
        ref = m(x)
    assert sorted(seen) == ["scale", "shift"]          # the path under test ran
    torch.testing.assert_close(y.float(), ref.float(), rtol=3e-2, atol=3e-2 * ref.float().abs().max().item())
    ins = _instrs(cg)
    dma_t = [i for i in ins if i.op is Op.DMA_COPY and i.attrs.transpose and i.dst.buffer.endswith(".ascale")]
    pe_t = [i for i in ins if i.op is Op.TRANSPOSE and i.dst.buffer.endswith(".ascalep")]
    assert (len(dma_t), len(pe_t)) == ((1, 0) if by_dma else (0, 1))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_prologue_is_what_makes_it_right(target, monkeypatch):
    torch.manual_seed(0)
    m = _NormLinear(200, 300).to(torch.bfloat16).eval()
    x = torch.randn(130, 200, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = m(x)

    def plain_copy(self, b, dst, src, j, kt, engines=None):
        if dst is not src:
            b.tensor_copy(dst, src)
    monkeypatch.setattr(matmul_prologue.APrologue, "make", plain_copy)
    PROGRAM_CACHE.clear()              # compile again, with the prologue dropped
    try:
        bad, _ = _run(m, x, target)
    finally:
        PROGRAM_CACHE.clear()
    assert (bad.float() - ref.float()).abs().max() > 0.3


def test_norm_with_another_reader_is_not_folded():
    torch.manual_seed(0)
    m = _NormLinear(200, 300, also_return_norm=True).to(torch.bfloat16).eval()
    x = torch.randn(130, 200, dtype=torch.bfloat16)
    (y, h), cg = _run(m, x, "trn2")
    with torch.no_grad():
        ry, rh = m(x)
    assert not _folded(cg)
    torch.testing.assert_close(y.float(), ry.float(), rtol=3e-2, atol=3e-2 * ry.float().abs().max().item())
    torch.testing.assert_close(h.float(), rh.float(), rtol=3e-2, atol=3e-2)


def _ref(name, shape, dtype=DType.BF16):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return TensorRef(name, dtype, tuple(shape), tuple(reversed(st)))


def _program(stats_read=False, second_reader_as_b=False):
    kp = KProgram()
    for n, numel, role in [("x", 128 * 64, Role.INPUT), ("w", 64, Role.INPUT), ("b", 64, Role.INPUT),
                           ("W", 64 * 32, Role.INPUT), ("y", 128 * 64, Role.TEMP),
                           ("mean", 128, Role.TEMP), ("rstd", 128, Role.TEMP),
                           ("o", 128 * 32, Role.OUTPUT), ("o2", 64 * 64, Role.OUTPUT)]:
        kp.buffers[n] = HbmTensor(n, numel, DType.BF16, role)
    kp.inputs = ["x", "w", "b", "W"]
    ln = KOp(KKind.LAYER_NORM, (_ref("y", (128, 64)), _ref("mean", (128, 1)), _ref("rstd", (128, 1))),
             (_ref("x", (128, 64)), _ref("w", (64,)), _ref("b", (64,))),
             LayerNormKAttrs(1, 1e-5, True, True))
    mm = KOp(KKind.MATMUL, (_ref("o", (1, 128, 32)),), (_ref("y", (1, 128, 64)), _ref("W", (1, 64, 32))),
             MatmulKAttrs())
    kp.kernels = [ln, mm]
    kp.outputs = [_ref("o", (128, 32))]
    if stats_read:
        kp.outputs.append(_ref("mean", (128, 1)))
    if second_reader_as_b:    # y^T @ y: y read as B (not along K of an A operand)
        yt = TensorRef("y", DType.BF16, (1, 64, 128), (0, 1, 64))
        kp.kernels.append(KOp(KKind.MATMUL, (_ref("o2", (1, 64, 64)),),
                              (yt, _ref("y", (1, 128, 64))), MatmulKAttrs()))
    return kp


def test_pass_folds_and_rewires_the_inputs():
    kp = _program()
    assert fold_norm_affine(kp) == 1
    ln, mm = kp.kernels
    assert ln.attrs == LayerNormKAttrs(1, 1e-5, False, False) and [r.buffer for r in ln.ins] == ["x"]
    assert [r.buffer for r in mm.ins] == ["y", "W", "w", "b"]
    assert (mm.attrs.a_scale, mm.attrs.a_shift) == (2, 3)
    assert "a_scale=in2, a_shift=in3" in str(mm)


@pytest.mark.parametrize("kw", [{"stats_read": True}, {"second_reader_as_b": True}])
def test_pass_leaves_norms_it_cannot_fold(kw):
    kp = _program(**kw)
    before = [str(k) for k in kp.kernels]
    assert fold_norm_affine(kp) == 0
    assert [str(k) for k in kp.kernels] == before
