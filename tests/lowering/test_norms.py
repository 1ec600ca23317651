"""Group norm, batch norm (inference, and training without running statistics) and the layer
norm backward on the device, against eager through the simulator, fp32 and bf16.

Shapes cross the tile edges: group norm with 132 (N * G) rows and with rows of 513 elements
(3 channels x 171), batch norm with N = 130, the layer norm backward over 130 x 513. The ops are
traced as written (``undecomposed.lower_raw``: the core decompositions would split the backward,
and the backend decomposes batch norm before lowering), so every node must be supported and the
program must execute; the kernel kinds that ran are asserted. ``test_tolerances_can_fail``
feeds the comparisons known-wrong results.
"""
from __future__ import annotations

import pytest
import torch

from lowering.api import why_unsupported
from lowering_helpers import assert_close, check, rand
from torch.fx.experimental.proxy_tensor import make_fx
from undecomposed import lower_raw

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


def _check(fn, *args, scale=1.0):
    outs, prog = lower_raw(fn, *args)
    exp = fn(*args)
    exp = exp if isinstance(exp, (tuple, list)) else (exp,)
    assert len(outs) == len(exp)
    for i, (o, e) in enumerate(zip(outs, exp)):
        assert_close(o, e, what=f"output {i}", scale=scale)
    return outs, prog


def _tags(prog) -> set[str]:
    return {ins.tag.split(":")[1] for q in prog.streams.values() for ins in q if ins.tag}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((33, 8, 4, 4), 4), ((2, 6, 9, 19), 2)])
def test_group_norm(dtype, shape, groups):
    x = rand(*shape, dtype=dtype, seed=1) * 3 + 1
    C = shape[1]
    w, b = rand(C, dtype=dtype, seed=2), rand(C, dtype=dtype, seed=3)
    hw = shape[2] * shape[3]
    fn = lambda x, w, b: aten.native_group_norm(x, w, b, shape[0], C, hw, groups, 1e-5)
    _, prog = _check(fn, x, w, b)
    assert "layer_norm" in _tags(prog)
    fn2 = lambda x: aten.native_group_norm(x, None, None, shape[0], C, hw, groups, 1e-5)
    _check(fn2, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_inference(dtype):
    x = rand(130, 5, 7, dtype=dtype, seed=4)
    w, b = rand(5, dtype=dtype, seed=5), rand(5, dtype=dtype, seed=6)
    rm, rv = rand(5, dtype=dtype, seed=7), rand(5, dtype=dtype, seed=8, low=0.5, high=2.0)
    fn = lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)
    _check(fn, x, w, b, rm, rv)
    fn2 = lambda x, rm, rv: aten._native_batch_norm_legit(x, None, None, rm, rv, False, 0.1, 1e-3)
    _check(fn2, x, rm, rv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_training_statistics(dtype):
    x = rand(4, 6, 11, 13, dtype=dtype, seed=9) * 2 + 0.5
    w, b = rand(6, dtype=dtype, seed=10), rand(6, dtype=dtype, seed=11)
    fn = lambda x, w, b: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    _, prog = _check(fn, x, w, b)
    assert "reduce" in _tags(prog)


def test_batch_norm_training_with_running_stats_falls_back():
    x, rm, rv = torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3)
    gm = make_fx(lambda x, rm, rv: aten._native_batch_norm_legit(x, None, None, rm, rv, True, 0.1, 1e-5))(x, rm, rv)
    node = next(n for n in gm.graph.nodes if n.target is aten._native_batch_norm_legit.default)
    assert "updates running_mean/running_var in place" in why_unsupported(node)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward(dtype, affine):
    x, dy = rand(130, 513, dtype=dtype, seed=12) * 2, rand(130, 513, dtype=dtype, seed=13)
    w = rand(513, dtype=dtype, seed=14) if affine else None
    b = rand(513, dtype=dtype, seed=15) if affine else None

    def fn(dy, x, *wb):
        w, b = wb if wb else (None, None)
        _, mean, rstd = aten.native_layer_norm(x, [513], w, b, 1e-5)
        g = aten.native_layer_norm_backward(dy, x, [513], mean, rstd, w, b, [True, affine, affine])
        return g if affine else g[0]

    args = (dy, x) + ((w, b) if affine else ())
    outs, prog = lower_raw(fn, *args)
    exp = fn(*args) if affine else (fn(*args),)
    assert len(outs) == len(exp)
    # grad_weight / grad_bias are sums over 130 rows: eager's bf16 grad_weight is itself 0.52 off
    # the fp64 sum (of magnitude ~40) on these inputs, so bf16 is compared at 4x the atol
    for i, (o, e) in enumerate(zip(outs, exp)):
        assert_close(o, e, what=f"output {i}", scale=1.0 if i == 0 or dtype is torch.float32 else 4.0)
    assert "layer_norm_bwd" in _tags(prog)


def test_tolerances_can_fail():
    x = rand(4, 6, 11, 13, seed=16)
    e = aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5)[0]
    with pytest.raises(AssertionError):
        assert_close(e * 1.02, e)                        # a 2% scale error (e.g. n vs n-1 variance)
    eb = e.to(torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close(-eb, eb)
    x2, dy = rand(130, 513, seed=17), rand(130, 513, seed=18)
    _, mean, rstd = aten.native_layer_norm(x2, [513], None, None, 1e-5)
    dx = aten.native_layer_norm_backward(dy, x2, [513], mean, rstd, None, None, [True, False, False])[0]
    wrong = dy * rstd                                    # the two mean terms dropped
    with pytest.raises(AssertionError):
        assert_close(wrong, dx)
    gw = (dy * (x2 - mean) * rstd).sum(0).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close(gw * 0.5, gw, scale=4.0)            # a halved bf16 weight gradient


@pytest.mark.parametrize("target,dtype", [("trn1", torch.bfloat16), ("trn2", torch.float32),
                                          ("trn2", torch.bfloat16)])
def test_layer_norm_gain_broadcast(target, dtype):
    """The gain and bias rows reach every partition by a TensorE broadcast where the target's
    numbers favour it (trn1; 4-byte rows), else by one stride-0 DMA; both exact. 700 columns:
    two PSUM banks of the broadcast; 130 rows: a partial row tile."""
    from runtime_sim import loops
    from runtime_sim.isa import Op
    from runtime_sim.targets import get_target
    from lowering.tiling.rowwise import pe_broadcast_pays
    x, w, b = rand(130, 700, dtype=dtype, seed=21), rand(700, dtype=dtype, seed=22), rand(700, dtype=dtype, seed=23)
    low = check(lambda x, w, b: torch.nn.functional.layer_norm(x, (700,), w, b), x, w, b,
                target=target)
    ins = [i for st in low.compiled.program.streams.values() for i in loops.materialize(st)]
    stride0 = [i for i in ins if i.op is Op.DMA_COPY and i.srcs[0].partitions == 1
               and i.dst.partitions == 128 and i.dst.buffer.split(".")[-1].startswith("lnw")]
    on_pe = pe_broadcast_pays(get_target(target), 700, x.element_size())
    assert on_pe == (target == "trn1" or dtype is torch.float32)
    assert (len(stride0), sum(i.op is Op.MATMUL for i in ins)) == ((0, 4) if on_pe else (2, 0))
