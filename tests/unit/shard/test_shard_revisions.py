"""Revisions per shard in ShardGroupMachine: each write bumps its shard's revision, the
history serves watches, a move (whole or in chunks) carries every key's revisions, the
shard's revision and its history, and snapshots keep them (older formats still read)."""

from __future__ import annotations

import msgspec

from quorumlog.shard.group_commands import DeleteShards, InsertShards, PullStatus
from quorumlog.shard.group_driver import entry_for_pull_response
from quorumlog.shard.group_machine import ShardGroupMachine
from tests.unit.shard.test_group_machine import SHARD_COUNT, Replica, insert_from, key_in_shard


def revisions_of(machine: ShardGroupMachine, shard: int) -> dict[str, tuple[int, int, int]]:
    records = machine.shards[shard].store.records
    return {
        key: (record.create_revision, record.mod_revision, record.version)
        for key, record in sorted(records.items())
    }


def owner_with_writes() -> Replica:
    replica = Replica(1)
    replica.configure(1, [1] * SHARD_COUNT)
    replica.write(key_in_shard(0, 0), "a", sequence=1)
    replica.write(key_in_shard(0, 1), "b", sequence=2)
    replica.write(key_in_shard(0, 0), "a2", sequence=3)
    replica.write(key_in_shard(1, 0), "c", sequence=4)
    replica.write(key_in_shard(0, 1), "", sequence=5, operation="delete")
    return replica


def test_each_write_bumps_its_own_shards_revision() -> None:
    replica = owner_with_writes()
    machine = replica.machine
    assert machine.shards[0].store.revision == 4
    assert machine.shards[1].store.revision == 1
    assert revisions_of(machine, 0) == {key_in_shard(0, 0): (1, 3, 2)}
    assert revisions_of(machine, 1) == {key_in_shard(1, 0): (1, 1, 1)}
    events = machine.shards[0].store.events_since(1, "", "\x00", 100)
    assert [(event.type, event.kv.key, event.kv.mod_revision) for event in events] == [
        ("PUT", key_in_shard(0, 0), 1),
        ("PUT", key_in_shard(0, 1), 2),
        ("PUT", key_in_shard(0, 0), 3),
        ("DELETE", key_in_shard(0, 1), 4),
    ]
    # A duplicate (same client and sequence) is not a new revision.
    replica.write(key_in_shard(0, 0), "again", sequence=3)
    assert machine.shards[0].store.revision == 4
    assert machine.get(key_in_shard(0, 0)) == "a2"


def test_a_refused_or_failed_write_is_no_revision() -> None:
    replica = owner_with_writes()
    key = key_in_shard(0, 0)
    result = replica.write(key, "new", sequence=6, operation="cas")  # expects missing
    assert not result.ok
    assert replica.machine.shards[0].store.revision == 4


def moved(pull_bytes_max: int) -> tuple[Replica, Replica]:
    """Shard 0 moves from group 1 to group 2, whole (0) or in chunks of about that size."""
    old_owner = owner_with_writes()
    for number in range(4):
        old_owner.write(key_in_shard(0, 2 + number), f"v{number}", sequence=10 + number)
    new_owner = Replica(2)
    new_owner.configure(1, [1] * SHARD_COUNT)
    for replica in (old_owner, new_owner):
        replica.configure(2, [2, 1, 1, 1])
    resume_at: tuple[int, int] | None = None
    while True:
        response = old_owner.machine.pull_request_for(2, [0], resume_at, pull_bytes_max)
        assert response.status is PullStatus.OK and response.insert is not None
        new_owner.control(response.insert)
        if pull_bytes_max:
            # A chunk applied twice (a pull restarted by a new leader) changes nothing.
            before = revisions_of(new_owner.machine, 0)
            new_owner.control(response.insert)
            assert revisions_of(new_owner.machine, 0) == before
        resume_at = response.resume_at
        if resume_at is None:
            break
    return old_owner, new_owner


def test_a_moved_shard_keeps_its_revisions_and_history_and_goes_on_from_them() -> None:
    for pull_bytes_max in (0, 40):
        old_owner, new_owner = moved(pull_bytes_max)
        old_store = old_owner.machine.shards[0].store
        new_store = new_owner.machine.shards[0].store
        assert revisions_of(new_owner.machine, 0) == revisions_of(old_owner.machine, 0)
        assert new_store.revision == old_store.revision == 8
        assert new_owner.machine.shards[0].arrived_revision == 0  # nothing stayed behind
        # The history came along, each event with its key before: a watch from any
        # revision goes on at the new owner, and a read at a past revision reads the same.
        assert new_store.compacted_revision == old_store.compacted_revision == 0
        assert new_store.history == old_store.history
        assert new_store.history_bytes == old_store.history_bytes
        assert new_store.range("", "\x00", revision=3) == old_store.range("", "\x00", revision=3)
        new_owner.write(key_in_shard(0, 0), "after", client_id="other", sequence=1)
        [event] = new_store.events_since(9, "", "\x00", 100)
        assert event.kv.mod_revision == 9 and event.kv.version == 3
        assert event.kv.create_revision == 1


def test_an_insert_without_revisions_makes_them_up_the_same_way_each_time() -> None:
    old_owner, _ = moved(0)
    insert = insert_from(old_owner, 2, [0])
    bare = msgspec.structs.replace(
        insert, key_revisions=None, store_revisions=None, history=None, compacted_revisions=None
    )
    results = []
    for _ in range(2):
        new_owner = Replica(2)
        new_owner.configure(1, [1] * SHARD_COUNT)
        new_owner.configure(2, [2, 1, 1, 1])
        new_owner.control(bare)
        results.append(revisions_of(new_owner.machine, 0))
        assert new_owner.machine.get(key_in_shard(0, 0)) == "a2"
    assert results[0] == results[1]
    assert sorted(mod for _, mod, _ in results[0].values()) == [1, 2, 3, 4, 5]


def test_an_insert_from_an_older_build_decodes() -> None:
    """An InsertShards encoded before the revision fields (a shorter array) still decodes."""
    old_owner, _ = moved(0)
    insert = insert_from(old_owner, 2, [0])
    fields = msgspec.msgpack.decode(msgspec.msgpack.encode(insert))
    older = msgspec.msgpack.encode(fields[:-4])
    decoded = msgspec.msgpack.decode(older, type=InsertShards)
    assert decoded.key_revisions is None and decoded.store_revisions is None
    assert decoded.history is None and decoded.compacted_revisions is None
    assert decoded.shards == insert.shards


def test_an_insert_without_history_leaves_it_behind() -> None:
    """From a build that carried revisions but not history: the shard's history at the new
    owner starts at the revision it arrived with, which the watch service reports as a
    move (`arrived_revision`), not as a gap."""
    old_owner, _ = moved(0)
    insert = insert_from(old_owner, 2, [0])
    without = msgspec.structs.replace(insert, history=None, compacted_revisions=None)
    new_owner = Replica(2)
    new_owner.configure(1, [1] * SHARD_COUNT)
    new_owner.configure(2, [2, 1, 1, 1])
    new_owner.control(without)
    shard = new_owner.machine.shards[0]
    assert shard.arrived_revision == 8 == shard.store.compacted_revision
    assert shard.store.history == []
    assert revisions_of(new_owner.machine, 0) == revisions_of(old_owner.machine, 0)


def test_snapshots_keep_revisions_history_and_the_arrival() -> None:
    _, new_owner = moved(40)
    new_owner.write(key_in_shard(0, 0), "after", client_id="other", sequence=1)
    new_owner.control(DeleteShards(2, [0]))
    machine = new_owner.machine
    restored = ShardGroupMachine(2, SHARD_COUNT)
    restored.restore(machine.snapshot())
    assert restored.snapshot() == machine.snapshot()
    for shard in range(SHARD_COUNT):
        assert revisions_of(restored, shard) == revisions_of(machine, shard)
    store = restored.shards[0].store
    assert store.revision == 9 and len(store.history) == 9
    [event] = store.events_since(9, "", "\x00", 100)
    assert event.prev_kv is not None and event.prev_kv.value == b"a2"


def test_revision_listeners_hear_every_entry_that_changes_the_state() -> None:
    replica = Replica(1)
    heard: list[int] = []
    replica.machine.revision_listeners.append(lambda: heard.append(replica.machine.applied_index))
    replica.configure(1, [1] * SHARD_COUNT)
    replica.write(key_in_shard(0), "x")
    assert heard == [0, 1]  # called inside apply, before the index moves


def test_the_insert_proposed_for_a_pull_answer_keeps_the_revisions() -> None:
    """The new owner's leader rebuilds the insert it proposes from the answer: revisions
    and history must survive that (they once did not, and a watch then skipped events)."""
    for pull_bytes_max in (0, 40):
        old_owner = owner_with_writes()
        new_owner = Replica(2)
        new_owner.configure(1, [1] * SHARD_COUNT)
        for replica in (old_owner, new_owner):
            replica.configure(2, [2, 1, 1, 1])
        response = old_owner.machine.pull_request_for(2, [0], None, pull_bytes_max)
        assert response.insert is not None
        entry = entry_for_pull_response(new_owner.machine, response)
        assert entry is not None
        assert entry.key_revisions == response.insert.key_revisions
        assert entry.store_revisions == {0: 4}
        assert entry.history == response.insert.history
        assert entry.compacted_revisions == {0: 0}
        if not pull_bytes_max:
            assert entry.history is not None and len(entry.history[0]) == 4
        # History past the shard's revision, or out of order, is not proposed either.
        first = old_owner.machine.shards[0].store.history[0]
        late = msgspec.structs.replace(first, kv=msgspec.structs.replace(first.kv, mod_revision=9))
        for events in ([late], [first, first, late][::-1]):
            odd = msgspec.structs.replace(response.insert, history={0: events})
            odd_response = msgspec.structs.replace(response, insert=odd)
            assert entry_for_pull_response(new_owner.machine, odd_response) is None
        # An answer whose revisions do not fit its keys is not proposed (asked again).
        bad = msgspec.structs.replace(response.insert, key_revisions={0: []})
        assert bad.shards[0]
        wrong = msgspec.structs.replace(response, insert=bad)
        assert entry_for_pull_response(new_owner.machine, wrong) is None
        past = msgspec.structs.replace(
            response.insert, key_revisions={0: [(1, 9, 2)]}, store_revisions={0: 4}
        )
        assert (
            entry_for_pull_response(
                new_owner.machine, msgspec.structs.replace(response, insert=past)
            )
            is None
        )
