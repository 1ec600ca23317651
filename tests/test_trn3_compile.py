"""The NeuronCore-v4 features the compiler uses, through ``torch.compile`` on trn3: VectorE's
fast exponential in attention's softmax and TensorE's background transposes, with values that
match eager and the instructions seen in the program and in the trace. (Each feature's own
semantics, cost and checks: tests/machine/test_trn3_features.py, test_trn3_mx.py.)

Not used by the compiler, and why (docs/simulator.md, section 8): bf16 PSUM results would round
every score or partial sum to 8 bits before the softmax or the next K step; MX matmuls need
block-scaled fp8 operands, which no CPU model can express (torch 2.13's CPU ``_scaled_mm``
rejects e8m0 block scales: tensor-wise and row-wise scaling only)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import neuron_compiler


def _run(target: str, tmp_path: Path, q, k, v):
    torch._dynamo.reset()
    fn = torch.compile(F.scaled_dot_product_attention, backend="neuron",
                       options={"target": target, "dump_dir": str(tmp_path / target)})
    with torch.no_grad(), neuron_compiler.profile() as prof:
        out = fn(q, k, v)
    trace = tmp_path / f"{target}.json"
    prof.export_chrome_trace(str(trace))
    program = "".join(p.read_text() for p in (tmp_path / target).rglob("program.txt"))
    return out, prof.to_dict(), json.loads(trace.read_text())["traceEvents"], program


def _tracks(events) -> dict[str, int]:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    n: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "X":
            key = names.get((e["pid"], e["tid"]), "?")
            n[key] = n.get(key, 0) + 1
    return n


def test_attention_on_trn3_uses_the_fast_exponential_and_background_transposes(tmp_path):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 128, generator=g).to(torch.bfloat16) for n in (256, 1024, 1024))
    out, d, events, program = _run("trn3", tmp_path, q, k, v)
    assert d["fallback_nodes"] == 0 and d["device_nodes"] >= 1, d["fallbacks"]
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    with pytest.raises(AssertionError):                    # the tolerance can fail
        torch.testing.assert_close(out * 0.5, ref, atol=2e-2, rtol=2e-2)
    assert "exponential" in program, "no VectorE exponential in the trn3 program"
    tracks = _tracks(events)
    assert any(t.startswith("pe.bg") for t in tracks), tracks


def test_trn2_program_of_the_same_attention_has_neither(tmp_path):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 128, generator=g).to(torch.bfloat16) for n in (256, 1024, 1024))
    out, d, events, program = _run("trn2", tmp_path, q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=2e-2, rtol=2e-2)
    assert "exponential" not in program
    assert not any(t.startswith("pe.bg") for t in _tracks(events))
