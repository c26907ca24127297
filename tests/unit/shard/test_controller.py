"""ControllerMachine: the reference's shardctrler tests, validation, dedup, snapshots."""

from __future__ import annotations

import re

import msgspec
import pytest

from quorumlog.kv.machine import MalformedEntryError
from quorumlog.shard.balance import moves_lower_bound
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration, make_configuration
from quorumlog.shard.controller import ControllerMachine, ControllerSnapshot
from quorumlog.shard.controller_commands import (
    ControllerBatch,
    ControllerCommand,
    ControllerEntry,
    ControllerResult,
    Join,
    Leave,
    Move,
    Query,
    encode_entry,
)
from tests.unit.shard.harness import Admin, changed_shards, check, servers_of

# --- the reference's shardctrler tests ------------------------------------------------------


def test_initial_configuration_is_empty() -> None:
    admin = Admin()
    configuration = admin.query()
    assert configuration.number == 0
    assert configuration.shards == [UNASSIGNED_GID] * 16
    assert configuration.groups == {}
    assert admin.machine.latest == configuration


def test_basic_join_and_leave() -> None:
    admin = Admin()
    assert admin.join(1) == ControllerResult(ok=True, configuration_number=1)
    check(admin.query(), {1})
    assert admin.join(2).configuration_number == 2
    check(admin.query(), {1, 2})
    assert admin.leave(1).configuration_number == 3
    check(admin.query(), {2})
    assert admin.leave(2).configuration_number == 4
    check(admin.query(), set())
    assert admin.query().number == 4


def test_history_of_configurations_is_preserved() -> None:
    admin = Admin()
    seen = [admin.query()]
    for step in range(1, 6):
        admin.join(step)
        seen.append(admin.query())
    admin.leave(2, 4)
    seen.append(admin.query())
    for number, configuration in enumerate(seen):
        assert configuration.number == number
        assert admin.query(number) == configuration
        assert admin.machine.query(number) == configuration
    # Past the latest, and -1, read the latest.
    assert admin.query(len(seen) + 10) == seen[-1]
    assert admin.machine.query(-1) == seen[-1]


def test_query_below_minus_one_is_rejected() -> None:
    admin = Admin()
    result = admin.run(Query(admin.take_sequence(), -2))
    assert not result.ok
    assert result.error is not None
    with pytest.raises(ValueError, match="-1 or more"):
        admin.machine.query(-2)


def test_join_of_several_groups_makes_one_configuration() -> None:
    admin = Admin()
    admin.join(1)
    result = admin.join(2, 3, 4)
    assert result.configuration_number == 2
    configuration = admin.query()
    assert configuration.number == 2
    check(configuration, {1, 2, 3, 4})
    assert [configuration.shards.count(gid) for gid in (1, 2, 3, 4)] == [4, 4, 4, 4]


def test_leave_of_several_groups_makes_one_configuration() -> None:
    admin = Admin()
    admin.join(1, 2, 3, 4, 5)
    before = admin.query()
    result = admin.leave(1, 3, 5)
    assert result.configuration_number == 2
    after = admin.query()
    check(after, {2, 4})
    # Only the departed groups' shards moved.
    for shard in changed_shards(before, after):
        assert before.shards[shard] in {1, 3, 5}


def test_move_pins_a_shard_until_the_next_join_or_leave() -> None:
    admin = Admin()
    admin.join(1, 2)
    # The reference moves every shard alternately and checks each lands where told.
    for shard in range(16):
        target = 1 if shard % 2 == 0 else 2
        admin.move(shard, target)
    configuration = admin.query()
    assert configuration.number == 1 + 16
    assert configuration.shards == [1 if shard % 2 == 0 else 2 for shard in range(16)]
    # An unbalancing move also sticks: nothing rebalances behind it.
    admin.move(1, 1)
    admin.move(3, 1)
    pinned = admin.query()
    assert pinned.shards.count(1) == 10
    assert pinned.shards[1] == 1
    assert pinned.shards[3] == 1
    # The next join rebalances, moving as few shards as any balanced map could.
    admin.join(3)
    after = admin.query()
    check(after, {1, 2, 3})
    assert len(changed_shards(pinned, after)) == moves_lower_bound(pinned.shards, [1, 2, 3])


def test_move_to_unknown_group_or_bad_shard_is_rejected() -> None:
    admin = Admin()
    admin.join(1)
    for result in (admin.move(0, 2), admin.move(16, 1), admin.move(-1, 1), admin.move(0, 0)):
        assert not result.ok
        assert result.error
    assert admin.query().number == 1


def test_minimal_transfers_after_joins() -> None:
    admin = Admin()
    admin.join(1)
    for new_gid in range(2, 9):
        before = admin.query()
        admin.join(new_gid)
        after = admin.query()
        check(after, set(range(1, new_gid + 1)))
        moved = changed_shards(before, after)
        # A join takes shards only to the new group, and no more than balance needs.
        assert all(after.shards[shard] == new_gid for shard in moved)
        assert len(moved) == moves_lower_bound(before.shards, after.groups)


def test_minimal_transfers_after_leaves() -> None:
    admin = Admin()
    admin.join(*range(1, 9))
    for leaving_gid in range(1, 8):
        before = admin.query()
        admin.leave(leaving_gid)
        after = admin.query()
        check(after, set(range(leaving_gid + 1, 9)))
        moved = changed_shards(before, after)
        # A leave moves only the departed group's shards.
        assert all(before.shards[shard] == leaving_gid for shard in moved)
        assert len(moved) == before.shards.count(leaving_gid)


def test_balance_after_every_operation_with_more_groups_than_shards() -> None:
    admin = Admin(ControllerMachine(shard_count=4))
    for gid in range(1, 7):
        admin.join(gid)
        configuration = admin.query()
        counts = [configuration.shards.count(gid) for gid in configuration.groups]
        assert max(counts) - min(counts) <= 1
        assert UNASSIGNED_GID not in configuration.shards
    before = admin.query()
    # Spare groups (owning nothing) leave without moving any shard.
    spare = [gid for gid in before.groups if gid not in before.shards]
    assert len(spare) == 2
    admin.leave(*spare)
    assert admin.query().shards == before.shards


def test_all_shards_go_to_gid_zero_when_no_group_is_left() -> None:
    admin = Admin()
    admin.join(1, 2, 3)
    admin.leave(1, 2, 3)
    check(admin.query(), set())
    admin.join(4)
    check(admin.query(), {4})


def test_configurable_shard_count() -> None:
    admin = Admin(ControllerMachine(shard_count=5))
    admin.join(1, 2)
    configuration = admin.query()
    assert configuration.shard_count == 5
    assert sorted(configuration.shards.count(gid) for gid in (1, 2)) == [2, 3]
    assert admin.machine.shard_count == 5


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (Join(1, {}), "no group"),
        (Join(1, {0: ["a:1"]}), "positive"),
        (Join(1, {-3: ["a:1"]}), "positive"),
        (Join(1, {1: ["x:1"]}), "already joined"),
        (Join(1, {5: []}), "no servers"),
        (Join(1, {5: [""]}), "empty server"),
        (Join(1, {5: [f"n{n}:1" for n in range(65)]}), "at most"),
        (Leave(1, []), "no group"),
        (Leave(1, [1, 9]), r"\[9\]"),
    ],
)
def test_bad_join_or_leave_is_rejected_and_changes_nothing(
    command: ControllerCommand, message: str
) -> None:
    admin = Admin()
    admin.join(1)
    latest = admin.machine.latest
    # A client of its own, so the command's sequence 1 does not collide with join(1)'s.
    other = Admin(admin.machine, client_id="other")
    other.index = admin.index
    [result] = other.run_commands(command)
    assert not result.ok
    assert result.error is not None
    assert re.search(message, result.error), result.error
    assert result.configuration_number is None
    assert len(admin.machine.configurations) == 2
    assert admin.machine.latest is latest


def test_group_count_bound() -> None:
    admin = Admin(ControllerMachine(group_count_max=3))
    admin.join(1, 2)
    result = admin.join(3, 4)
    assert not result.ok
    assert admin.join(3).ok
    with pytest.raises(ValueError, match="group_count_max"):
        ControllerMachine(group_count_max=0)


# --- deduplication --------------------------------------------------------------------------


def test_retried_join_in_a_later_entry_is_not_applied_twice() -> None:
    admin = Admin()
    join = Join(admin.take_sequence(), {1: servers_of(1)})
    first = admin.run(join)
    admin.join(2)
    retry = admin.run(join)
    assert retry == first == ControllerResult(ok=True, configuration_number=1)
    assert admin.machine.latest.number == 2
    assert admin.machine.duplicate_count == 1


def test_retried_leave_and_move_in_the_same_batch_are_not_applied_twice() -> None:
    admin = Admin()
    admin.join(1, 2, 3)
    leave = Leave(admin.take_sequence(), [3])
    move = Move(admin.take_sequence(), 0, 2)
    results = admin.run_commands(leave, move, leave, move)
    assert results[2:] == results[:2]
    assert [result.configuration_number for result in results] == [2, 3, 2, 3]
    assert admin.machine.latest.number == 3
    assert admin.machine.duplicate_count == 2


def test_retried_rejected_command_gets_the_same_error_and_is_not_reexecuted() -> None:
    admin = Admin()
    admin.join(1)
    move = Move(admin.take_sequence(), 0, 2)
    rejected = admin.run(move)
    assert not rejected.ok
    # Group 2 joins in between: re-executing the move would now succeed.
    admin.join(2)
    assert admin.run(move) == rejected
    assert admin.machine.latest.number == 2


def test_retry_after_acknowledgement_is_not_applied_and_gets_no_number() -> None:
    admin = Admin()
    join = Join(admin.take_sequence(), {1: servers_of(1)})
    admin.run(join)
    [retry] = admin.run_commands(join, first_unacknowledged=join.sequence + 1)
    assert retry == ControllerResult(ok=True, configuration_number=None)
    assert admin.machine.latest.number == 1


def test_same_sequence_from_different_clients_is_two_commands() -> None:
    machine = ControllerMachine()
    first = Admin(machine, client_id="a")
    second = Admin(machine, client_id="b")
    first.join(1)
    second.index = first.index
    second.join(2)
    assert machine.latest.number == 2
    assert machine.duplicate_count == 0


def test_queries_are_not_stored_so_a_retry_reads_again() -> None:
    admin = Admin()
    query = Query(admin.take_sequence(), -1)
    assert admin.run(query).configuration == admin.machine.query(0)
    admin.join(1)
    retried = admin.run(query)
    assert retried.configuration is not None
    assert retried.configuration.number == 1
    assert admin.machine.duplicate_count == 0
    assert admin.machine.sessions.sessions["admin"].results.keys() == {2}


# --- apply, snapshots -------------------------------------------------------------------------


def test_entries_at_or_below_applied_index_are_skipped() -> None:
    admin = Admin()
    admin.join(1)
    data = encode_entry(ControllerEntry(5, [ControllerBatch("x", 0, [Join(1, {2: ["b:1"]})])]))
    assert admin.machine.apply(admin.index, data) == []
    admin.machine.mark_applied(10)
    assert admin.machine.applied_index == 10
    admin.machine.mark_applied(3)
    assert admin.machine.applied_index == 10
    assert admin.machine.apply(10, data) == []
    assert admin.machine.latest.number == 1


def test_malformed_entry_raises() -> None:
    machine = ControllerMachine()
    with pytest.raises(MalformedEntryError, match="entry 1"):
        machine.apply(1, b"\x01\x02")
    bad_command = msgspec.msgpack.encode([5, [["c", 0, [["explode", 1]]]]])
    with pytest.raises(MalformedEntryError):
        machine.apply(1, bad_command)
    assert machine.applied_index == 0


def test_snapshot_restore_round_trip_mid_sequence() -> None:
    original = Admin()
    original.join(1, 2)
    original.move(0, 2)
    retried_join = Join(original.take_sequence(), {3: servers_of(3)})
    original.run(retried_join)
    data = original.machine.snapshot()

    restored = Admin(ControllerMachine())
    restored.machine.restore(data)
    restored.index = original.index
    restored.next_sequence = original.next_sequence
    restored.timestamp_ms = original.timestamp_ms
    assert restored.machine.snapshot() == data
    assert restored.machine.configurations == original.machine.configurations
    assert restored.machine.applied_index == original.machine.applied_index

    # Both continue with the same commands and stay identical; the restored sessions still
    # recognise a command applied before the snapshot.
    for admin in (original, restored):
        assert admin.run(retried_join).configuration_number == 3
        admin.leave(1)
        admin.join(4, 5)
        admin.move(7, 5)
    assert restored.machine.snapshot() == original.machine.snapshot()
    assert restored.machine.latest.number == 6
    check(restored.machine.query(5), {2, 3, 4, 5})


def test_restore_rejects_bad_snapshots_and_keeps_state() -> None:
    admin = Admin()
    admin.join(1)
    before = admin.machine.snapshot()
    good = msgspec.msgpack.decode(before, type=ControllerSnapshot)

    def variant(**changes: object) -> bytes:
        return msgspec.msgpack.encode(msgspec.structs.replace(good, **changes))

    stray_owner = ShardConfiguration(1, [9] * 16, {1: ["a"]})
    nonempty_first = ShardConfiguration(0, [1] * 16, {1: ["a"]})
    unbalanced_history = [*good.configurations, make_configuration(5, [1] * 16, {1: ["a"]})]
    bad_snapshots = [
        (b"not a snapshot", "does not decode"),
        (variant(format_version=99), "format"),
        (variant(shard_count=8), "8 shards"),
        (variant(configurations=[]), "no configuration"),
        (variant(configurations=unbalanced_history), "numbered 5"),
        (variant(configurations=good.configurations[1:]), "numbered 1"),
        (variant(configurations=[good.configurations[0], stray_owner]), "not a group"),
        (variant(configurations=[good.configurations[1]]), "numbered 1"),
        (variant(configurations=[nonempty_first]), "configuration 0 is not empty"),
    ]
    for data, message in bad_snapshots:
        with pytest.raises(MalformedEntryError, match=message):
            admin.machine.restore(data)
        assert admin.machine.snapshot() == before


def test_restore_into_machine_with_other_shard_count_is_refused() -> None:
    admin = Admin()
    admin.join(1)
    with pytest.raises(MalformedEntryError, match="16 shards"):
        ControllerMachine(shard_count=8).restore(admin.machine.snapshot())


def test_session_expiry_follows_entry_timestamps() -> None:
    machine = ControllerMachine(session_ttl_ms=100)
    admin = Admin(machine)
    join = Join(admin.take_sequence(), {1: servers_of(1)})
    admin.run(join)
    admin.timestamp_ms += 1_000
    other = Admin(machine, client_id="other")
    other.index = admin.index
    other.timestamp_ms = admin.timestamp_ms
    other.join(2)
    assert "admin" not in machine.sessions.sessions
    assert machine.session_count == 1
