"""Striping and quorums (reference 001: write sets, Qf = Qw - Qa + 1 per write set)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from quorumlog.ledger.protocol_schedule import DistributionSchedule


def test_write_sets_stripe_as_in_the_reference() -> None:
    """001: E=3, Qw=2 -> entry 0 to 0,1; entry 1 to 1,2; entry 2 to 2,0."""
    schedule = DistributionSchedule(3, 2, 2)
    assert [schedule.write_set(entry) for entry in range(4)] == [(0, 1), (1, 2), (2, 0), (0, 1)]


@pytest.mark.parametrize(
    ("write_quorum", "ack_quorum", "fence_quorum"), [(5, 3, 3), (3, 2, 2), (3, 3, 1)]
)
def test_fence_quorum_is_write_quorum_minus_ack_quorum_plus_one(
    write_quorum: int, ack_quorum: int, fence_quorum: int
) -> None:
    """001's three examples."""
    assert DistributionSchedule(5, write_quorum, ack_quorum).fence_quorum_size == fence_quorum


def test_every_write_set_must_be_covered() -> None:
    """001: E=3, Qw=Qa=2 (Qf=1): bookies 0,1,2 need two of them fenced, since each of the
    write sets {0,1}, {1,2}, {2,0} needs one."""
    schedule = DistributionSchedule(3, 2, 2)
    assert not schedule.fence_covered({0})
    assert schedule.fence_covered({0, 1})
    assert schedule.fence_covered({1, 2})
    # E=Qw=Qa: any one bookie is enough.
    assert DistributionSchedule(3, 3, 3).fence_covered({2})
    # Qw=3, Qa=2 (Qf=2): two of three.
    assert not DistributionSchedule(3, 3, 2).fence_covered({0})
    assert DistributionSchedule(3, 3, 2).fence_covered({0, 2})


def brute_force_frontier(
    schedule: DistributionSchedule, watermarks: list[int], last_add_confirmed: int
) -> int:
    entry = last_add_confirmed + 1
    while True:
        acks = sum(1 for p in schedule.write_set(entry) if watermarks[p] >= entry)
        if acks < schedule.ack_quorum_size:
            return entry - 1
        entry += 1


@st.composite
def schedules_and_watermarks(draw: st.DrawFn) -> tuple[DistributionSchedule, list[int], int]:
    ensemble = draw(st.integers(1, 6))
    write_quorum = draw(st.integers(1, ensemble))
    ack_quorum = draw(st.integers(1, write_quorum))
    last_add_confirmed = draw(st.integers(-1, 20))
    watermarks = draw(st.lists(st.integers(-1, 40), min_size=ensemble, max_size=ensemble))
    return DistributionSchedule(ensemble, write_quorum, ack_quorum), watermarks, last_add_confirmed


@given(schedules_and_watermarks())
def test_acknowledged_frontier_matches_counting_acks_entry_by_entry(
    case: tuple[DistributionSchedule, list[int], int],
) -> None:
    schedule, watermarks, last_add_confirmed = case
    expected = brute_force_frontier(schedule, watermarks, last_add_confirmed)
    assert schedule.acknowledged_frontier(watermarks, last_add_confirmed) == expected


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError):
        DistributionSchedule(3, 4, 2)
    with pytest.raises(ValueError):
        DistributionSchedule(3, 2, 3)


@st.composite
def schedules_and_batches(draw: st.DrawFn) -> tuple[DistributionSchedule, int, int, int]:
    ensemble = draw(st.integers(1, 6))
    write_quorum = draw(st.integers(1, ensemble))
    schedule = DistributionSchedule(ensemble, write_quorum, 1)
    return (
        schedule,
        draw(st.integers(0, ensemble - 1)),
        draw(st.integers(0, 1000)),
        draw(st.integers(0, 40)),
    )


@given(schedules_and_batches())
def test_a_share_is_the_entries_whose_write_set_holds_the_position(
    drawn: tuple[DistributionSchedule, int, int, int],
) -> None:
    """The picker is built from strides; it must pick exactly what `holds` says, in order."""
    schedule, position, first_entry_id, count = drawn
    batch = [first_entry_id + k for k in range(count)]
    expected = [entry for entry in batch if schedule.holds(position, entry)]
    assert schedule.share(position, first_entry_id, batch) == expected
    assert schedule.share(position, first_entry_id, batch) == expected  # the cached picker
