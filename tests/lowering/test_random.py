"""Random ops on the device: native_dropout, rand, randn (and ``_like``) through the simulator,
fp32 and bf16, 130 x 513 (row tiles cross the partition edge and a partial last row).

The values differ from eager's (a Philox4x32-10 generator), so the checks are statistical and
structural: dropout's zero fraction within 2% of p, survivors equal to x / (1 - p), the mask
consistent with the zeros; rand in [0, 1) with a flat histogram; randn with mean 0 and std 1;
the same numbers after the same ``torch.manual_seed`` and fresh ones on the next call; and
through ``torch.compile``, dropout runs on the device with no fallback, forward and backward.
Every statistical check is fed a known-wrong result once (``test_checks_can_fail``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neuron_compiler
from lowering_helpers import rand
from runtime_sim import Op
from undecomposed import lower_raw

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]
SHAPE = (130, 513)


def _ran_rng(prog) -> int:
    return sum(1 for q in prog.streams.values() for ins in q if ins.op is Op.RAND_PHILOX)


def check_dropout(x, out, mask, p):
    """Zero fraction within 2% of p; survivors scaled by 1/(1-p); mask marks the survivors."""
    zero = 1.0 - mask.float().mean().item()
    assert abs(zero - p) <= 0.02, f"zero fraction {zero:.4f}, p = {p}"
    assert bool((out[~mask] == 0).all()), "dropped elements must be 0"
    want = (x[mask].float() / (1 - p)).to(x.dtype)
    got = out[mask]
    tol = 1e-6 if x.dtype is torch.float32 else 8e-3
    err = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-6)).max().item()
    assert err <= tol, f"survivors off by {err:g} (relative), tolerance {tol:g}"


def check_uniform(u):
    v = u.float().flatten().numpy().astype(np.float64)
    assert v.min() >= 0.0 and v.max() < 1.0, (v.min(), v.max())
    hist = np.histogram(v, bins=16, range=(0, 1))[0]
    e = v.size / 16
    chi2 = float(((hist - e) ** 2 / e).sum())
    assert chi2 < 37.7, f"chi-square {chi2:.1f} over 16 bins (15 dof, p = 0.001: 37.7)"


def check_normal(z):
    v = z.float().flatten()
    assert abs(v.mean().item()) < 0.02 and abs(v.std().item() - 1) < 0.02, (v.mean(), v.std())
    frac = (v.abs() < 1).float().mean().item()              # 68.27% within one sigma
    assert abs(frac - 0.6827) < 0.01, frac


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_native_dropout(dtype, p):
    x = rand(*SHAPE, dtype=dtype, seed=1)
    torch.manual_seed(0)
    (out, mask), prog = lower_raw(lambda x: aten.native_dropout(x, p, True), x)
    assert mask.dtype is torch.bool and out.dtype is dtype
    check_dropout(x, out, mask, p)
    assert _ran_rng(prog) >= 2


def test_native_dropout_eval_is_identity():
    x = rand(4, 9, seed=2)
    (out, mask), _ = lower_raw(lambda x: aten.native_dropout(x, 0.4, False), x)
    assert torch.equal(out, x) and bool(mask.all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_rand_and_randn(dtype):
    x = rand(*SHAPE, dtype=dtype, seed=3)
    (u, z), prog = lower_raw(lambda x: (torch.rand(SHAPE, dtype=dtype), torch.randn_like(x)), x)
    assert u.dtype is dtype and z.dtype is dtype and u.shape == SHAPE
    check_uniform(u)
    check_normal(z)


def test_seeded_by_manual_seed_and_fresh_per_call():
    x = rand(40, 50, seed=4)
    fn = lambda x: aten.native_dropout(x, 0.5, True)
    from lowering_helpers import compile_fn, to_numpy
    gm, cg = compile_fn(fn, x)
    torch.manual_seed(7)
    a = cg.run([to_numpy(x)])[0]
    b = cg.run([to_numpy(x)])[0]
    torch.manual_seed(7)
    c = cg.run([to_numpy(x)])[0]
    assert all(np.array_equal(i, j) for i, j in zip(a, c)), "same seed, same mask"
    assert not np.array_equal(a[1], b[1]), "the next call draws a fresh mask"


def test_dropout_through_torch_compile_forward_and_backward():
    torch._dynamo.reset()
    x = torch.randn(*SHAPE, requires_grad=True)
    f = torch.compile(lambda x: F.dropout(x, 0.3, training=True).sum(), backend="neuron",
                      options={"fallback": "error"})
    with neuron_compiler.profile() as prof:
        f(x).backward()
    d = prof.to_dict()
    assert d["fallback_nodes"] == 0 and d["device_nodes"] > 0
    g = x.grad                                              # 1/(1-p) where kept, 0 where dropped
    kept = g != 0
    assert abs((~kept).float().mean().item() - 0.3) <= 0.02
    assert torch.allclose(g[kept], torch.full_like(g[kept], 1 / 0.7))


def test_checks_can_fail():
    x = rand(*SHAPE, seed=5)
    g = torch.Generator().manual_seed(0)
    keep = torch.rand(SHAPE, generator=g) >= 0.35             # the wrong p
    with pytest.raises(AssertionError, match="zero fraction"):
        check_dropout(x, torch.where(keep, x / 0.65, 0), keep, 0.3)
    keep = torch.rand(SHAPE, generator=g) >= 0.3
    with pytest.raises(AssertionError, match="survivors"):    # survivors not rescaled
        check_dropout(x, torch.where(keep, x, 0), keep, 0.3)
    with pytest.raises(AssertionError, match="chi-square"):   # a skewed generator
        check_uniform(torch.rand(SHAPE, generator=g) ** 1.2)
    with pytest.raises(AssertionError):
        check_uniform(torch.ones(4))                           # 1.0 is outside [0, 1)
    with pytest.raises(AssertionError):
        check_normal(torch.randn(SHAPE, generator=g) * 1.05)   # std 1.05
