"""The collective cost model (runtime_sim.collectives) and its calibration command."""
import dataclasses
import math

import pytest

from runtime_sim import calibrate_collectives as cal
from runtime_sim.collectives import (KINDS, MESH_BELOW, RDH_UP_TO, CollectiveError,
                                     collective_cost, links_in_group, mean_hops, place)
from runtime_sim.targets import INTERCONNECTS, get_interconnect

MIB = 1 << 20
SIZES = [0, 4, 1024, 64 << 10, MIB - 4, MIB, 8 * MIB, RDH_UP_TO, RDH_UP_TO + 4, 1 << 30]


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ranks", [2, 8, 16, 64])
def test_time_never_decreases_with_size_for_one_algorithm(target, kind, ranks):
    algorithm = "mesh" if kind in ("all_to_all", "broadcast") else "ring"
    times = [collective_cost(kind, n, ranks, target, algorithm=algorithm).total_ns for n in SIZES]
    assert times == sorted(times), times
    assert times[-1] > 10 * times[0]            # large messages are bandwidth-bound


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_chosen_algorithm_time_grows_with_size_between_switch_points(target):
    for lo, hi in ((4, MESH_BELOW - 4), (MESH_BELOW, RDH_UP_TO), (RDH_UP_TO + 4, 1 << 30)):
        a, b = (collective_cost("all_reduce", n, 16, target) for n in (lo, hi))
        assert a.algorithm == b.algorithm
        assert b.total_ns > a.total_ns


def test_algorithm_switch_points_trn2_16_ranks():
    algs = {n: collective_cost("all_reduce", n, 16, "trn2").algorithm
            for n in (4, MESH_BELOW - 1, MESH_BELOW, RDH_UP_TO, RDH_UP_TO + 1)}
    assert algs == {4: "mesh", MESH_BELOW - 1: "mesh", MESH_BELOW: "rdh", RDH_UP_TO: "rdh",
                    RDH_UP_TO + 1: "kangaring"}


def test_rdh_needs_a_power_of_two_and_kangaring_whole_chips():
    assert collective_cost("all_reduce", 8 * MIB, 12, "trn2").algorithm == "ring"
    # 2 ranks of one trn2 chip: no chip-to-chip ring for KangaRing
    assert collective_cost("all_reduce", 1 << 30, 2, "trn2").algorithm == "ring"
    # 6 ranks: 1.5 chips at LNC=2, not whole chips
    assert collective_cost("all_reduce", 1 << 30, 6, "trn2").algorithm == "ring"
    assert collective_cost("all_to_all", 1 << 30, 16, "trn2").algorithm == "mesh"
    with pytest.raises(CollectiveError, match="rdh needs a power-of-two group.*12 ranks"):
        collective_cost("all_reduce", 8 * MIB, 12, "trn2", algorithm="rdh")


def test_latency_floor_is_hops_times_per_hop_latency():
    hop = get_interconnect("trn2").hop_ns
    c = collective_cost("all_reduce", 0, 16, "trn2")            # 4 chips: mesh, 2 steps per phase
    assert (c.algorithm, c.steps, c.total_ns) == ("mesh", 4, 4 * hop)
    one_chip = collective_cost("all_reduce", 4, 2, "trn2")       # LNC=2: 2 ranks on one chip
    assert one_chip.steps == 2 and one_chip.total_ns >= 2 * hop
    ring = collective_cost("all_gather", 4, 16, "trn2", algorithm="ring")
    assert ring.steps == 15 and ring.latency_ns == 15 * hop
    kanga = collective_cost("all_gather", 4, 16, "trn2", algorithm="kangaring")
    assert kanga.steps == math.ceil(15 / 2)                     # INTRA L123: half of Ring's


def test_between_instances_hops_cost_15_us_and_efa_carries_each_ranks_share():
    ic = get_interconnect("trn2")
    one = collective_cost("all_reduce", 8, 64, "trn2")            # 16 chips x 4 ranks: one instance
    two = collective_cost("all_reduce", 8, 128, "trn2")
    assert one.placement.instances == 1 and two.placement.instances == 2
    assert two.inter_steps == 2 and two.latency_ns == pytest.approx(
        one.latency_ns + 2 * ic.inter_hop_ns)
    big = collective_cost("all_reduce", 1 << 30, 128, "trn2")
    efa = {ph: ns for ph, ns, _ in big.phases if ph.endswith("@efa")}
    share = (1 << 30) / 64 / 2                                   # 1/n_local of B, (I-1)/I
    assert efa == pytest.approx({"rs@efa": share / (ic.efa_bytes_per_ns_per_chip / 4),
                                 "ag@efa": share / (ic.efa_bytes_per_ns_per_chip / 4)})
    slow = dataclasses.replace(ic, efa_bytes_per_ns_per_chip=ic.efa_bytes_per_ns_per_chip / 10)
    assert collective_cost("all_reduce", 1 << 30, 128, "trn2", interconnect=slow).bound == "efa"


def test_one_rank_costs_nothing():
    c = collective_cost("all_reduce", 1 << 20, 1, "trn2")
    assert c.total_ns == 0 and c.algorithm == "none"


def test_topology_links_and_hops():
    torus, switch = get_interconnect("trn2"), get_interconnect("trn3")
    assert [links_in_group(c, torus) for c in (1, 2, 4, 8, 16)] == [0, 1, 2, 3, 4]
    assert [links_in_group(c, switch) for c in (1, 2, 16)] == [0, 4, 4]
    assert mean_hops(16, torus) == pytest.approx(32 / 15)     # 4x4 torus: 2 x mean ring distance
    assert mean_hops(16, switch) == 1.0


def test_link_bandwidth_bounds_a_large_ring():
    """A 16-chip ring all-gather can go no faster than D bytes over the chip's four links."""
    ic = get_interconnect("trn2")
    n, ranks = 1 << 30, 64
    c = collective_cost("all_gather", n, ranks, "trn2", algorithm="ring")
    assert c.transfer_ns >= (ranks - 1) / ranks * n / ic.chip_link_bytes_per_ns
    faster = dataclasses.replace(ic, chip_link_bytes_per_ns=4 * ic.chip_link_bytes_per_ns)
    assert collective_cost("all_gather", n, ranks, "trn2", algorithm="ring",
                           interconnect=faster).total_ns <= c.total_ns


def test_lnc_sets_ranks_per_chip():
    assert place(16, "trn2").chips == 4                    # default LNC=2: 4 ranks per chip
    assert place(16, "trn2", lnc=1).chips == 2             # 8 ranks per chip
    assert place(2, "trn1").chips == 1                     # trn1 default LNC=1: 2 per chip
    assert {t: ic.default_lnc for t, ic in INTERCONNECTS.items()} == {
        "trn1": 1, "trn2": 2, "trn3": 2}


@pytest.mark.parametrize("args, match", [
    (("all_sum", 4, 2), "kind must be one of"),
    (("all_reduce", -1, 2), "nbytes must be an integer >= 0, got -1"),
    (("all_reduce", 4, 0), "ranks must be an integer >= 1, got 0"),
    (("all_reduce", 4, 96), "must fill them .64 ranks each at LNC=2., got 96"),
])
def test_bad_arguments_name_the_rule_and_value(args, match):
    with pytest.raises(CollectiveError, match=match):
        collective_cost(*args, target="trn2")


def test_bad_lnc_and_algorithm():
    with pytest.raises(CollectiveError, match="lnc must divide the chip's 8 NeuronCores, got lnc=3"):
        collective_cost("all_reduce", 4, 2, "trn2", lnc=3)
    with pytest.raises(CollectiveError, match="algorithm must be one of"):
        collective_cost("all_reduce", 4, 2, "trn2", algorithm="tree")


# ---- calibration -------------------------------------------------------------------------------
BUSBW = {"all_reduce": lambda r: 2 * (r - 1) / r}


@pytest.mark.parametrize("table", cal.TABLES, ids=lambda t: t.lines)
def test_published_rows_are_transcribed_consistently(table):
    """Each row's busbw must follow from its size and time by nccom-test's own definitions
    (nccom-test.rst L58-59, L107-126), in the table's own unit (L752-764 divides by 1e9 where
    L59 says GiB, ``Table.gb``): a mistyped size or time fails here."""
    for row in table.rows:
        algbw = row.nbytes / (row.time_us * 1e-6) / table.gb
        busbw = algbw * BUSBW[table.kind](table.ranks)
        assert busbw == pytest.approx(row.busbw_gib_s, abs=0.011, rel=0.02), row


def test_calibration_report_lists_every_row_with_source_and_status(capsys):
    status = cal.main([])
    text = capsys.readouterr().out
    rows = cal.evaluate()
    assert len(rows) == sum(len(t.rows) for t in cal.TABLES)
    assert "do not state their instance type" in text
    for t in cal.TABLES:
        assert f"({t.lines}) on {t.target}" in text
    for r in rows:
        assert r["source"].startswith("tools/neuron-sys-tools/nccom-test.rst L")
        assert r["within_25pct"] == (abs(r["ratio"] - 1) <= 0.25)
        assert r["within_25pct"] or r["reason"]
    assert status == (0 if all(r["within_25pct"] for r in rows) else 1)


# neuron-ls "CONNECTED DEVICES" of trn1.32xlarge and trn2.48xlarge (identical columns:
# neuron-runtime/explore/runtime-performance-tips.rst L113-255 and L369-511, aws-neuron-sdk@81ce03a)
NEURON_LS_CONNECTED = {
    0: {12, 3, 4, 1}, 1: {13, 0, 5, 2}, 2: {14, 1, 6, 3}, 3: {15, 2, 7, 0},
    4: {0, 7, 8, 5}, 5: {1, 4, 9, 6}, 6: {2, 5, 10, 7}, 7: {3, 6, 11, 4},
    8: {4, 11, 12, 9}, 9: {5, 8, 13, 10}, 10: {6, 9, 14, 11}, 11: {7, 10, 15, 8},
    12: {8, 15, 0, 13}, 13: {9, 12, 1, 14}, 14: {10, 13, 2, 15}, 15: {11, 14, 3, 12}}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_torus_is_the_published_chip_adjacency(target):
    """The model's one-hop neighbours of each chip are exactly the devices neuron-ls lists as
    connected (the row-major 4x4 torus; trn1's shape was ASSUMED before this table was found)."""
    from runtime_sim.collectives import _hops
    ic = get_interconnect(target)
    assert ic.chips_per_instance == len(NEURON_LS_CONNECTED)
    for a, linked in NEURON_LS_CONNECTED.items():
        assert {b for b in range(16) if _hops(a, b, ic) == 1} == linked, a


def test_2023_tables_compare_with_ring_and_p50():
    """The Neuron 2.10 tables (trn1) predate the Mesh all-reduce and RDH between instances (the
    collectives / runtime release notes): every row is modelled with Ring, the time read as P50."""
    by_table = {t.name: t for t in cal.TABLES}
    for r in cal.evaluate():
        t = by_table[r["table"]]
        if t.target == "trn1":
            assert t.algorithm == "ring" and r["model_algorithm"] == "ring"
            assert r["algorithm_set_by_table"] and r["statistic"].startswith("P50")
        else:
            assert t.algorithm is None and not r["algorithm_set_by_table"]


def test_report_says_what_was_searched_for_a_per_operation_cost(capsys):
    """No per-operation constant is in the model; the report names what was searched and what
    was found instead, and every latency-bound red row points to that record."""
    cal.main([])
    text = capsys.readouterr().out
    assert "Per-operation cost: searched, NOT FOUND" in text
    for needle in ("nccom-test.rst", "intranode", "compute-comm-overlap.rst",
                   "aws-neuronx-{collectives,runtime-lib}", "500us to 40us",
                   "nrt_experimental.rst L141", "NEFF start", "151 us", "6.16"):
        assert needle in text, needle
    red_latency = [r for r in cal.evaluate() if r["bound"] == "latency" and not r["within_25pct"]]
    assert red_latency and all("'Per-operation cost' below" in r["reason"] for r in red_latency)
    small = collective_cost("all_reduce", 4, 16, "trn2")
    assert small.latency_ns == small.steps * get_interconnect("trn2").hop_ns   # hops only
    assert small.total_ns < small.latency_ns + 1.0                             # 4 B: < 1 ns data
