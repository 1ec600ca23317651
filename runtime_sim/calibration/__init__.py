"""Calibration of the timing model against published measurements.

- ``builder``: a small program builder (buffer placement and automatic semaphores) for
  hand-written kernels;
- ``matmul``: the NKI matmul tutorial's four kernels; ``mamba``: the fused Mamba tutorial's;
  ``mamba_spill``: its ``mamba_v2`` beyond one PSUM bank, with the evictions SBUF capacity
  forces at seq >= 7168; ``layernorm``: the LayerNorm tutorial's two kernels; ``probes``: DMA
  probes (the DMA overview's Example 1, the bandwidth guide's bytes-per-partition statements);
- ``suite``: the published figures, each with its source, and the programs that reproduce them;
- ``fit``: the simulated values, the fits of the FITTED constants, leave-one-out errors,
  sensitivities, the mean absolute error and the table (``python -m runtime_sim.calibrate``).

The programs are written in the ISA by hand, following each tutorial's source instruction for
instruction; they are not produced by the compiler (``lowering``), which this package never imports.
"""
from .fit import FITTED, Fitted, Report, Row, fit_constant, format_table, mae, run_suite, solve
from .suite import CASES, DOCS, Case, Figure

__all__ = ["CASES", "DOCS", "FITTED", "Case", "Figure", "Fitted", "Report", "Row", "fit_constant",
           "format_table", "mae", "run_suite", "solve"]
