"""Replicas agree: same entries give the same configurations and byte-identical snapshots,
whatever order a join's groups were listed in; random histories stay balanced and minimal."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.shard.balance import moves_lower_bound
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration
from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.controller_commands import (
    ControllerBatch,
    ControllerCommand,
    ControllerEntry,
    Join,
    Leave,
    Move,
    Query,
    encode_entry,
)
from tests.unit.shard.harness import changed_shards, servers_of


def shuffled_join(sequence: int, gids: list[int], generator: random.Random) -> Join:
    """A join whose groups dict was built in a random insertion order."""
    order = list(gids)
    generator.shuffle(order)
    return Join(sequence, {gid: servers_of(gid) for gid in order})


def test_two_machines_fed_the_same_entries_give_identical_snapshots() -> None:
    entries = [
        ControllerEntry(10, [ControllerBatch("a", 0, [Join(1, {1: servers_of(1)})])]),
        ControllerEntry(
            20,
            [
                ControllerBatch("b", 0, [Join(1, {3: servers_of(3), 2: servers_of(2)})]),
                ControllerBatch("a", 2, [Move(2, 5, 3), Query(3, -1)]),
            ],
        ),
        ControllerEntry(30, [ControllerBatch("a", 3, [Leave(4, [1])])]),
    ]
    first, second = ControllerMachine(), ControllerMachine()
    for index, entry in enumerate(entries, start=1):
        data = encode_entry(entry)
        assert first.apply(index, data) == second.apply(index, data)
    assert first.configurations == second.configurations
    assert first.snapshot() == second.snapshot()


def test_join_order_of_groups_does_not_change_state_or_snapshot_bytes() -> None:
    generator = random.Random(7)
    snapshots = set()
    for _ in range(10):
        machine = ControllerMachine()
        join = shuffled_join(1, [5, 1, 9, 3, 7], generator)
        machine.apply(1, encode_entry(ControllerEntry(1, [ControllerBatch("c", 0, [join])])))
        leave = Leave(2, [9, 1])
        machine.apply(2, encode_entry(ControllerEntry(2, [ControllerBatch("c", 0, [leave])])))
        snapshots.add(machine.snapshot())
    assert len(snapshots) == 1


# --- random histories -----------------------------------------------------------------------

GID_UNIVERSE = list(range(1, 13))

Step = tuple[str, list[int], int, int]
"""(kind, gids, shard, gid choice): join and leave use the gids, move the last two."""

steps_strategy = st.lists(
    st.tuples(
        st.sampled_from(["join", "join", "leave", "move"]),
        st.lists(st.sampled_from(GID_UNIVERSE), min_size=1, max_size=4, unique=True),
        st.integers(min_value=0, max_value=20),
        st.integers(min_value=0, max_value=12),
    ),
    min_size=1,
    max_size=25,
)


def make_command(
    step: Step, sequence: int, latest: ShardConfiguration, generator: random.Random
) -> ControllerCommand:
    """Turn a drawn step into a command, valid against `latest` where it can be (an invalid
    one, like a move to no group or of a shard past the end, checks rejection)."""
    kind, gids, shard, gid_choice = step
    if kind == "join":
        new_gids = [gid for gid in gids if gid not in latest.groups]
        return shuffled_join(sequence, new_gids or gids, generator)
    live = sorted(latest.groups)
    if kind == "leave":
        present = [gid for gid in gids if gid in latest.groups]
        if not present and live:
            present = [live[gid_choice % len(live)]]
        return Leave(sequence, present or gids)
    gid = live[gid_choice % len(live)] if live else gid_choice
    return Move(sequence, shard % (latest.shard_count + 1), gid)


def check_step(
    command: ControllerCommand, before: ShardConfiguration, after: ShardConfiguration
) -> None:
    if isinstance(command, Move):
        assert len(changed_shards(before, after)) <= 1
        assert after.shards[command.shard] == command.gid
        assert after.groups == before.groups
        return
    assert isinstance(command, Join | Leave)
    gids = set(after.groups)
    if not gids:
        assert after.shards == [UNASSIGNED_GID] * after.shard_count
    else:
        counts = [after.shards.count(gid) for gid in gids]
        assert max(counts) - min(counts) <= 1
        assert all(owner in gids for owner in after.shards)
    assert len(changed_shards(before, after)) == moves_lower_bound(before.shards, gids)


@settings(max_examples=120, deadline=None)
@given(
    steps=steps_strategy,
    shard_count=st.integers(min_value=1, max_value=20),
    seed=st.integers(min_value=0, max_value=2**32),
    snapshot_at=st.integers(min_value=0, max_value=25),
)
def test_random_histories_are_balanced_minimal_and_deterministic(
    steps: list[Step], shard_count: int, seed: int, snapshot_at: int
) -> None:
    # Two replicas see the same commands, but each join's groups dict is built in its own
    # random order, as if decoded on different machines from differently built requests.
    first = ControllerMachine(shard_count=shard_count)
    second = ControllerMachine(shard_count=shard_count)
    first_generator, second_generator = random.Random(seed), random.Random(seed + 1)
    for index, step in enumerate(steps, start=1):
        before = first.latest
        command = make_command(step, index, before, first_generator)
        twin = make_command(step, index, second.latest, second_generator)
        query = Query(10_000 + index, -1)
        first_results = first.apply(
            index, encode_entry(ControllerEntry(index, [ControllerBatch("c", 0, [command, query])]))
        )
        second_results = second.apply(
            index, encode_entry(ControllerEntry(index, [ControllerBatch("c", 0, [twin, query])]))
        )
        assert first_results == second_results
        [[result, read]] = first_results
        if result.ok:
            assert result.configuration_number == before.number + 1
            check_step(command, before, first.latest)
        else:
            assert first.latest is before
        assert read.configuration == first.latest
        if index == snapshot_at:
            # A replica restored from a snapshot mid-history carries on identically.
            restored = ControllerMachine(shard_count=shard_count)
            restored.restore(second.snapshot())
            second = restored
    assert first.snapshot() == second.snapshot()
    assert first.configurations == second.configurations
