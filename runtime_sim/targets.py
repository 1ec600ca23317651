"""Target descriptions: every hardware number the project uses, in one place, with its source.

Sources are paths in the public ``aws-neuron/aws-neuron-sdk`` documentation (as collected in
``shared/hardware.md``); ``sdk@2.26:`` marks the Neuron 2.26 version of the docs. Where AWS
documents disagree, the chosen value is used and the other is named in the comment; a caller can
override any field with ``dataclasses.replace(get_target("trn2"), field=value)``.

Invariants
- A ``Target`` is frozen; the simulator, the cost table and the compiler read numbers only from it.
- Clocks are in GHz (cycles per ns); bandwidths in bytes per ns (== GB/s); sizes in bytes.
- No number is fitted to a measurement. A number no document gives says ``ASSUMED`` and why;
  ``python -m runtime_sim.calibrate --sensitivity`` prints every row's sensitivity to each one.
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
    dma_transfer_ns: float       # fixed time of one transfer on each of its DMA engines (see below)
    dma_partitions_per_engine: int
    dma_transpose_efficiency: float  # HBM->SBUF DMA transpose throughput / plain throughput

    # --- host link (not in hardware.md) -----------------------------------------------------
    host_link_bytes_per_ns: float

    # --- DMA cost per transfer (runtime_sim.costs, "DMA model") ------------------------------
    # Each transfer (one DMA instruction's share on one DMA engine) takes ``dma_transfer_ns`` of
    # fixed time on its engine (descriptor setup, synchronisation, semaphore-to-start), then its
    # data phase at ``dma_engine_bytes_per_ns``. The fixed phase of the next transfer on an engine
    # overlaps the data phase of the previous one, so a stream of transfers runs at one per
    # max(fixed, data): the shape of the DMA guide's efficiency-versus-size figure (flat time per
    # transfer up to ~2 KiB per partition, linear above; hardware-sources.md, "DMA cost per
    # transfer"). No per-byte efficiency factor: data moves at the documented per-engine rate.
    #
    # Each contiguous chunk of a transfer moves at least this many bytes of engine time. ASSUMED:
    # no document gives the cost of a fragmented transfer (the DMA guide says only that "small
    # fragmented transfers underperform badly", nki-dma-bandwidth-guide.rst L13-16); 64 B is one
    # access of the memory interfaces' usual burst size, taken so that element-wise strided
    # transfers cost what their accesses would, not what their payload would. Calibrate prints
    # every row's sensitivity to it.
    dma_min_chunk_bytes: float = 64.0
    # SBUF->SBUF DMA transpose throughput / plain throughput (ARCH2 L340: "up to 50%").
    dma_transpose_sbuf_efficiency: float = 0.5
    # Indirect DMA (dma_gather / dma_scatter): its descriptors depend on index values in SBUF, so
    # they are generated at run time by software DGE on GpSimd (nki-dge.rst: "swdge is the only
    # mode that supports indirect (gather/scatter) operations"), one descriptor per lookup row
    # (each moves at least dma_min_chunk_bytes of engine time, like any contiguous chunk).
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

    # --- TensorE instruction turnaround (``MM_INIT_LATENCY``): a matmul takes at least
    # ``min(mm_init_latency_cycles, M)`` cycles (costs.c_matmul, the sdk@2.26 nc_matmul cost
    # note ``max(min(64, N_stationary), N_moving)``, which names no generation). Documented for
    # NeuronCore-v2 only: ARCH1 L267 "MM_INIT_LATENCY is 64 TensorE cycles on NeuronCore-v2",
    # nki_perf_guide.rst L678-679 "(64 cycles on trn1)". ASSUMED the same on NC-v3 / NC-v4:
    # trainium2_arch.rst and trainium3_arch.rst give no TensorE cycle figure (81ce03a).
    mm_init_latency_cycles: int = 64

    # ScalarE's fused free-axis reduce (``ActivationAttrs.reduce``) with an op other than add:
    # "On NeuronCore-v2, the reduce_op must be nl.add" (ISA nki/api/nki/isa/__init__.py L1476,
    # activation_reduce; the same file's activation, L1348, says "must be nl.add" without a
    # generation). NC-v3/v4 take the other reductions here (max, min, ...), read from L1476.
    scalar_reduce_any_op: bool = False

    # --- NeuronCore-v4 features (the defaults: the target does not have the feature) ------------
    # VectorE fast exponential (``Op.EXPONENTIAL``, nki.isa.exponential): its throughput as a
    # multiple of ScalarE's ``activation(op=exp)`` on the same target; 0 = no such instruction.
    # ARCH3 L179: "at 4x the throughput compared to the nisa.activation (op=nl.exp) instruction
    # on the Scalar Engine"; ISA3 L2286-2287: "Available only on NeuronCore-v4 and newer".
    # costs.c_exponential turns it into cycles and caps it at VectorE's datapath width (ARCH3
    # L52), which binds on trn3: the two statements disagree by 2x, see there.
    vector_exp_speedup: int = 0
    # A matmul may write a bf16 PSUM destination and accumulate into one (ARCH3 L124-143 "BF16
    # Matmul Results in PSUM"; ISA3 nc_matmul L588-589: "The dst tile must be a float32 tile in
    # NeuronCore-v2 and NeuronCore-v3. Starting NeuronCore-v4, dst can either be a float32 or
    # bfloat16 tile").
    psum_bf16: bool = False
    # PSUM banks one matmul destination may span: N <= 512 fp32 ("matching the maximum number of
    # float32 elements per PSUM bank") on NC-v2/v3; NC-v4 "up to 4096 for float32 dst or 8192 for
    # bfloat16 dst, matching the size of 8x PSUM banks (the entire PSUM)" (ISA3 nc_matmul
    # L612-615; hardware.md "Memory rules"). ``moving_free_max`` stays the one-bank fp32 limit.
    matmul_psum_banks: int = 1
    # TensorE background transpose (ARCH3 L145-150): "run a transpose operation in parallel to
    # another matrix multiplication (or another transpose)"; costs.TensorLanes.
    background_transpose: bool = False
    # MXFP8: the MX matmul (``MatmulMxAttrs``, NKI nc_matmul_mx) and VectorE ``quantize_mx``
    # (ISA3 L717-719, L2744-2746: "Available only on NeuronCore-v4 and newer"); the MX matmul's
    # rate is ``fp8_matmul_speedup`` (ARCH3 L75: "4x the throughput compared to a BF16/FP16
    # matmul"). The documents disagree on the MX moving tile: "[128, 512] in x4 data types"
    # (ARCH3 L118) against "must not exceed 4096 when dst is in float32 or 8192 when dst is in
    # bfloat16" (ISA3 L782-783); the checks use the API's, i.e. ``matmul_psum_banks``' rule.
    mx_matmul: bool = False

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
#  DMA   = nki/deep-dives/nki-dma-bandwidth-guide.rst (DG), nki/get-started/about/nki-dma-overview.rst
#          (DO: engines, queues, the 17 / 23 / 33 B/ns per engine table L43-63)
#  DGE   = nki/deep-dives/nki-dge.rst (aws-neuron-sdk@81ce03a)
#  ISA   = sdk@2.26:general/nki/api/nki/isa/__init__.py ("Estimated instruction cost" notes)
#  ISA3  = aws-neuron-sdk@81ce03a nki/api/nki/isa/__init__.py (the NC-v4 API docstrings: nc_matmul
#          L489-711, nc_matmul_mx L714-826, exponential L2283-2385, quantize_mx L2741-2816)
#  ARCH1 / ARCH3 line numbers: aws-neuron-sdk@81ce03a

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
    dma_engines=16, dma_queues_per_engine=16,                            # DO L7, L29
    dma_engine_bytes_per_ns=17.0,                                        # DO L43-63, DG L58-64: 272 GB/s per core
    dma_transfer_ns=1300.0,        # DG L39-41: "~1300 ns" per transfer (pre-built descriptors)
    dma_partitions_per_engine=8,                                         # DO L34: eight partitions each
    dma_transpose_efficiency=0.0,                                        # ARCH2 L321: DMA transpose is NC-v3+
    host_link_bytes_per_ns=32.0,  # ASSUMED (not in hardware.md): PCIe Gen4 x16 ~32 GB/s
    shared_ports=True,                                                   # ARCH1: NC-v2 port limits
)

TRN2 = Target(
    name="trn2", neuron_core="NeuronCore-v3", cores_per_chip=8,           # ARCH2
    tensor_clock_ghz=2.4,                                                # ARCH2: 79 TF bf16 = 128*128*2*2.4
    vector_clock_ghz=0.96, scalar_clock_ghz=1.2, gpsimd_clock_ghz=1.2,   # ARCH2
    pe_rows=128, pe_cols=128, moving_free_max=512,                       # ARCH2
    fp32_matmul_slowdown=4, fp8_matmul_speedup=2,                        # ARCH2: 20 TF fp32, 158 TF fp8
    lanes=128, min_ii_cycles=64, access_overhead_cycles=60,              # ISA
    # ASSUMED as NC-v2: "a static instruction overhead of 100 engine cycles" is ARCH1 L402-404
    # (the NC-v2 guide; nki_perf_guide.rst L417 "~100 cycles" names no generation);
    # trainium2_arch.rst gives no figure. Likewise mm_init_latency_cycles (see Target).
    dependent_vector_penalty_cycles=100,
    vector_fast_copy_factor=4, vector_fast_tt_factor=2, scalar_bf16_factor=1,  # ISA (trn2 fast modes)
    sbuf_partitions=128, sbuf_bytes_per_partition=224 * KIB,             # ARCH2: 28 MiB
    psum_bytes_per_partition=16 * KIB, psum_banks=8,                     # ARCH2
    hbm_bytes_per_ns=2900.0,                                             # ARCH2: 2.9 TB/s (NKI guide: 3 TB/s)
    hbm_bytes_per_chip=96 * GIB,                                         # ARCH2: 96 GiB per chip (hardware.md)
    dma_engines=16, dma_queues_per_engine=16,                            # DO L7, L29
    dma_engine_bytes_per_ns=23.0,                                        # DO L43-63: 368 GB/s; DO L153: 32 KiB in 1,416 ns
    # DGE L124, ARCH2 L364: each hardware-DGE DMA instruction takes ~600 ns on NC-v3. The DMA
    # guide's ~1300 ns (no generation given) as a per-transfer occupancy contradicts the trn2
    # tutorial profiles (tests/machine/test_calibration.py)
    dma_transfer_ns=600.0,
    dma_partitions_per_engine=8,                                         # DO L34: eight partitions each
    dma_transpose_efficiency=0.9,                                        # ARCH2 L321: up to 90%
    host_link_bytes_per_ns=64.0,  # ASSUMED (not in hardware.md): PCIe Gen5 x16 ~64 GB/s
    pe_ramp_start_speed=0.5,                                             # power ramp (see Target)
    scalar_reduce_any_op=True,                                           # ISA L1476 (NC-v2 only: add)
)

TRN3 = Target(
    name="trn3", neuron_core="NeuronCore-v4", cores_per_chip=8,           # ARCH3
    tensor_clock_ghz=2.4,                                                # ARCH3: 79 TF bf16
    vector_clock_ghz=1.2, scalar_clock_ghz=1.2, gpsimd_clock_ghz=1.2,    # ARCH3
    pe_rows=128, pe_cols=128, moving_free_max=512,                       # ARCH3; one bank (matmul_psum_banks below)
    fp32_matmul_slowdown=4, fp8_matmul_speedup=4,                        # ARCH3: 20 TF fp32, 315 TF mxfp8
    lanes=128, min_ii_cycles=64, access_overhead_cycles=60,              # ISA
    # ASSUMED as NC-v2 (ARCH1 L402-404): trainium3_arch.rst gives no figure; likewise
    # mm_init_latency_cycles (see Target)
    dependent_vector_penalty_cycles=100,
    vector_fast_copy_factor=4, vector_fast_tt_factor=2, scalar_bf16_factor=2,  # ARCH3: ScalarE 256 bf16/cycle
    sbuf_partitions=128, sbuf_bytes_per_partition=256 * KIB,             # ARCH3: 32 MiB
    psum_bytes_per_partition=16 * KIB, psum_banks=8,                     # ARCH3
    hbm_bytes_per_ns=4900.0,                                             # ARCH3: 4.9 TB/s (NKI guide: 4.7 TB/s)
    hbm_bytes_per_chip=144 * GIB,                                        # ARCH3: 144 GiB per chip (hardware.md)
    dma_engines=16, dma_queues_per_engine=16,                            # DO L7, L29
    dma_engine_bytes_per_ns=33.0,                                        # DO L43-63, DG L58-64: 528 GB/s per core
    # ASSUMED as NC-v3's ~600 ns (DGE L124): no NC-v4 figure is published
    dma_transfer_ns=600.0,
    dma_partitions_per_engine=8,                                         # DO L34: eight partitions each
    dma_transpose_efficiency=0.9,                                        # ASSUMED: ARCH2 L321's trn2 figure; none for trn3
    host_link_bytes_per_ns=64.0,  # ASSUMED (not in hardware.md): PCIe Gen5 x16 ~64 GB/s
    pe_ramp_start_speed=0.5,                                             # power ramp (see Target)
    # NC-v4 features (see Target): ARCH3 L179 / ISA3 L2286-2287 (4x ScalarE exp); ARCH3 L129,
    # ISA3 L588-589 (bf16 PSUM); ISA3 L612-615 (8 banks); ARCH3 L148 (background transpose);
    # ISA3 L717-719 (MX matmul, quantize_mx)
    vector_exp_speedup=4, psum_bf16=True, matmul_psum_banks=8, background_transpose=True,
    mx_matmul=True,                                                      # ISA3 L717-719, L2744-2746
    scalar_reduce_any_op=True,                                           # ISA L1476 (NC-v2 only: add)
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}
DEFAULT_TARGET = "trn2"


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; expected one of {sorted(TARGETS)}") from None


# =============================================================================================
# Interconnect: chip-to-chip links, topology and collective latencies (runtime_sim.collectives)
# =============================================================================================
# Sources (aws-neuron-sdk@81ce03a; hardware-sources.md section 4):
#  INTRA = neuron-runtime/explore/intranode-collective-comm.rst
#  INTER = neuron-runtime/explore/internode-collective-comm.rst
#  COLL  = neuron-runtime/about/collectives.rst
#  NCCOM = tools/neuron-sys-tools/nccom-test.rst
#  TRN1A = about-neuron/arch/neuron-hardware/trn1-arch.rst; TRN2A = .../trn2-arch.rst;
#  TRN3A = .../trn3-arch.rst; CHIP2 = .../trainium2.rst; CHIP3 = .../trainium3.rst
#  TIPS  = neuron-runtime/explore/runtime-performance-tips.rst: neuron-ls tables whose "CONNECTED
#          DEVICES" column is the chip adjacency (trn1.32xlarge L113-255, trn2.48xlarge L369-511):
#          device d is linked to d+-1 mod 4 in its row of four and d+-4 mod 16 (device 0: "12, 3,
#          4, 1", L132; device 5: "1, 4, 9, 6", L172), a row-major 4x4 torus on both, and device
#          d holds NeuronCores 2d..2d+1 (trn1) or 4d..4d+3 (trn2 at LNC=2), consecutive ids.
#
# Bandwidth convention. ASSUMED: a per-chip interconnect figure is what the chip can send (and,
# at the same time, receive): per direction, summed over its links, each link carrying an equal
# share. Evidence, not a fit: TRN3A L94 calls four PCIe Gen6 x8 links "a total of 256 GB/s of
# bidirectional bandwidth", and a PCIe Gen6 x8 link carries ~64 GB/s per direction (PCI-SIG:
# 64 GT/s per lane), so AWS's "bidirectional" per-chip figure is the per-direction sum.
@dataclass(frozen=True)
class Interconnect:
    """The chip-to-chip side of one generation (every number with its source, per instance)."""

    target: str
    links_per_chip: int          # NeuronLinks per chip
    chip_link_bytes_per_ns: float  # per chip, per direction, over all its links (GB/s)
    topology: str                # "torus2d" (point-to-point NeuronLink) | "switch" (all-to-all)
    torus_side: int              # chips per torus row (torus2d); unused for "switch"
    chips_per_instance: int      # chips of one NeuronLink domain (an instance / UltraServer)
    default_lnc: int             # physical NeuronCores per logical core (= per rank)
    hop_ns: float                # per-hop latency inside the NeuronLink domain
    inter_hop_ns: float          # per-hop latency between instances (EFA)
    efa_bytes_per_ns_per_chip: float  # EFA bandwidth per chip, per direction (GB/s)
    cc_cores_per_chip: int = 0   # collective-communication cores per chip (0: not modelled)

    @property
    def link_bytes_per_ns(self) -> float:
        """One link's share of the chip's bandwidth, per direction."""
        return self.chip_link_bytes_per_ns / self.links_per_chip


# Per-hop latency, every generation: INTRA L61 "the per-hop latency of Ring/KangaRing is about
# 1-2 us (HBM load dependent)": the midpoint of the range is taken (the document is trn2-era;
# ASSUMED the same on trn1 and trn3, for which no figure is published). Between instances:
# INTER L66 "the per-hop or point-to-point latency is ~15us"; COLL L114 (trn2.48xl, ib_write_lat)
# "a minimal packet takes 15us (latency) to go from an HBM in one server to an HBM of another".
_HOP_NS = 1500.0
_INTER_HOP_NS = 15000.0

# CC cores ("dedicated synchronization processors responsible for the orchestration of collective
# communications. The CC cores control when and how data movement engines transfer data", COLL
# L112). Per chip: trn1 6 (ARCH1 L23 "6 CC-Cores"); trn2 16 (CHIP2 L48 "16 CC-Cores"; the NKI
# guide ARCH2 L18 says 20: hardware-sources.md "Known contradictions" 3); trn3 16 (CHIP3 L47; ARCH3
# L18 says 20). 16 is taken for trn2/trn3 because a second document agrees with it: OVERLAP =
# neuron-runtime/explore/compute-comm-overlap.rst L110 "The hardware provides two CC cores per
# physical Neuron core ... LNC2 mode ... four CC cores per logical unit" (2 x 8 cores = 16).

INTERCONNECTS: dict[str, Interconnect] = {
    "trn1": Interconnect(
        target="trn1",
        links_per_chip=4,               # ARCH1 L24: "4 (Trainium) NeuronLink-v2"
        chip_link_bytes_per_ns=384.0,   # CHIP2 L134-136 "Inter-chip Interconnect (GB/sec/chip)" 384;
                                        # TRN1A L58 (trn1.32xlarge; trn1n.32xlarge: 768, L69)
        topology="torus2d",             # TRN1A L77, L82: "2D Torus topology"
        torus_side=4,                   # TIPS L113-255: trn1.32xlarge's connected devices form
                                        # a row-major 4x4 torus (TRN1A L50-52, L77: 16 chips, 2D)
        chips_per_instance=16,          # TRN1A L50-52: trn1.32xlarge, 16 Trainium chips
        default_lnc=1,                  # NCCOM L567-568: "1 for inf2 and trn1"
        hop_ns=_HOP_NS, inter_hop_ns=_INTER_HOP_NS,
        efa_bytes_per_ns_per_chip=800.0 / 8 / 16,  # TRN1A L59: 800 Gbps per trn1.32xlarge / 16
        cc_cores_per_chip=6,            # ARCH1 L23: "6 CC-Cores" (3 per NeuronCore-v2)
    ),
    "trn2": Interconnect(
        target="trn2",
        links_per_chip=4,               # ARCH2 L19: "4 NeuronLink-v3"
        # TRN2A L97-99: "Intra-instance NeuronLink-v3 bandwidth (GB/sec/chip) 1,024". CHIP2
        # L36-37 / L134-137 give 1,280 per chip: 1,024 inside the instance + 256 between the
        # instances of an UltraServer (TRN2A L100-102); a trn2.48xlarge has the 1,024.
        chip_link_bytes_per_ns=1024.0,
        topology="torus2d",             # TRN2A L33: "4x4, 2D Torus"; COLL L121
        torus_side=4,                   # TRN2A L33; TIPS L369-511 (row-major, as trn1)
        chips_per_instance=16,          # TRN2A L29, L70-71: 16 Trainium2 chips
        default_lnc=2,                  # NCCOM L567-568: "2 for trn2 and trn3"; COLL L110
        hop_ns=_HOP_NS, inter_hop_ns=_INTER_HOP_NS,
        efa_bytes_per_ns_per_chip=200.0 / 8,  # COLL L110: "each connected to a 200Gbps EFA"
        cc_cores_per_chip=16,           # CHIP2 L48; OVERLAP L110 (2 per core); ARCH2 L18 says 20
    ),
    "trn3": Interconnect(
        target="trn3",
        links_per_chip=4,               # ARCH3 L19: "4 NeuronLink-v4"
        # TRN3A L78-80: "NeuronLink-v4 bandwidth (GiB/sec/device) 2,048" (the instance table,
        # as trn2's figure above). Disagreeing: CHIP3 L41 "2.56 TB/sec bandwidth per device";
        # TRN3A L116-124 PCIe Gen6 256 + 320 + 128 = 704 GB/s (hardware-sources.md
        # "Known contradictions" 4). Override with dataclasses.replace to try another.
        chip_link_bytes_per_ns=2048.0 * 1.073741824,
        topology="switch",              # TRN3A L7, L13: NeuronSwitch-v1 all-to-all, "replacing
                                        # the previous 2D-torus"
        torus_side=0,
        chips_per_instance=64,          # TRN3A L13: Gen1 UltraServer, 64 devices, one scale-up domain
        default_lnc=2,                  # NCCOM L567-568: "2 for trn2 and trn3"
        hop_ns=_HOP_NS, inter_hop_ns=_INTER_HOP_NS,  # ASSUMED as trn2 (no trn3 figure)
        efa_bytes_per_ns_per_chip=12800.0 / 8 / 64,  # TRN3A L81-83: 12,800 Gbps per Gen1 (64 chips)
        cc_cores_per_chip=16,           # CHIP3 L47; ARCH3 L18 says 20
    ),
}


def get_interconnect(name: str) -> Interconnect:
    try:
        return INTERCONNECTS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r} for the interconnect; expected one of "
                         f"{sorted(INTERCONNECTS)}") from None
