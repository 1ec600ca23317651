"""What one simulation measured.

Invariants
- Times are simulated nanoseconds on the target's clocks, never host wall time.
- ``engine_busy_ns`` is keyed by engine name (``pe``, ``dve``, ``act``, ``pool``, ``dma``); for
  ``dma`` it is the time at least one DMA queue was transferring (union of intervals), so every
  busy fraction lies in [0, 1].
- ``tensor_flop_utilisation()`` = matmul FLOPs / (bf16 TensorE peak x total time);
  ``hbm_utilisation()`` = DMA HBM bytes / (the core's HBM share x total time).
- ``roofline_ns`` is the largest of: FLOPs at TensorE peak, the program's minimum HBM traffic
  (its input and output buffers, each moved once) at the core's share of HBM bandwidth, and, per
  Vector/Scalar/GpSimd engine, its element work at the rate that engine streams each
  instruction (``costs.Cost.work_ns``: no MIN_II floor, fixed overhead or dependency penalty).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimStats:
    target: str
    total_ns: float = 0.0
    instructions: int = 0
    engine_busy_ns: dict[str, float] = field(default_factory=dict)
    semaphore_wait_ns: dict[str, float] = field(default_factory=dict)
    flops: int = 0
    hbm_bytes: int = 0                # bytes read from or written to HBM by DMA
    min_hbm_bytes: int = 0            # program inputs + outputs
    dma_count: int = 0
    dma_bytes: int = 0
    spill_bytes: int = 0              # DMA bytes into/out of buffers whose name starts "spill"
    sbuf_peak_bytes: int = 0          # per-partition high-water mark x partitions
    psum_peak_bytes: int = 0
    roofline_ns: float = 0.0
    tensor_peak_flops_per_ns: float = 0.0   # the target's bf16 TensorE peak (for the utilisation)
    hbm_peak_bytes_per_ns: float = 0.0      # the core's share of HBM bandwidth

    def busy_fraction(self) -> dict[str, float]:
        if self.total_ns <= 0:
            return {k: 0.0 for k in self.engine_busy_ns}
        return {k: min(1.0, v / self.total_ns) for k, v in self.engine_busy_ns.items()}

    def tensor_flop_utilisation(self, peak_flops_per_ns: float | None = None) -> float:
        """Matmul FLOPs / (peak x total time); the peak defaults to the target's bf16 peak."""
        peak = peak_flops_per_ns or self.tensor_peak_flops_per_ns
        if self.total_ns <= 0 or peak <= 0:
            return 0.0
        return self.flops / (peak * self.total_ns)

    def hbm_utilisation(self, bytes_per_ns: float | None = None) -> float:
        """HBM bytes moved by DMA / (the core's HBM bandwidth share x total time)."""
        bw = bytes_per_ns or self.hbm_peak_bytes_per_ns
        if self.total_ns <= 0 or bw <= 0:
            return 0.0
        return self.hbm_bytes / (bw * self.total_ns)

    def to_dict(self) -> dict:
        return {
            "target": self.target, "total_ns": self.total_ns, "instructions": self.instructions,
            "engine_busy": self.busy_fraction(), "semaphore_wait_ns": dict(self.semaphore_wait_ns),
            "flops": self.flops, "hbm_bytes": self.hbm_bytes, "min_hbm_bytes": self.min_hbm_bytes,
            "dma_count": self.dma_count, "dma_bytes": self.dma_bytes,
            "spill_bytes": self.spill_bytes, "sbuf_peak_bytes": self.sbuf_peak_bytes,
            "psum_peak_bytes": self.psum_peak_bytes, "roofline_ns": self.roofline_ns,
            "tensor_flop_utilisation": self.tensor_flop_utilisation(),
            "hbm_utilisation": self.hbm_utilisation(),
        }


@dataclass
class TraceEvent:
    """One executed instruction: a Chrome trace-event ``X`` (complete) event on ``queue``'s track."""

    queue: str
    name: str
    start_ns: float
    dur_ns: float
    args: dict[str, str] = field(default_factory=dict)


@dataclass
class SimResult:
    stats: SimStats
    outputs: dict[str, "object"] = field(default_factory=dict)  # name -> np.ndarray (uint8 bytes)
    trace: list[TraceEvent] = field(default_factory=list)
