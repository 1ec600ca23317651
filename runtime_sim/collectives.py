"""Collective communication as a timed device operation: topology, algorithm choice and cost.

``collective_cost(kind, nbytes, ranks, target)`` answers how long one collective of ``nbytes``
(the buffer size as nccom-test counts it: the all-reduce buffer B, the all-gather output, the
reduce-scatter input, the all-to-all buffer, the broadcast tensor) takes among ``ranks`` ranks of
one generation, and by which algorithm. Every hardware number comes from
``runtime_sim.targets`` (``Target`` for HBM and DMA, ``Interconnect`` for links, topology,
latencies and the default LNC), each with its source there. Sources of the algorithms (aws-neuron-sdk
@81ce03a): INTRA = neuron-runtime/explore/intranode-collective-comm.rst, INTER =
neuron-runtime/explore/internode-collective-comm.rst, COLL = neuron-runtime/about/collectives.rst.

The model
- Placement: each rank is one logical core of ``lnc`` physical cores (COLL L110), so a chip holds
  ``cores_per_chip // lnc`` ranks; a group's ranks fill chips in order (ASSUMED: a group is
  consecutive logical cores, as nccom-test's ``-r`` ranks are; neuron-ls numbers a chip's cores
  consecutively, runtime-performance-tips.rst L113-255, L369-511), chips fill a row-major 4x4
  torus (trn1/trn2: the same tables' "CONNECTED DEVICES") or hang off a switch (trn3), and
  instances of ``chips_per_instance`` chips.
- An all-reduce is a reduce-scatter then an all-gather (INTRA L55, L85, L109); each phase moves
  D = (N-1)/N x B per rank (INTER L85, L113, L168: the same for Ring, Mesh and RDH).
- Time = sum over phases of (steps x per-hop latency + the slowest of three resources):
  * NeuronLink: the bytes leaving one chip / the links the group can use there (a torus chip
    reaches 1, 2, 3 or 4 neighbours inside the group; a switch chip uses all its links). Ring,
    KangaRing and RDH send D per chip (one ring edge, or the recursive steps' sum); Mesh sends each
    rank's off-chip share of D routed over the torus, times the mean hop distance of the group's
    chips (INTRA L94: "routing ... leads to link over-subscription").
  * HBM of one chip: its ranks' HBM touches. Ring, Mesh, RDH ("Normal" HBM pressure, INTRA
    L161-189): reduce-scatter 2 reads + 1 write, all-gather 1 read + 1 write per chunk per rank
    (INTRA L128, L133); KangaRing per pair of ranks: 3R1W and 1R2W (INTRA L128, L133).
  * DMA of one rank: D over its CC channels, each one DMA engine at the target's per-engine rate
    (``channels``). The data path of a collective is "pre-constructed DMA rings" driven by the
    CC cores (OVERLAP = compute-comm-overlap.rst L16-18; COLL L112: the CC cores "control when
    and how data movement engines transfer data"); a DMA engine serves its rings one packet at a
    time, round-robin (OVERLAP L79); a physical core has two CC cores, four per LNC=2 rank, "each
    CC core can manage a distinct communication stream" (OVERLAP L110); the per-chip CC-core
    counts are in ``targets.Interconnect``. ASSUMED: one CC core drives one DMA ring at a time, so
    a rank moves data on (CC cores per physical core x lnc) engines at once. Not used: the NKI
    collectives API's channel limit (4 for groups of every device of a node, 2 otherwise,
    nki/api/nki/collectives/__init__.py L308-309), which is stated for NKI's own permutes.
- Steps per phase (INTRA L158-189, INTER L166-170): Ring N-1; KangaRing ceil((N-1)/2) ("the
  per-hop latency is cut by half", INTRA L123); Mesh 1 on one chip, else 2 (an inter-chip step and
  an intra-chip step, INTRA L99, L104); RDH log2(chips) recursive steps plus 1 intra-chip step
  when a chip holds several ranks (INTRA L149-156).
- Algorithm by size (INTRA L160-189, trn2, "Sweet Range (Empirically)", MB read as MiB as
  nccom-test's own units are binary, nccom-test.rst L621-623): Mesh below 1 MiB, RDH up to 56 MiB,
  KangaRing above; RDH needs a power-of-two group (INTER L166); KangaRing needs whole chips of an
  even number of ranks and at least two chips (INTRA L123, L135); the fallback is Ring. ASSUMED on
  trn1 and trn3 too (the document describes trn2). All-to-all is Mesh at every size (each rank
  sends a distinct piece to every peer, COLL L69); broadcast (no Neuron document describes it) is
  Mesh below 1 MiB and a pipelined Ring above, both ASSUMED.
- More than one instance: hierarchical (COLL L101-103): the collective inside each instance, plus
  an RDH (Ring when not a power of two) exchange between instances of each rank's 1/n_local share
  over its EFA share (COLL L110) at ``inter_hop_ns`` per step (INTER L66).
- Not modelled: any fixed per-operation cost of the runtime. No document gives one (INTRA L61
  puts a collective's whole latency term at "10^0 to 10^1 us"); what was searched, and the
  release-dependent figures found instead (a "collectives barrier" of 500 then 40 us, NEFF-start
  savings), is printed by ``python -m runtime_sim.calibrate_collectives``
  (``calibrate_collectives.SEARCHED``). Also not modelled: contention with compute for DMA
  engines and HBM, the over-subscription of RDH, the single-step Mesh.

Invariants
- Pure: numpy-free, torch-free, no state; the same arguments give the same ``CollectiveCost``.
- ``total_ns`` is ``latency_ns + transfer_ns``; it never decreases when ``nbytes`` grows for a
  fixed algorithm; one rank costs 0.
- Bad input raises ``CollectiveError`` naming the argument, the rule and the value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .targets import Interconnect, Target, get_interconnect, get_target

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALGORITHMS = ("ring", "mesh", "rdh", "kangaring")
MIB = 1024 * 1024
MESH_BELOW = 1 * MIB          # INTRA L175-179: Mesh "< 1MB"
RDH_UP_TO = 56 * MIB          # INTRA L180-189: RDH "1-56MB", KangaRing ">56MB"

# Phases of each kind (INTRA L55: all-reduce = reduce-scatter + all-gather)
_PHASES = {"all_reduce": ("rs", "ag"), "all_gather": ("ag",), "reduce_scatter": ("rs",),
           "all_to_all": ("a2a",), "broadcast": ("bc",)}
# HBM touches per byte a rank moves, per phase (INTRA L128, L133): Ring RS 2R1W, AG 1R1W.
# All-to-all and broadcast: ASSUMED 1R1W (a copy), as an all-gather step.
_TOUCHES = {"rs": 3, "ag": 2, "a2a": 2, "bc": 2}
# KangaRing, per pair of ranks (INTRA L128: AG one 1R2W; L133: RS one 3R1W)
_KANGA_TOUCHES = {"rs": 4, "ag": 3}
# nccom-test's bus bandwidth factors (nccom-test.rst L107-126); broadcast ASSUMED 1 (permute's)
_BUSBW = {"all_reduce": lambda r: 2 * (r - 1) / r, "all_gather": lambda r: (r - 1) / r,
          "reduce_scatter": lambda r: (r - 1) / r, "all_to_all": lambda r: (r - 1) / r,
          "broadcast": lambda r: 1.0}


class CollectiveError(ValueError):
    """A collective asked with arguments the model cannot take (names argument, rule, value)."""


@dataclass(frozen=True)
class Placement:
    """Where a group's ranks sit: ``ranks`` logical cores of ``lnc`` physical cores each."""

    ranks: int
    lnc: int
    ranks_per_chip: int           # of the generation (cores_per_chip // lnc)
    chips: int                    # chips the group touches inside one instance
    instances: int
    ranks_per_instance: int       # of the group, inside one instance

    @property
    def ranks_on_chip(self) -> int:
        """The group's ranks on one (full) chip."""
        return min(self.ranks_per_instance, self.ranks_per_chip)


@dataclass(frozen=True)
class CollectiveCost:
    """One collective's modelled time, split into its latency and its data movement."""

    kind: str
    nbytes: int
    ranks: int
    target: str
    algorithm: str                # one of ALGORITHMS, or "none" for one rank
    placement: Placement
    steps: int                    # hops inside the instance (all phases)
    latency_ns: float
    transfer_ns: float
    bound: str                    # what limits the transfer: link | hbm | dma | efa | latency
    inter_steps: int = 0          # hops between instances
    phases: tuple[tuple[str, float, str], ...] = field(default=())  # (phase, transfer ns, bound)

    @property
    def total_ns(self) -> float:
        return self.latency_ns + self.transfer_ns

    @property
    def algbw_gib_s(self) -> float:
        """nccom-test's algorithm bandwidth: size / time, in GiB/s (nccom-test.rst L58-59)."""
        return self.nbytes / self.total_ns * 1e9 / 2**30 if self.total_ns else 0.0

    @property
    def busbw_gib_s(self) -> float:
        """nccom-test's bus bandwidth: algbw x the kind's factor (nccom-test.rst L107-126)."""
        return self.algbw_gib_s * _BUSBW[self.kind](self.ranks) if self.ranks > 1 else 0.0

    def describe(self) -> str:
        p = self.placement
        return (f"{self.kind} {self.nbytes} B x{self.ranks} ranks on {self.target} (LNC={p.lnc}, "
                f"{p.chips} chip(s), {p.instances} instance(s)): {self.algorithm}, "
                f"{self.total_ns / 1e3:.2f} us = {self.steps} hop(s)"
                + (f" + {self.inter_steps} inter-instance hop(s)" if self.inter_steps else "")
                + f" {self.latency_ns / 1e3:.2f} us + transfer {self.transfer_ns / 1e3:.2f} us "
                f"({self.bound}-bound)")


def _targets(target: str | Target, interconnect: Interconnect | None) -> tuple[Target, Interconnect]:
    t = get_target(target) if isinstance(target, str) else target
    return t, interconnect if interconnect is not None else get_interconnect(t.name)


def place(ranks: int, target: str | Target = "trn2", lnc: int | None = None,
          interconnect: Interconnect | None = None) -> Placement:
    """The placement of a group of ``ranks`` consecutive logical cores (module docstring)."""
    t, ic = _targets(target, interconnect)
    if not isinstance(ranks, int) or ranks < 1:
        raise CollectiveError(f"collective: ranks must be an integer >= 1, got {ranks!r}")
    lnc = ic.default_lnc if lnc is None else lnc
    if lnc < 1 or t.cores_per_chip % lnc:
        raise CollectiveError(f"collective on {t.name}: lnc must divide the chip's "
                              f"{t.cores_per_chip} NeuronCores, got lnc={lnc!r}")
    per_chip = t.cores_per_chip // lnc
    per_instance = per_chip * ic.chips_per_instance
    instances = -(-ranks // per_instance)
    if instances > 1 and ranks % per_instance:
        raise CollectiveError(f"collective on {t.name}: a group spanning instances must fill "
                              f"them ({per_instance} ranks each at LNC={lnc}), got {ranks} ranks")
    local = min(ranks, per_instance)
    return Placement(ranks, lnc, per_chip, -(-local // per_chip), instances, local)


# ---- topology ----------------------------------------------------------------------------------
def _coords(chip: int, side: int) -> tuple[int, int]:
    return divmod(chip, side)


def _ring_dist(a: int, b: int, side: int) -> int:
    d = abs(a - b) % side
    return min(d, side - d)


def _hops(a: int, b: int, ic: Interconnect) -> int:
    """NeuronLink hops between two chips (one switch traversal counts as one hop)."""
    if a == b:
        return 0
    if ic.topology == "switch":
        return 1
    (ay, ax), (by, bx) = _coords(a, ic.torus_side), _coords(b, ic.torus_side)
    return _ring_dist(ax, bx, ic.torus_side) + _ring_dist(ay, by, ic.torus_side)


def links_in_group(chips: int, ic: Interconnect) -> int:
    """Links a chip of the group can use toward the group: on a switch all of them; on a torus
    the fewest neighbours inside the group of any of its chips (the slowest chip bounds a ring)."""
    if chips <= 1:
        return 0
    if ic.topology == "switch":
        return ic.links_per_chip
    return min(min(ic.links_per_chip, sum(1 for b in range(chips) if _hops(a, b, ic) == 1))
               for a in range(chips))


def mean_hops(chips: int, ic: Interconnect) -> float:
    """The mean NeuronLink hop count between two different chips of the group."""
    if chips <= 1:
        return 0.0
    pairs = [(a, b) for a in range(chips) for b in range(chips) if a != b]
    return sum(_hops(a, b, ic) for a, b in pairs) / len(pairs)


# ---- algorithm choice --------------------------------------------------------------------------
def eligible(algorithm: str, kind: str, p: Placement) -> str | None:
    """None if ``algorithm`` can run ``kind`` on placement ``p``, else why not."""
    if algorithm not in ALGORITHMS:
        return f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}"
    if kind == "all_to_all" and algorithm != "mesh":
        return "all_to_all is modelled as mesh only"
    if kind == "broadcast" and algorithm not in ("mesh", "ring"):
        return "broadcast is modelled as mesh or ring only"
    n = p.ranks_per_instance
    if algorithm == "rdh" and n & (n - 1):
        return f"rdh needs a power-of-two group (INTER L166), got {n} ranks"
    if algorithm == "kangaring":
        r = p.ranks_on_chip
        if p.chips < 2 or r != p.ranks_per_chip or r % 2 or n % p.ranks_per_chip:
            return (f"kangaring needs whole chips of an even number of ranks and >= 2 chips "
                    f"(INTRA L123, L135), got {n} ranks on {p.chips} chip(s) of {p.ranks_per_chip}")
    return None


def choose_algorithm(kind: str, nbytes: int, p: Placement) -> str:
    """The algorithm by size (INTRA L160-189; module docstring)."""
    if kind == "all_to_all":
        return "mesh"
    if nbytes < MESH_BELOW:
        return "mesh"
    if kind == "broadcast":
        return "ring"
    want = "rdh" if nbytes <= RDH_UP_TO else "kangaring"
    return want if eligible(want, kind, p) is None else "ring"


# ---- cost --------------------------------------------------------------------------------------
def channels(t: Target, ic: Interconnect, lnc: int) -> int:
    """DMA engines one rank's collective streams through: one per CC core of its ``lnc`` physical
    cores (module docstring); all the rank's engines when the generation gives no CC-core count."""
    if not ic.cc_cores_per_chip:
        return lnc * t.dma_engines
    return max(1, ic.cc_cores_per_chip * lnc // t.cores_per_chip)


def _steps(algorithm: str, phase: str, p: Placement) -> int:
    n, c = p.ranks_per_instance, p.chips
    if n <= 1:
        return 0
    if algorithm == "mesh":
        return 1 if c == 1 else 2
    if algorithm == "rdh":
        return (1 if p.ranks_on_chip > 1 else 0) + math.ceil(math.log2(c)) if c > 1 else 1
    if algorithm == "kangaring":
        return math.ceil((n - 1) / 2)
    return n - 1                                                   # ring


def _phase_transfer(algorithm: str, phase: str, nbytes: int, p: Placement, t: Target,
                    ic: Interconnect) -> tuple[float, str]:
    """(ns, bound) of moving one phase's data inside one instance."""
    n, c, r = p.ranks_per_instance, p.chips, p.ranks_on_chip
    d = nbytes if phase == "bc" else (n - 1) / n * nbytes      # bytes one rank moves
    times: dict[str, float] = {}
    links = links_in_group(c, ic)
    if links:
        if algorithm == "mesh":
            off_chip = d * (n - r) / (n - 1) if phase != "bc" else d * (c - 1)
            egress = r * off_chip * mean_hops(c, ic) if phase != "bc" else off_chip * mean_hops(c, ic)
        else:
            egress = d                                             # one ring edge leaves a chip
        times["link"] = egress / (links * ic.link_bytes_per_ns)
    if algorithm == "kangaring":
        hbm = (r / 2) * d * _KANGA_TOUCHES[phase]
    else:
        hbm = r * d * _TOUCHES[phase]
    times["hbm"] = hbm / t.hbm_bytes_per_ns
    times["dma"] = d / (channels(t, ic, p.lnc) * t.dma_engine_bytes_per_ns)
    bound = max(times, key=lambda k: times[k])
    return times[bound], bound


def collective_cost(kind: str, nbytes: int, ranks: int, target: str | Target = "trn2",
                    lnc: int | None = None, algorithm: str | None = None,
                    interconnect: Interconnect | None = None) -> CollectiveCost:
    """The modelled time of one collective (module docstring). ``algorithm`` forces one (it
    must be eligible); ``interconnect`` overrides the generation's (``dataclasses.replace``)."""
    t, ic = _targets(target, interconnect)
    if kind not in KINDS:
        raise CollectiveError(f"collective: kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(nbytes, int) or nbytes < 0:
        raise CollectiveError(f"collective {kind}: nbytes must be an integer >= 0, got {nbytes!r}")
    p = place(ranks, t, lnc, ic)
    if ranks == 1:
        return CollectiveCost(kind, nbytes, ranks, t.name, "none", p, 0, 0.0, 0.0, "latency")
    if algorithm is None:
        algorithm = choose_algorithm(kind, nbytes, p)
    else:
        why = eligible(algorithm, kind, p)
        if why is not None:
            raise CollectiveError(f"collective {kind} x{ranks} on {t.name}: {why}")
    steps = 0
    transfer = 0.0
    phases = []
    for ph in _PHASES[kind]:
        steps += _steps(algorithm, ph, p)
        ns, bound = _phase_transfer(algorithm, ph, nbytes, p, t, ic)
        transfer += ns
        phases.append((ph, ns, bound))
    latency = steps * ic.hop_ns
    inter_steps = 0
    if p.instances > 1:
        i = p.instances
        per_step = math.ceil(math.log2(i)) if i & (i - 1) == 0 else i - 1
        share = nbytes / p.ranks_per_instance * (i - 1) / i   # each rank's 1/n_local, RDH/Ring
        for ph in _PHASES[kind]:
            inter_steps += per_step
            efa = ic.efa_bytes_per_ns_per_chip / p.ranks_per_chip   # COLL L110: per-rank share
            ns = share / efa
            transfer += ns
            phases.append((f"{ph}@efa", ns, "efa"))
        latency += inter_steps * ic.inter_hop_ns
    bound = max(phases, key=lambda x: x[1])[2] if phases else "latency"
    if transfer < latency:
        bound = "latency"
    return CollectiveCost(kind, nbytes, ranks, t.name, algorithm, p, steps, latency, transfer,
                          bound, inter_steps, tuple(phases))


def with_interconnect(target: str, **changes: object) -> Interconnect:
    """``target``'s interconnect with ``changes`` (e.g. ``chip_link_bytes_per_ns=2560.0``)."""
    return replace(get_interconnect(target), **changes)  # type: ignore[arg-type]
