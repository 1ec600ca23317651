"""The on-disk compile cache (``cache_dir`` / ``$NEURON_CACHE_DIR``), across real processes:
a second process compiles >= 3x faster from the cache and reports hits; after every cache file is
truncated, a third process warns, compiles again and still matches eager; two processes
compiling at once leave only whole entries."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch

from neuron_compiler.cache import (MAGIC, CacheEntry, DiskCache, NeuronCacheWarning, cache_key,
                                   request, request_key)
from neuron_compiler.options import validate_options
from neuron_compiler.runtime import PROGRAM_CACHE, program_cache_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Two device partitions (the fft falls back between them) so that the cache serves several
# entries per process; sizes that cross tile edges so the lowering has real work to do.
SCRIPT = r'''
import json, sys, warnings
import torch, neuron_compiler

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(200, 384)
        self.b = torch.nn.Linear(384, 130)
        self.norm = torch.nn.LayerNorm(130)
        self.c = torch.nn.Linear(66, 129)

    def forward(self, x):
        h = self.norm(self.b(torch.nn.functional.gelu(self.a(x))))
        s = torch.fft.rfft(h, dim=-1).abs()
        return torch.softmax(self.c(s), dim=-1)

torch.manual_seed(0)
model = Model().eval()
x = torch.randn(160, 200)
f = torch.compile(model, backend="neuron", options={"cache_dir": sys.argv[1]})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad(), neuron_compiler.profile() as prof:
        y = f(x)
with torch.no_grad():
    ref = model(x)
d = prof.to_dict()
print(json.dumps({"cache": d["cache"], "program_cache": d["program_cache"],
                  "compile_time_s": d["compile_time_s"],
                  "device_nodes": d["device_nodes"], "partitions": len(d["partitions"]),
                  "max_err": (y - ref).abs().max().item(),
                  "matches": torch.allclose(y, ref, atol=1e-4, rtol=1e-3),
                  "warnings": [str(w.message) for w in caught
                               if issubclass(w.category, neuron_compiler.cache.NeuronCacheWarning)],
                  "summary": prof.summary()}))
'''


def _run(script, cache_dir, tmp_path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NEURON_CACHE_DIR", None)
    env.pop("NEURON_DUMP_DIR", None)
    return subprocess.Popen([sys.executable, str(script), str(cache_dir)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _entries(cache_dir) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(cache_dir) for f in files
                  if f.endswith(".neuron"))


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "compile_model.py"
    path.write_text(SCRIPT)
    return path


def test_second_process_hits_truncated_entries_recompile(script, tmp_path):
    cache = tmp_path / "cache"
    first = _result(_run(script, cache, tmp_path))
    assert first["cache"]["hits"] == 0 and first["cache"]["misses"] >= 2, first
    assert first["partitions"] >= 2 and first["matches"], first
    entries = _entries(cache)
    assert len(entries) == first["cache"]["misses"]

    second = _result(_run(script, cache, tmp_path))
    assert second["cache"] == {"hits": first["cache"]["misses"], "misses": 0}, second
    assert second["program_cache"]["disk_hits"] == first["cache"]["misses"], second
    assert second["matches"] and second["max_err"] == first["max_err"]
    assert "on-disk compile cache" in second["summary"] and "hits" in second["summary"]
    speedup = first["compile_time_s"] / second["compile_time_s"]
    assert speedup >= 3.0, (first["compile_time_s"], second["compile_time_s"])

    for path in entries:                       # truncate every cache file
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    third = _result(_run(script, cache, tmp_path))
    assert third["cache"] == {"hits": 0, "misses": first["cache"]["misses"]}, third
    assert len(third["warnings"]) == len(entries), third["warnings"]
    assert all("is corrupt" in w and "compiled again" in w for w in third["warnings"])
    assert third["matches"], third
    disk = DiskCache(str(cache))                # the entries were rewritten whole
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCacheWarning)
        assert all(disk.load(os.path.basename(p).removesuffix(".neuron")) for p in entries)


def test_two_processes_compiling_at_once(script, tmp_path):
    cache = tmp_path / "cache"
    procs = [_run(script, cache, tmp_path) for _ in range(2)]
    results = [_result(p) for p in procs]
    assert all(r["matches"] and not r["warnings"] for r in results)
    entries = _entries(cache)
    assert entries and not [f for d, _, fs in os.walk(cache) for f in fs if f.startswith(".tmp")]
    disk = DiskCache(str(cache))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCacheWarning)   # every entry is whole
        for path in entries:
            assert disk.load(os.path.basename(path).removesuffix(".neuron")) is not None
    for r in results:       # each asked for every partition (one may have hit the other's)
        assert r["cache"]["hits"] + r["cache"]["misses"] == len(entries) >= 2, r


# ---- the file format, in process ---------------------------------------------------------------
REQUEST = request("0" * 64, (((4, 4), "torch.float32"),), (("target", "'trn2'"),), "trn2")
KEY = cache_key("0" * 64, (((4, 4), "torch.float32"),), (("target", "'trn2'"),), "trn2")


def _entry() -> CacheEntry:
    return CacheEntry("g/fused_0 (float32[4, 4])", None, ("aten.foo.default", "no reason"),
                      [("ir_pre_fusion.txt", "text\n")], REQUEST)


def test_round_trip_and_layout(tmp_path):
    disk = DiskCache(str(tmp_path))
    path = disk.store(KEY, _entry())
    assert path == os.path.join(str(tmp_path), KEY[:2], KEY + ".neuron")
    data = open(path, "rb").read()
    assert data.startswith(MAGIC)
    header = json.loads(data[len(MAGIC):data.index(b"\n", len(MAGIC))])
    assert header["key"] == KEY and header["origin"] == _entry().origin
    got = disk.load(KEY)
    assert got == _entry()
    assert disk.load("ab" * 32) is None                  # absent: a plain miss, no warning


@pytest.mark.parametrize("damage, problem", [
    (lambda d: b"", "empty file"),
    (lambda d: d[:len(MAGIC) + 5], "header line is truncated"),
    (lambda d: d[:-3], "truncated"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "sha256"),
    (lambda d: d.replace(MAGIC, b"something else\n"), "magic"),
    (lambda d: d.replace(KEY.encode(), b"f" * 64), "names key"),
])
def test_damaged_entry_warns_and_is_removed(tmp_path, damage, problem):
    disk = DiskCache(str(tmp_path))
    path = disk.store(KEY, _entry())
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(damage(data))
    with pytest.warns(NeuronCacheWarning, match=problem):
        assert disk.load(KEY) is None
    assert not os.path.exists(path)


def test_checksummed_payload_that_is_not_an_entry(tmp_path):
    disk = DiskCache(str(tmp_path))
    path = disk.store(KEY, _entry())
    payload = pickle.dumps({"not": "an entry"})
    header = json.dumps({"key": KEY, "bytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + header + b"\n" + payload)
    with pytest.warns(NeuronCacheWarning, match="expected a CacheEntry"):
        assert disk.load(KEY) is None


def test_unwritable_directory_warns_once_and_compiles(tmp_path):
    (tmp_path / KEY[:2]).write_text("a file where the entry's directory should be")
    disk = DiskCache(str(tmp_path))
    with pytest.warns(NeuronCacheWarning, match="cannot write"):
        assert disk.store(KEY, _entry()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCacheWarning)
        assert disk.store(KEY, _entry()) is None              # said once
    assert disk.load(KEY) is None


def test_key_depends_on_everything_it_names():
    base = ("0" * 64, (((4, 4), "torch.float32"),), (("target", "'trn2'"),), "trn2")
    variants = [("1" * 64,) + base[1:], (base[0], (((4, 5), "torch.float32"),)) + base[2:],
                base[:2] + ((("target", "'trn2'"), ("auto_cast", "'all'")),) + base[3:],
                base[:3] + ("trn3",)]
    keys = {cache_key(*base)} | {cache_key(*v) for v in variants}
    assert len(keys) == 5 and cache_key(*base) == KEY


def test_option_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CACHE_DIR", str(tmp_path))
    assert validate_options({}).cache_dir == str(tmp_path)
    assert validate_options({"cache_dir": None}).cache_dir is None
    monkeypatch.delenv("NEURON_CACHE_DIR")
    assert validate_options({}).cache_dir is None
    with pytest.raises(ValueError, match="cache_dir.*int"):
        validate_options({"cache_dir": 3})
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        DiskCache(str(not_a_dir))


def test_in_process_hits_skip_the_disk(tmp_path):
    """A partition the process already lowered comes from the program cache: the disk is
    asked only on a program-cache miss (so ``cache`` counts one miss, then nothing)."""
    import neuron_compiler
    torch._dynamo.reset()
    PROGRAM_CACHE.clear()          # no program of an earlier test in this process
    try:
        f = torch.compile(lambda x: torch.relu(x * 3.0 + 1.0), backend="neuron",
                          options={"cache_dir": str(tmp_path)})
        with neuron_compiler.profile() as prof:
            f(torch.randn(33, 65))
        torch._dynamo.reset()
        g = torch.compile(lambda x: torch.relu(x * 3.0 + 1.0), backend="neuron",
                          options={"cache_dir": str(tmp_path)})
        with neuron_compiler.profile() as prof2:
            g(torch.randn(33, 65))
    finally:
        torch._dynamo.reset()
    assert prof.to_dict()["cache"]["misses"] == 1
    d2 = prof2.to_dict()
    assert d2["program_cache"]["hits"] == 1 and d2["cache"] == {"hits": 0, "misses": 0}


def test_program_lowered_without_a_cache_dir_is_stored_when_one_is_asked(tmp_path):
    import neuron_compiler
    torch._dynamo.reset()
    PROGRAM_CACHE.clear()
    fn = lambda x: torch.tanh(x * 5.0 - 2.0)          # noqa: E731
    try:
        f = torch.compile(fn, backend="neuron")
        f(torch.randn(17, 130))
        g = torch.compile(fn, backend="neuron", options={"cache_dir": str(tmp_path)})
        with neuron_compiler.profile() as prof:
            g(torch.randn(17, 130))
    finally:
        torch._dynamo.reset()
    d = prof.to_dict()
    assert d["program_cache"]["hits"] == 1 and d["cache"] == {"hits": 0, "misses": 0}
    assert len(_entries(tmp_path)) == 1


# ---- entries turned against their user -----------------------------------------------------
def _compile_in_a_fresh_process(fn, x, cache_dir, mode="functional"):
    """``fn(x)`` compiled as a new process would: no program in memory, Dynamo reset."""
    import neuron_compiler
    torch._dynamo.reset()
    PROGRAM_CACHE.clear()
    f = torch.compile(fn, backend="neuron", options={"cache_dir": str(cache_dir),
                                                     "sim_mode": mode})
    with warnings.catch_warnings(record=True) as caught, neuron_compiler.profile() as prof:
        warnings.simplefilter("always")
        y = f(x)
    torch._dynamo.reset()
    return y, prof.to_dict(), [str(w.message) for w in caught
                               if issubclass(w.category, NeuronCacheWarning)]


def _relu_affine(x):
    return torch.relu(x * 3.0 + 1.0)


def _tanh_matmul(x):
    return torch.tanh(x @ x.t()).sum(-1)


def _rewrite(path: str, payload: bytes) -> None:
    """Write ``payload`` under the entry at ``path`` with a valid header for its key."""
    key = os.path.basename(path).removesuffix(".neuron")
    header = json.dumps({"key": key, "bytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + header + b"\n" + payload)


@pytest.mark.parametrize("header", ["copied", "rewritten"])
def test_another_graphs_entry_under_this_key_is_detected(tmp_path, header):
    x = torch.randn(33, 65)
    _compile_in_a_fresh_process(_relu_affine, x, tmp_path / "a")
    _compile_in_a_fresh_process(_tanh_matmul, x, tmp_path / "b")
    (theirs,), (ours,) = _entries(tmp_path / "a"), _entries(tmp_path / "b")
    data = open(theirs, "rb").read()
    if header == "copied":                  # the file as it is: its header names its own key
        with open(ours, "wb") as f:
            f.write(data)
    else:                                   # header rewritten for our key: only the payload tells
        _rewrite(ours, data[data.index(b"\n", len(MAGIC)) + 1:])
    y, d, warned = _compile_in_a_fresh_process(_tanh_matmul, x, tmp_path / "b")
    assert len(warned) == 1 and "is corrupt or misplaced" in warned[0], warned
    if header == "rewritten":
        assert "written for another request" in warned[0], warned
    assert d["cache"] == {"hits": 0, "misses": 1}
    torch.testing.assert_close(y, _tanh_matmul(x), rtol=1e-4, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCacheWarning)   # recompiled and rewritten whole
        assert DiskCache(str(tmp_path / "b")).load(
            os.path.basename(ours).removesuffix(".neuron")) is not None


class _Hostile:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["payload", "inside an entry"])
def test_a_hostile_entry_runs_nothing(tmp_path, where):
    x = torch.randn(33, 65)
    _compile_in_a_fresh_process(_relu_affine, x, tmp_path)
    (path,) = _entries(tmp_path)
    marker = tmp_path / "pwned"
    evil = _Hostile(str(marker))
    if where == "payload":
        payload = pickle.dumps(evil)
    else:
        key = os.path.basename(path).removesuffix(".neuron")
        good = DiskCache(str(tmp_path)).load(key)
        payload = pickle.dumps(dataclasses.replace(good, stage_files=[("x.txt", evil)]))
    _rewrite(path, payload)
    y, d, warned = _compile_in_a_fresh_process(_relu_affine, x, tmp_path)
    assert not marker.exists()                               # the command never ran
    assert len(warned) == 1 and "system, which a cache entry may not load" in warned[0], warned
    assert d["cache"] == {"hits": 0, "misses": 1}
    torch.testing.assert_close(y, _relu_affine(x))
    assert b"system" not in open(path, "rb").read()          # rewritten by the recompile


def test_disk_hits_show_in_the_profile_and_the_program_cache_counter(tmp_path):
    x = torch.randn(33, 65)
    _, cold, _ = _compile_in_a_fresh_process(_relu_affine, x, tmp_path)
    assert cold["program_cache"]["disk_hits"] == 0 and cold["cache"]["misses"] == 1
    _, warm, warned = _compile_in_a_fresh_process(_relu_affine, x, tmp_path)
    assert not warned
    assert warm["cache"] == {"hits": 1, "misses": 0}
    assert warm["program_cache"] == {"hits": 0, "misses": 1, "disk_hits": 1}
    assert program_cache_info()["disk_hits"] == 1


def test_a_warm_timing_mode_call_does_not_simulate_again(tmp_path, monkeypatch):
    """The program's timing statistics travel with the entry: a warm process's timing-mode
    call takes them (same figures) instead of simulating the program."""
    x = torch.randn(100, 130)
    _, cold, _ = _compile_in_a_fresh_process(_tanh_matmul, x, tmp_path, mode="timing")
    import lowering.compiled

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated again")
    monkeypatch.setattr(lowering.compiled, "simulate", no_simulation)
    y, warm, warned = _compile_in_a_fresh_process(_tanh_matmul, x, tmp_path, mode="timing")
    assert not warned and warm["cache"] == {"hits": 1, "misses": 0}
    assert warm["simulated_time_us"] == cold["simulated_time_us"] > 0
    torch.testing.assert_close(y, _tanh_matmul(x))
