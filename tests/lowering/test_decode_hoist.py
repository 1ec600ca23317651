"""Small pointwise kernels move up past at most ``MAX_PASSED`` kernels (``passes/hoist.py``): a
decode step's cache index computed before the layer's projection, not after it. Values against
eager through the simulator; the kernel order from the post-fusion dump; a kernel never moves
past one that writes what it reads, nor past another small one."""
from __future__ import annotations

import torch

from lowering.kir import (DType, EOp, Expr, KKind, KOp, KProgram, HbmTensor, PointwiseAttrs, Role,
                          TensorRef)
from lowering.passes.hoist import MAX_PASSED, hoist_small_kernels
from lowering_helpers import assert_close, lower_and_run, rand

NOTE = "small pointwise kernels moved up"


def _kernels(low) -> list[str]:
    return [ln.split(" = ", 1)[1].split("[", 1)[0] for ln in low.dumps["ir_post_fusion.txt"].splitlines()
            if " = " in ln and ln.startswith("%")]


def test_an_index_of_an_input_moves_before_the_matmul():
    x, w = rand(64, 128, seed=1), rand(128, 96, seed=2) * 0.1
    p = torch.tensor([5])

    def fn(x, w, p):
        y = x @ w
        i = torch.where(p < 0, p + 64, p)       # a small kernel of an input, after the matmul
        return torch.index_select(y, 0, i)

    low = lower_and_run(fn, x, w, p)
    assert_close(low.outputs[0], fn(x, w, p))
    assert NOTE in low.dumps["ir_post_fusion.txt"]
    ks = _kernels(low)
    assert ks.index("pointwise") < ks.index("matmul"), ks


def test_a_small_kernel_of_a_product_stays_after_it():
    x, w = rand(64, 128, seed=3), rand(128, 96, seed=4) * 0.1
    fn = lambda x, w: (x @ w)[0, :4] * 2.0          # noqa: E731
    low = lower_and_run(fn, x, w)
    assert_close(low.outputs[0], fn(x, w))
    ks = _kernels(low)
    assert ks.index("matmul") < ks.index("pointwise"), ks


def _ref(name, n=1):
    return TensorRef(name, DType.FP32, (n,), (1,))


def _pw(out, *ins):
    return KOp(KKind.POINTWISE, (_ref(out),), tuple(_ref(i) for i in ins),
               PointwiseAttrs(Expr(EOp.LOAD, index=0)), (out,))


def test_order_rules_on_a_hand_made_program():
    """A small kernel stops below a writer of its input, below a reader of its output, below
    another small kernel, and after MAX_PASSED big kernels."""
    bufs = {n: HbmTensor(n, 1, DType.FP32, Role.TEMP) for n in "abcdefghs"}
    bufs["x"] = HbmTensor("x", 1, DType.FP32, Role.INPUT)
    big = HbmTensor("big", 4096, DType.FP32, Role.TEMP)
    bufs["big"] = big

    def bigk(name, *ins):
        return KOp(KKind.POINTWISE, (TensorRef("big", DType.FP32, (4096,), (1,)),),
                   tuple(_ref(i) for i in ins), PointwiseAttrs(Expr(EOp.LOAD, index=0)), (name,))

    ks = [_pw("a", "x"), bigk("B1", "x"), _pw("b", "a"), bigk("B2", "x"), bigk("B3", "x"),
          bigk("B4", "x"), bigk("B5", "x"), _pw("c", "x")]
    kp = KProgram(buffers=bufs, kernels=ks, inputs=["x"], outputs=[_ref("c")])
    moved = hoist_small_kernels(kp)
    order = [k.origin[0] for k in kp.kernels]
    # b reads a (small: its order kept, it stops below a); c moves past MAX_PASSED big kernels
    assert order.index("b") == order.index("a") + 1, order
    assert order.index("c") == len(order) - 1 - MAX_PASSED, order
    assert len(moved) == 2, moved
