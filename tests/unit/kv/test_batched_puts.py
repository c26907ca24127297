"""Plain puts applied per batch (`fresh_puts`, `MVCCStore.put_commands`) must leave exactly
the state, history and answers that applying them command by command leaves."""

from __future__ import annotations

import itertools
import random

import pytest

from quorumlog.codec.kv_v3 import RANGE_END_ALL, KeyValue, RequestOp, Txn
from quorumlog.codec.wire import KVCommand
from quorumlog.kv import machine as machine_module
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine, fresh_puts
from quorumlog.kv.mvcc import MVCCStore
from quorumlog.kv.sessions import Session


def store_state(store: MVCCStore) -> tuple[object, ...]:
    return (
        dict(store.records),
        list(store.history),
        store.history_bytes,
        store.revision,
        store.compacted_revision,
        {lease: set(keys) for lease, keys in store.lease_keys.items()},
        list(store.sorted_keys),
    )


def small_store() -> MVCCStore:
    # Small bounds, so the puts below cross them many times (trims mid-batch).
    return MVCCStore(history_events_max=16, history_bytes_max=2048)


def test_put_commands_leave_what_put_then_finish_leave() -> None:
    batched, single = small_store(), small_store()
    for store in (batched, single):
        lease = store.lease_grant(60, 0)
        store.put("leased", b"x", lease.lease_id)
        store.finish()
        store.put("gone", b"x")
        store.finish()
        store.delete("gone")
        store.finish()
    chooser = random.Random(7)
    for round_number in range(40):
        # New keys, overwrites, a deleted key put again, a leased key overwritten.
        names = ["leased", "gone", *(f"k{chooser.randrange(12)}" for _ in range(9))]
        chooser.shuffle(names)
        values = [f"{round_number}-{position}".encode() * 9 for position in range(len(names))]
        batched.put_commands(names, values)
        for name, value in zip(names, values, strict=True):
            single.put(name, value)
            single.finish()
        assert store_state(batched) == store_state(single), f"round {round_number}"
    assert batched.compacted_revision > 0  # the bounds were crossed


def test_each_batched_put_is_its_own_revision_and_watchers_see_each_in_order() -> None:
    machine = KVStateMachine()
    commands = [KVCommand(sequence, "put", "k", f"v{sequence}") for sequence in range(1, 51)]
    before = machine.revision
    machine.apply(1, encode_entry(KVEntry(0, [ClientBatch("c", 1, commands)])))
    assert machine.revision == before + 50
    events = machine.store.events_since(before + 1, "", RANGE_END_ALL, 1000)
    assert [event.kv.mod_revision for event in events] == list(range(before + 1, before + 51))
    assert [event.kv.value for event in events] == [f"v{n}".encode() for n in range(1, 51)]
    assert [event.kv.version for event in events] == list(range(1, 51))
    assert events[0].prev_kv is None
    for earlier, later in itertools.pairwise(events):
        assert later.prev_kv == earlier.kv


def command_for(chooser: random.Random, sequence: int) -> KVCommand:
    key = f"k{chooser.randrange(6)}"
    kind = chooser.random()
    if kind < 0.75:
        return KVCommand(sequence, "put", key, f"v{sequence}")
    if kind < 0.85:
        return KVCommand(sequence, "delete", key)
    if kind < 0.9:
        return KVCommand(sequence, "put", key)  # no value: refused
    if kind < 0.95:
        return KVCommand(sequence, "append", key, "+")
    return KVCommand(sequence, "cas", key, f"v{sequence}", expected=None)


def random_entries(seed: int, count: int) -> list[KVEntry]:
    """Entries of two clients: mostly batches of new consecutive puts; also retried
    batches (duplicates), gaps, repeated sequences, other ops, acknowledgements."""
    chooser = random.Random(seed)
    next_sequence = {"a": 1, "b": 1}
    sent: dict[str, list[ClientBatch]] = {"a": [], "b": []}
    entries = []
    for number in range(count):
        batches = []
        for client in chooser.sample(["a", "b"], chooser.randint(1, 2)):
            if sent[client] and chooser.random() < 0.15:
                batches.append(chooser.choice(sent[client]))  # a retry
                continue
            first = next_sequence[client] + (3 if chooser.random() < 0.1 else 0)
            sequences = list(range(first, first + chooser.randint(1, 8)))
            if chooser.random() < 0.1:
                sequences.append(sequences[-1])  # the same sequence twice in one batch
            commands = [
                KVCommand(sequence, "put", f"k{chooser.randrange(6)}", f"v{sequence}")
                if chooser.random() < 0.8
                else command_for(chooser, sequence)
                for sequence in sequences
            ]
            next_sequence[client] = sequences[-1] + 1
            acknowledged = max(1, next_sequence[client] - chooser.randint(1, 12))
            batch = ClientBatch(client, acknowledged, commands)
            sent[client].append(batch)
            batches.append(batch)
        entries.append(KVEntry(1000 + number, batches))
    return entries


@pytest.mark.parametrize("seed", range(6))
def test_batches_give_the_state_and_answers_command_by_command_gives(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = random_entries(seed, 60)
    settings = {"session_results_max": 10, "history_events_max": 16, "history_bytes_max": 1024}
    batched = KVStateMachine(**settings)
    batched_results = [batched.apply(index, encode_entry(e)) for index, e in enumerate(entries, 1)]
    batched_snapshot = batched.snapshot()
    monkeypatch.setattr(machine_module, "fresh_puts", lambda *arguments: None)
    single = KVStateMachine(**settings)
    single_results = [single.apply(index, encode_entry(e)) for index, e in enumerate(entries, 1)]
    assert batched_results == single_results
    assert batched.duplicate_count == single.duplicate_count > 0
    assert batched_snapshot == single.snapshot()


def test_fresh_puts_takes_only_batches_of_new_consecutive_plain_puts() -> None:
    session = Session(last_active_ms=0, first_unacknowledged=5)
    session.results[9] = machine_module.OK_RESULT

    def puts(*commands: KVCommand, results_max: int = 100) -> object:
        return fresh_puts(session, list(commands), results_max)

    assert puts(KVCommand(5, "put", "a", "x"), KVCommand(6, "put", "b", "é")) == (
        [5, 6],
        ["a", "b"],
        [b"x", "é".encode()],
    )
    assert puts() is None
    assert puts(KVCommand(4, "put", "a", "x")) is None  # below first_unacknowledged
    assert puts(KVCommand(9, "put", "a", "x")) is None  # answered already
    assert puts(KVCommand(5, "put", "a", "x"), KVCommand(7, "put", "a", "x")) is None  # gap
    assert puts(KVCommand(5, "put", "a", "x"), KVCommand(5, "put", "a", "x")) is None
    assert puts(KVCommand(5, "append", "a", "x")) is None
    assert puts(KVCommand(5, "put", "a")) is None  # no value
    assert puts(KVCommand(5, "put", "a", "x"), results_max=1) is None  # would drop one


def test_a_leased_key_put_plainly_leaves_its_lease() -> None:
    machine = KVStateMachine()
    machine.store.lease_grant(60, 0)
    machine.store.txn(Txn([], [RequestOp("put", "k", value=b"x", lease=1)], []))
    batch = ClientBatch("c", 1, [KVCommand(1, "put", "k", "y")])
    machine.apply(1, encode_entry(KVEntry(0, [batch])))
    record = machine.store.records["k"]
    assert record == KeyValue("k", b"y", record.create_revision, 2, 2, 0)
    assert machine.store.lease_keys[1] == set()


def model_trim(
    events: list[tuple[int, int]], events_max: int, bytes_max: int
) -> tuple[list[tuple[int, int]], int]:
    """The history bound's rule, written plainly over (revision, bytes) pairs: over
    either bound, drop the oldest events until both are at seven eighths of their bound,
    then the rest of the last revision cut. The events kept, and the revision compacted
    to (0: none)."""
    if len(events) <= events_max and sum(size for _, size in events) <= bytes_max:
        return events, 0
    cut = max(len(events) - (events_max - events_max // 8), 0)
    while cut < len(events) and sum(size for _, size in events[cut:]) > (
        bytes_max - bytes_max // 8
    ):
        cut += 1
    if cut == 0:
        return events, 0
    revision = events[cut - 1][0]
    while cut < len(events) and events[cut][0] == revision:
        cut += 1
    return events[cut:], revision


def test_history_bounds_trim_exactly_as_the_plain_rule_says() -> None:
    events_max, bytes_max = 24, 1500
    store = MVCCStore(history_events_max=events_max, history_bytes_max=bytes_max)
    model: list[tuple[int, int]] = []
    """(revision, bytes) of each event the history should hold."""
    compacted = 0
    chooser = random.Random(11)
    for step in range(600):
        revision = store.revision
        names = [f"k{chooser.randrange(8)}" for _ in range(chooser.randint(1, 4))]
        kind = chooser.random()
        # Each command's events (key + value + 48 bytes), bounded as it finishes.
        commands: list[list[tuple[int, int]]] = []
        if kind < 0.5:
            sizes = [chooser.randrange(1, 200) for _ in names]
            store.put_commands(names, [b"v" * size for size in sizes])
            commands = [
                [(revision + number, len(name) + size + 48)]
                for number, (name, size) in enumerate(zip(names, sizes, strict=True), 1)
            ]
        elif kind < 0.7:
            store.txn(Txn([], [RequestOp("put", name, value=b"t" * 30) for name in names], []))
            commands = [[(revision + 1, len(name) + 30 + 48) for name in names]]
        elif kind < 0.85:
            present = set(store.records)
            store.txn(Txn([], [RequestOp("delete", name) for name in names], []))
            deleted = []
            for name in names:
                if name in present:  # a second delete of a key finds nothing
                    present.discard(name)
                    deleted.append(name)
            commands = [[(revision + 1, len(name) + 48) for name in deleted]] if deleted else []
        elif revision > store.compacted_revision + 1:
            compacted = chooser.randrange(store.compacted_revision + 1, revision)
            store.compact(compacted)
            model = [pair for pair in model if pair[0] > compacted]
        for events in commands:
            model, cut_to = model_trim([*model, *events], events_max, bytes_max)
            compacted = max(compacted, cut_to)
        history = [(e.kv.mod_revision, len(e.kv.key) + len(e.kv.value) + 48) for e in store.history]
        assert history == model, f"step {step}"
        assert store.compacted_revision == compacted, f"step {step}"
        assert store.history_bytes == sum(size for _, size in model)
    assert compacted > 0
