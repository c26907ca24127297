"""KVStateMachine: operations, deduplication, session expiry and snapshots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.codec.kv_v3 import KeyValue
from quorumlog.codec.wire import KVCommand, KVCommandResult
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine, MalformedEntryError


def entry_bytes(timestamp_ms: int, *batches: ClientBatch) -> bytes:
    return encode_entry(KVEntry(timestamp_ms=timestamp_ms, batches=list(batches)))


def batch(client_id: str, *commands: KVCommand, first_unacknowledged: int = 0) -> ClientBatch:
    return ClientBatch(client_id, first_unacknowledged, list(commands))


class Applier:
    """Feeds one command per entry at increasing indexes."""

    def __init__(self, machine: KVStateMachine) -> None:
        self.machine = machine
        self.index = 0

    def run(
        self,
        client_id: str,
        command: KVCommand,
        timestamp_ms: int = 0,
        first_unacknowledged: int = 0,
    ) -> KVCommandResult:
        self.index += 1
        data = entry_bytes(
            timestamp_ms, batch(client_id, command, first_unacknowledged=first_unacknowledged)
        )
        [[result]] = self.machine.apply(self.index, data)
        return result


def test_put_get_append_delete() -> None:
    applier = Applier(KVStateMachine())
    assert applier.run("c", KVCommand(1, "put", "k", "a")) == KVCommandResult(True, None)
    assert applier.run("c", KVCommand(2, "put", "k", "b")) == KVCommandResult(True, None)
    assert applier.run("c", KVCommand(3, "append", "k", "c")) == KVCommandResult(True, None)
    assert applier.machine.get("k") == "bc"
    assert applier.run("c", KVCommand(4, "append", "new", "x")) == KVCommandResult(True, None)
    assert applier.machine.get("new") == "x"
    assert applier.run("c", KVCommand(5, "delete", "k")) == KVCommandResult(True, "bc")
    assert applier.run("c", KVCommand(6, "delete", "k")) == KVCommandResult(True, None)
    assert applier.machine.get("k") is None
    assert applier.machine.read(["k", "new"]) == [None, "x"]
    assert applier.machine.applied_index == 6
    assert applier.machine.key_count == 1
    assert applier.machine.session_count == 1


def test_compare_and_set() -> None:
    applier = Applier(KVStateMachine())
    # expected None: the key must be missing.
    assert applier.run("c", KVCommand(1, "cas", "k", "v1", None)) == KVCommandResult(True, None)
    assert applier.run("c", KVCommand(2, "cas", "k", "v2", None)) == KVCommandResult(False, "v1")
    assert applier.run("c", KVCommand(3, "cas", "k", "v2", "wrong")) == KVCommandResult(False, "v1")
    assert applier.machine.get("k") == "v1"
    assert applier.run("c", KVCommand(4, "cas", "k", "v2", "v1")) == KVCommandResult(True, "v1")
    assert applier.machine.get("k") == "v2"
    # A new value of None deletes.
    assert applier.run("c", KVCommand(5, "cas", "k", None, "v2")) == KVCommandResult(True, "v2")
    assert applier.machine.get("k") is None


def test_commands_it_cannot_carry_out_are_rejected_without_change() -> None:
    applier = Applier(KVStateMachine())
    assert applier.run("c", KVCommand(1, "explode", "k", "v")) == KVCommandResult(False, None)
    assert applier.run("c", KVCommand(2, "put", "k", None)) == KVCommandResult(False, None)
    assert applier.run("c", KVCommand(3, "append", "k", None)) == KVCommandResult(False, None)
    assert applier.machine.key_count == 0


def test_one_entry_many_batches_results_in_order() -> None:
    machine = KVStateMachine()
    data = entry_bytes(
        5,
        batch("a", KVCommand(1, "put", "x", "1"), KVCommand(2, "append", "x", "2")),
        batch("b", KVCommand(1, "put", "x", "3")),
        batch("c"),
    )
    assert machine.apply(1, data) == [
        [KVCommandResult(True, None), KVCommandResult(True, None)],
        [KVCommandResult(True, None)],
        [],
    ]
    assert machine.get("x") == "3"
    assert machine.session_count == 3


def test_duplicate_sequence_is_not_applied_again() -> None:
    applier = Applier(KVStateMachine())
    first = applier.run("c", KVCommand(1, "append", "k", "x"))
    again = applier.run("c", KVCommand(1, "append", "k", "x"))
    assert first == again == KVCommandResult(True, None)
    assert applier.machine.get("k") == "x"
    assert applier.machine.duplicate_count == 1
    # Another client's sequence 1 is a different command.
    applier.run("other", KVCommand(1, "append", "k", "y"))
    assert applier.machine.get("k") == "xy"


def test_duplicate_within_one_batch() -> None:
    machine = KVStateMachine()
    command = KVCommand(7, "append", "k", "x")
    [[first, second]] = machine.apply(1, entry_bytes(0, batch("c", command, command)))
    assert first == second
    assert machine.get("k") == "x"


def test_acknowledged_results_are_released_and_never_reapplied() -> None:
    applier = Applier(KVStateMachine())
    applier.run("c", KVCommand(1, "append", "k", "x"))
    applier.run("c", KVCommand(2, "append", "k", "y"), first_unacknowledged=2)
    session = applier.machine.sessions.sessions["c"]
    assert list(session.results) == [2]
    # Sequence 1 is below first_unacknowledged: a late duplicate gets the forgotten answer.
    assert applier.run("c", KVCommand(1, "append", "k", "x")) == KVCommandResult(True, None)
    assert applier.machine.get("k") == "xy"
    # first_unacknowledged never goes back.
    applier.run("c", KVCommand(3, "put", "z", "1"), first_unacknowledged=0)
    assert session.first_unacknowledged == 2


def test_index_at_or_below_applied_is_skipped() -> None:
    machine = KVStateMachine()
    data = entry_bytes(0, batch("c", KVCommand(1, "append", "k", "x")))
    machine.apply(3, data)
    assert machine.apply(3, entry_bytes(0, batch("c", KVCommand(2, "append", "k", "y")))) == []
    assert machine.get("k") == "x"
    machine.mark_applied(5)
    assert machine.applied_index == 5
    machine.mark_applied(4)
    assert machine.applied_index == 5


@pytest.mark.parametrize("data", [b"", b"\xff\xff", b"\x93\x01\x02\x03", b"not msgpack"])
def test_malformed_entry_raises(data: bytes) -> None:
    machine = KVStateMachine()
    with pytest.raises(MalformedEntryError, match="entry 1"):
        machine.apply(1, data)
    assert machine.applied_index == 0


def test_malformed_snapshot_raises_and_keeps_state() -> None:
    applier = Applier(KVStateMachine())
    applier.run("c", KVCommand(1, "put", "k", "v"))
    with pytest.raises(MalformedEntryError, match="snapshot"):
        applier.machine.restore(b"\x01\x02")
    assert applier.machine.get("k") == "v"


def test_sessions_expire_by_entry_time() -> None:
    ttl_ms = 1000
    applier = Applier(KVStateMachine(session_ttl_ms=ttl_ms))
    applier.run("old", KVCommand(1, "append", "k", "x"), timestamp_ms=100)
    applier.run("new", KVCommand(1, "append", "k", "y"), timestamp_ms=1100)
    assert set(applier.machine.sessions.sessions) == {"old", "new"}
    applier.run("new", KVCommand(2, "append", "k", "z"), timestamp_ms=1101)
    assert set(applier.machine.sessions.sessions) == {"new"}
    assert applier.machine.sessions.expired_count == 1


def test_clock_never_goes_back() -> None:
    applier = Applier(KVStateMachine(session_ttl_ms=1000))
    applier.run("a", KVCommand(1, "put", "k", "x"), timestamp_ms=5000)
    # A new leader whose clock is behind: activity is stamped with the monotonic clock.
    applier.run("b", KVCommand(1, "put", "k", "y"), timestamp_ms=10)
    assert applier.machine.sessions.clock_ms == 5000
    assert applier.machine.sessions.sessions["b"].last_active_ms == 5000
    applier.run("c", KVCommand(1, "put", "k", "y"), timestamp_ms=6001)
    assert set(applier.machine.sessions.sessions) == {"c"}


def test_session_count_cap_evicts_least_recently_active() -> None:
    applier = Applier(KVStateMachine(session_count_max=2))
    applier.run("a", KVCommand(1, "put", "k", "1"))
    applier.run("b", KVCommand(1, "put", "k", "2"))
    applier.run("a", KVCommand(2, "put", "k", "3"))
    applier.run("c", KVCommand(1, "put", "k", "4"))
    assert list(applier.machine.sessions.sessions) == ["a", "c"]
    assert applier.machine.sessions.evicted_count == 1


def test_session_results_cap_keeps_at_most_once() -> None:
    applier = Applier(KVStateMachine(session_results_max=3))
    for sequence in range(1, 6):
        applier.run("c", KVCommand(sequence, "append", "k", str(sequence)))
    session = applier.machine.sessions.sessions["c"]
    assert sorted(session.results) == [3, 4, 5]
    assert session.first_unacknowledged == 3
    assert applier.run("c", KVCommand(1, "append", "k", "1")) == KVCommandResult(True, None)
    assert applier.machine.get("k") == "12345"


def test_snapshot_round_trip_and_deterministic_bytes() -> None:
    applier = Applier(KVStateMachine())
    applier.run("b", KVCommand(1, "put", "z", "1"), timestamp_ms=10)
    applier.run("a", KVCommand(1, "put", "a", "2"), timestamp_ms=20)
    applier.run("a", KVCommand(2, "delete", "z"), timestamp_ms=30, first_unacknowledged=2)
    snapshot = applier.machine.snapshot()
    restored = KVStateMachine()
    restored.restore(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.applied_index == 3
    assert restored.get("a") == "2"
    assert list(restored.sessions.sessions) == ["b", "a"]
    assert restored.sessions.clock_ms == 30
    # The same keys held in another order give the same bytes for the data.
    left, right = KVStateMachine(), KVStateMachine()
    x, y = KeyValue("x", b"1", 1, 1, 1), KeyValue("y", b"2", 2, 2, 1)
    left.store.load([x, y], 2, 0, [], [], 1)
    right.store.load([y, x], 2, 0, [], [], 1)
    assert left.snapshot() == right.snapshot()


# --- properties -----------------------------------------------------------------------

CLIENTS = ["a", "b", "c"]
KEYS = ["k1", "k2", "k3"]
VALUES = st.sampled_from(["", "x", "yz", "é"])


@st.composite
def command_steps(draw: st.DrawFn) -> list[tuple[str, KVCommand, int]]:
    """(client, command, timestamp) steps; some steps repeat an earlier command verbatim."""
    steps: list[tuple[str, KVCommand, int]] = []
    next_sequence = dict.fromkeys(CLIENTS, 1)
    timestamp_ms = 0
    for _ in range(draw(st.integers(0, 40))):
        timestamp_ms += draw(st.integers(0, 50))
        if steps and draw(st.integers(0, 3)) == 0:
            client_id, command, _ = steps[draw(st.integers(0, len(steps) - 1))]
            steps.append((client_id, command, timestamp_ms))
            continue
        client_id = draw(st.sampled_from(CLIENTS))
        sequence = next_sequence[client_id]
        next_sequence[client_id] += 1
        operation = draw(st.sampled_from(["put", "append", "delete", "cas"]))
        key = draw(st.sampled_from(KEYS))
        value = draw(VALUES)
        expected = draw(st.one_of(st.none(), VALUES))
        steps.append(
            (client_id, KVCommand(sequence, operation, key, value, expected), timestamp_ms)
        )
    return steps


def model_run(
    steps: list[tuple[str, KVCommand, int]],
) -> tuple[dict[str, str], list[KVCommandResult]]:
    """A plain dict, and a table of first results: what exactly-once execution returns."""
    data: dict[str, str] = {}
    seen: dict[tuple[str, int], KVCommandResult] = {}
    results = []
    for client_id, command, _ in steps:
        identity = (client_id, command.sequence)
        if identity not in seen:
            previous = data.get(command.key)
            ok = True
            if command.op == "put":
                data[command.key] = command.value or ""
            elif command.op == "append":
                data[command.key] = (previous or "") + (command.value or "")
            elif command.op == "delete":
                data.pop(command.key, None)
            elif previous == command.expected:
                data[command.key] = command.value or ""
            else:
                ok = False
            # put and append answer no old value (kept small); delete and cas say it.
            answered = None if command.op in ("put", "append") else previous
            seen[identity] = KVCommandResult(ok, answered)
        results.append(seen[identity])
    return data, results


def machine_run(
    machine: KVStateMachine, steps: list[tuple[str, KVCommand, int]], first_index: int = 1
) -> list[KVCommandResult]:
    results = []
    for offset, (client_id, command, timestamp_ms) in enumerate(steps):
        [[result]] = machine.apply(
            first_index + offset, entry_bytes(timestamp_ms, batch(client_id, command))
        )
        results.append(result)
    return results


@settings(max_examples=150, deadline=None)
@given(command_steps())
def test_matches_dict_model_with_exactly_once(steps: list[tuple[str, KVCommand, int]]) -> None:
    machine = KVStateMachine()
    results = machine_run(machine, steps)
    expected_data, expected_results = model_run(steps)
    assert results == expected_results
    assert machine.data == expected_data


@settings(max_examples=100, deadline=None)
@given(command_steps(), st.integers(0, 40))
def test_snapshot_mid_sequence_gives_identical_results(
    steps: list[tuple[str, KVCommand, int]], cut: int
) -> None:
    cut = min(cut, len(steps))
    straight = KVStateMachine(session_ttl_ms=200)
    straight_results = machine_run(straight, steps)

    first = KVStateMachine(session_ttl_ms=200)
    results = machine_run(first, steps[:cut])
    second = KVStateMachine(session_ttl_ms=200)
    second.restore(first.snapshot())
    assert second.snapshot() == first.snapshot()
    results += machine_run(second, steps[cut:], first_index=cut + 1)
    assert results == straight_results
    assert second.snapshot() == straight.snapshot()


@settings(max_examples=100, deadline=None)
@given(command_steps())
def test_replicas_fed_the_same_entries_agree(steps: list[tuple[str, KVCommand, int]]) -> None:
    # A short TTL and cap so expiry and eviction happen along the way.
    replicas = [KVStateMachine(session_ttl_ms=100, session_count_max=2) for _ in range(2)]
    outputs = [machine_run(replica, steps) for replica in replicas]
    assert outputs[0] == outputs[1]
    assert replicas[0].snapshot() == replicas[1].snapshot()
    assert list(replicas[0].sessions.sessions) == list(replicas[1].sessions.sessions)
