"""Target descriptions: every hardware number the project uses, in one place, with its source.

Sources are paths in the public ``aws-neuron/aws-neuron-sdk`` documentation (as collected in
``shared/hardware.md``); ``sdk@2.26:`` marks the Neuron 2.26 version of the docs. Where AWS
documents disagree, the chosen value is used and the other is named in the comment; a caller can
override any field with ``dataclasses.replace(get_target("trn2"), field=value)``.

Invariants
- A ``Target`` is frozen; the simulator, the cost table and the compiler read numbers only from it.
- Clocks are in GHz (cycles per ns); bandwidths in bytes per ns (== GB/s); sizes in bytes.
- A number fitted to measurements (not read from a document) says ``FITTED`` and what it was
  fitted on.
"""
from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class Target:
    name: str
    neuron_core: str
    cores_per_chip: int

    # --- clocks (GHz) -----------------------------------------------------------------------
    tensor_clock_ghz: float
    vector_clock_ghz: float
    scalar_clock_ghz: float
    gpsimd_clock_ghz: float

    # --- TensorE ------------------------------------------------------------------------------
    pe_rows: int                 # contraction (K) per pass: partitions of stationary/moving
    pe_cols: int                 # stationary free size M
    moving_free_max: int         # N per matmul instruction
    fp32_matmul_slowdown: int    # fp32 runs at 1/this of the bf16 rate
    fp8_matmul_speedup: int      # fp8 rate multiple over bf16 (trn2 double-row, trn3 MX)

    # --- Vector / Scalar / GpSimd ------------------------------------------------------------
    lanes: int                   # elements per cycle in the base mode (one per partition)
    min_ii_cycles: int           # minimum initiation interval of a Vector/Scalar/GpSimd instr
    access_overhead_cycles: int  # fixed cycles per tensor access
    dependent_vector_penalty_cycles: int  # extra cycles of a dependent/tiny Vector instruction
    vector_fast_copy_factor: int   # tensor_copy/tensor_scalar bf16->bf16 SBUF contiguous
    vector_fast_tt_factor: int     # tensor_tensor all-bf16 both SBUF
    scalar_bf16_factor: int        # ScalarE elements/cycle multiple for 2-byte types (trn3)

    # --- on-chip memory ---------------------------------------------------------------------
    sbuf_partitions: int
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_banks: int

    # --- HBM and DMA ------------------------------------------------------------------------
    hbm_bytes_per_ns: float      # per chip
    hbm_bytes_per_chip: int      # capacity
    dma_engines: int             # per core
    dma_queues_per_engine: int
    dma_engine_bytes_per_ns: float
    dma_fixed_latency_ns: float  # setup + semaphore write per transfer
    dma_descriptor_ns: float     # hardware descriptor generation per instruction (NC-v3+)
    dma_partitions_per_engine: int
    dma_transpose_efficiency: float  # HBM->SBUF DMA transpose throughput / plain throughput

    # --- host link (not in hardware.md) -----------------------------------------------------
    host_link_bytes_per_ns: float

    # --- DMA efficiency model (defaulted; used by runtime_sim.costs) ------------------------
    # Each contiguous chunk of a transfer costs as much engine time as this many extra bytes.
    # FITTED to a reading, not to a measurement (runtime_sim.calibration.fit, constant
    # ``dma_chunk_overhead_bytes``: a 1-d root search on a [128, 256 B] stream probe): the DMA
    # guide's "< 256 B per partition: severely overhead-bound" read as "a 256 B chunk costs as
    # much engine time as its payload" (50% at 256 B). Then 2 KiB chunks run at 89% and 4 KiB at
    # 94% ("approaches peak", "saturates": the suite's two bound rows). Unfitted (0), the one DMA
    # measurement it touches, one trn2 engine moving 32 KiB in 1,416 ns (nki-dma-overview.rst),
    # would be 1.006x instead of 1.04x; the trn1 matmul steps show no per-chunk dependence
    # (docs/simulator.md, section 5: sensitivities and leave-one-out).
    dma_chunk_overhead_bytes: float = 256.0
    # SBUF->SBUF DMA transpose throughput / plain throughput (DMA: "SBUF->SBUF up to 50%").
    dma_transpose_sbuf_efficiency: float = 0.5
    # Sustained fraction of dma_engine_bytes_per_ns that DMA data phases reach (1.0: the
    # documented figure is the sustained rate). FITTED on trn1, see TRN1 below.
    dma_efficiency: float = 1.0
    # Indirect DMA (dma_gather / dma_scatter): its descriptors depend on index values in SBUF, so
    # they are generated at run time by software DGE on GpSimd (nki-dge.rst: "swdge is the only
    # mode that supports indirect (gather/scatter) operations"), one descriptor per lookup row
    # (each pays dma_chunk_overhead_bytes in the data phase, like any contiguous chunk).
    # ASSUMED (no published software-DGE figure; nki-dge.rst only says it "consumes GpSimd
    # cycles"): generation occupies the queue as long as hardware DGE's documented ~600 ns per
    # instruction (nki-dge.rst, hardware.md DMA), on every target (trn1's pre-built descriptors
    # cannot serve data-dependent addresses).
    dma_swdge_ns: float = 600.0

    # Philox4x32-10 on GpSimdE (``rand_philox``): ASSUMED, no published figure (NKI's own RNG
    # instructions give no cost). Estimated from the operation count: 10 rounds of two 32x32
    # multiplies (hi and lo words), two xors and a key bump per 4-word block is ~60 32-bit
    # operations per 4 elements, ~15 per element, plus the scaling: 16 cycles per element
    # and partition (each GpSimd core's 16 32-bit lanes serve its 16 partitions).
    philox_cycles_per_element: float = 16.0

    # --- TensorE power ramp (trn2/trn3; hardware.md, tools/neuron-explorer/overview-summary-page.rst:
    # "starts near 50% speed and ramps to full over ~3 us; falls back if utilisation drops below
    # 50% in a ~3 us window"). pe_ramp_start_speed == 1.0 disables the ramp (trn1: not documented).
    pe_ramp_start_speed: float = 1.0
    pe_ramp_ns: float = 3000.0           # busy time from start speed to full speed
    pe_ramp_window_ns: float = 3000.0    # utilisation window (time constant of its moving average)
    pe_ramp_min_utilisation: float = 0.5  # below it the engine falls back to the start speed
    # LoadStationary runs up to 4x faster than a MultiplyMoving of the same free size and
    # normally loads in the background (trainium_inferentia2_arch.rst "Fast/Background
    # LoadStationary"); it is exposed only when TensorE was idle before a matmul with a new
    # stationary: ceil(M / load_stationary_speedup) cycles.
    load_stationary_speedup: int = 4

    # --- NC-v2 shared SBUF/PSUM ports (trainium_inferentia2_arch.rst: "VectorE and GpSimdE
    # cannot access SBUF in parallel; VectorE and ScalarE cannot access PSUM in parallel";
    # trainium2_arch.rst: NC-v3 removes both limits).
    shared_ports: bool = False

    # --- derived ------------------------------------------------------------------------------
    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_bytes_per_partition // self.psum_banks

    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_partitions * self.sbuf_bytes_per_partition

    @property
    def hbm_bytes_per_core(self) -> int:
        """HBM capacity one NeuronCore may use: its chip's, shared evenly by its cores."""
        return self.hbm_bytes_per_chip // self.cores_per_chip

    @property
    def hbm_bytes_per_ns_per_core(self) -> float:
        return self.hbm_bytes_per_ns / self.cores_per_chip

    @property
    def dma_bytes_per_ns(self) -> float:
        return self.dma_engines * self.dma_engine_bytes_per_ns

    @property
    def tensor_peak_flops_per_ns(self) -> float:
        """bf16 peak FLOP/ns of one core: 128 x 128 PEs x 2 FLOP x clock (hardware.md)."""
        return self.pe_rows * self.pe_cols * 2 * self.tensor_clock_ghz

    def peak_flops_per_ns(self, itemsize: int) -> float:
        if itemsize >= 4:
            return self.tensor_peak_flops_per_ns / self.fp32_matmul_slowdown
        if itemsize == 1:
            return self.tensor_peak_flops_per_ns * self.fp8_matmul_speedup
        return self.tensor_peak_flops_per_ns


# Sources used below (hardware.md):
#  ARCH1 = nki/guides/architecture/trainium_inferentia2_arch.rst
#  ARCH2 = nki/guides/architecture/trainium2_arch.rst, about-neuron/arch/neuron-hardware/neuron-core-v3.rst
#  ARCH3 = nki/guides/architecture/trainium3_arch.rst, about-neuron/arch/neuron-hardware/neuron-core-v4.rst
#  DMA   = nki/deep-dives/nki-dma-bandwidth-guide.rst
#  ISA   = sdk@2.26:general/nki/api/nki/isa/__init__.py ("Estimated instruction cost" notes)

TRN1 = Target(
    name="trn1", neuron_core="NeuronCore-v2", cores_per_chip=2,           # ARCH1
    tensor_clock_ghz=2.8,                                                # ARCH1: 92 TF bf16 = 128*128*2*2.8
    vector_clock_ghz=1.12, scalar_clock_ghz=1.4, gpsimd_clock_ghz=1.4,   # ARCH1
    pe_rows=128, pe_cols=128, moving_free_max=512,                       # ARCH1; ISA nc_matmul limits
    fp32_matmul_slowdown=4, fp8_matmul_speedup=1,                        # ARCH1: 23 TF fp32 vs 92 bf16
    lanes=128, min_ii_cycles=64, access_overhead_cycles=60,              # ISA (MIN_II); hardware.md memory rules
    dependent_vector_penalty_cycles=100,                                 # ISA / nki_perf_guide.rst
    vector_fast_copy_factor=1, vector_fast_tt_factor=1, scalar_bf16_factor=1,  # fast modes are trn2+
    sbuf_partitions=128, sbuf_bytes_per_partition=192 * KIB,             # ARCH1: 24 MiB
    psum_bytes_per_partition=16 * KIB, psum_banks=8,                     # ARCH1: 2 MiB, 8 x 2 KiB
    hbm_bytes_per_ns=820.0,                                              # ARCH1: 820 GB/s per chip
    hbm_bytes_per_chip=32 * GIB,                                         # ARCH1: 32 GiB per chip (hardware.md)
    dma_engines=16, dma_queues_per_engine=16,                            # ARCH1
    dma_engine_bytes_per_ns=17.0,                                        # DMA: 272 GB/s per core (ARCH1: 27 GiB/s)
    dma_fixed_latency_ns=1300.0,                                         # DMA: ~1.3 us per transfer
    dma_descriptor_ns=0.0,                                               # software DGE on NC-v2
    dma_partitions_per_engine=8,                                         # DMA
    dma_transpose_efficiency=0.0,                                        # no DMA transpose on trn1
    host_link_bytes_per_ns=32.0,  # ASSUMED (not in hardware.md): PCIe Gen4 x16 ~32 GB/s
    # FITTED on one row (runtime_sim.calibration.fit, constant ``trn1.dma_efficiency``: a 1-d
    # root search over this value, everything else as stored): the NKI matmul tutorial's step
    # "loads hoisted out of the inner loop" (sdk@2.26 matrix_multiplication.rst, trn1, bf16,
    # 42.96 ms). Evidence for a per-byte factor (docs/simulator.md, section 5): the three
    # DMA-bound steps move 5.4 / 4.4 / 2.2 GB in 51.8 / 43.0 / 22.1 ms, 105 / 103 / 103 GB/s per
    # core (0.38-0.39 of the documented 16 x 17 GB/s) whether the contiguous runs are 256 B or
    # 1 KiB; with the 256 B per-chunk overhead above charged on top, the data phases run at
    # 0.478 of the documented per-engine rate. The tiled and blocked steps share the hoisted
    # step's DMA bottleneck: they confirm this number, not independently of it.
    dma_efficiency=0.478,
    shared_ports=True,                                                   # ARCH1: NC-v2 port limits
)

TRN2 = Target(
    name="trn2", neuron_core="NeuronCore-v3", cores_per_chip=8,           # ARCH2
    tensor_clock_ghz=2.4,                                                # ARCH2: 79 TF bf16 = 128*128*2*2.4
    vector_clock_ghz=0.96, scalar_clock_ghz=1.2, gpsimd_clock_ghz=1.2,   # ARCH2
    pe_rows=128, pe_cols=128, moving_free_max=512,                       # ARCH2
    fp32_matmul_slowdown=4, fp8_matmul_speedup=2,                        # ARCH2: 20 TF fp32, 158 TF fp8
    lanes=128, min_ii_cycles=64, access_overhead_cycles=60,              # ISA
    dependent_vector_penalty_cycles=100,                                 # ISA
    vector_fast_copy_factor=4, vector_fast_tt_factor=2, scalar_bf16_factor=1,  # ISA (trn2 fast modes)
    sbuf_partitions=128, sbuf_bytes_per_partition=224 * KIB,             # ARCH2: 28 MiB
    psum_bytes_per_partition=16 * KIB, psum_banks=8,                     # ARCH2
    hbm_bytes_per_ns=2900.0,                                             # ARCH2: 2.9 TB/s (NKI guide: 3 TB/s)
    hbm_bytes_per_chip=96 * GIB,                                         # ARCH2: 96 GiB per chip (hardware.md)
    dma_engines=16, dma_queues_per_engine=16,                            # ARCH2
    dma_engine_bytes_per_ns=23.0,                                        # DMA: 368 GB/s per core; 32 KiB in 1,416 ns
    dma_fixed_latency_ns=1300.0,                                         # DMA
    dma_descriptor_ns=600.0,                                             # DMA: hardware DGE ~600 ns/instr
    dma_partitions_per_engine=8,                                         # DMA
    dma_transpose_efficiency=0.9,                                        # DMA: HBM->SBUF transpose up to 90%
    host_link_bytes_per_ns=64.0,  # ASSUMED (not in hardware.md): PCIe Gen5 x16 ~64 GB/s
    pe_ramp_start_speed=0.5,                                             # power ramp (see Target)
)

TRN3 = Target(
    name="trn3", neuron_core="NeuronCore-v4", cores_per_chip=8,           # ARCH3
    tensor_clock_ghz=2.4,                                                # ARCH3: 79 TF bf16
    vector_clock_ghz=1.2, scalar_clock_ghz=1.2, gpsimd_clock_ghz=1.2,    # ARCH3
    pe_rows=128, pe_cols=128, moving_free_max=512,                       # ARCH3 (NC-v4 allows more across banks)
    fp32_matmul_slowdown=4, fp8_matmul_speedup=4,                        # ARCH3: 20 TF fp32, 315 TF mxfp8
    lanes=128, min_ii_cycles=64, access_overhead_cycles=60,              # ISA
    dependent_vector_penalty_cycles=100,                                 # ISA
    vector_fast_copy_factor=4, vector_fast_tt_factor=2, scalar_bf16_factor=2,  # ARCH3: ScalarE 256 bf16/cycle
    sbuf_partitions=128, sbuf_bytes_per_partition=256 * KIB,             # ARCH3: 32 MiB
    psum_bytes_per_partition=16 * KIB, psum_banks=8,                     # ARCH3
    hbm_bytes_per_ns=4900.0,                                             # ARCH3: 4.9 TB/s (NKI guide: 4.7 TB/s)
    hbm_bytes_per_chip=144 * GIB,                                        # ARCH3: 144 GiB per chip (hardware.md)
    dma_engines=16, dma_queues_per_engine=16,                            # ARCH3
    dma_engine_bytes_per_ns=33.0,                                        # DMA: 528 GB/s per core
    dma_fixed_latency_ns=1300.0,                                         # DMA
    dma_descriptor_ns=600.0,                                             # DMA
    dma_partitions_per_engine=8,                                         # DMA
    dma_transpose_efficiency=0.9,                                        # DMA (trn2 figure; none published for trn3)
    host_link_bytes_per_ns=64.0,  # ASSUMED (not in hardware.md): PCIe Gen5 x16 ~64 GB/s
    pe_ramp_start_speed=0.5,                                             # power ramp (see Target)
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}
DEFAULT_TARGET = "trn2"


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; expected one of {sorted(TARGETS)}") from None
