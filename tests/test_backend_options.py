"""Options of the neuron backend: strict validation, defaults, the environment variable."""
from __future__ import annotations

import warnings

import pytest
import torch

import neuron_compiler
from neuron_compiler import NeuronOptionError, NeuronOptions, validate_options
from neuron_compiler.testing import compile_for_neuron


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_defaults(monkeypatch):
    monkeypatch.delenv("NEURON_DUMP_DIR", raising=False)
    opts = validate_options(None)
    assert opts == NeuronOptions(target="trn2", sim_mode="functional", fallback="allow",
                                 dump_dir=None)
    assert NeuronOptions.valid_keys() == ("target", "sim_mode", "fallback", "dump_dir",
                                          "auto_cast", "cache_dir", "host_link_gbps",
                                          "call_overhead_us", "lnc")


def test_unknown_key_lists_valid_keys():
    with pytest.raises(NeuronOptionError) as info:
        validate_options({"targte": "trn3"})
    msg = str(info.value)
    assert "'targte'" in msg
    for key in ("target", "sim_mode", "fallback", "dump_dir"):
        assert key in msg


def test_bad_value_names_key_allowed_and_given():
    with pytest.raises(NeuronOptionError) as info:
        validate_options({"target": "trn9"})
    msg = str(info.value)
    assert "'target'" in msg and "'trn2'" in msg and "'trn3'" in msg and "'trn9'" in msg
    with pytest.raises(NeuronOptionError, match="sim_mode.*'fast'"):
        validate_options({"sim_mode": "fast"})
    with pytest.raises(NeuronOptionError, match="fallback.*'ignore'"):
        validate_options({"fallback": "ignore"})
    with pytest.raises(NeuronOptionError, match="dump_dir.*int"):
        validate_options({"dump_dir": 3})
    with pytest.raises(NeuronOptionError, match="must be a dict"):
        validate_options(["target"])  # type: ignore[arg-type]


def test_options_are_frozen():
    opts = validate_options({"target": "trn3"})
    with pytest.raises(Exception):
        opts.target = "trn1"  # type: ignore[misc]


def test_dump_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_DUMP_DIR", str(tmp_path))
    assert validate_options({}).dump_dir == str(tmp_path)
    assert validate_options({"dump_dir": None}).dump_dir is None  # explicit key wins
    other = tmp_path / "other"
    assert validate_options({"dump_dir": other}).dump_dir == str(other)


def test_unknown_key_through_torch_compile():
    f = compile_for_neuron(lambda x: x + 1, options={"targets": "trn3"})
    with pytest.raises(Exception) as info:
        f(torch.randn(4))
    msg = str(info.value)
    assert "'targets'" in msg and "valid options are: target, sim_mode, fallback, dump_dir, auto_cast" in msg


def test_bad_value_through_torch_compile():
    f = compile_for_neuron(lambda x: x + 1, options={"sim_mode": "fast"})
    with pytest.raises(Exception, match="option 'sim_mode' must be one of 'functional', "
                                        "'timing'; got 'fast'"):
        f(torch.randn(4))


def test_backend_rejects_unexpected_keywords():
    from neuron_compiler.backend import neuron_backend
    with pytest.raises(NeuronOptionError, match="unexpected keyword"):
        neuron_backend(None, [], target="trn3")  # type: ignore[arg-type]


def test_mode_is_accepted_with_a_warning():
    from neuron_compiler.backend import neuron_backend
    gm = torch.fx.symbolic_trace(lambda x: (x * 2,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = neuron_backend(gm, [torch.randn(3)], mode="max-autotune")
    assert any("max-autotune" in str(w.message) for w in caught)
    assert callable(fn)


def test_package_exports():
    assert neuron_compiler.__version__
    assert callable(neuron_compiler.profile)
    assert neuron_compiler.neuron_backend.__name__ == "neuron_backend"


def test_warns_when_another_neuron_backend_is_registered(monkeypatch):
    from torch._dynamo.backends import registry

    from neuron_compiler.backend import neuron_backend

    def torch_neuronx_backend(gm, example_inputs):  # stands in for AWS's backend
        return gm

    monkeypatch.setitem(registry._COMPILER_FNS, "neuron", torch_neuronx_backend)
    gm = torch.fx.symbolic_trace(lambda x: (x * 2,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        neuron_backend(gm, [torch.randn(3)])
    msgs = [str(w.message) for w in caught]
    assert any("another torch.compile backend named 'neuron'" in m and "neuron_sim" in m
               for m in msgs), msgs
