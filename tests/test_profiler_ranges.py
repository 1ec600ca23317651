"""``torch.profiler`` ranges per device partition and per fallback op, and Perfetto tracks named
as AWS's Neuron profiler names the engines."""
from __future__ import annotations

import json
import re

import pytest
import torch

import neuron_compiler
from neuron_compiler.runtime import DEVICE_TIME_RANGE
from runtime_sim.trace import track_label


def _compile(fn):
    torch._dynamo.reset()          # a fresh compile: its first call is the warm-up
    return torch.compile(fn, backend="neuron")


def model(x, w):
    h = torch.relu(x @ w)
    return torch.fft.rfft(h, dim=-1).real * 2.0


def test_record_function_ranges_per_partition_and_fallback():
    f = _compile(model)
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    f(x, w)
    with torch.profiler.profile() as prof, neuron_compiler.profile() as ours:
        f(x, w)
    names = [e.name for e in prof.events()]
    d = ours.to_dict()
    partitions = {p["name"] for p in d["partitions"]}
    assert len(partitions) == 2
    for p in partitions:
        assert names.count(f"neuron partition: {p}") == 1, (p, names)
    assert names.count("neuron fallback: aten._fft_r2c.default") == 1
    ranges = [e for e in prof.events() if e.name.startswith("neuron ")]
    assert all(e.cpu_time_total > 0 for e in ranges)


def test_trace_tracks_are_named_after_the_engines(tmp_path):
    f = _compile(lambda x, w: torch.softmax(x @ w, dim=-1))
    with neuron_compiler.profile() as prof:
        f(torch.randn(64, 96), torch.randn(96, 80))
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "pe (TensorE)" in tracks and any(t.startswith("dma") and "(DMA queue " in t
                                            for t in tracks), tracks
    assert tracks <= {track_label(q) for q in ("pe", "dve", "act", "pool")} | {
        t for t in tracks if t.startswith("dma")}


def test_track_label():
    assert [track_label(q) for q in ("pe", "dve", "act", "pool", "dma12", "other")] == [
        "pe (TensorE)", "dve (VectorE)", "act (ScalarE)", "pool (GpSimdE)",
        "dma12 (DMA queue 12)", "other"]


def test_partition_range_carries_the_simulated_device_time():
    """The partition's range lasts the simulator's host time; a range inside it names the
    simulated device time of the call (the profile's figure), much smaller here."""
    f = _compile(lambda x, w: torch.softmax(x @ w, dim=-1))
    x, w = torch.randn(64, 96), torch.randn(96, 80)
    f(x, w)
    with torch.profiler.profile() as prof, neuron_compiler.profile() as ours:
        f(x, w)
    (part,) = ours.to_dict()["partitions"]
    events = list(prof.events())
    (outer,) = [e for e in events if e.name == f"neuron partition: {part['name']}"]
    (inner,) = [e for e in events if e.name.startswith(DEVICE_TIME_RANGE)]
    match = re.fullmatch(rf"{DEVICE_TIME_RANGE}(\S+) ([\d.]+) us simulated on trn2", inner.name)
    assert match and match.group(1) == part["name"], inner.name
    assert float(match.group(2)) == pytest.approx(part["simulated_time_us"], abs=1e-3)
    start, end = outer.time_range.start, outer.time_range.end
    assert start <= inner.time_range.start <= inner.time_range.end <= end   # nested in it
    assert outer.cpu_time_total > 10 * part["simulated_time_us"]    # host time >> device time
