"""Dropped sessions in a shard group (Raft dissertation §6.3): a client whose session a
shard no longer has is refused there, before and after the shard moves, and a retry of a
write applied before is never applied again.

Each regression test checks first that nothing ran twice (the data), then how the refusal
is answered, so on a machine without the rule it fails on the data."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.codec.wire import ErrorCode, KVCommand, KVCommandResult
from quorumlog.kv.commands import ClientBatch
from quorumlog.kv.machine import MalformedEntryError
from quorumlog.kv.sessions import NewClientRule, SessionRecord, SessionTable
from quorumlog.shard.group_commands import (
    ClientWrites,
    PullRequest,
    PullStatus,
    WritesApplied,
    WrongGroup,
)
from quorumlog.shard.group_driver import (
    entry_for_pull_response,
    handle_pull_request,
    next_pull_request,
)
from quorumlog.shard.group_machine import ShardGroupMachine, merge_session_records
from tests.unit.shard.test_group_machine import SHARD_COUNT, Replica, insert_from, key_in_shard


def crowded(gid: int = 1, **bounds: int) -> Replica:
    """A replica whose shards keep one session each (unless told otherwise)."""
    replica = Replica(gid)
    replica.machine = ShardGroupMachine(gid, SHARD_COUNT, **({"session_count_max": 1} | bounds))
    return replica


def is_refused(result: object) -> bool:
    return (
        isinstance(result, KVCommandResult)
        and result.ok is False
        and result.error is ErrorCode.SESSION_EXPIRED
    )


def evict_alice(replica: Replica, shard: int = 0) -> str:
    """Alice appends "x" to a key of `shard` (sequence 1; she never got the answer), then
    Bob's first write to the shard takes the only session place. Returns Alice's key."""
    key = key_in_shard(shard)
    assert replica.write(key, "x", client_id="alice", operation="append") == KVCommandResult()
    replica.write(key_in_shard(shard, 1), "b", client_id="bob")
    return key


# --- the regressions ------------------------------------------------------------------------


def test_a_retry_after_eviction_is_refused_and_not_applied_again() -> None:
    replica = crowded()
    replica.configure(1, [1] * SHARD_COUNT)
    key = evict_alice(replica)
    retry = replica.write(key, "x", client_id="alice", operation="append")
    assert replica.machine.get(key) == "x"
    assert is_refused(retry)
    assert replica.machine.session_expired_count == 1
    assert list(replica.machine.shards[0].sessions.expired) == ["alice"]


def test_a_retry_after_expiry_is_refused_and_not_applied_again() -> None:
    replica = Replica(1)
    replica.machine = ShardGroupMachine(1, SHARD_COUNT, session_ttl_ms=1_000)
    replica.configure(1, [1] * SHARD_COUNT)
    key = key_in_shard(0)
    replica.write(key, "x", client_id="alice", operation="append")
    replica.timestamp_ms += 5_000
    replica.write(key_in_shard(0, 1), "b", client_id="bob")  # moves shard 0's time on
    retry = replica.write(key, "x", client_id="alice", operation="append")
    assert replica.machine.get(key) == "x"
    assert is_refused(retry)


def test_a_dropped_session_moves_with_its_shard() -> None:
    """Alice's session on shard 0 is dropped at the old owner; the shard moves; her retry
    at the new owner is refused there too."""
    old, new = crowded(1), Replica(2)
    for replica in (old, new):
        replica.configure(1, [1] * SHARD_COUNT)
    key = evict_alice(old)
    for replica in (old, new):
        replica.configure(2, [2, 1, 1, 1])
    new.control(insert_from(old, 2, [0]))
    new.timestamp_ms = old.timestamp_ms
    retry = new.write(key, "x", client_id="alice", operation="append")
    assert new.machine.get(key) == "x"
    assert is_refused(retry)
    # Bob's session moved as a live one: his next write is applied.
    assert new.write(key_in_shard(0, 1), "c", client_id="bob", sequence=2) == KVCommandResult()


@pytest.mark.parametrize("bytes_max", [1, 10_000])
def test_a_dropped_session_moves_in_a_chunked_pull(bytes_max: int) -> None:
    old, new = crowded(1), Replica(2)
    for replica in (old, new):
        replica.configure(1, [1] * SHARD_COUNT)
    key = evict_alice(old)
    for replica in (old, new):
        replica.configure(2, [2, 1, 1, 1])
    request: PullRequest | None = PullRequest(2, 2, [0], bytes_max=bytes_max)
    while request is not None:
        response = handle_pull_request(old.machine, request)
        assert response.status is PullStatus.OK
        entry = entry_for_pull_response(new.machine, response)
        assert entry is not None
        new.control(entry)
        request = next_pull_request(request, response)
    new.timestamp_ms = old.timestamp_ms
    retry = new.write(key, "x", client_id="alice", operation="append")
    assert new.machine.get(key) == "x"
    assert is_refused(retry)
    assert list(new.machine.shards[0].sessions.expired) == ["alice"]


# --- what is and is not refused ------------------------------------------------------------


def test_a_first_write_to_another_shard_may_carry_any_sequence() -> None:
    """A client numbers its writes across shards: shard tables do not use rule 2."""
    replica = Replica(1)
    replica.configure(1, [1] * SHARD_COUNT)
    replica.write(key_in_shard(0), "a", client_id="alice", sequence=1, first_unacknowledged=1)
    later = replica.write(
        key_in_shard(1), "b", client_id="alice", sequence=9, first_unacknowledged=9
    )
    assert later == KVCommandResult()
    assert replica.machine.get(key_in_shard(1)) == "b"


def test_a_batch_is_refused_whole_if_any_served_shard_dropped_the_session() -> None:
    replica = crowded()
    replica.configure(1, [1, 1, 2, 2])
    evict_alice(replica, shard=0)
    commands = [
        KVCommand(5, "put", key_in_shard(1), "new"),
        KVCommand(1, "append", key_in_shard(0), "x"),
        KVCommand(6, "put", key_in_shard(2), "elsewhere"),
    ]
    result = replica.propose(
        ClientWrites(replica.timestamp_ms, [ClientBatch("alice", 1, commands)])
    )
    assert replica.machine.get(key_in_shard(1)) is None
    assert replica.machine.get(key_in_shard(0)) == "x"
    assert isinstance(result, WritesApplied)
    [[first, second, third]] = result.results
    assert is_refused(first)
    assert is_refused(second)
    assert third == WrongGroup(2, 1)
    assert "alice" not in replica.machine.shards[1].sessions.sessions


def test_merging_keeps_a_session_dropped_on_either_side_dropped() -> None:
    table = SessionTable(new_client_rule=NewClientRule.NOT_REMEMBERED)
    table.touch("alice", 1)
    table.remember_dropped("bob")
    merge_session_records(
        table,
        [
            SessionRecord("alice", 0, 0, [], [], expired=True),
            SessionRecord("bob", 0, 1, [1], [KVCommandResult()]),
        ],
        clock_ms=50,
    )
    assert table.sessions == {}
    assert table.expired == {"bob": 0, "alice": 50}


# --- snapshots ----------------------------------------------------------------------------


def test_dropped_sessions_survive_a_snapshot() -> None:
    replica = crowded()
    replica.configure(1, [1] * SHARD_COUNT)
    key = evict_alice(replica)
    data = replica.machine.snapshot()
    restored = ShardGroupMachine(1, SHARD_COUNT, session_count_max=1)
    restored.restore(data)
    assert restored.snapshot() == data
    replica.machine = restored
    assert is_refused(replica.write(key, "x", client_id="alice", operation="append"))
    assert restored.get(key) == "x"


def as_format_1(snapshot: bytes) -> bytes:
    """The bytes a build before dropped-session records wrote for the same state: session
    records of five fields, results of two, format 1."""
    fields = msgspec.msgpack.decode(snapshot)
    fields[0] = 1
    # Format 3 shards are [state, kvs, sessions, revisions and history...]; format 1 and 2
    # shards are [state, {key: text value}, sessions].
    fields[7] = [
        [shard[0], {kv[0]: kv[1].decode() for kv in shard[1]}, shard[2]] for shard in fields[7]
    ]
    for shard in fields[7]:
        for record in shard[2]:
            assert record[5] is False, "format 1 cannot hold a dropped session"
            del record[5]
            for result in record[4]:
                del result[2]
    return msgspec.msgpack.encode(fields)


def test_a_format_1_snapshot_is_read() -> None:
    replica = Replica(1)
    replica.configure(1, [1] * SHARD_COUNT)
    key = key_in_shard(0)
    replica.write(key, "x", client_id="alice", operation="append")
    restored = ShardGroupMachine(1, SHARD_COUNT)
    restored.restore(as_format_1(replica.machine.snapshot()))
    assert [restored.shard_data(shard) for shard in range(SHARD_COUNT)] == [
        replica.machine.shard_data(shard) for shard in range(SHARD_COUNT)
    ]
    # Revisions are made up from the snapshot alone: the keys in order, from 1.
    assert restored.shards[0].store.records[key].mod_revision == 1
    assert restored.shards[0].store.compacted_revision == 1
    replica.machine = restored
    assert replica.write(key, "x", client_id="alice", operation="append") == KVCommandResult()
    assert restored.get(key) == "x"
    assert restored.duplicate_count == 1


def test_an_unknown_format_is_refused_naming_both() -> None:
    machine = ShardGroupMachine(1, SHARD_COUNT)
    fields = msgspec.msgpack.decode(machine.snapshot())
    fields[0] = 4
    with pytest.raises(MalformedEntryError) as refusal:
        machine.restore(msgspec.msgpack.encode(fields))
    message = str(refusal.value)
    assert "\n" not in message
    assert "format 4" in message
    assert "[1, 2, 3]" in message
