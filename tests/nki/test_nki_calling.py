"""Calling kernels: numpy and torch arguments, in-place outputs, targets, the profile, the
import aliases for unchanged kernel files."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import neuron_compiler
import neuron_compiler.nki.language as nl
from neuron_compiler import nki

import nki_kernels_v1 as v1
import nki_kernels_v2 as v2

rng = np.random.default_rng(1)


def test_torch_in_torch_out():
    a = torch.randn(130, 520)
    b = torch.randn(130, 520, dtype=torch.float32)
    out = v1.add_scale[2, 2](a, b)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, (a + b) * 2)
    x = torch.randn(128, 512).to(torch.bfloat16)
    y = v2.add_scale[1, 1](x, x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ((x.float() + x.float()).bfloat16().float() * 2))


def test_kernel_writing_its_argument_updates_it_in_place():
    @nki.jit
    def double_into(a, out):
        t = nl.load(a)
        nl.store(out, value=nl.multiply(t, 2.0))

    a = rng.standard_normal((64, 32), dtype=np.float32)
    out = np.zeros_like(a)
    assert double_into(a, out) is None
    np.testing.assert_array_equal(out, a * 2)


def test_targets_time_differently_and_values_agree():
    lhsT = rng.standard_normal((512, 256), dtype=np.float32)
    rhs = rng.standard_normal((512, 1024), dtype=np.float32)
    runs = {t: nki.simulate(v2.matmul, lhsT, rhs, target=t) for t in ("trn1", "trn2", "trn3")}
    for r in runs.values():
        np.testing.assert_allclose(r.outputs[0], lhsT.T @ rhs, rtol=2e-4, atol=2e-4)
        assert r.time_us > 0 and "matmul on" in r.summary()
    assert runs["trn3"].time_us < runs["trn2"].time_us
    assert len({round(r.time_us, 3) for r in runs.values()}) == 3
    with nki.target("trn3"):
        v2.matmul(lhsT, rhs)
    assert v2.matmul.last.target == "trn3"


def test_calls_appear_in_the_profile(tmp_path):
    a = rng.standard_normal((256, 512), dtype=np.float32)
    with neuron_compiler.profile() as prof:
        v1.add_scale[2, 1](a, a)
        v1.add_scale[2, 1](a, a)
        v2.transpose(a)
    d = prof.to_dict()
    names = sorted(p["name"] for p in d["partitions"])
    assert names == ["nki_add_scale/kernel[2, 1]", "nki_transpose/kernel"]
    add = next(p for p in d["partitions"] if p["name"].startswith("nki_add_scale"))
    assert add["calls"] == 2 and add["simulated_time_us"] == pytest.approx(2 * add["simulated_time_per_call_us"])
    assert add["engine_busy"]["dve"] > 0 and add["hbm_bytes"] >= 3 * a.nbytes
    assert {g["kind"] for g in d["graphs"]} == {"nki"}
    assert d["simulated_time_us"] > 0 and "nki_add_scale" in prof.summary()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" and "dma" in json.dumps(e) for e in events)


ALIAS_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    {prelude}
    from neuron_compiler import nki as ours
    done = ours.install_aliases()
    import nki, nki.language as nl, nki.isa as nisa
    from neuronxcc import nki as nki2
    import neuronxcc.nki.language as nl2
    print(nki is ours, nl is ours.language, nisa is ours.isa, nki2 is ours, nl2 is ours.language)

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), nl.load(b)))
        return out
    x = np.ones((4, 8), np.float32)
    print(bool((add(x, x) == 2).all()))
""")


def _run(script: str, cwd) -> list[str]:
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")


def test_aliases_resolve_to_this_front_end(tmp_path):
    out = _run(ALIAS_SCRIPT.format(prelude=""), tmp_path)
    assert out[0] == "True True True True True" and out[1] == "True"


def test_aliases_never_shadow_a_real_install(tmp_path):
    real = tmp_path / "site" / "nki"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / 'site')!r})
        from neuron_compiler import nki as ours
        done = ours.install_aliases()
        import nki
        import neuronxcc.nki as n2
        print(getattr(nki, "REAL", False), "nki" in done, n2 is ours)
    """)
    assert _run(script, tmp_path)[0] == "True False True"


def test_python_dash_m_runs_an_unchanged_script(tmp_path):
    (tmp_path / "k.py").write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def neg(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.negative(nl.load(a)))
            return out

        if __name__ == "__main__":
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            assert (neg(x) == -x).all()
            print("target", neg.last.target)
    """))
    r = subprocess.run([sys.executable, "-m", "neuron_compiler.nki", "--target", "trn3", "k.py"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "target trn3" in r.stdout
