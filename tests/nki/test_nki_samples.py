"""The nki-samples tutorial kernels, unchanged, from local copies of that repository (never
part of this project): runs only when ``NKI_SAMPLES_NEW`` (a copy at the ``nki`` generation,
e.g. 6905a68) and/or ``NKI_SAMPLES_OLD`` (the ``neuronxcc.nki`` generation, fc5c69f) name them.
The cases and their numpy references are in nki_samples.py (also a script printing the table
of docs/nki.md). Large shapes are left to the script; here the quick ones, and kernels made
wrong on purpose must fail their tolerance."""
import os

import numpy as np
import pytest

import nki_samples as S
from neuron_compiler import nki

ROOTS = {"new": os.environ.get("NKI_SAMPLES_NEW"), "old": os.environ.get("NKI_SAMPLES_OLD")}
SLOW = ("2048^3", "s4096", "s1024", "1024^3", "b1 c256")


@pytest.fixture(scope="module")
def loads():
    nki.install_aliases()
    S._stub_host_modules()
    return {g: S.loader(r, g) for g, r in ROOTS.items() if r}


def _quick():
    return [pytest.param(c, id=f"{c.gen}-{c.name}-{c.shape}") for c in S.cases()
            if not any(x in c.shape for x in SLOW)]


@pytest.mark.parametrize("case", _quick())
def test_tutorial_kernel_matches_numpy(case, loads):
    if case.gen not in loads:
        pytest.skip(f"set NKI_SAMPLES_{case.gen.upper()} to a local copy of aws-neuron/nki-samples")
    for tg, (err, us) in S.check(case, loads[case.gen], np.random.default_rng(0)).items():
        assert err <= case.tol, f"{case.name} on {tg}: max error {err:.2e} of max |ref| > {case.tol}"
        assert us > 0


def test_layernorm_v2_with_a_wrong_statistic_fails(loads, monkeypatch):
    """bn_aggr's variance taken as its mean (a wrong layout reading) must fail the tolerance."""
    if "old" not in loads:
        pytest.skip("set NKI_SAMPLES_OLD to a local copy of aws-neuron/nki-samples at fc5c69f")
    case = next(c for c in S.cases() if c.name.endswith("kernel_v2") and c.shape == "300 x 1000")
    mod = loads["old"]("layernorm", "layernorm_nki_kernel")
    real = mod.nisa.bn_aggr

    def swapped(data, **kw):
        mv = real(data, **kw)
        return mod.nl.copy(mv[:, 0:1].broadcast_to((mv.shape[0], 2)))
    monkeypatch.setattr(mod.nisa, "bn_aggr", swapped)
    errs = S.check(case, loads["old"], np.random.default_rng(0), targets=("trn2",))
    assert errs["trn2"][0] > case.tol


def _mx_case(name):
    return next(c for c in S.cases() if c.name.startswith(name))


def test_mx_matmul_with_one_wrong_scale_fails(loads):
    """One stationary scale one step too large (a scaling group doubled) must fail."""
    if "new" not in loads:
        pytest.skip("set NKI_SAMPLES_NEW to a local copy of aws-neuron/nki-samples")
    case = _mx_case("mx_kernels.kernel_offline_quantized_mx_matmul (float8_e5m2)")
    build = case.build

    def wrong(load, rng):
        r = build(load, rng)
        st_s = r.args[1].copy()
        st_s[3, 5] += 1
        r.args = (r.args[0], st_s) + r.args[2:]
        return r
    case.build = wrong
    err = S.check(case, loads["new"], np.random.default_rng(0))["trn3"][0]
    assert err > case.tol


def test_mx_kernel_on_trn2_names_the_instruction_and_the_rule(loads):
    if "new" not in loads:
        pytest.skip("set NKI_SAMPLES_NEW to a local copy of aws-neuron/nki-samples")
    case = _mx_case("mx_kernels.kernel_offline_quantized_mx_matmul (float8_e5m2)")
    with pytest.raises(Exception, match=r"(?s)matmul\(.*perf_mode=mx.*not available on trn2 \(NeuronCore-v3\)"
                                        r".*mx_kernels.py:\d+"):
        S.check(case, loads["new"], np.random.default_rng(0), targets=("trn2",))
