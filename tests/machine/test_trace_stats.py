"""Statistics of a run and the Chrome trace-event JSON, validated against what Perfetto's JSON
importer needs (object with a ``traceEvents`` list; metadata ``M`` events naming processes and
threads; complete ``X`` events with numeric ``ts``/``dur`` in microseconds, integer pid/tid, a
string name and JSON-serialisable ``args``; strict JSON: no NaN/Infinity)."""
from __future__ import annotations

import json
import math

import numpy as np

from runtime_sim import DType, simulate, to_chrome_trace, write_chrome_trace
from runtime_sim.calibration import mamba as mb
from runtime_sim.calibration import matmul as mm


def _strict_load(text: str) -> dict:
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


def validate_perfetto(doc: dict) -> dict[int, str]:
    """Raise AssertionError unless ``doc`` is a trace Perfetto's JSON importer accepts; return the
    thread names by tid."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]
    names: dict[tuple[int, int], str] = {}
    for e in doc["traceEvents"]:
        assert isinstance(e, dict) and e.get("ph") in ("M", "X"), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("name"), str) and e["name"], e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
        else:
            for k in ("ts", "dur"):
                v = e.get(k)
                assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, e
            assert isinstance(e.get("args", {}), dict)
            assert all(isinstance(v, (str, int, float)) for v in e.get("args", {}).values()), e
            assert (e["pid"], e["tid"]) in names, f"event on an unnamed track: {e}"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    return {tid: n for (_, tid), n in names.items()}


def test_trace_of_a_calibration_kernel_opens_in_perfetto(tmp_path):
    prog = mm.fully_optimized("trn2", M=512, K=256, N=1024, dtype=DType.FP32, tiles_m=2, tiles_n=2, tiles_k=2)
    r = np.random.default_rng(0)
    feeds = {"lhsT": r.standard_normal((256, 512)).astype(np.float32),
             "rhs": r.standard_normal((256, 1024)).astype(np.float32)}
    res = simulate(prog, feeds, trace=True)
    p = write_chrome_trace(tmp_path / "mm.json", {"matmul": res, "again": res})
    doc = _strict_load(p.read_text())
    names = validate_perfetto(doc)
    # one track per engine and per DMA queue used, in pe, dve, act, pool, dma order
    assert {"pe", "dve", "dma0", "dma16", "dma32"} <= set(names.values())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert len(xs) == prog.num_instructions
    assert max(e["ts"] + e["dur"] for e in xs) * 1000 <= res.stats.total_ns + 1e-6
    assert all("instr" in e["args"] and "completed_ns" in e["args"] for e in xs)
    single = to_chrome_trace(res)
    assert single["otherData"]["total_ns"] == res.stats.total_ns


def test_statistics_of_a_run():
    prog = mb.mamba_v2("trn1", 1, 256, 256, 2)
    res = simulate(prog, mode="timing")
    st = res.stats
    d = st.to_dict()
    assert st.instructions == prog.num_instructions
    # DMA count and bytes: 2 x (delta, u) tiles + (A, B, C) per state + 2 output tiles
    assert st.dma_count == 2 * 2 + 2 * 2 * 3 + 2
    assert st.dma_bytes == 2 * 2 * 128 * 256 * 4 + 2 * 2 * (128 + 256 + 256) * 4 + 2 * 128 * 256 * 4
    assert st.hbm_bytes == st.dma_bytes and st.spill_bytes == 0
    assert 0 < st.hbm_utilisation() < 1 and 0 < st.tensor_flop_utilisation() < 1
    assert d["hbm_utilisation"] == st.hbm_utilisation() and "tensor_flop_utilisation" in d
    assert st.flops == 8 * 2 * 1 * 128 * 256          # 8 partition broadcasts: K=1 matmuls
    assert set(st.semaphore_wait_ns) == {"pe", "dve", "act", "pool", "dma"}
    assert st.semaphore_wait_ns["dve"] > 0            # VectorE waits for the first loads
    busy = st.busy_fraction()
    assert busy["dve"] > 0.3 and all(0 <= v <= 1 for v in busy.values())
    assert 0 < st.roofline_ns <= st.total_ns
    assert st.sbuf_peak_bytes > 0 and st.psum_peak_bytes == 4 * 2048 * 128
