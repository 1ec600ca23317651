"""Calibration of the timing model against published measurements.

- ``builder``: a small program builder (buffer placement and automatic semaphores) for
  hand-written kernels;
- ``matmul``: the NKI matmul tutorial's four kernels; ``mamba``: the fused Mamba tutorial's;
  ``mamba_spill``: its ``mamba_v2`` at seq 8192 with the spill plan SBUF capacity forces;
- ``suite``: the published figures, the runs and the table (``python -m runtime_sim.calibrate``).

The programs are written in the ISA by hand, following each tutorial's loop structure; they are
not produced by the compiler (``lowering``), which this package never imports.
"""
from .suite import CASES, Case, Row, format_table, run_case

__all__ = ["CASES", "Case", "Row", "format_table", "run_case"]
