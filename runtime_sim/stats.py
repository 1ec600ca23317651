"""What one simulation measured.

Invariants
- Times are simulated nanoseconds on the target's clocks, never host wall time.
- ``engine_busy_ns`` is keyed by engine name (``pe``, ``dve``, ``act``, ``pool``, ``dma``); for
  ``dma`` it is the time at least one DMA queue was transferring (union of intervals), so every
  busy fraction lies in [0, 1].
- ``tensor_flop_utilisation()`` = matmul FLOPs / (bf16 TensorE peak x total time);
  ``hbm_utilisation()`` = DMA HBM bytes / (the core's HBM share x total time).
- ``roofline_ns`` is the physical floor of the program's work on one NeuronCore, the largest of
  ``roofline_tensor_ns`` (matmul FLOPs at the TensorE peak for their dtype),
  ``roofline_scalar_ns`` (transcendental activation elements at the ScalarE rate; the set is
  ``sim_static.TRANSCENDENTAL``) and ``roofline_hbm_ns`` (``min_hbm_bytes``, the compulsory
  traffic: every program input read once and every output written once, at the core's share of
  HBM bandwidth). It never grows with the bytes a program happens to move: that traffic is
  ``hbm_bytes``, reported beside it as ``traffic_ratio() = hbm_bytes / min_hbm_bytes`` (1.0 =
  nothing moved twice; None when the program has no compulsory bytes).
- ``roofline_ns <= total_ns`` for every program that reads each of its inputs and writes each
  of its outputs (each floor term is a lower bound of the time of the instructions it counts).
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
    min_hbm_bytes: int = 0            # compulsory: program inputs read once + outputs written once
    dma_count: int = 0
    dma_bytes: int = 0
    spill_bytes: int = 0              # DMA bytes into/out of buffers whose name starts "spill"
    sbuf_peak_bytes: int = 0          # per-partition high-water mark x partitions
    psum_peak_bytes: int = 0
    roofline_ns: float = 0.0          # max of the three floors below
    roofline_tensor_ns: float = 0.0   # matmul FLOPs / TensorE peak (per dtype)
    roofline_scalar_ns: float = 0.0   # transcendental elements / ScalarE rate
    roofline_hbm_ns: float = 0.0      # min_hbm_bytes / the core's HBM share
    transcendental_elements: int = 0  # elements of ScalarE activations with a transcendental func
    tensor_peak_flops_per_ns: float = 0.0   # the target's bf16 TensorE peak (for the utilisation)
    hbm_peak_bytes_per_ns: float = 0.0      # the core's share of HBM bandwidth

    def roofline_bound(self) -> str:
        """Which floor binds: ``"tensor"``, ``"scalar"`` or ``"hbm"`` (ties in that order)."""
        floors = {"tensor": self.roofline_tensor_ns, "scalar": self.roofline_scalar_ns,
                  "hbm": self.roofline_hbm_ns}
        return max(floors, key=lambda k: floors[k])

    def traffic_ratio(self) -> float | None:
        """HBM bytes the program moved / its compulsory bytes (None without compulsory bytes)."""
        return self.hbm_bytes / self.min_hbm_bytes if self.min_hbm_bytes > 0 else None

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
            "roofline_tensor_ns": self.roofline_tensor_ns,
            "roofline_scalar_ns": self.roofline_scalar_ns,
            "roofline_hbm_ns": self.roofline_hbm_ns, "roofline_bound": self.roofline_bound(),
            "transcendental_elements": self.transcendental_elements,
            "traffic_ratio": self.traffic_ratio(),
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
