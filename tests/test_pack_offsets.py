"""Tests of ``lowering.memory.pack_offsets`` and its helpers."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowering.memory import PackingError, lower_bound, pack_offsets, peak, validate

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "minimalloc-challenging"
INSTANCES = sorted(DATA.glob("*.csv"))

Row = tuple[int, int, int, int]


def load(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        return [
            (int(r["id"]), int(r["lower"]), int(r["upper"]), int(r["size"]))
            for r in csv.DictReader(handle)
        ]


# --------------------------------------------------------------------------- #
# The MiniMalloc challenging instances
# --------------------------------------------------------------------------- #


@pytest.mark.skipif(not INSTANCES, reason=f"no instances in {DATA}")
@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.stem)
def test_instances_valid_with_small_budget(path: Path) -> None:
    rows = load(path)
    offsets = pack_offsets(rows, effort=1500)
    assert set(offsets) == {r[0] for r in rows}
    validate(rows, offsets)
    bound = lower_bound(rows)
    assert bound <= peak(rows, offsets) <= 1.3 * bound


@pytest.mark.skipif(not INSTANCES, reason=f"no instances in {DATA}")
@pytest.mark.parametrize("name", ["C", "F"])
def test_instances_solved_to_lower_bound(name: str) -> None:
    (path,) = [p for p in INSTANCES if p.name.startswith(name + ".")]
    rows = load(path)
    offsets = pack_offsets(rows, effort=8000)
    validate(rows, offsets)
    assert peak(rows, offsets) == lower_bound(rows)


@pytest.mark.skipif(not INSTANCES, reason=f"no instances in {DATA}")
def test_capacity_error_on_instance_names_the_numbers() -> None:
    rows = load(INSTANCES[0])
    bound = lower_bound(rows)
    with pytest.raises(PackingError) as info:
        pack_offsets(rows, capacity=bound - 1024)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.capacity == bound - 1024 and err.lower_bound == bound
    assert err.best_peak >= bound
    for number in (bound - 1024, err.best_peak, bound):
        assert str(number) in str(err)


# --------------------------------------------------------------------------- #
# Edge cases and helpers
# --------------------------------------------------------------------------- #


def test_empty_input() -> None:
    assert pack_offsets([]) == {}
    assert lower_bound([]) == 0
    assert peak([], {}) == 0
    validate([], {})


def test_zero_size_buffers_get_offset_zero() -> None:
    rows = [("a", 0, 4, 0), ("b", 0, 4, 8), ("c", 2, 6, 0), ("d", 1, 3, 4)]
    offsets = pack_offsets(rows)
    assert offsets["a"] == 0 and offsets["c"] == 0
    validate(rows, offsets)
    assert peak(rows, offsets) == lower_bound(rows) == 12


def test_half_open_lifetimes_share_addresses() -> None:
    rows = [("a", 0, 5, 10), ("b", 5, 9, 10), ("c", 9, 12, 10)]
    offsets = pack_offsets(rows)
    assert offsets == {"a": 0, "b": 0, "c": 0}


@pytest.mark.parametrize("lower, upper", [(3, 3), (5, 2)])
def test_empty_lifetime_is_an_error_naming_the_id(lower: int, upper: int) -> None:
    with pytest.raises(ValueError, match="bad-buffer"):
        pack_offsets([("ok", 0, 1, 1), ("bad-buffer", lower, upper, 4)])


def test_other_input_errors() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        pack_offsets([("x", 0, 1, 1), ("x", 1, 2, 1)])
    with pytest.raises(ValueError, match="negative"):
        pack_offsets([("x", 0, 1, -1)])
    with pytest.raises(ValueError, match="integer"):
        pack_offsets([("x", 0.5, 1, 1)])
    with pytest.raises(ValueError, match="alignment"):
        pack_offsets([("x", 0, 1, 1)], alignment=0)


def test_alignment() -> None:
    rows = [(k, k % 3, k % 3 + 2, 5 + k) for k in range(8)]
    offsets = pack_offsets(rows, alignment=16)
    assert all(o % 16 == 0 for o in offsets.values())
    validate(rows, offsets)


def test_validate_names_the_overlapping_pair() -> None:
    rows = [("a", 0, 4, 8), ("b", 2, 6, 8), ("c", 6, 9, 8)]
    validate(rows, {"a": 0, "b": 8, "c": 0})
    with pytest.raises(ValueError, match=r"'a' and 'b'"):
        validate(rows, {"a": 0, "b": 4, "c": 0})
    with pytest.raises(ValueError, match="'c' has no offset"):
        validate(rows, {"a": 0, "b": 8})


def test_lower_bound_and_peak() -> None:
    rows = [("a", 0, 4, 8), ("b", 2, 6, 3), ("c", 4, 9, 7)]
    assert lower_bound(rows) == 11  # a+b at [2, 4); b+c = 10 at [4, 6)
    assert peak(rows, {"a": 0, "b": 8, "c": 0}) == 11


def test_deterministic_and_independent_of_capacity() -> None:
    rows = [(k, (7 * k) % 11, (7 * k) % 11 + 1 + k % 4, 1 + (5 * k) % 9) for k in range(40)]
    first = pack_offsets(rows, effort=3000)
    assert pack_offsets(rows, effort=3000) == first
    assert pack_offsets(rows, capacity=peak(rows, first), effort=3000) == first


def test_time_budget_still_returns_a_valid_packing() -> None:
    rows = [(k, (7 * k) % 50, (7 * k) % 50 + 1 + k % 9, 1 + (5 * k) % 13) for k in range(300)]
    offsets = pack_offsets(rows, time_budget_s=0.01)
    validate(rows, offsets)


# --------------------------------------------------------------------------- #
# Property tests on small random instances
# --------------------------------------------------------------------------- #


@st.composite
def instances(draw: st.DrawFn, max_buffers: int = 14, max_time: int = 12, max_size: int = 9) -> list[Row]:
    count = draw(st.integers(0, max_buffers))
    rows = []
    for ident in range(count):
        lower = draw(st.integers(0, max_time - 1))
        upper = draw(st.integers(lower + 1, max_time))
        rows.append((ident, lower, upper, draw(st.integers(0, max_size))))
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from([1, 1, 2, 4]))
def test_random_instances_are_packed_validly(rows: list[Row], alignment: int) -> None:
    offsets = pack_offsets(rows, alignment=alignment, effort=400)
    assert set(offsets) == {r[0] for r in rows}
    validate(rows, offsets)
    assert all(o % alignment == 0 and o >= 0 for o in offsets.values())
    assert peak(rows, offsets) >= lower_bound(rows)
    for ident, _, _, size in rows:
        if size == 0:
            assert offsets[ident] == 0


@settings(max_examples=60, deadline=None)
@given(instances())
def test_capacity_error_reports_capacity_peak_and_bound(rows: list[Row]) -> None:
    bound = lower_bound(rows)
    best = peak(rows, pack_offsets(rows, effort=400))
    assert pack_offsets(rows, capacity=best, effort=400) is not None
    if bound == 0:
        return
    with pytest.raises(PackingError) as info:
        pack_offsets(rows, capacity=bound - 1, effort=400)
    err = info.value
    assert (err.capacity, err.lower_bound) == (bound - 1, bound)
    assert err.best_peak >= bound
    assert all(str(x) in str(err) for x in (bound - 1, err.best_peak, bound))


def brute_force_optimum(rows: list[Row]) -> int:
    """Smallest feasible capacity, by exhaustive search over all offsets."""
    live = [r for r in rows if r[3] > 0]
    clash = {
        (i, j)
        for i, j in itertools.combinations(range(len(live)), 2)
        if live[i][1] < live[j][2] and live[j][1] < live[i][2]
    }

    def fits(capacity: int, placed: list[int]) -> bool:
        k = len(placed)
        if k == len(live):
            return True
        size = live[k][3]
        for offset in range(capacity - size + 1):
            if all(
                (j, k) not in clash or offset + size <= placed[j] or placed[j] + live[j][3] <= offset
                for j in range(k)
            ):
                if fits(capacity, placed + [offset]):
                    return True
        return False

    capacity = lower_bound(rows)
    while not fits(capacity, []):
        capacity += 1
    return capacity


@settings(max_examples=80, deadline=None)
@given(instances(max_buffers=6, max_time=6, max_size=4))
def test_small_instances_are_solved_optimally(rows: list[Row]) -> None:
    offsets = pack_offsets(rows)
    validate(rows, offsets)
    assert peak(rows, offsets) == brute_force_optimum(rows)
