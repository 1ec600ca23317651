"""Calibration of the timing model against published measurements.

- ``builder``: a small program builder (buffer placement and automatic semaphores) for
  hand-written kernels;
- ``matmul``: the NKI matmul tutorial's four kernels; ``mamba``: the fused Mamba tutorial's;
  ``mamba_spill``: its ``mamba_v2`` beyond one PSUM bank, with the evictions SBUF capacity
  forces at seq >= 7168; ``layernorm``: the LayerNorm tutorial's two kernels; ``probes``: DMA
  probes (the DMA overview's Example 1, the bandwidth guide's bytes-per-partition statements);
- ``suite``: the published figures, each with its source, and the programs that reproduce them;
- ``evaluate``: the simulated values, every row's sensitivity to the ASSUMED constants, the
  mean absolute error and the table (``python -m runtime_sim.calibrate``). No constant is
  fitted to a published figure.

The programs are written in the ISA by hand, following each tutorial's source instruction for
instruction; they are not produced by the compiler (``lowering``), which this package never imports.
"""
from .evaluate import ASSUMED, Assumed, Report, Row, format_table, mae, run_suite
from .suite import CASES, DOCS, Case, Figure

__all__ = ["ASSUMED", "CASES", "DOCS", "Assumed", "Case", "Figure", "Report", "Row", "format_table",
           "mae", "run_suite"]
