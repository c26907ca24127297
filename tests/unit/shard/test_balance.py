"""rebalance: even counts, fewest moves (checked against brute force), order independence."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.shard.balance import moves_lower_bound, rebalance
from quorumlog.shard.config import UNASSIGNED_GID


def changed(before: list[int], after: list[int]) -> int:
    return sum(1 for old, new in zip(before, after, strict=True) if old != new)


def is_balanced(shards: list[int], gids: set[int]) -> bool:
    if not gids:
        return all(owner == UNASSIGNED_GID for owner in shards)
    if any(owner not in gids for owner in shards):
        return False
    counts = [shards.count(gid) for gid in gids]
    return max(counts) - min(counts) <= 1


def brute_force_fewest_moves(before: list[int], gids: set[int]) -> int:
    """Try every assignment of shards to live groups; the fewest changes among balanced ones."""
    if not gids:
        return changed(before, [UNASSIGNED_GID] * len(before))
    fewest = len(before)
    for candidate in itertools.product(sorted(gids), repeat=len(before)):
        assignment = list(candidate)
        if is_balanced(assignment, gids):
            fewest = min(fewest, changed(before, assignment))
    return fewest


def test_first_join_takes_every_shard() -> None:
    assert rebalance([0] * 4, [7]) == [7, 7, 7, 7]


def test_second_group_takes_half_from_the_first() -> None:
    after = rebalance([1] * 10, [1, 2])
    assert after.count(1) == 5
    assert after.count(2) == 5
    # The first group keeps its lowest-numbered shards; the rest move.
    assert after == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]


def test_departed_group_shards_go_to_the_least_loaded() -> None:
    before = [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]
    # Group 1 leaves: 3 orphans, 4 holds only one shard so it takes two of them.
    after = rebalance(before, [2, 3, 4])
    assert after == [4, 4, 2, 2, 2, 2, 3, 3, 3, 4]
    assert after[3:] == before[3:]
    assert changed(before, after) == 3


def test_no_group_left_unassigns_everything() -> None:
    assert rebalance([1, 2, 1], []) == [0, 0, 0]


def test_more_groups_than_shards_leaves_spare_groups_empty_and_moves_nothing() -> None:
    before = [1, 2]
    after = rebalance(before, [1, 2, 3, 4])
    assert after == before


def test_extra_shards_go_to_groups_that_already_hold_them() -> None:
    # 5 shards over 2 groups: group 2 holds 3 and keeps them (it gets the extra target).
    before = [1, 1, 2, 2, 2]
    assert rebalance(before, [1, 2]) == before


def test_ties_are_broken_by_gid_not_by_input_order() -> None:
    before = [0] * 5
    expected = rebalance(before, [3, 1, 2])
    for order in itertools.permutations([1, 2, 3]):
        assert rebalance(before, list(order)) == expected
        assert rebalance(before, {gid: [f"s{gid}"] for gid in order}) == expected
    # The lowest gid gets the extra shard when loads tie.
    assert expected.count(1) == 2


def test_lower_bound_matches_brute_force_on_small_cases() -> None:
    generator = random.Random(20240601)
    for _ in range(300):
        shard_count = generator.randint(1, 6)
        universe = [0, 1, 2, 3, 4]
        before = [generator.choice(universe) for _ in range(shard_count)]
        gids = set(generator.sample([1, 2, 3, 4], generator.randint(0, 3)))
        after = rebalance(before, gids)
        fewest = brute_force_fewest_moves(before, gids)
        assert moves_lower_bound(before, gids) == fewest, (before, gids)
        assert changed(before, after) == fewest, (before, gids, after)
        assert is_balanced(after, gids)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=40),
    gids=st.sets(st.integers(min_value=1, max_value=9), max_size=8),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_rebalance_properties(before: list[int], gids: set[int], seed: int) -> None:
    after = rebalance(before, gids)
    assert is_balanced(after, gids)
    assert changed(before, after) == moves_lower_bound(before, gids)
    # Only orphans and a shrinking group's shards move, and only to growing groups: no
    # group both gives and receives.
    for old, new in zip(before, after, strict=True):
        if old != new:
            assert old not in gids or after.count(old) < before.count(old)
            assert new == UNASSIGNED_GID or after.count(new) > before.count(new)
    # Same answer whatever order the groups arrive in (dict insertion order, set order).
    shuffled = sorted(gids)
    random.Random(seed).shuffle(shuffled)
    assert rebalance(before, shuffled) == after
    assert rebalance(before, {gid: ["server"] for gid in shuffled}) == after
    # Balancing a balanced assignment changes nothing.
    assert rebalance(after, gids) == after
