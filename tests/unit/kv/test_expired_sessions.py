"""Dropped sessions in the KV machine (Raft dissertation §6.3): a client whose session the
machine no longer has is refused, never silently given a fresh session in which a retry of
an applied command would run twice.

Each regression test checks first that nothing ran twice (the data), then how the refusal
is answered, so on a machine without the rule it fails on the data."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.codec.wire import ErrorCode, KVCommand, KVCommandResult
from quorumlog.kv import machine as kv_machine
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVSnapshotV3, KVStateMachine, MalformedEntryError
from quorumlog.kv.sessions import (
    NewClientRule,
    SessionRecord,
    SessionTable,
    is_session_expired,
)

HOUR_MS = 60 * 60 * 1000


class Applier:
    """One entry per batch at increasing indexes, stamped with the time given."""

    def __init__(self, machine: KVStateMachine) -> None:
        self.machine = machine
        self.index = 0

    def run(
        self,
        client_id: str,
        *commands: KVCommand,
        first_unacknowledged: int = 1,
        timestamp_ms: int = 0,
    ) -> list[KVCommandResult]:
        self.index += 1
        batch = ClientBatch(client_id, first_unacknowledged, list(commands))
        entry = encode_entry(KVEntry(timestamp_ms=timestamp_ms, batches=[batch]))
        [results] = self.machine.apply(self.index, entry)
        return results


def append(sequence: int, value: str, key: str = "k") -> KVCommand:
    return KVCommand(sequence, "append", key, value)


def refused(results: list[KVCommandResult]) -> bool:
    return all(r.ok is False and r.error is ErrorCode.SESSION_EXPIRED for r in results)


# --- the regressions ------------------------------------------------------------------------


def test_a_retry_after_eviction_is_refused_and_not_applied_again() -> None:
    applier = Applier(KVStateMachine(session_count_max=1))
    # Alice's first append is applied; its answer is lost, so she will retry it.
    applier.run("alice", append(1, "x"))
    # Bob's session takes the only place: Alice's is evicted.
    applier.run("bob", append(1, "y", key="other"))
    retry = applier.run("alice", append(1, "x"))
    assert applier.machine.get("k") == "x"
    assert refused(retry)
    assert "alice" not in applier.machine.sessions.sessions


def test_a_retry_after_expiry_is_refused_and_not_applied_again() -> None:
    applier = Applier(KVStateMachine(session_ttl_ms=1_000))
    applier.run("alice", append(1, "x"), timestamp_ms=100)
    applier.run("alice", append(2, "y"), first_unacknowledged=2, timestamp_ms=200)
    # Alice idles past the TTL while her answer to 2 is lost; another client's entry
    # moves time on and expires her session.
    applier.run("bob", append(1, "z", key="other"), timestamp_ms=5_000)
    retry = applier.run("alice", append(2, "y"), first_unacknowledged=2, timestamp_ms=5_001)
    assert applier.machine.get("k") == "xy"
    assert refused(retry)


def test_a_client_past_its_first_answer_is_refused_after_the_record_is_gone() -> None:
    """Rule 2: after the record of the dropped session ages out, first_unacknowledged
    above 1 still says the client had a session."""
    applier = Applier(KVStateMachine(session_ttl_ms=1_000, expired_ttl_ms=1_000))
    applier.run("alice", append(1, "x"), timestamp_ms=0)
    applier.run("bob", append(1, "z", key="other"), timestamp_ms=1_500)  # Alice expires
    applier.run("bob", append(2, "z", key="other"), timestamp_ms=3_000)  # her record too
    assert "alice" not in applier.machine.sessions.expired
    retry = applier.run("alice", append(2, "y"), first_unacknowledged=2, timestamp_ms=3_001)
    assert applier.machine.get("k") == "x"
    assert refused(retry)


# --- what is and is not refused ------------------------------------------------------------


def test_a_new_client_gets_a_session_at_its_first_sequence() -> None:
    applier = Applier(KVStateMachine())
    for client_id, first_unacknowledged in (("wire-default", 0), ("ours", 1)):
        [result] = applier.run(client_id, append(1, "a"), first_unacknowledged=first_unacknowledged)
        assert result == KVCommandResult(ok=True, value=None)
    # A client whose first writes never arrived (they timed out) starts at a later sequence
    # and still says 1: it is new.
    [result] = applier.run("late-starter", append(3, "b"), first_unacknowledged=1)
    assert result.ok
    assert applier.machine.get("k") == "aab"
    assert applier.machine.session_expired_count == 0


def test_an_unknown_client_past_its_first_answer_is_refused() -> None:
    applier = Applier(KVStateMachine())
    results = applier.run("stranger", append(7, "x"), append(8, "y"), first_unacknowledged=7)
    assert refused(results)
    assert len(results) == 2
    assert applier.machine.get("k") is None
    assert applier.machine.session_count == 0
    assert applier.machine.session_expired_count == 2


def test_a_refusal_changes_nothing_and_repeats() -> None:
    applier = Applier(KVStateMachine(session_count_max=1))
    applier.run("alice", append(1, "x"))
    applier.run("bob", append(1, "y"))
    before = applier.machine.snapshot()
    for _ in range(2):
        assert refused(applier.run("alice", append(2, "z"), first_unacknowledged=2))
    after = msgspec.msgpack.decode(applier.machine.snapshot(), type=KVSnapshotV3)
    assert msgspec.structs.replace(after, applied_index=2) == msgspec.msgpack.decode(
        before, type=KVSnapshotV3
    )
    # The client's next session (a new id) is a new client.
    [result] = applier.run("alice-2", append(1, "w"))
    assert result.ok
    assert applier.machine.get("k") == "xyw"


def test_a_batch_of_several_commands_is_refused_whole() -> None:
    applier = Applier(KVStateMachine(session_count_max=1))
    applier.run("alice", append(1, "x"))
    applier.run("bob", append(1, "y", key="other"))
    results = applier.run("alice", append(1, "x"), append(2, "new"))
    assert applier.machine.get("k") == "x"
    assert refused(results)
    assert len(results) == 2
    # What a service asks to answer the batch with an ErrorResponse instead.
    assert is_session_expired(results)
    assert not is_session_expired(applier.run("bob", append(2, "z", key="other")))


def test_records_of_dropped_sessions_are_bounded_by_age_and_count() -> None:
    table = SessionTable(
        session_ttl_ms=10,
        session_count_max=100,
        new_client_rule=NewClientRule.FIRST_SEQUENCE,
        expired_ttl_ms=100,
        expired_count_max=2,
    )
    for number, now_ms in enumerate((0, 1, 2)):
        table.advance_clock(now_ms)
        table.touch(f"c{number}", 1)
    table.advance_clock(20)  # all three expire; only the two latest are remembered
    assert list(table.expired) == ["c1", "c2"]
    assert table.expired_count == 3
    assert not table.admits("c2", 1)
    assert table.admits("c0", 1)  # forgotten by the count bound: rule 2 alone decides
    assert not table.admits("c0", 2)
    table.advance_clock(121)
    assert list(table.expired) == []


def test_the_unchecked_rule_keeps_the_old_behaviour() -> None:
    """The shard controller's table: a missing session is a new one, nothing remembered."""
    table = SessionTable(session_count_max=1)
    table.touch("alice", 5)
    table.touch("bob", 5)
    assert table.expired == {}
    assert table.admits("alice", 5)
    assert table.touch("alice", 5).results == {}


def test_the_rules_decide_from_the_table_alone() -> None:
    tables = {
        rule: SessionTable(session_count_max=1, new_client_rule=rule) for rule in NewClientRule
    }
    for table in tables.values():
        table.touch("alice", 1)
        table.touch("bob", 1)  # evicts alice
    answers = {
        rule: (table.admits("alice", 1), table.admits("carol", 1), table.admits("carol", 9))
        for rule, table in tables.items()
    }
    assert answers == {
        NewClientRule.FIRST_SEQUENCE: (False, True, False),
        NewClientRule.NOT_REMEMBERED: (False, True, True),
        NewClientRule.UNCHECKED: (True, True, True),
    }


# --- snapshots ----------------------------------------------------------------------------


def test_dropped_sessions_survive_a_snapshot() -> None:
    applier = Applier(KVStateMachine(session_count_max=1))
    applier.run("alice", append(1, "x"))
    applier.run("bob", append(1, "y", key="other"))
    data = applier.machine.snapshot()
    restored = KVStateMachine(session_count_max=1)
    restored.restore(data)
    assert restored.snapshot() == data
    assert list(restored.sessions.expired) == ["alice"]
    follower = Applier(restored)
    follower.index = applier.index
    assert refused(follower.run("alice", append(1, "x")))
    assert restored.get("k") == "x"


class SessionRecordFormat1(msgspec.Struct, frozen=True, array_like=True):
    client_id: str
    last_active_ms: int
    first_unacknowledged: int
    sequences: list[int]
    results: list[tuple[bool, str | None]]


class KVSnapshotFormat1(msgspec.Struct, frozen=True, array_like=True):
    format_version: int
    applied_index: int
    clock_ms: int
    data: dict[str, str]
    sessions: list[SessionRecordFormat1]


def test_a_format_1_snapshot_is_read() -> None:
    old = KVSnapshotFormat1(
        format_version=1,
        applied_index=4,
        clock_ms=50,
        data={"k": "x"},
        sessions=[SessionRecordFormat1("alice", 40, 1, [1], [(True, None)])],
    )
    machine = KVStateMachine()
    machine.restore(msgspec.msgpack.encode(old))
    assert machine.get("k") == "x"
    assert machine.sessions.sessions["alice"].results == {1: KVCommandResult(True, None)}
    assert machine.sessions.expired == {}
    # The retry of Alice's command is still a duplicate.
    applier = Applier(machine)
    applier.index = 4
    assert applier.run("alice", append(1, "x"), timestamp_ms=60) == [KVCommandResult(True, None)]
    assert machine.get("k") == "x"
    # It is written back in the current format.
    rewritten = msgspec.msgpack.decode(machine.snapshot(), type=KVSnapshotV3)
    assert rewritten.format_version == kv_machine.SNAPSHOT_FORMAT_VERSION == 3


def test_an_unknown_format_is_refused_naming_both() -> None:
    machine = KVStateMachine()
    snapshot = msgspec.msgpack.decode(machine.snapshot(), type=KVSnapshotV3)
    future = msgspec.structs.replace(snapshot, format_version=4)
    with pytest.raises(MalformedEntryError) as refusal:
        machine.restore(msgspec.msgpack.encode(future))
    message = str(refusal.value)
    assert "\n" not in message
    assert "format 4" in message
    assert "[1, 2, 3]" in message


def test_a_dropped_record_with_results_is_malformed() -> None:
    machine = KVStateMachine()
    snapshot = msgspec.msgpack.decode(machine.snapshot(), type=KVSnapshotV3)
    bad = msgspec.structs.replace(
        snapshot,
        sessions=[SessionRecord("alice", 0, 0, [1], [KVCommandResult()], expired=True)],
    )
    with pytest.raises(MalformedEntryError, match="holds results"):
        machine.restore(msgspec.msgpack.encode(bad))
