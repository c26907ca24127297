"""ShardGroupMachine: shard state transitions one by one, replay idempotency, wrong group,
dedup across a migration, garbage collection and snapshots."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.codec.wire import KVCommand, KVCommandResult
from quorumlog.kv.commands import ClientBatch
from quorumlog.kv.machine import MalformedEntryError
from quorumlog.kv.sessions import SessionRecord, SessionTable, lookup_duplicate
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.shard.config import (
    UNASSIGNED_GID,
    ShardConfiguration,
    make_configuration,
    shard_for_key,
)
from quorumlog.shard.group_commands import (
    ClientWrites,
    ControlApplied,
    DeleteShards,
    EmptyEntry,
    GroupApplyResult,
    GroupEntry,
    InsertShards,
    NewConfiguration,
    PullStatus,
    WriteResult,
    WritesApplied,
    WrongGroup,
    encode_entry,
)
from quorumlog.shard.group_machine import (
    GroupSnapshot,
    ShardGroupMachine,
    ShardState,
    merge_session_records,
)

SHARD_COUNT = 4
SERVING = ShardState.SERVING
PULLING = ShardState.PULLING
BE_PULLING = ShardState.BE_PULLING
GARBAGE_COLLECTING = ShardState.GARBAGE_COLLECTING


def key_in_shard(shard: int, number: int = 0) -> str:
    """The `number`-th key (in "key-0", "key-1", ... order) that hashes to `shard`."""
    found = 0
    for candidate in range(10_000):
        key = f"key-{candidate}"
        if shard_for_key(key, SHARD_COUNT) == shard:
            if found == number:
                return key
            found += 1
    raise AssertionError(f"no key for shard {shard}")


def configuration(number: int, shards: list[int]) -> ShardConfiguration:
    gids = sorted({gid for gid in shards if gid != UNASSIGNED_GID})
    return make_configuration(number, shards, {gid: [f"g{gid}:1"] for gid in gids})


class Replica:
    """One replica of a group: its log, and a machine that applies each entry as proposed."""

    def __init__(self, gid: int) -> None:
        self.machine = ShardGroupMachine(gid, SHARD_COUNT)
        self.log: list[bytes] = []
        self.timestamp_ms = 1_000

    def propose(self, entry: GroupEntry) -> GroupApplyResult:
        data = encode_entry(entry)
        self.log.append(data)
        result = self.machine.apply(len(self.log), data)
        assert result is not None
        return result

    def control(self, entry: GroupEntry) -> ControlApplied:
        result = self.propose(entry)
        assert isinstance(result, ControlApplied)
        return result

    def configure(self, number: int, shards: list[int]) -> ControlApplied:
        return self.control(NewConfiguration(configuration(number, shards)))

    def write(
        self,
        key: str,
        value: str,
        client_id: str = "client",
        sequence: int = 1,
        operation: str = "put",
        first_unacknowledged: int = 0,
    ) -> WriteResult:
        self.timestamp_ms += 10
        command = KVCommand(sequence, operation, key, value)
        batch = ClientBatch(client_id, first_unacknowledged, [command])
        result = self.propose(ClientWrites(self.timestamp_ms, [batch]))
        assert isinstance(result, WritesApplied)
        [[write_result]] = result.results
        return write_result

    def states(self) -> list[ShardState]:
        return [self.machine.shard_state(shard) for shard in range(SHARD_COUNT)]

    def replayed(self) -> ShardGroupMachine:
        machine = ShardGroupMachine(self.machine.gid, SHARD_COUNT)
        for index, data in enumerate(self.log, start=1):
            machine.apply(index, data)
        return machine


def insert_from(source: Replica, number: int, shards: list[int]) -> InsertShards:
    response = source.machine.pull_request_for(number, shards)
    assert response.status is PullStatus.OK
    assert response.insert is not None
    return response.insert


def ok(value: str | None = None) -> KVCommandResult:
    return KVCommandResult(ok=True, value=value)


# --- configuration changes ------------------------------------------------------------------


def test_a_new_machine_serves_nothing() -> None:
    replica = Replica(1)
    assert replica.machine.current_configuration.number == 0
    assert replica.machine.all_serving()
    assert replica.write(key_in_shard(0), "v") == WrongGroup(0, 0)
    assert replica.machine.get(key_in_shard(0)) == WrongGroup(0, 0)


def test_shards_from_gid_zero_serve_at_once_with_empty_data() -> None:
    replica = Replica(1)
    result = replica.configure(1, [1, 1, 2, 2])
    assert result == ControlApplied(accepted=True, configuration_number=1, shards=[0, 1])
    assert replica.states() == [SERVING] * 4
    assert replica.write(key_in_shard(0), "v") == ok()
    assert replica.machine.get(key_in_shard(0)) == "v"
    assert replica.machine.get(key_in_shard(2)) == WrongGroup(2, 1)


def test_configuration_must_be_the_next_number() -> None:
    replica = Replica(1)
    skipped = replica.configure(2, [1, 1, 1, 1])
    assert not skipped.accepted
    assert skipped.reason == "configuration 2 is not 1"
    assert replica.configure(1, [1, 1, 1, 1]).accepted
    before = replica.machine.snapshot()
    again = replica.configure(1, [2, 2, 2, 2])  # a replayed or stale proposal
    assert not again.accepted
    assert msgspec.structs.replace(snapshot_of(replica.machine), applied_index=0) == (
        msgspec.structs.replace(decode_snapshot(before), applied_index=0)
    )


def test_configuration_waits_until_every_shard_serves() -> None:
    replica = Replica(1)
    replica.configure(1, [1, 1, 1, 1])
    replica.configure(2, [1, 1, 1, 2])
    assert replica.states() == [SERVING, SERVING, SERVING, BE_PULLING]
    refused = replica.configure(3, [1, 1, 1, 1])
    assert not refused.accepted
    assert refused.reason == "shards [3] are still migrating"
    assert replica.machine.current_configuration.number == 2


def test_moving_shards_change_state_and_untouched_shards_keep_serving() -> None:
    old_owner, new_owner = Replica(1), Replica(2)
    for replica in (old_owner, new_owner):
        replica.configure(1, [1, 1, 2, 2])
    old_owner.write(key_in_shard(0), "zero")
    old_owner.write(key_in_shard(1), "one", sequence=2)
    for replica in (old_owner, new_owner):
        assert replica.configure(2, [2, 1, 2, 2]).shards == [0]
    assert old_owner.states() == [BE_PULLING, SERVING, SERVING, SERVING]
    assert new_owner.states() == [PULLING, SERVING, SERVING, SERVING]
    # Shard 1 (old owner) and shards 2, 3 (new owner) did not move: they keep serving.
    assert old_owner.write(key_in_shard(1), "one'", sequence=3) == ok()  # puts answer no old value
    assert old_owner.machine.get(key_in_shard(1)) == "one'"
    assert new_owner.write(key_in_shard(2), "two") == ok()
    # The moving shard is served by neither side until its data arrives.
    assert old_owner.write(key_in_shard(0), "x", sequence=4) == WrongGroup(0, 2)
    assert new_owner.write(key_in_shard(0), "x", sequence=2) == WrongGroup(0, 2)
    assert new_owner.machine.get(key_in_shard(0)) == WrongGroup(0, 2)


def test_previous_and_current_configuration() -> None:
    replica = Replica(1)
    assert replica.machine.previous_configuration.number == 0
    replica.configure(1, [1, 1, 1, 1])
    replica.configure(2, [1, 1, 1, 1])
    assert replica.machine.previous_configuration.number == 1
    assert replica.machine.current_configuration.number == 2


def test_shards_handed_to_gid_zero_are_dropped() -> None:
    replica = Replica(1)
    replica.configure(1, [1, 1, 1, 1])
    replica.write(key_in_shard(0), "v")
    result = replica.configure(2, [UNASSIGNED_GID] * 4)
    assert result.shards == [0, 1, 2, 3]
    assert replica.states() == [SERVING] * 4
    assert replica.machine.stored_key_count() == 0
    assert replica.machine.all_serving()


def test_a_malformed_configuration_is_refused() -> None:
    replica = Replica(1)
    wrong_count = make_configuration(1, [1] * 8, {1: ["g1:1"]})
    refused = replica.control(NewConfiguration(wrong_count))
    assert not refused.accepted
    assert refused.reason == "configuration 1 has 8 shards, not 4"
    unlisted = ShardConfiguration(number=1, shards=[1, 1, 1, 9], groups={1: ["g1:1"]})
    assert not replica.control(NewConfiguration(unlisted)).accepted
    assert replica.machine.current_configuration.number == 0


# --- pulling, inserting, deleting ------------------------------------------------------------


def moved_pair() -> tuple[Replica, Replica]:
    """Group 1 owned every shard and wrote to shard 0; configuration 2 gives 0 and 1 to 2."""
    old_owner, new_owner = Replica(1), Replica(2)
    for replica in (old_owner, new_owner):
        replica.configure(1, [1, 1, 1, 1])
    old_owner.write(key_in_shard(0), "zero", client_id="alice", sequence=1)
    old_owner.write(key_in_shard(1), "one", client_id="bob", sequence=1)
    for replica in (old_owner, new_owner):
        replica.configure(2, [2, 2, 1, 1])
    return old_owner, new_owner


def test_pull_answers_depend_on_the_previous_owners_configuration() -> None:
    old_owner, _ = moved_pair()
    lagging = Replica(1)
    lagging.configure(1, [1, 1, 1, 1])
    assert lagging.machine.pull_request_for(2, [0]).status is PullStatus.NOT_READY
    response = old_owner.machine.pull_request_for(2, [0, 1, 2])
    assert response.status is PullStatus.OK
    assert response.insert is not None
    # Shard 2 is not BE_PULLING here: it is not part of the answer.
    assert response.insert.shards == {0: {key_in_shard(0): "zero"}, 1: {key_in_shard(1): "one"}}
    assert [record.client_id for record in response.insert.sessions[0]] == ["alice"]
    assert old_owner.machine.pull_request_for(1, [0]).status is PullStatus.GONE
    assert old_owner.machine.pull_request_for(2, [2, 3]).status is PullStatus.GONE


def test_pull_answer_is_a_copy() -> None:
    old_owner, _ = moved_pair()
    insert = insert_from(old_owner, 2, [0])
    insert.shards[0]["injected"] = "x"
    assert old_owner.machine.shard_data(0) == {key_in_shard(0): "zero"}


def test_insert_turns_pulling_into_garbage_collecting_which_serves() -> None:
    old_owner, new_owner = moved_pair()
    result = new_owner.control(insert_from(old_owner, 2, [0, 1]))
    assert result == ControlApplied(accepted=True, configuration_number=2, shards=[0, 1])
    assert new_owner.states() == [GARBAGE_COLLECTING, GARBAGE_COLLECTING, SERVING, SERVING]
    assert new_owner.machine.get(key_in_shard(0)) == "zero"
    assert new_owner.write(key_in_shard(0), "+", operation="append", sequence=5) == ok()
    assert new_owner.machine.get(key_in_shard(0)) == "zero+"
    assert not new_owner.machine.all_serving()


def test_insert_is_applied_only_for_the_current_configuration() -> None:
    old_owner, new_owner = moved_pair()
    insert = insert_from(old_owner, 2, [0, 1])
    stale = msgspec.structs.replace(insert, configuration_number=1)
    future = msgspec.structs.replace(insert, configuration_number=3)
    for entry in (stale, future):
        result = new_owner.control(entry)
        assert not result.accepted
        assert new_owner.states()[:2] == [PULLING, PULLING]


def test_a_replayed_insert_does_not_overwrite_later_writes() -> None:
    old_owner, new_owner = moved_pair()
    insert = insert_from(old_owner, 2, [0, 1])
    new_owner.control(insert)
    new_owner.write(key_in_shard(0), "newer", client_id="carol")
    replay = new_owner.control(insert)
    assert replay == ControlApplied(accepted=True, configuration_number=2, shards=[])
    assert new_owner.machine.get(key_in_shard(0)) == "newer"


def test_a_shard_serves_as_soon_as_its_own_data_arrives() -> None:
    first, second, receiver = Replica(1), Replica(2), Replica(3)
    for replica in (first, second, receiver):
        replica.configure(1, [1, 1, 2, 2])
        replica.configure(2, [3, 1, 3, 2])
    assert receiver.states() == [PULLING, SERVING, PULLING, SERVING]
    receiver.control(insert_from(first, 2, [0]))
    # Shard 0 (from group 1) serves while shard 2 (from group 2) is still pulling.
    assert receiver.write(key_in_shard(0), "v") == ok()
    assert receiver.write(key_in_shard(2), "v", sequence=2) == WrongGroup(2, 2)
    assert receiver.states() == [GARBAGE_COLLECTING, SERVING, PULLING, SERVING]


def test_delete_on_the_previous_owner_drops_the_copy() -> None:
    old_owner, new_owner = moved_pair()
    new_owner.control(insert_from(old_owner, 2, [0, 1]))
    result = old_owner.control(DeleteShards(2, [0, 1]))
    assert result == ControlApplied(accepted=True, configuration_number=2, shards=[0, 1])
    assert old_owner.states() == [SERVING] * 4
    assert old_owner.machine.shard_data(0) == {}
    assert old_owner.machine.shard_data(1) == {}
    assert old_owner.machine.get(key_in_shard(0)) == WrongGroup(0, 2)
    assert old_owner.machine.pull_request_for(2, [0, 1]).status is PullStatus.GONE
    assert old_owner.machine.all_serving()


def test_delete_on_the_new_owner_confirms_garbage_collection() -> None:
    old_owner, new_owner = moved_pair()
    new_owner.control(insert_from(old_owner, 2, [0, 1]))
    old_owner.control(DeleteShards(2, [0, 1]))
    result = new_owner.control(DeleteShards(2, [0, 1]))
    assert result.shards == [0, 1]
    assert new_owner.states() == [SERVING] * 4
    assert new_owner.machine.get(key_in_shard(0)) == "zero"


def test_delete_replays_and_configuration_numbers() -> None:
    old_owner, new_owner = moved_pair()
    future = old_owner.control(DeleteShards(3, [0, 1]))
    assert not future.accepted
    assert old_owner.states()[:2] == [BE_PULLING, BE_PULLING]
    new_owner.control(insert_from(old_owner, 2, [0, 1]))
    old_owner.control(DeleteShards(2, [0, 1]))
    replay = old_owner.control(DeleteShards(2, [0, 1]))
    assert replay == ControlApplied(accepted=True, configuration_number=2, shards=[])
    # A delete before the insert changes nothing on the new owner: shards still PULLING.
    early = Replica(2)
    early.configure(1, [1, 1, 1, 1])
    early.configure(2, [2, 2, 1, 1])
    assert early.control(DeleteShards(2, [0, 1])).shards == []
    assert early.states()[:2] == [PULLING, PULLING]
    # An older configuration's delete was done before this group could leave it.
    old_owner.configure(3, [2, 2, 1, 1])
    older = old_owner.control(DeleteShards(2, [0, 1]))
    assert older == ControlApplied(accepted=True, configuration_number=3, shards=[])


def test_a_late_delete_does_not_touch_a_shard_that_moved_again() -> None:
    """Shard 0 goes 1 → 2 → 1 → 2. A delete for the first move, applied late (a lagging
    leader proposed it again), must leave the second move's copies alone on both sides."""
    first, second = Replica(1), Replica(2)
    owners = [[1, 1, 1, 1], [2, 1, 1, 1], [1, 1, 1, 1], [2, 1, 1, 1]]
    for number, shards in enumerate(owners, start=1):
        for replica in (first, second):
            replica.configure(number, shards)
        if number == 1:
            first.write(key_in_shard(0), "v")
            continue
        giver, taker = (first, second) if shards[0] == 2 else (second, first)
        taker.control(insert_from(giver, number, [0]))
        if number < 4:
            giver.control(DeleteShards(number, [0]))
            taker.control(DeleteShards(number, [0]))
    assert first.states()[0] is BE_PULLING
    assert second.states()[0] is GARBAGE_COLLECTING
    for replica in (first, second):
        late = replica.control(DeleteShards(2, [0]))
        assert late == ControlApplied(accepted=True, configuration_number=4, shards=[])
    assert first.states()[0] is BE_PULLING
    assert first.machine.shard_data(0) == {key_in_shard(0): "v"}
    assert second.states()[0] is GARBAGE_COLLECTING


def test_after_garbage_collection_the_previous_owner_holds_only_what_it_owns() -> None:
    old_owner, new_owner = moved_pair()
    for number in range(20):
        old_owner.write(key_in_shard(2, number), "x" * 100, sequence=10 + number)
    assert old_owner.machine.stored_key_count() == 2 + 20
    new_owner.control(insert_from(old_owner, 2, [0, 1]))
    old_owner.control(DeleteShards(2, [0, 1]))
    assert old_owner.machine.stored_key_count() == 20
    assert all(len(old_owner.machine.shards[shard].sessions) == 0 for shard in (0, 1))


# --- dedup across a migration ------------------------------------------------------------------


def test_a_retry_after_the_shard_moved_is_not_applied_twice() -> None:
    old_owner, new_owner = Replica(1), Replica(2)
    for replica in (old_owner, new_owner):
        replica.configure(1, [1, 1, 1, 1])
    key = key_in_shard(0)
    first = old_owner.write(key, "a", client_id="alice", sequence=7, operation="append")
    assert first == ok()  # the answer is lost on its way to the client
    for replica in (old_owner, new_owner):
        replica.configure(2, [2, 1, 1, 1])
    assert old_owner.write(key, "a", client_id="alice", sequence=7) == WrongGroup(0, 2)
    new_owner.control(insert_from(old_owner, 2, [0]))
    retry = new_owner.write(key, "a", client_id="alice", sequence=7, operation="append")
    assert retry == first
    assert new_owner.machine.get(key) == "a"
    assert new_owner.machine.duplicate_count == 1
    follow_up = new_owner.write(key, "b", client_id="alice", sequence=8, operation="append")
    assert follow_up == ok()
    assert new_owner.machine.get(key) == "ab"


def test_wrong_group_answers_do_not_touch_sessions() -> None:
    replica = Replica(1)
    replica.configure(1, [1, 1, 2, 2])
    assert replica.write(key_in_shard(2), "v", client_id="alice") == WrongGroup(2, 1)
    assert all(len(shard.sessions) == 0 for shard in replica.machine.shards)


def test_merge_keeps_everything_either_side_knows() -> None:
    table = SessionTable()
    table.advance_clock(500)
    session = table.touch("alice", first_unacknowledged=3)
    table.remember(session, 3, ok("here-3"))
    table.remember(session, 6, ok("here-6"))
    incoming = [
        SessionRecord("alice", 90_000, 4, [4, 5], [ok("there-4"), ok("there-5")]),
        SessionRecord("bob", 90_000, 2, [2], [ok("there-2")]),
    ]
    merge_session_records(table, incoming, clock_ms=700)
    alice = table.sessions["alice"]
    assert alice.first_unacknowledged == 4
    assert alice.results == {4: ok("there-4"), 5: ok("there-5"), 6: ok("here-6")}
    assert lookup_duplicate(alice, 3) is not None  # below first_unacknowledged: a duplicate
    assert lookup_duplicate(alice, 7) is None
    # Merged sessions count as active at this group's clock, in the back of the order.
    assert [(client, table.sessions[client].last_active_ms) for client in table.sessions] == [
        ("alice", 700),
        ("bob", 700),
    ]


def test_merge_respects_the_session_bounds() -> None:
    table = SessionTable(session_count_max=1, session_results_max=2)
    table.touch("old", 0)
    record = SessionRecord("new", 0, 0, [1, 2, 3], [ok("1"), ok("2"), ok("3")])
    merge_session_records(table, [record], clock_ms=0)
    assert list(table.sessions) == ["new"]
    assert table.sessions["new"].results == {2: ok("2"), 3: ok("3")}
    assert table.sessions["new"].first_unacknowledged == 2
    with pytest.raises(InvariantViolation):
        merge_session_records(table, [SessionRecord("bad", 0, 0, [1], [])], clock_ms=0)


def test_sessions_of_served_shards_expire_and_frozen_ones_do_not() -> None:
    old_owner = Replica(1)
    old_owner.machine = ShardGroupMachine(1, SHARD_COUNT, session_ttl_ms=1_000)
    old_owner.configure(1, [1, 1, 1, 1])
    old_owner.write(key_in_shard(0), "v", client_id="alice")
    old_owner.write(key_in_shard(1), "v", client_id="bob")
    old_owner.configure(2, [2, 1, 1, 1])
    old_owner.timestamp_ms += 10_000
    old_owner.write(key_in_shard(2), "v", client_id="carol")
    sessions = [len(shard.sessions) for shard in old_owner.machine.shards]
    assert sessions == [1, 0, 1, 0]  # bob expired; alice's shard is frozen until pulled


# --- entries, replay and snapshots ------------------------------------------------------------


def scenario() -> tuple[Replica, Replica]:
    """A move with every kind of entry on both sides, and writes before, during and after."""
    old_owner, new_owner = Replica(1), Replica(2)
    for replica in (old_owner, new_owner):
        replica.configure(1, [1, 1, 1, 2])
        replica.control(EmptyEntry())
    old_owner.write(key_in_shard(0), "a", client_id="alice", sequence=1)
    old_owner.write(key_in_shard(1), "b", client_id="bob", sequence=1)
    new_owner.write(key_in_shard(3), "c", client_id="carol", sequence=1)
    for replica in (old_owner, new_owner):
        replica.configure(2, [2, 1, 2, 2])
    old_owner.write(key_in_shard(1), "b2", client_id="bob", sequence=2, first_unacknowledged=2)
    new_owner.control(insert_from(old_owner, 2, [0, 2]))
    new_owner.write(key_in_shard(0), "a2", client_id="alice", sequence=2, operation="append")
    old_owner.control(DeleteShards(2, [0, 2]))
    new_owner.control(DeleteShards(2, [0, 2]))
    for replica in (old_owner, new_owner):
        replica.configure(3, [2, 2, 2, 2])
    new_owner.control(insert_from(old_owner, 3, [1]))
    return old_owner, new_owner


def decode_snapshot(data: bytes) -> GroupSnapshot:
    return msgspec.msgpack.decode(data, type=GroupSnapshot)


def snapshot_of(machine: ShardGroupMachine) -> GroupSnapshot:
    return decode_snapshot(machine.snapshot())


def state_without_index(machine: ShardGroupMachine) -> GroupSnapshot:
    return msgspec.structs.replace(snapshot_of(machine), applied_index=0)


def state_without_activity(machine: ShardGroupMachine) -> GroupSnapshot:
    """The state, leaving out when sessions were last active: a retried write is not applied
    again, but it does count as the client's activity (as in the KV machine)."""
    snapshot = state_without_index(machine)
    shards = [
        msgspec.structs.replace(
            shard,
            sessions=sorted(
                (msgspec.structs.replace(record, last_active_ms=0) for record in shard.sessions),
                key=lambda record: record.client_id,
            ),
        )
        for shard in snapshot.shards
    ]
    return msgspec.structs.replace(snapshot, shards=shards)


def test_the_scenario_ends_where_expected() -> None:
    old_owner, new_owner = scenario()
    assert new_owner.machine.get(key_in_shard(0)) == "aa2"
    assert new_owner.machine.get(key_in_shard(1)) == "b2"
    assert new_owner.states() == [SERVING, GARBAGE_COLLECTING, SERVING, SERVING]
    assert old_owner.states() == [SERVING, BE_PULLING, SERVING, SERVING]


@pytest.mark.parametrize("side", [0, 1])
def test_every_entry_is_idempotent_when_applied_again(side: int) -> None:
    """A log with any one entry repeated (right after itself, or at the end) ends in the
    same state as the log without the repeat."""
    replica = scenario()[side]
    expected = state_without_activity(replica.machine)
    for position, data in enumerate(replica.log):
        for repeat_at in (position + 1, len(replica.log)):
            log = [*replica.log[:repeat_at], data, *replica.log[repeat_at:]]
            machine = ShardGroupMachine(replica.machine.gid, SHARD_COUNT)
            for index, entry in enumerate(log, start=1):
                machine.apply(index, entry)
            assert state_without_activity(machine) == expected, (position, repeat_at)


def test_replaying_the_log_gives_identical_bytes() -> None:
    for replica in scenario():
        assert replica.replayed().snapshot() == replica.machine.snapshot()


def test_snapshot_restore_round_trip_and_continue() -> None:
    for replica in scenario():
        data = replica.machine.snapshot()
        restored = ShardGroupMachine(replica.machine.gid, SHARD_COUNT)
        restored.restore(data)
        assert restored.snapshot() == data
        assert restored.applied_index == len(replica.log)
        # Both continue with the same entries and stay identical.
        follow_up = ClientWrites(
            replica.timestamp_ms + 5_000,
            [ClientBatch("dave", 0, [KVCommand(1, "put", key_in_shard(0), "d")])],
        )
        data_entry = encode_entry(follow_up)
        index = len(replica.log) + 1
        assert replica.machine.apply(index, data_entry) == restored.apply(index, data_entry)
        assert restored.snapshot() == replica.machine.snapshot()


def test_restore_rejects_bad_snapshots_and_keeps_state() -> None:
    old_owner, _ = scenario()
    machine = old_owner.machine
    before = machine.snapshot()
    with pytest.raises(MalformedEntryError, match="does not decode"):
        machine.restore(b"\x00garbage")
    with pytest.raises(MalformedEntryError, match="taken by group 1"):
        ShardGroupMachine(2, SHARD_COUNT).restore(before)
    with pytest.raises(MalformedEntryError, match="shards"):
        ShardGroupMachine(1, 8).restore(before)
    snapshot = decode_snapshot(before)
    bad_states = [
        msgspec.structs.replace(snapshot, format_version=99),
        msgspec.structs.replace(
            snapshot,
            shards=[
                msgspec.structs.replace(snapshot.shards[0], state=PULLING),
                *snapshot.shards[1:],
            ],
        ),
        msgspec.structs.replace(snapshot, previous=snapshot.current),
    ]
    for bad in bad_states:
        with pytest.raises(MalformedEntryError):
            machine.restore(msgspec.msgpack.encode(bad))
    assert machine.snapshot() == before


def test_apply_skips_covered_indexes_and_rejects_garbage() -> None:
    replica = Replica(1)
    replica.configure(1, [1, 1, 1, 1])
    assert replica.machine.apply(1, replica.log[0]) is None
    replica.machine.mark_applied(5)
    assert replica.machine.applied_index == 5
    replica.machine.mark_applied(3)
    assert replica.machine.applied_index == 5
    with pytest.raises(MalformedEntryError, match="log entry 6"):
        replica.machine.apply(6, b"\xc1")
    assert replica.machine.applied_index == 5


def test_a_non_empty_unowned_shard_is_an_invariant_violation() -> None:
    replica = Replica(1)
    replica.machine.shards[0].store.put("stray", b"x")
    replica.machine.shards[0].store.finish()
    with pytest.raises(InvariantViolation, match="shard 0 holds data it does not own"):
        replica.configure(1, [1, 1, 1, 1])


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="gid"):
        ShardGroupMachine(0)
    with pytest.raises(ValueError, match="shard_count"):
        ShardGroupMachine(1, 0)


def test_batches_spanning_shards_get_per_command_results() -> None:
    replica = Replica(1)
    replica.configure(1, [1, 1, 2, 2])
    commands = [
        KVCommand(1, "put", key_in_shard(0), "a"),
        KVCommand(2, "put", key_in_shard(2), "b"),
        KVCommand(3, "put", key_in_shard(1), "c"),
        KVCommand(1, "put", key_in_shard(0), "again"),  # a duplicate inside the batch
    ]
    result = replica.propose(ClientWrites(5_000, [ClientBatch("alice", 0, commands)]))
    assert isinstance(result, WritesApplied)
    assert result.results == [[ok(), WrongGroup(2, 1), ok(), ok()]]
    assert replica.machine.get(key_in_shard(0)) == "a"
    assert replica.machine.shards_in_state(SERVING) == [0, 1, 2, 3]


def test_random_logs_replay_to_identical_bytes() -> None:
    generator = random.Random(7)
    replica = Replica(1)
    replica.configure(1, [1, 1, 1, 1])
    for step in range(300):
        key = key_in_shard(generator.randrange(SHARD_COUNT), generator.randrange(3))
        replica.timestamp_ms += generator.randrange(0, 3_000)
        replica.write(
            key,
            str(step),
            client_id=f"client-{generator.randrange(5)}",
            sequence=generator.randrange(1, 40),
            operation=generator.choice(["put", "append", "delete", "cas"]),
            first_unacknowledged=generator.randrange(0, 20),
        )
    assert replica.replayed().snapshot() == replica.machine.snapshot()


def test_sessions_moved_to_a_group_that_never_wrote_survive_its_first_write() -> None:
    """The new owner's clock is 0 (it never applied a client write): the insert brings it up
    to the sender's clock, so its first write (at about the sender's time) does not expire
    the sessions that just arrived, and a retry of a write applied before the move stays a
    duplicate."""
    old, new = Replica(1), Replica(2)
    hour_ms = 60 * 60 * 1000
    old.timestamp_ms = 5 * hour_ms
    for replica in (old, new):
        replica.configure(1, [1] * SHARD_COUNT)
    key = key_in_shard(0)
    assert old.write(key, "a", sequence=1, operation="append") == ok()
    for replica in (old, new):
        replica.configure(2, [2, 1, 1, 1])
    assert new.machine.clock_ms == 0
    new.control(insert_from(old, 2, [0]))
    assert new.machine.clock_ms == old.machine.clock_ms
    new.timestamp_ms = old.timestamp_ms
    # The retry of the append (same client, same sequence) is answered from the session.
    assert new.write(key, "a", sequence=1, operation="append") == ok()
    assert new.machine.shard_data(0)[key] == "a"
    assert new.machine.duplicate_count == 1
