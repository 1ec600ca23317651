"""The mxfp-matmul tutorial of nki-samples (``nki`` generation, trn3 only: MX is NeuronCore-v4):
the three kernels of mx_kernels.py with the inputs mx_toplevel.py gives them, from the local
copy (never this project). Data and references come from the copy's own numpy golden model
(mx_cpu_utils.py: ``generate_stabilized_mx_data``, ``quantize_mx_golden``,
``nc_matmul_mx_golden``); the strided-copy kernels are also compared with the plain product of
their bf16 inputs, as mx_toplevel.py does. Outputs are bf16 (one rounding, relative error <=
2^-8): per element |out - ref| <= 2^-7 (|ref| + 1e-3 max |ref|)."""
from __future__ import annotations

import ml_dtypes as mld
import numpy as np

DIR = "mxfp-matmul"
X4 = {mld.float8_e5m2: "float8_e5m2_x4", mld.float8_e4m3fn: "float8_e4m3fn_x4", mld.float4_e2m1fn: "float4_e2m1fn_x4"}
TOL = 2.0 ** -7      # one bf16 ulp (rounding is half of one: 2^-8 relative)


def _nl(name):
    import neuron_compiler.nki.language as nl
    return getattr(nl, name)


def _offline(qd):
    def build(load, rng):
        from nki_samples import Run
        cpu, k = load(DIR, "mx_cpu_utils"), load(DIR, "mx_kernels")
        np.random.seed(int(rng.integers(1 << 31)))
        _, _, st_x4, st_s = cpu.generate_stabilized_mx_data(qd, (128, 128 * 4))
        _, _, mv_x4, mv_s = cpu.generate_stabilized_mx_data(qd, (128, 512 * 4))
        ref = cpu.nc_matmul_mx_golden(st_x4, mv_x4, st_s, mv_s, qd, qd)
        return Run(k.kernel_offline_quantized_mx_matmul, (st_x4, st_s, mv_x4, mv_s, _nl(X4[qd])), ref)
    return build


def _on_device(qs, qm):
    def build(load, rng):
        from nki_samples import Run
        cpu, k = load(DIR, "mx_cpu_utils"), load(DIR, "mx_kernels")
        np.random.seed(int(rng.integers(1 << 31)))
        _, _, st_x4, st_s = cpu.generate_stabilized_mx_data(qs, (128, 128 * 4))
        mv, _, _, _ = cpu.generate_stabilized_mx_data(qm, (128, 512 * 4))
        mv_bf16 = mv.astype(mld.bfloat16)
        mq, ms = cpu.quantize_mx_golden(mv_bf16.astype(np.float32), qm)
        ref = cpu.nc_matmul_mx_golden(st_x4, mq, st_s, ms, qs, qm)
        return Run(k.kernel_on_device_quantize_matmul_mx, (st_x4, st_s, mv_bf16, _nl(X4[qs]), _nl(X4[qm])), ref)
    return build


def _strided(qd, use_tensor_copy):
    def build(load, rng):
        from nki_samples import Run
        cpu, k = load(DIR, "mx_cpu_utils"), load(DIR, "mx_kernels")
        np.random.seed(int(rng.integers(1 << 31)))
        st, _, _, _ = cpu.generate_stabilized_mx_data(qd, (512, 128))
        mv, _, _, _ = cpu.generate_stabilized_mx_data(qd, (512, 512))
        st, mv = st.astype(mld.bfloat16), mv.astype(mld.bfloat16)
        ref = st.astype(np.float64).T @ mv.astype(np.float64)
        return Run(k.kernel_copy_strided_quantize_matmul_mx, (st, mv, _nl(X4[qd]), use_tensor_copy), ref)
    return build


def mx_cases(Case, Run):
    n = lambda d: d.__name__
    out = [Case(f"mx_kernels.kernel_offline_quantized_mx_matmul ({n(q)})", "new", "128 x 512 x 512", _offline(q), TOL)
           for q in (mld.float8_e5m2, mld.float4_e2m1fn, mld.float8_e4m3fn)]
    out += [Case(f"mx_kernels.kernel_on_device_quantize_matmul_mx ({n(a)} @ {n(b)})", "new", "128 x 512 x 512",
                 _on_device(a, b), TOL)
            for a, b in ((mld.float4_e2m1fn, mld.float8_e5m2), (mld.float8_e5m2, mld.float8_e5m2),
                         (mld.float8_e4m3fn, mld.float8_e4m3fn))]
    out += [Case(f"mx_kernels.kernel_copy_strided_quantize_matmul_mx ({n(mld.float8_e5m2)}, "
                 f"{'tensor_copy' if tc else 'DMA'})", "new", "128 x 512 x 512", _strided(mld.float8_e5m2, tc), TOL)
            for tc in (True, False)]
    for c in out:
        c.targets, c.floor = ("trn3",), 1e-3
    return out
