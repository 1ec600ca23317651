"""The calibration programs compute what their tutorials compute (small shapes, functional mode,
every check on, so the builder's semaphores are race-free), and the calibration command works.
The full-size runs belong to ``python -m runtime_sim.calibrate`` and bench/ (a slow test here)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime_sim import DType, simulate
from runtime_sim.calibration import CASES, format_table, run_case
from runtime_sim.calibration import mamba as mb
from runtime_sim.calibration import mamba_spill as ms
from runtime_sim.calibration import matmul as mm

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(M=512, K=256, N=1024)


@pytest.mark.parametrize("kind", list(mm.KERNELS))
@pytest.mark.parametrize("target,dtype", [("trn1", DType.BF16), ("trn2", DType.FP32)])
def test_matmul_kernels_compute_the_matmul(kind, target, dtype):
    kw = dict(tiles_m=2, tiles_n=2, tiles_k=2) if kind == "fully_optimized" else {}
    prog = mm.KERNELS[kind](target, dtype=dtype, **SMALL, **kw)
    r = np.random.default_rng(1)
    lhsT = r.uniform(-1, 1, (SMALL["K"], SMALL["M"])).astype(np.float32).astype(dtype.np)
    rhs = r.uniform(-1, 1, (SMALL["K"], SMALL["N"])).astype(np.float32).astype(dtype.np)
    res = simulate(prog, {"lhsT": lhsT, "rhs": rhs})
    out = res.outputs["result"].view(dtype.np).reshape(SMALL["M"], SMALL["N"]).astype(np.float32)
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    # fp32 accumulation in PSUM; the bf16 kernels round the result (and, fully_optimized, the
    # partial sums in the SBUF bf16 result tiles)
    tol = 1e-4 if dtype is DType.FP32 else 0.15
    np.testing.assert_allclose(out, ref, atol=tol, rtol=0)
    assert res.stats.flops == 2 * SMALL["M"] * SMALL["N"] * SMALL["K"]


def _mamba_ref(delta, u, A, B, C):
    dA = np.exp(delta[:, :, None, :] * A[None, :, :, None])
    dBu = delta[:, :, None, :] * B[:, None, :, :] * u[:, :, None, :]
    out = np.zeros_like(dA)
    prev = 0.0
    for i in range(dA.shape[-1]):
        prev = dA[..., i] * prev + dBu[..., i]
        out[..., i] = prev
    return (out * C[:, None, :, :]).sum(axis=2)


def _mamba_inputs(bt, S, ch, st):
    r = np.random.default_rng(2)
    f = np.float32
    delta, u = r.uniform(0, 0.5, (bt, ch, S)).astype(f), r.uniform(-1, 1, (bt, ch, S)).astype(f)
    A = -r.uniform(0.5, 1.0, (ch, st)).astype(f)
    B, C = r.uniform(-1, 1, (bt, st, S)).astype(f), r.uniform(-1, 1, (bt, st, S)).astype(f)
    return dict(delta=delta, u=u, A=A, B=B, C=C)


@pytest.mark.parametrize("version", ["v1", "v1_reload", "v2", "v3"])
def test_mamba_kernels_compute_the_selective_scan(version):
    bt, S, ch, st = 2, 128, 256, 3
    f = np.float32
    x = _mamba_inputs(bt, S, ch, st)
    prog = {"v1": lambda: mb.mamba_v1("trn1", bt, S, ch, st),
            "v1_reload": lambda: mb.mamba_v1("trn1", bt, S, ch, st, resident=1),
            "v2": lambda: mb.mamba_v2("trn1", bt, S, ch, st),
            "v3": lambda: mb.mamba_v3("trn1", bt, S, ch, st, seq_tile=32)}[version]()
    res = simulate(prog, x)
    out = res.outputs["out"].view(f).reshape(bt, ch, S)
    ref = _mamba_ref(*(x[n].astype(np.float64) for n in ("delta", "u", "A", "B", "C")))
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-5)


def test_mamba_v2_spill_computes_the_same_values():
    """The seq 8192 slot structure (five slots, delta spilled) at a small size, against the same
    program without spilling and numpy; every check on (races between spill DMAs and reuse)."""
    bt, S, ch, st = 2, 1024, 256, 3
    x = _mamba_inputs(bt, S, ch, st)
    ref = _mamba_ref(*(x[n].astype(np.float64) for n in ("delta", "u", "A", "B", "C")))
    outs = {}
    for name, kw in [("no spill", dict(spill=False, max_slots=5)), ("spill", dict(max_slots=5)),
                     ("spill, reload from input", dict(max_slots=5, remat=True))]:
        prog = ms.mamba_v2_long("trn1", bt, S, ch, st, piece=256, **kw)
        slots = [b for b in prog.buffers if b.name.startswith("slot")]
        assert len(slots) == (6 if name == "no spill" else 5)
        res = simulate(prog, x)
        assert (res.stats.spill_bytes > 0) == (name == "spill")
        outs[name] = res.outputs["out"].view(np.float32).reshape(bt, ch, S)
        np.testing.assert_allclose(outs[name], ref, atol=2e-5, rtol=1e-5)
    assert np.array_equal(outs["spill"], outs["no spill"])
    assert np.array_equal(outs["spill, reload from input"], outs["no spill"])


def test_mamba_v2_seq8192_spill_is_forced_by_capacity():
    plan = ms.plan_for("trn1", 8192)
    assert plan.slots == 5 and plan.peak == 6 and plan.spilled == ("delta",)
    assert plan.over == ("bcast B", "deltaBu", "scan", "bcast C", "scanC") and plan.reload_after == "scanC"
    assert ms.plan_for("trn1", 8192, bcast_home="psum").over == ("deltaBu", "scan", "scanC")
    assert ms.plan_for("trn1", 7168).spilled == ()           # six 28 KiB slots still fit
    with pytest.raises(ValueError, match="SBUF"):               # the same program without spilling
        ms.mamba_v2_long("trn1", seq=8192, channels=128, state=2, spill=False)
    prog = ms.mamba_v2_long("trn1", seq=8192, channels=128, state=2)
    assert sum(b.bytes_per_partition for b in prog.buffers if b.memory.value == "sbuf") <= 192 * 1024


def test_mamba_v2_long_broadcasts_live_in_sbuf():
    """Beyond one PSUM tile (nl.tile_size.psum_fmax = 512 fp32) the [128, seq] broadcast is an SBUF
    tile (nl.broadcast_to returns SBUF): TensorE writes bank-sized pieces, each is copied to SBUF,
    and the multiplies read SBUF only (fp32 SBUF x SBUF: 2N). Values match numpy, every check on."""
    from runtime_sim.isa import Memory
    bt, S, ch, st = 1, 1024, 128, 2
    x = _mamba_inputs(bt, S, ch, st)
    ref = _mamba_ref(*(x[n].astype(np.float64) for n in ("delta", "u", "A", "B", "C")))
    for home in ("sbuf", "psum"):
        prog = ms.mamba_v2_long("trn1", bt, S, ch, st, piece=256, bcast_home=home)
        tts = [i for q, ins in prog.streams.items() for i in ins if i.op.name == "TENSOR_TENSOR"]
        reads_psum = any(s.memory is Memory.PSUM for i in tts for s in i.srcs)
        assert reads_psum == (home == "psum")
        out = simulate(prog, x).outputs["out"].view(np.float32).reshape(bt, ch, S)
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-5)


def test_validation_rows_do_not_gate():
    from runtime_sim.calibration.suite import Row
    val = [c for c in CASES if not c.gating]
    assert len(val) == 14 and all("scaling table" in c.name for c in val)
    bad = Row(val[0], val[0].published_us * 0.5)
    text = format_table([bad])
    assert "validation (not gating): OUTSIDE tolerance" in text and "0.50" in text
    assert "0 reproduced" in text and "OUTSIDE: " in text


def test_calibration_case_and_table_smoke():
    case = next(c for c in CASES if c.name.startswith("mamba_v1 channels=256"))
    row = run_case(case)
    assert row.simulated_us and row.ok(), format_table([row])
    assert 0.75 <= row.ratio <= 1.25
    text = format_table([row])
    assert "172.93 us" in text and "VectorE active" in text and "within tolerance" in text


def test_calibrate_command_writes_json(tmp_path):
    out = tmp_path / "cal.json"
    p = subprocess.run([sys.executable, "-m", "runtime_sim.calibrate", "--only", "channels=256", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 1
    r = rows[0]
    assert {"name", "source", "published_us", "simulated_us"} <= set(r)
    assert r["published_us"] == 172.93 and r["simulated_us"] > 0
    assert r["active_percent"][0]["metric"] == "dve" and r["active_percent"][0]["published"] == 98.71


def test_fitted_constants_say_what_they_were_fitted_on():
    src = (ROOT / "runtime_sim" / "targets.py").read_text()
    fitted = [m.start() for m in re.finditer("FITTED", src)]
    assert fitted, "targets.py marks fitted constants"
    assert "hoist" in src and "42.96" in src   # dma_efficiency: fitted on the hoisted-loads kernel


@pytest.mark.slow
def test_full_calibration_within_tolerance():
    rows = [run_case(c) for c in CASES]
    assert all(r.ok() for r in rows if r.case.gating), format_table(rows)
