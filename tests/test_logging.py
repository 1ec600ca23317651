"""The ``neuron_compiler`` logger through ``torch._logging`` (TORCH_LOGS, set_logs) and the
tlparse artifacts through ``trace_structured`` (TORCH_TRACE)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_compiler import logs
from neuron_compiler.errors import NeuronInternalError
from neuron_compiler.testing import compile_for_neuron

ROOT = Path(__file__).resolve().parents[1]

# A device partition, a fallback op (logcumsumexp), a recompile of f (a second shape: a second
# compile id of its frame), a second frame (h), and a program-cache hit (an identical model after
# a reset). Every partition compiles lazily at its first call, after Dynamo's compile returned.
SCRIPT = textwrap.dedent("""
    import torch
    def f(a):
        return torch.logcumsumexp(a, 0).sin() + 1
    def h(a):
        return a.cos() * 2
    x = torch.randn(2, 8)
    g1 = torch.compile(f, backend="neuron", dynamic=False)
    g1(x)
    g1(torch.randn(3, 8))
    torch.compile(h, backend="neuron")(torch.randn(4, 4))
    torch._dynamo.reset()
    g2 = torch.compile(lambda a: torch.logcumsumexp(a, 0).sin() + 1, backend="neuron")
    g2(x)
    print("done")
""")


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    e.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]))
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    return proc


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One run of SCRIPT with TORCH_LOGS=+neuron_compiler and TORCH_TRACE (shared: ~20 s)."""
    tmp = tmp_path_factory.mktemp("traced")
    trace_dir = tmp / "trace"
    return _run(tmp, TORCH_LOGS="+neuron_compiler", TORCH_TRACE=str(trace_dir)), trace_dir


def _ours(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "neuron_compiler/" in ln]


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_torch_logs_debug_and_torch_trace(traced):
    proc, trace_dir = traced
    text = "\n".join(_ours(proc.stderr))
    assert "1 device partition(s), 2 device nodes, 1 fallback nodes" in text
    assert "fallback aten.logcumsumexp.default x1: aten.logcumsumexp.default:" in text  # op and reason
    assert "/fused_0: compiled in " in text and " instructions" in text
    assert "/fused_0: program cache hit (first lowered for inference_" in text
    assert "fused_0: aten.add.Tensor x1, aten.sin.default x1" in text          # DEBUG
    assert "fallback node logcumsumexp:" in text and "signature (float32[2, 8])" in text

    files = list(trace_dir.iterdir())
    assert files, "TORCH_TRACE wrote no file"
    trace = "".join(f.read_text() for f in files)
    assert '"name": "neuron_compiler_graph"' in trace
    assert '"name": "neuron_compiler_partition"' in trace
    lines = trace.splitlines()
    i = next(i for i, ln in enumerate(lines) if '"neuron_compiler_graph"' in ln)
    payload = json.loads(lines[i + 1].strip())       # the payload follows, tab-indented
    assert payload["partitions"] == {"fused_0": {"aten.add.Tensor": 1, "aten.sin.default": 1}}
    assert payload["fallbacks"][0]["op"] == "aten.logcumsumexp.default"
    assert payload["fallback_nodes"] == 1 and payload["target"] == "trn2"


def _trace_events(trace_dir: Path) -> list[tuple[dict, str]]:
    """(metadata, payload) of every structured event TORCH_TRACE wrote: a glog prefix, `] `,
    the metadata as JSON, then the payload's lines, each starting with a tab."""
    events: list[tuple[dict, list[str]]] = []
    for f in sorted(trace_dir.iterdir()):
        for line in f.read_text().splitlines():
            if line.startswith("\t") and events:
                events[-1][1].append(line[1:])
            elif "] {" in line:
                events.append((json.loads(line.split("] ", 1)[1]), []))
    return [(m, "\n".join(p)) for m, p in events]


def test_artifacts_carry_the_compile_id_of_their_dynamo_compile(traced):
    _, trace_dir = traced
    ours = [(m, json.loads(p)) for m, p in _trace_events(trace_dir)
            if m.get("artifact", {}).get("name", "").startswith("neuron_compiler")]
    graphs = [(m, p) for m, p in ours if m["artifact"]["name"] == "neuron_compiler_graph"]
    parts = [(m, p) for m, p in ours if m["artifact"]["name"] == "neuron_compiler_partition"]
    assert len(graphs) == 4 and len(parts) == 4, [m for m, _ in ours]
    ids = [(m.get("frame_id"), m.get("frame_compile_id")) for m, _ in graphs]
    # f, f recompiled, h: three compiles (torch._dynamo.reset() restarts the ids: the lambda's
    # compile after it is (0, 0) again)
    assert None not in {i for pair in ids for i in pair} and len(set(ids[:3])) == 3, ids
    assert ids[0][0] == ids[1][0] and ids[1][1] == ids[0][1] + 1      # f, then f recompiled
    ids_of: dict[str, set] = {}         # f and the lambda after the reset: one graph name
    for m, p in graphs:
        ids_of.setdefault(p["name"], set()).add((m["frame_id"], m["frame_compile_id"]))
    for m, p in parts:                  # tlparse files an artifact without ids under [-/-]
        assert "frame_id" in m and "frame_compile_id" in m, (p["graph"], m)
        assert (m["frame_id"], m["frame_compile_id"]) in ids_of[p["graph"]], (p["graph"], m)


def test_artifact_takes_an_explicit_compile_id(monkeypatch):
    from torch._guards import CompileId
    from torch._logging._internal import trace_log
    seen: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.metadata)  # type: ignore[attr-defined]

    # ours alone (torch's lazy handler removes itself while the handlers are iterated)
    monkeypatch.setattr(trace_log, "handlers", [Keep()])
    level = trace_log.level
    trace_log.setLevel(logging.DEBUG)                            # as TORCH_TRACE sets it
    try:
        assert logs.current_compile_id() is None                 # no Dynamo compile running
        logs.artifact("neuron_compiler_test", lambda: {"x": 1},
                      compile_id=CompileId(frame_id=7, frame_compile_id=2))
        logs.artifact("neuron_compiler_test", lambda: {"x": 2})
    finally:
        trace_log.setLevel(level)
    assert len(seen) == 2, seen
    assert (seen[0]["frame_id"], seen[0]["frame_compile_id"]) == (7, 2)
    assert "frame_id" not in seen[1]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    h = _Records()
    logs.log.addHandler(h)
    yield h.records
    logs.log.removeHandler(h)


def _compile_and_run() -> None:
    with torch.no_grad():
        compile_for_neuron(lambda x: torch.relu(x) * 3.0)(torch.randn(4, 8))


def test_registration_is_idempotent_and_set_logs_knows_us(records, monkeypatch, capfd):
    from torch._logging._internal import log_registry
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    assert logs.REGISTERED and log_registry.is_log("neuron_compiler")
    before = dict(log_registry.log_alias_to_log_qnames)
    assert logs._register() and dict(log_registry.log_alias_to_log_qnames) == before
    _compile_and_run()                           # not asked for: nothing of ours is printed
    assert _ours(capfd.readouterr().err) == [] and records == []
    try:
        torch._logging.set_logs(modules={"neuron_compiler": logging.INFO})
        assert logs.log.getEffectiveLevel() == logging.INFO
        torch._dynamo.reset()
        _compile_and_run()
    finally:
        torch._logging.set_logs()
    printed = "\n".join(_ours(capfd.readouterr().err))
    assert "1 device partition(s)" in printed and "/fused_0: " in printed    # torch's handler
    assert "signature (" not in printed                                       # no DEBUG lines
    msgs = [r.getMessage() for r in records]
    assert any("1 device partition(s)" in m for m in msgs), msgs
    assert all(r.levelno >= logging.INFO for r in records)
    assert logs.log.getEffectiveLevel() > logging.INFO          # set_logs() switched us off
    records.clear()
    torch._dynamo.reset()
    _compile_and_run()
    assert records == []


def test_compile_failure_is_logged_with_partition_and_op(records, monkeypatch):
    api = pytest.importorskip("lowering.api")
    from lowering.errors import LoweringError

    def compile_graph(gm, specs, target, dump=None, name=None):
        mul = next(n for n in gm.graph.nodes if "mul" in str(n.target))
        raise LoweringError(f"lowering {mul.format_node()} failed")

    monkeypatch.setattr(api, "compile_graph", compile_graph)
    f = compile_for_neuron(lambda x: torch.relu(x * 2.0) + 1.0)
    with pytest.raises(NeuronInternalError), torch.no_grad():
        f(torch.randn(4, 8))
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "compile failed" in warned[0] and "/fused_0" in warned[0]
    assert "aten.mul.Tensor (node mul)" in warned[0]
