"""The partition assignors: every partition to exactly one eligible member, balanced,
deterministic, and (cooperative-sticky) moving no more partitions than balance needs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.stream.assignors import (
    COOPERATIVE_STICKY,
    RANGE,
    TopicPartition,
    all_partitions,
    assign,
)

TOPICS = ["a", "b", "c"]

members_strategy = st.lists(
    st.text(alphabet="mnopq", min_size=1, max_size=3), min_size=1, max_size=7, unique=True
)
counts_strategy = st.fixed_dictionaries({topic: st.integers(0, 12) for topic in TOPICS})


def owners(assignment: dict[str, list[TopicPartition]]) -> dict[TopicPartition, str]:
    found: dict[TopicPartition, str] = {}
    for member, partitions in assignment.items():
        for partition in partitions:
            assert partition not in found, f"{partition} assigned twice"
            found[partition] = member
    return found


def check_complete(
    subscriptions: dict[str, list[str]],
    counts: dict[str, int],
    assignment: dict[str, list[TopicPartition]],
) -> None:
    found = owners(assignment)
    assert set(found) == set(all_partitions(subscriptions, counts))
    for partition, member in found.items():
        assert partition[0] in subscriptions[member]


@pytest.mark.parametrize("assignor", [RANGE, COOPERATIVE_STICKY])
@settings(max_examples=80, deadline=None)
@given(members=members_strategy, counts=counts_strategy, data=st.data())
def test_every_partition_once_to_a_subscriber_and_deterministic(
    assignor: str, members: list[str], counts: dict[str, int], data: st.DataObject
) -> None:
    subscriptions = {
        member: data.draw(st.lists(st.sampled_from(TOPICS), min_size=1, unique=True))
        for member in members
    }
    assignment = assign(assignor, subscriptions, counts, {})
    check_complete(subscriptions, counts, assignment)
    shuffled = list(subscriptions.items())
    random.Random(7).shuffle(shuffled)
    assert assign(assignor, dict(shuffled), counts, {}) == assignment


@settings(max_examples=80, deadline=None)
@given(members=members_strategy, counts=counts_strategy)
def test_sticky_is_balanced_when_subscriptions_match(
    members: list[str], counts: dict[str, int]
) -> None:
    subscriptions = {member: list(TOPICS) for member in members}
    assignment = assign(COOPERATIVE_STICKY, subscriptions, counts, {})
    loads = [len(partitions) for partitions in assignment.values()]
    assert max(loads) - min(loads) <= 1


def test_range_splits_each_topic_in_contiguous_ranges() -> None:
    assignment = assign(RANGE, {"m1": ["t"], "m2": ["t"]}, {"t": 3}, {})
    assert assignment == {"m1": [("t", 0), ("t", 1)], "m2": [("t", 2)]}


@settings(max_examples=80, deadline=None)
@given(members=members_strategy, counts=counts_strategy, newcomer=st.text("xyz", min_size=1))
def test_sticky_join_takes_only_from_others_and_leave_moves_only_the_leavers(
    members: list[str], counts: dict[str, int], newcomer: str
) -> None:
    subscriptions = {member: list(TOPICS) for member in members}
    before = assign(COOPERATIVE_STICKY, subscriptions, counts, {})
    # A member joins: every partition stays where it was or goes to the newcomer.
    joined = assign(COOPERATIVE_STICKY, {**subscriptions, newcomer: list(TOPICS)}, counts, before)
    owner_before, owner_after = owners(before), owners(joined)
    moved = [p for p, member in owner_after.items() if owner_before[p] != member]
    assert all(owner_after[p] == newcomer for p in moved)
    loads = [len(partitions) for partitions in joined.values()]
    assert max(loads) - min(loads) <= 1
    # The newcomer takes no more than its fair share (the fewest moves balance allows).
    assert len(moved) == len(joined[newcomer]) <= -(-len(owner_after) // len(joined))
    # A member leaves: only its partitions move.
    leaver = members[0]
    rest = {member: topics for member, topics in subscriptions.items() if member != leaver}
    if not rest:
        return
    left = assign(COOPERATIVE_STICKY, rest, counts, before)
    for partition, member in owners(left).items():
        if owner_before[partition] != leaver:
            assert member == owner_before[partition]


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(ValueError, match="assignor"):
        assign("roundrobin", {"m": ["t"]}, {"t": 1}, {})
