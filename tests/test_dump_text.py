"""The dump's text views, from hand-written dump files (no compile): ``neuron-dump diff`` never
cuts silently, ``decisions.md`` states each reason once, ``signature.txt`` has one input per
line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from neuron_compiler.dump import format_signature, signature_lines, signature_summary
from neuron_compiler.dump_diff import CELL, GRAPH_LINES
from neuron_compiler.dump_views import decisions, decisions_markdown
from neuron_compiler.inspect import main as neuron_dump

# ---- signature.txt ------------------------------------------------------------------------------
# 20 inputs, as a transformer block's partition has them: the old one-line form was 400+ chars
SIG = tuple(("T", (768, 3072 + i), "bfloat16", i % 3 == 0) for i in range(20)) + (("S", 7),
                                                                                  ("O", "Foo"))


def test_signature_is_one_input_per_line():
    text = format_signature(SIG)
    lines = text.splitlines()
    assert len(lines) == len(SIG) and max(len(ln) for ln in lines) < 60
    assert lines[0] == "arg0: bfloat16[768, 3072] (parameter)"
    assert lines[1] == "arg1: bfloat16[768, 3073]"
    assert lines[-2:] == ["arg20: 7", "arg21: Foo"]
    assert signature_lines(text)[1] == "bfloat16[768, 3073]"
    assert signature_summary(text) == "22 inputs (signature.txt)"
    short = format_signature((("T", (8, 16), "float32", False),))
    assert signature_summary(short) == "float32[8, 16]"
    old = "(float32[2, 100, 64], float32[64], 3)\n"                 # an older dump's one line
    assert signature_lines(old) == ["float32[2, 100, 64]", "float32[64]", "3"]
    assert format_signature(()) == "(no inputs)\n" and signature_summary("(no inputs)\n") == "-"


# ---- neuron-dump diff ---------------------------------------------------------------------------
def _dump(root: Path, graph_lines: list[str], sig: tuple, ops: dict[str, int]) -> Path:
    cdir = root / "000_inference_0123abcd"
    pdir = cdir / "fused_0.s0"
    pdir.mkdir(parents=True)
    (cdir / "compile.json").write_text(json.dumps({
        "kind": "inference", "target": "trn2", "device_nodes": sum(ops.values()),
        "fallback_nodes": 0, "fallbacks": [], "partitions": {"fused_0": ops}}))
    (cdir / "fx_graph_readable.py").write_text("\n".join(graph_lines) + "\n")
    (pdir / "signature.txt").write_text(format_signature(sig))
    (pdir / "compiled.json").write_text(json.dumps({"instructions_per_queue": {"pe": 4}}))
    (pdir / "stats.json").write_text(json.dumps({"total_ns": 1000.0, "roofline_ns": 500.0}))
    return root


@pytest.fixture
def two_dumps(tmp_path):
    graph = [f"    mul_{i}: f32[8] = torch.ops.aten.mul.Tensor(x, {i})" for i in range(100)]
    changed = graph[:20] + [ln.replace("mul", "add") for ln in graph[20:50]] + graph[50:]
    ops_a = {f"aten.op_number_{i}.default": 1 for i in range(8)}
    ops_b = dict(ops_a, **{"aten.op_number_99.default": 2})
    sig_b = SIG[:5] + (("T", (768, 4096), "bfloat16", False),) + SIG[6:]
    a = _dump(tmp_path / "a", graph, SIG, ops_a)
    b = _dump(tmp_path / "b", changed, sig_b, ops_b)
    return a, b


def test_diff_shows_every_change_or_says_how_many_more(two_dumps, capsys):
    a, b = two_dumps
    assert neuron_dump(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    shown = [ln.strip() for ln in out.splitlines() if re.match(r"\s+[-+]    (mul|add)_", ln)]
    assert len(shown) == GRAPH_LINES == 40                       # 60 changed lines
    assert "... 20 more changed lines (all of them: neuron-dump diff --full DIR_A DIR_B)" in out
    assert "graph" in out and "changed (+30 -30 lines)" in out
    # the signature: one input changed, shown as a line diff of the inputs
    assert "-bfloat16[768, 3077]" in out and "+bfloat16[768, 4096]" in out
    # the ops cell is longer than CELL: cut with "...", and the changed row printed whole below
    row = next(ln for ln in out.splitlines() if ln.startswith("* fused_0 ops"))
    assert " ... " in row
    whole = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(("A: ", "B: "))]
    assert any("op_number_99.default x2" in ln for ln in whole), whole
    assert any(ln.startswith("A: ") and "op_number_7.default x1" in ln for ln in whole)
    assert f"was cut at {CELL} characters" in out
    for ln in out.splitlines():                                 # no cell longer than CELL
        if ln.startswith(("* ", "  ")) and not ln.startswith("      "):
            assert all(len(c) <= CELL for c in re.split(r"\s{2,}", ln[2:])), ln

    assert neuron_dump(["diff", "--full", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    shown = [ln for ln in out.splitlines() if re.match(r"\s+[-+]    (mul|add)_", ln)]
    assert len(shown) == 60 and "more changed lines" not in out


def test_diff_of_identical_dumps_says_same(two_dumps, capsys):
    a, _ = two_dumps
    assert neuron_dump(["diff", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("same") and "\n*" not in out


# ---- decisions.md -------------------------------------------------------------------------------
POST = """\
buffer %in0: 64 x float32 (input)
buffer %t1: 64 x float32 (temp)
buffer %t2: 64 x float32 (temp)
buffer %t3: 64 x float32 (temp)
buffer %t4: 64 x float32 (output)
%t1[8, 8]:float32 = matmul[](%in0[8, 8]:float32, %in0[8, 8]:float32)  # mm
%t2[8, 8]:float32 = matmul[](%t1[8, 8]:float32, %in0[8, 8]:float32)  # mm_1
%t3[8, 1]:float32 = reduce[op=ReduceOp.SUM](%t1[8, 8]:float32)  # sum_1
%t4[8, 8]:float32 = attention[](%t2[8, 8]:float32, %t2[8, 8]:float32, %t3[8, 8]:float32)  # bmm,_softmax,bmm_1
# WhyNoFuse matmul -> matmul at mm -> mm_1: %t1: no rule for matmul into matmul
# WhyNoFuse matmul -> reduce at mm -> sum_1: %t1: no rule for matmul into reduce
# WhyNoFuse matmul -> attention at mm_1 -> bmm,_softmax,bmm_1: %t2: no rule for matmul into attention
# WhyNoFuse attention at bmm,_softmax,bmm_1: values are not one batch form
"""


def test_decisions_state_each_reason_once():
    md = decisions_markdown(decisions({"ir_pre_fusion.txt": POST, "ir_post_fusion.txt": POST}))
    fusion = md.split("## Fusion")[1].split("## Matmul blocking")[0]
    for reason in ("no rule for matmul into matmul", "no rule for matmul into reduce",
                   "no rule for matmul into attention", "values are not one batch form"):
        assert fusion.count(reason) == 1, (reason, fusion)
    assert fusion.count("%t1:") == 1                     # one entry per tensor
    t1 = fusion.split("- %t1:")[1].split("\n- ")[0]
    assert "  - k1 matmul (mm_1): no rule for matmul into matmul" in t1
    assert "  - k2 reduce (sum_1): no rule for matmul into reduce" in t1
    # the line that names no tensor: listed once, referred to from each edge it names
    edges, listed = fusion.split("Refused fusions recorded")
    assert edges.count("[R1]") == 2                      # the %t2 and %t3 edges refer to it
    assert ("- [R1] WhyNoFuse attention at bmm,_softmax,bmm_1: values are not one batch form"
            in listed)
