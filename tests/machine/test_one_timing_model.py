"""One timing model: the compiler (``lowering``) prices work only through ``runtime_sim.costs``
(``instr_cost``, ``dma_tile_data_ns``, ``min_ii_ns``, ``static_busy``, ...), never by its own
formula over the machine's rates. So a change to the machine reaches the compiler's choices.

The check is syntactic: no module of ``lowering`` reads a ``Target`` field that only a cost rule
needs (a clock, a bandwidth, a per-instruction overhead, a speed factor) or imports a cost
helper that exposes one (``clock_ghz``). Fields that are capacities or capabilities
(partitions, PSUM banks, ``min_ii_cycles`` as an element-count threshold), a rate compared as a
capability (``t.fp8_matmul_speedup >= 2``: is there a double-row mode) and ``dma_transfer_ns``
as a latency stay allowed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RATE = re.compile(r"(_clock_ghz|bytes_per_ns(_per_core)?|dma_min_chunk_bytes|dependent_vector_penalty_cycles"
                  r"|access_overhead_cycles|_fast_(copy|tt)_factor|scalar_bf16_factor|fp32_matmul_slowdown"
                  r"|fp8_matmul_speedup|shared_ports|pe_ramp_\w+|load_stationary_speedup"
                  r"|philox_cycles_per_element|dma_swdge_ns|peak_flops_per_ns|vector_exp_speedup"
                  r"|mm_init_latency_cycles)$")


def offenders(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        compared = {id(x) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                    for x in (n.left, *n.comparators)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and RATE.search(node.attr) and id(node) not in compared:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "runtime_sim.costs":
                out += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}"
                        for a in node.names if a.name == "clock_ghz"]
    return out


def test_lowering_has_no_timing_formula_of_its_own():
    bad = offenders(ROOT / "lowering")
    assert not bad, "price work through runtime_sim.costs instead:\n" + "\n".join(bad)


def test_the_check_finds_a_copied_formula(tmp_path):
    (tmp_path / "x.py").write_text("def f(t, n):\n    ok = t.fp8_matmul_speedup >= 2\n"
                                   "    return n / t.dma_engine_bytes_per_ns\n")
    (tmp_path / "y.py").write_text("from runtime_sim.costs import clock_ghz\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert len(offenders(tmp_path)) == 2
    finally:
        ROOT = old
