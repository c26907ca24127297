"""The KV clients when the cluster no longer has their session: the call raises
SessionExpiredError (not retried, not UnknownOutcomeError), nothing is applied, and later
calls go under a new session (a new client id, sequences from 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from quorumlog import AsyncKVClient, KVClient
from quorumlog.codec import wire
from quorumlog.errors import RequestRejectedError, SessionExpiredError
from quorumlog.kv.async_client import PendingCommand
from quorumlog.kv.connection import (
    ClientSession,
    check_command_result,
    write_results,
)
from quorumlog.kv.machine import KVStateMachine
from quorumlog.kv.sessions import SESSION_EXPIRED_RESULT
from tests.unit.kv.fake_cluster import ClusterThread, FakeCluster
from tests.unit.kv.test_async_client import run


@pytest.fixture
def crowded_cluster() -> Iterator[FakeCluster]:
    """A cluster whose KV machine keeps one session: a second client evicts the first."""
    cluster = FakeCluster()
    cluster.machine = KVStateMachine(session_count_max=1)
    with ClusterThread(cluster) as running:
        yield running


def test_an_evicted_client_gets_the_error_and_then_a_new_session(
    crowded_cluster: FakeCluster,
) -> None:
    cluster = crowded_cluster
    leader = cluster.node("n1")
    with KVClient(cluster.endpoints) as alice, KVClient(cluster.endpoints) as bob:
        alice.append("k", "x")
        first_id = alice.client_id
        bob.put("other", "y")  # takes the only session place
        writes_before = len(leader.writes())
        with pytest.raises(SessionExpiredError, match="session"):
            alice.append("k", "z")
        assert len(leader.writes()) == writes_before + 1  # refused, not retried
        assert cluster.machine.get("k") == "x"
        assert alice.client_id != first_id
        alice.append("k", "w")
        assert cluster.machine.get("k") == "xw"
    renewed = leader.writes()[-1]
    assert renewed.client_id == alice.client_id
    assert renewed.commands[0].sequence == wire.FIRST_SEQUENCE
    assert renewed.first_unacknowledged == wire.FIRST_SEQUENCE


def test_an_error_response_session_expired_is_raised_and_renews(
    crowded_cluster: FakeCluster,
) -> None:
    """A node may answer the refusal as an ErrorResponse instead of as results."""
    leader = crowded_cluster.node("n1")
    with KVClient(crowded_cluster.endpoints) as client:
        client.put("k", "a")
        first_id = client.client_id
        leader.write_errors = [wire.ErrorCode.SESSION_EXPIRED]
        with pytest.raises(SessionExpiredError, match="injected session_expired"):
            client.put("k", "b")
        assert client.client_id != first_id
        client.put("k", "c")
    assert crowded_cluster.machine.get("k") == "c"
    assert [write.client_id for write in leader.writes()] == [first_id, first_id, client.client_id]


def test_a_session_reports_its_first_sequence_until_a_write_is_answered() -> None:
    session = ClientSession("alice", hold_seconds=1.0)
    for number in range(3):
        session.sequences.allocate(("put", f"k{number}", "v", None), now=0.0)
    for sequence in (1, 2):
        session.sequences.acknowledge(sequence)  # e.g. released after an unknown outcome
    assert session.sequences.first_unacknowledged() == 3
    assert session.first_unacknowledged() == wire.FIRST_SEQUENCE
    session.answered = True
    assert session.first_unacknowledged() == 3
    renewed = session.renewed()
    assert renewed.client_id != "alice"
    assert renewed.first_unacknowledged() == wire.FIRST_SEQUENCE
    assert renewed.sequences.next_sequence == wire.FIRST_SEQUENCE


def test_results_carrying_an_error_are_never_taken_for_answers() -> None:
    command = wire.KVCommand(1, "cas", "k", "new", "old")
    with pytest.raises(SessionExpiredError):
        write_results(wire.KVWriteResult(request_id=1, results=[SESSION_EXPIRED_RESULT]), 1, "n1")
    with pytest.raises(SessionExpiredError):
        check_command_result(command, SESSION_EXPIRED_RESULT)
    # A cas that found another value is an answer (ok=False); one carrying an error is not.
    assert check_command_result(command, wire.KVCommandResult(False, "other")).ok is False
    with pytest.raises(RequestRejectedError, match="too_large"):
        check_command_result(command, wire.KVCommandResult(False, None, wire.ErrorCode.TOO_LARGE))


def test_the_async_client_fails_the_refused_batch_and_goes_on() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.machine = KVStateMachine(session_count_max=1)
        async with AsyncKVClient(cluster.endpoints) as alice:
            await alice.put("k0", "x")
            first_id = alice.client_id
            async with AsyncKVClient(cluster.endpoints) as bob:
                await bob.put("other", "y")
            outcomes = await asyncio.gather(
                *(alice.put(f"k{number}", "z") for number in range(1, 4)),
                return_exceptions=True,
            )
            assert all(isinstance(outcome, SessionExpiredError) for outcome in outcomes)
            assert cluster.machine.read(["k1", "k2", "k3"]) == [None, None, None]
            assert alice.client_id != first_id
            await asyncio.gather(*(alice.put(f"k{number}", "w") for number in range(1, 4)))
            assert cluster.machine.read(["k1", "k2", "k3"]) == ["w", "w", "w"]
        last = cluster.node("n1").writes()[-1]
        assert last.client_id == alice.client_id
        assert sorted(command.sequence for command in last.commands) == [1, 2, 3]

    run(test)


def test_the_async_client_never_mixes_sessions_in_one_batch() -> None:
    async def test(cluster: FakeCluster) -> None:
        client = AsyncKVClient(cluster.endpoints)
        sent: list[list[str]] = []

        async def record(batch: list[PendingCommand]) -> None:
            sent.append([pending.session.client_id for pending in batch])

        client.send_writes = record  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        old, new = client.session, client.session.renewed()
        for number, session in enumerate([old, old, new, new, old]):
            command = wire.KVCommand(number + 1, "put", f"k{number}", "v")
            client.pending_writes.append(
                PendingCommand(command, loop.time() + 5, loop.create_future(), session)
            )
        client.flush_writes()
        await asyncio.gather(*client.tasks)
        assert sent == [
            [old.client_id] * 2,
            [new.client_id] * 2,
            [old.client_id],
        ]
        await client.close()

    run(test)
