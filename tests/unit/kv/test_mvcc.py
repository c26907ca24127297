"""The multi-version KV machine: revisions, ranges, txns, leases, compaction, snapshots."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.codec import kv_v3
from quorumlog.codec.kv_v3 import RANGE_END_ALL, Compare, KeyValue, RequestOp, Txn
from quorumlog.codec.wire import KVCommand
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVSnapshot, KVStateMachine, MalformedEntryError
from quorumlog.kv.mvcc import MVCCStore, StoreFailure
from quorumlog.kv.sessions import SessionRecord


class V3Applier:
    """One client feeding one command per entry."""

    def __init__(self, machine: KVStateMachine | None = None) -> None:
        self.machine = machine or KVStateMachine()
        self.index = 0
        self.sequence = 0

    def entry(self, entry: KVEntry) -> list[list[object]]:
        self.index += 1
        return self.machine.apply(self.index, encode_entry(entry))  # type: ignore[return-value]

    def v3(self, command: kv_v3.V3Command, timestamp_ms: int = 0) -> kv_v3.V3Response:
        self.sequence += 1
        payload = kv_v3.encode_command(command)
        batch = ClientBatch("c", 0, [KVCommand(self.sequence, "v3", "", payload=payload)])
        [[result]] = self.machine.apply(
            self.next_index(), encode_entry(KVEntry(timestamp_ms, [batch]))
        )
        assert result.payload is not None
        return kv_v3.decode_response(result.payload)

    def text(self, op: str, key: str, value: str | None = None) -> None:
        self.sequence += 1
        batch = ClientBatch("c", 0, [KVCommand(self.sequence, op, key, value)])
        self.machine.apply(self.next_index(), encode_entry(KVEntry(0, [batch])))

    def next_index(self) -> int:
        self.index += 1
        return self.index

    def put(self, key: str, value: bytes, lease: int = 0) -> kv_v3.V3Response:
        return self.v3(Txn([], [RequestOp("put", key, value=value, lease=lease)], []))


def test_revisions_versions_and_one_revision_per_txn() -> None:
    applier = V3Applier()
    applier.put("a", b"1")
    applier.put("a", b"2")
    applier.text("put", "b", "text")
    store = applier.machine.store
    assert store.revision == 3
    assert store.records["a"] == KeyValue("a", b"2", 1, 2, 2)
    assert applier.machine.get("b") == "text"
    assert applier.machine.get_bytes("b") == b"text"
    response = applier.v3(
        Txn(
            [],
            [RequestOp("put", "x", value=b"x"), RequestOp("delete", "a"), RequestOp("get", "x")],
            [],
        )
    )
    assert isinstance(response, kv_v3.TxnResponse)
    assert response.revision == 4
    assert [kv.key for kv in response.responses[2].kvs] == ["x"]  # the txn sees its own put
    assert store.records["x"].mod_revision == 4
    # A delete of nothing and a read-only txn change no revision.
    applier.text("delete", "missing")
    applier.v3(Txn([], [RequestOp("get", "x")], []))
    assert store.revision == 4
    # Re-created after a delete: a new create revision, version 1.
    applier.put("a", b"again")
    assert store.records["a"] == KeyValue("a", b"again", 5, 5, 1)


def test_txn_compares_choose_the_branch() -> None:
    applier = V3Applier()
    applier.put("k", b"v")

    def txn(compare: Compare) -> bool:
        response = applier.v3(Txn([compare], [RequestOp("get", "k")], []))
        assert isinstance(response, kv_v3.TxnResponse)
        return response.succeeded

    assert txn(Compare("value", "k", "==", b"v"))
    assert not txn(Compare("value", "k", "!=", b"v"))
    assert txn(Compare("value", "k", "<", b"w"))
    assert txn(Compare("version", "k", "==", 1))
    assert txn(Compare("create", "missing", "==", 0))
    assert not txn(Compare("value", "missing", "==", b""))  # etcd: a missing key's value
    assert txn(Compare("mod", "k", ">", 0))


def test_range_prefix_limit_from_key_and_past_revisions() -> None:
    applier = V3Applier()
    for key in ["a", "b/1", "b/2", "b/3", "c"]:
        applier.put(key, key.encode())
    store = applier.machine.store
    kvs, count = store.range("b/", "b0", limit=2)
    assert [kv.key for kv in kvs] == ["b/1", "b/2"] and count == 3
    kvs, count = store.range("b/2", RANGE_END_ALL)
    assert [kv.key for kv in kvs] == ["b/2", "b/3", "c"]
    applier.put("b/1", b"new")
    applier.v3(Txn([], [RequestOp("delete", "b/", end="b0")], []))
    assert store.range("b/", "b0") == ([], 0)
    kvs, _ = store.range("b/", "b0", revision=5)
    assert [(kv.key, kv.value) for kv in kvs] == [("b/1", b"b/1"), ("b/2", b"b/2"), ("b/3", b"b/3")]
    kvs, _ = store.range("b/1", None, revision=6)
    assert kvs == [KeyValue("b/1", b"new", 2, 6, 2)]
    with pytest.raises(StoreFailure, match="past"):
        store.range("a", None, revision=99)
    assert isinstance(applier.v3(kv_v3.Compact(5)), kv_v3.CompactResponse)
    with pytest.raises(StoreFailure, match="compacted"):
        store.range("a", None, revision=4)
    assert store.range("a", None, revision=5)[1] == 1
    failure = applier.v3(kv_v3.Compact(5))
    assert isinstance(failure, kv_v3.V3Failure) and failure.code == "compacted"
    with pytest.raises(StoreFailure, match="compacted"):
        store.events_since(5, "", RANGE_END_ALL, 100)
    assert [event.type for event in store.events_since(6, "", RANGE_END_ALL, 100)] == [
        "PUT",
        "DELETE",
        "DELETE",
        "DELETE",
    ]


def test_history_is_bounded_by_compacting_whole_revisions() -> None:
    store = MVCCStore(history_events_max=8)
    for number in range(20):
        store.put(f"k{number}", b"x")
        store.put(f"j{number}", b"x")
        store.finish()
    assert len(store.history) <= 8
    assert store.compacted_revision == store.history[0].kv.mod_revision - 1
    assert all(event.kv.mod_revision > store.compacted_revision for event in store.history)


def test_leases_expire_only_through_the_log_and_keepalive_wins() -> None:
    applier = V3Applier()
    granted = applier.v3(kv_v3.LeaseGrant(2), timestamp_ms=1_000)
    assert isinstance(granted, kv_v3.LeaseResponse) and granted.lease_id == 1
    applier.put("held", b"x", lease=1)
    failure = applier.put("other", b"x", lease=77)
    assert isinstance(failure, kv_v3.V3Failure) and failure.code == "lease_not_found"
    assert "other" not in applier.machine.store.records
    # The leader asked too early by the log's clock (a keepalive came in between): kept.
    applier.v3(kv_v3.LeaseKeepAlive(1), timestamp_ms=2_500)
    applier.entry(KVEntry(3_000, [], expired_leases=[1]))
    assert "held" in applier.machine.store.records
    applier.entry(KVEntry(4_500, [], expired_leases=[1]))
    assert "held" not in applier.machine.store.records
    assert applier.machine.store.leases == {}
    revoked = applier.v3(kv_v3.LeaseRevoke(1))
    assert isinstance(revoked, kv_v3.V3Failure) and revoked.code == "lease_not_found"


def test_snapshot_round_trip_carries_revisions_leases_and_history() -> None:
    applier = V3Applier()
    applier.v3(kv_v3.LeaseGrant(10), timestamp_ms=5)
    applier.put("a", b"\x00\xff", lease=1)
    applier.put("b", b"2")
    applier.put("a", b"again", lease=1)
    snapshot = applier.machine.snapshot()
    restored = KVStateMachine()
    restored.restore(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.store.revision == 3
    # Each event's key-before is rebuilt (the snapshot leaves it out): old reads work.
    assert restored.store.history[-1].prev_kv == KeyValue("a", b"\x00\xff", 1, 1, 1, 1)
    assert restored.store.range("a", None, revision=2)[0][0].value == b"\x00\xff"
    assert restored.store.lease_keys == {1: {"a"}}
    assert restored.store.events_since(1, "", RANGE_END_ALL, 10) == applier.machine.store.history


def test_a_format_2_snapshot_reads_with_revisions_made_up_in_key_order() -> None:
    session = SessionRecord("c", 7, 1, [], [])
    old = KVSnapshot(2, 12, 30, {"z": "last", "a": "first", "m": "é"}, [session])
    restored = KVStateMachine()
    restored.restore(msgspec.msgpack.encode(old))
    store = restored.store
    assert restored.applied_index == 12
    assert [store.records[key] for key in store.sorted_keys] == [
        KeyValue("a", b"first", 1, 1, 1),
        KeyValue("m", "é".encode(), 2, 2, 1),
        KeyValue("z", b"last", 3, 3, 1),
    ]
    assert store.revision == 3 and store.compacted_revision == 3
    assert restored.get("m") == "é"
    assert list(restored.sessions.sessions) == ["c"]
    # Format 1 (no `expired` on session records) reads the same way.
    restored_v1 = KVStateMachine()
    restored_v1.restore(msgspec.msgpack.encode(KVSnapshot(1, 12, 30, {"a": "first"}, [])))
    assert restored_v1.store.records["a"] == KeyValue("a", b"first", 1, 1, 1)


def test_an_unknown_snapshot_format_is_refused_naming_the_formats() -> None:
    future = KVSnapshot(9, 1, 0, {}, [])
    with pytest.raises(MalformedEntryError, match=r"format 9.*\[1, 2, 3\]"):
        KVStateMachine().restore(msgspec.msgpack.encode(future))


# --- range semantics against a model ------------------------------------------------------

KEYS = ["", "a", "a/1", "a/2", "ab", "b", "b/x"]


@st.composite
def histories(draw: st.DrawFn) -> list[Txn]:
    commands: list[Txn] = []
    for _ in range(draw(st.integers(1, 25))):
        operations: list[RequestOp] = []
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(KEYS[1:]))
            if draw(st.booleans()):
                operations.append(RequestOp("put", key, value=draw(st.binary(max_size=3))))
            else:
                end = draw(st.sampled_from([None, RANGE_END_ALL, "b", "a0"]))
                operations.append(RequestOp("delete", key, end=end))
        commands.append(Txn([], operations, []))
    return commands


def model_range(state: dict[str, bytes], key: str, end: str | None) -> list[tuple[str, bytes]]:
    return sorted((name, value) for name, value in state.items() if kv_v3.in_range(name, key, end))


@settings(max_examples=150, deadline=None)
@given(
    histories(),
    st.sampled_from(KEYS),
    st.sampled_from([None, RANGE_END_ALL, "a0", "b", "c"]),
    st.integers(0, 3),
)
def test_range_at_every_revision_matches_a_model(
    commands: list[Txn], key: str, end: str | None, limit: int
) -> None:
    applier = V3Applier()
    state: dict[str, bytes] = {}
    states = {0: dict(state)}
    for command in commands:
        for operation in command.success:
            if operation.kind == "put":
                state[operation.key] = operation.value
            else:
                for name in [n for n in state if kv_v3.in_range(n, operation.key, operation.end)]:
                    del state[name]
        applier.v3(command)
        states[applier.machine.store.revision] = dict(state)
    store = applier.machine.store
    for revision in range(store.revision + 1):
        expected = model_range(states.get(revision, {}) if revision else state, key, end)
        if revision not in states:
            continue
        kvs, count = store.range(key, end, limit, revision)
        assert count == len(expected)
        wanted = expected[:limit] if limit else expected
        assert [(kv.key, kv.value) for kv in kvs] == wanted
        assert all(kv.mod_revision <= (revision or store.revision) for kv in kvs)
