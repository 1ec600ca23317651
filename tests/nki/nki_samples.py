"""Every tutorial kernel of aws-neuron/nki-samples, run unchanged from a LOCAL COPY of that
repository (nothing of it is in this project) after ``install_aliases()``: values against numpy
references written here, on trn2 and trn3, and the simulated time of one call on each.

    python tests/nki/nki_samples.py --new DIR --old DIR [--only SUBSTRING] [-v]

``--new``: a checkout of nki-samples at a commit of the newer ``nki`` generation (HEAD 6905a68:
``import nki``, ``nisa.*(dst=...)``); ``--old``: one of the ``neuronxcc.nki`` generation (fc5c69f,
before the beta-2 update; it still has layernorm, rmsnorm, softmax, rotary and sd_attention).
For example, from a bare mirror: ``git --git-dir=M archive fc5c69f | tar -x -C /tmp/old``.
tests/nki/test_nki_samples.py runs the same cases when ``NKI_SAMPLES_NEW`` / ``NKI_SAMPLES_OLD``
name such copies. A case passes when max |out - ref| / max |ref| <= its tolerance on both
targets; ``check`` returns that error so a test can show a wrong kernel failing.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from neuron_compiler import nki

TUT = os.path.join("src", "nki_samples", "tutorials")


@dataclass
class Case:
    name: str
    gen: str                       # "new" | "old"
    shape: str
    build: Callable                # (load, rng) -> Run
    tol: float = 1e-3
    targets: tuple = ("trn2", "trn3")
    floor: float | None = None     # per-element error |out - ref| / (|ref| + floor * max |ref|)


@dataclass
class Run:
    kernel: object
    args: tuple
    ref: np.ndarray
    grid: tuple | None = None
    inner: object = None           # a host-side caller: the kernel it launches (its .last)
    kwargs: dict = field(default_factory=dict)


def _stub_host_modules() -> None:
    """Empty stand-ins for non-NKI imports some tutorial files make at the top and do not use
    in their kernels (torch_xla, torch_neuronx, loguru)."""
    for m in ("torch_xla", "torch_xla.core", "torch_xla.core.xla_model", "torch_neuronx", "loguru"):
        if m not in sys.modules:
            try:
                __import__(m)
            except Exception:
                mod = types.ModuleType(m)
                mod.logger = None
                mod.xla_model = None
                sys.modules[m] = mod
    sys.modules["torch_xla.core"].xla_model = sys.modules["torch_xla.core.xla_model"]


def loader(root: str, gen: str) -> Callable[[str, str], types.ModuleType]:
    """``load(folder, module)``: a tutorial module of the copy at ``root``, imported under a
    name of its own per generation (both have e.g. matrix_multiplication_nki_kernels)."""
    cache: dict = {}

    def load(folder: str, module: str) -> types.ModuleType:
        key = (folder, module)
        if key not in cache:
            d = os.path.join(root, TUT, folder)
            sys.path.insert(0, d)            # its sibling imports (mx_kernel_utils, ...)
            saved = {k: sys.modules.pop(k) for k in list(sys.modules)
                     if os.path.exists(os.path.join(d, k + ".py"))}
            try:
                spec = importlib.util.spec_from_file_location(f"nki_samples_{gen}.{module}",
                                                              os.path.join(d, module + ".py"))
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                cache[key] = mod
            finally:
                sys.path.remove(d)
                sys.modules.update(saved)
        return cache[key]
    load.fresh = lambda: loader(root, gen)
    return load


def check(case: Case, load, rng, targets=None) -> dict:
    """Run ``case`` on each target: ``{target: (relative max error, time_us)}``."""
    seed = int(rng.integers(1 << 31))
    out = {}
    for tg in targets or case.targets:
        # each target traces the kernel in a freshly imported module, as its own process would:
        # attn_fwd_v9-v11 place tiles with a module-level allocator whose offset only grows
        r = case.build(load.fresh(), np.random.default_rng(seed))
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in r.args]
        if r.inner is not None:
            with nki.target(tg):
                got = r.kernel(*a, **r.kwargs)
            run = r.inner.last
            assert run.target == tg
        else:
            run = nki.simulate(r.kernel, *a, target=tg, grid=r.grid, **r.kwargs)
            got = run.outputs[0]
        got = np.asarray(got, np.float64)
        big = np.max(np.abs(r.ref)) + 1e-30
        if case.floor is None:
            err = float(np.max(np.abs(got - r.ref)) / big)
        else:
            err = float(np.max(np.abs(got - r.ref) / (np.abs(r.ref) + case.floor * big)))
        out[tg] = (err, run.time_us)
    return out


# ---- references (numpy) ---------------------------------------------------------------------------

def f32(rng, *s):
    return rng.standard_normal(s).astype(np.float32)


def np_attention(q, k, v):
    qk = q.T.astype(np.float64) @ k
    e = np.exp(qk - qk.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)) @ v.T


def np_mamba(delta, u, A, B, C):
    dA = np.exp(delta[:, :, None, :] * A[None, :, :, None])
    dBu = (delta * u)[:, :, None, :] * B[:, None, :, :]
    h = np.zeros(dA.shape[:3])
    ys = []
    for s in range(delta.shape[-1]):
        h = dA[..., s] * h + dBu[..., s]
        ys.append(np.einsum("bcn,bn->bc", h, C[:, :, s]))
    return np.stack(ys, -1)


def np_layernorm(x, eps, g, b):
    x = x.astype(np.float64)
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps) * g + b


def np_rotary(q, k, cos, sin):
    hd = q.shape[-1]
    rot = lambda t: np.concatenate([-t[..., hd // 2:], t[..., :hd // 2]], -1)
    return np.stack([q * cos[:, None] + rot(q) * sin[:, None], k * cos[:, None] + rot(k) * sin[:, None]])


# ---- the cases ------------------------------------------------------------------------------------

def _add(mod, fn, inner, shape):
    def build(load, rng):
        m = load("tensor_addition", mod)
        a, b = f32(rng, *shape), f32(rng, *shape)
        return Run(getattr(m, fn), (a, b), a + b, inner=getattr(m, inner))
    return build


def _matmul(gen_fn, kmn):
    def build(load, rng):
        m = load("matrix_multiplication", "matrix_multiplication_nki_kernels")
        K, M, N = kmn
        l, r = f32(rng, K, M), f32(rng, K, N)
        return Run(getattr(m, gen_fn), (l, r), l.T.astype(np.float64) @ r)
    return build


def _transpose(load, rng):
    m = load("transpose2d", "transpose2d_nki_kernels")
    x = f32(rng, 128, 32)
    return Run(m.tensor_transpose2D_kernel_, (x, (4, 8)), x.reshape(128, 4, 8).transpose(0, 2, 1).reshape(128, 32))


def _avgpool(load, rng):
    m = load("average_pool2d", "average_pool2d_nki_kernels")
    x = f32(rng, 128, 64, 64)
    return Run(m.tensor_avgpool_kernel, (x, 2), x.reshape(128, 32, 2, 32, 2).mean((2, 4)))


def _mamba(fn):
    def build(load, rng):
        m = load("fused_mamba", "mamba_nki_kernels")
        delta = rng.uniform(0.0, 0.5, (1, 256, 512)).astype(np.float32)
        u = f32(rng, 1, 256, 512)
        A = -rng.uniform(0.1, 1.0, (256, 16)).astype(np.float32)
        B, C = f32(rng, 1, 16, 512), f32(rng, 1, 16, 512)
        return Run(getattr(m, fn), (delta, u, A, B, C), np_mamba(delta, u, A, B, C))
    return build


def _attention(fn, s, dt=np.float32):
    def build(load, rng):
        m = load("attention_fwd_performance", "attention_kernels")
        q, k, v = [((rng.random((128, s)) - 0.5) * 2).astype(dt) for _ in range(3)]
        return Run(getattr(m, fn), (q, k, v), np_attention(*(x.astype(np.float64) for x in (q, k, v))))
    return build


def _layernorm(fn, rows, cols):
    def build(load, rng):
        m = load("layernorm", "layernorm_nki_kernel")
        x = rng.random((rows, cols)).astype(np.float32)
        g, b = rng.random(cols).astype(np.float32), rng.random(cols).astype(np.float32)
        return Run(getattr(m, fn), (x, 1e-5, g, b), np_layernorm(x, 1e-5, g, b))
    return build


def _rmsnorm(load, rng):
    m = load("rmsnorm", "rmsnorm_nki_kernels")
    x, g = rng.random((300, 512)).astype(np.float32), rng.random(512).astype(np.float32)
    return Run(m.nki_rmsnorm_kernel, (x, g), x / np.sqrt(np.mean(x.astype(np.float64) ** 2, 1, keepdims=True)) * g)


def _softmax(load, rng):
    m = load("softmax", "softmax_nki_kernels")
    x = f32(rng, 300, 512)
    e = np.exp(x - x.max(1, keepdims=True))
    return Run(m.nki_softmax_kernel, (x,), e / e.sum(1, keepdims=True))


def _rotary(load, rng):
    m = load("rotary", "rotary_nki_kernels")
    bs, nh, sl, hd = 2, 2, 300, 64
    q, k = f32(rng, bs, nh, sl, hd), f32(rng, bs, nh, sl, hd)
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    fr = np.arange(sl)[:, None] * inv[None]
    emb = np.concatenate([fr, fr], -1)
    cos = np.broadcast_to(np.cos(emb), (bs, sl, hd)).astype(np.float32).copy()
    sin = np.broadcast_to(np.sin(emb), (bs, sl, hd)).astype(np.float32).copy()
    return Run(m.nki_apply_rotary_embedding, (q, k, cos, sin), np_rotary(q, k, cos, sin), grid=(bs, nh))


def _sd_attention(s):
    def build(load, rng):
        m = load("sd_attention", "sd_attention_nki_kernels")
        q, k, v = [rng.random((s, 64)).astype(np.float32) for _ in range(3)]
        qk = (q.astype(np.float64) * 0.125) @ k.T          # the kernel's softmax_scale = 1 / sqrt(64)
        e = np.exp(qk - qk.max(1, keepdims=True))
        return Run(m.fused_self_attn_for_SD_small_head_size, (q, k, v), (e / e.sum(1, keepdims=True)) @ v)
    return build


def cases() -> list[Case]:
    from nki_samples_mx import mx_cases      # the mxfp-matmul tutorial (its own references)
    out = []
    for k, kmn in (("nki_matmul_basic_", (128, 64, 512)), ("nki_matmul_tiled_", (1024,) * 3),
                   ("nki_matmul_hoist_load_", (1024,) * 3), ("nki_matmul_block_free_dimension_", (1024,) * 3),
                   ("nki_matmul_fully_optimized_", (2048,) * 3)):
        shape = "64 x 128 x 512" if k == "nki_matmul_basic_" else f"{kmn[0]}^3"
        for gen in ("new", "old"):
            out.append(Case(f"matrix_multiplication.{k}", gen, shape, _matmul(k, kmn)))
    out += mx_cases(Case, Run)
    old = [
        Case("tensor_addition.nki_tensor_add", "old", "256 x 1024",
             _add("tensor_addition_nki_kernels", "nki_tensor_add", "nki_tensor_add_kernel_", (256, 1024))),
        Case("spmd_tensor_addition.nki_tensor_add", "old", "256 x 1024",
             _add("spmd_tensor_addition_nki_kernels", "nki_tensor_add", "nki_tensor_add_kernel_", (256, 1024))),
        Case("spmd_multiple_nc.nki_tensor_add_nc2", "old", "512 x 2048",
             _add("spmd_multiple_nc_tensor_addition_nki_kernels", "nki_tensor_add_nc2", "nki_tensor_add_kernel_",
                  (512, 2048))),
        Case("transpose2d.tensor_transpose2D_kernel_", "old", "128 x (4 x 8)", _transpose),
        Case("average_pool2d.tensor_avgpool_kernel", "old", "c128 64 x 64, pool 2", _avgpool),
    ]
    old += [Case(f"fused_mamba.{v}", "old", "b1 c256 s512 n16", _mamba(v)) for v in ("mamba_v1", "mamba_v2", "mamba_v3")]
    for v in ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11"):
        s = 128 if v in ("v1", "v2") else 1024
        old.append(Case(f"attention_fwd.attn_fwd_{v}", "old", f"d128 s{s}", _attention(f"attn_fwd_{v}", s), 1e-2))
    for v in ("v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11"):   # the tutorial test's shape
        old.append(Case(f"attention_fwd.attn_fwd_{v}", "old", "d128 s4096", _attention(f"attn_fwd_{v}", 4096), 1e-2))
    for v in ("v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11"):   # its benchmark dtype
        old.append(Case(f"attention_fwd.attn_fwd_{v}", "old", "d128 s4096 bf16",
                        _attention(f"attn_fwd_{v}", 4096, ml_dtypes.bfloat16), 1e-2))
    old += [Case(f"layernorm.nki_layernorm_kernel_{v}", "old", "300 x 1024",
                 _layernorm(f"nki_layernorm_kernel_{v}", 300, 1024)) for v in ("v1", "v2")]
    old += [Case("layernorm.nki_layernorm_kernel_v2", "old", "300 x 1000",
                 _layernorm("nki_layernorm_kernel_v2", 300, 1000)),
            Case("rmsnorm.nki_rmsnorm_kernel", "old", "300 x 512", _rmsnorm),
            Case("softmax.nki_softmax_kernel", "old", "300 x 512", _softmax),
            Case("rotary.nki_apply_rotary_embedding (grid [2, 2])", "old", "b2 h2 s300 d64", _rotary)]
    old += [Case("sd_attention.fused_self_attn_for_SD_small_head_size", "old", f"s{s} d64", _sd_attention(s))
            for s in (1024, 4096)]
    return out + old


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", help="local copy of nki-samples, nki generation (e.g. HEAD 6905a68)")
    ap.add_argument("--old", help="local copy of nki-samples, neuronxcc generation (fc5c69f)")
    ap.add_argument("--only", default="", help="run the cases whose name or shape contains this")
    ap.add_argument("-v", action="store_true", help="print tracebacks")
    a = ap.parse_args(argv)
    nki.install_aliases()
    _stub_host_modules()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    roots = {"new": a.new, "old": a.old}
    loads = {g: loader(r, g) for g, r in roots.items() if r}
    bad = 0
    print("| tutorial kernel | generation | shape | max err / max ref | trn2 | trn3 |")
    print("|---|---|---|---|---|---|")
    for c in cases():
        if c.gen not in loads or a.only not in f"{c.name} {c.shape}":
            continue
        gen = "nki" if c.gen == "new" else "neuronxcc"
        try:
            r = check(c, loads[c.gen], np.random.default_rng(0))
            err = max(e for e, _ in r.values())
            ok = err <= c.tol
            bad += not ok
            t = {tg: f"{r[tg][1]:.1f} us" if tg in r else "n/a (NC-v4 only)" for tg in ("trn2", "trn3")}
            print(f"| `{c.name}` | {gen} | {c.shape} | {err:.1e}{'' if ok else f' > {c.tol} FAIL'} | "
                  f"{t['trn2']} | {t['trn3']} |", flush=True)
        except Exception as e:
            bad += 1
            print(f"| `{c.name}` | {gen} | {c.shape} | {type(e).__name__}: {str(e).splitlines()[0][:120]} | - | - |",
                  flush=True)
            if a.v:
                traceback.print_exc()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
