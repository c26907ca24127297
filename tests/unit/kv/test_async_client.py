"""AsyncKVClient: pipelining, batching and the shared retry rules, against the fake cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quorumlog import AsyncKVClient
from quorumlog.codec import wire
from quorumlog.errors import ClientError, ConnectionRefusedByNodeError, UnknownOutcomeError
from tests.unit.kv.fake_cluster import FakeCluster


def run(test: Callable[[FakeCluster], Awaitable[None]], node_count: int = 3) -> None:
    async def main() -> None:
        cluster = FakeCluster(node_count)
        await cluster.start()
        try:
            await asyncio.wait_for(test(cluster), timeout=15)
        finally:
            await cluster.stop()

    asyncio.run(main())


def test_operations() -> None:
    async def test(cluster: FakeCluster) -> None:
        async with AsyncKVClient(cluster.endpoints) as client:
            await client.put("k", "a")
            await client.append("k", "b")
            assert await client.get("k") == "ab"
            assert await client.get("k", stale=True) == "ab"
            assert await client.cas("k", "ab", "c") is True
            assert await client.cas("k", "ab", "d") is False
            await client.delete("k")
            assert await client.get("k") is None
            assert (await client.status()).is_leader
            assert [member.node_id for member in await client.member_list()] == ["n1", "n2", "n3"]
            await client.transfer_leader("n2")
            await client.put("after", "transfer")
        assert cluster.leader_id == "n2"
        assert len(cluster.node("n2").writes()) == 1

    run(test)


def test_concurrent_puts_are_batched_into_few_writes() -> None:
    async def test(cluster: FakeCluster) -> None:
        async with AsyncKVClient(cluster.endpoints, batch_commands_max=50) as client:
            await asyncio.gather(*(client.put(f"k{number}", str(number)) for number in range(200)))
            writes = cluster.node("n1").writes()
            assert len(writes) == 4
            assert client.write_requests_sent == 4
            sequences = sorted(c.sequence for write in writes for c in write.commands)
            assert sequences == list(range(1, 201))
            assert await client.get("k199") == "199"

    run(test)


def test_concurrent_gets_share_one_read() -> None:
    async def test(cluster: FakeCluster) -> None:
        async with AsyncKVClient(cluster.endpoints) as client:
            await client.put("a", "1")
            values = await asyncio.gather(client.get("a"), client.get("b"), client.get("a"))
            assert values == ["1", None, "1"]
        reads = [frame for frame in cluster.node("n1").requests if isinstance(frame, wire.KVRead)]
        assert [read.keys for read in reads] == [["a", "b", "a"]]

    run(test)


def test_batches_are_pipelined_on_one_connection() -> None:
    async def test(cluster: FakeCluster) -> None:
        leader = cluster.node("n1")
        # No answer comes until all 5 batches arrived: only a pipelining client finishes.
        leader.hold_answers_until_writes = 5
        async with AsyncKVClient(cluster.endpoints, batch_commands_max=10) as client:
            await asyncio.gather(*(client.put(f"k{number}", "v") for number in range(50)))
        assert len(leader.writes()) == 5
        assert len(leader.writers) <= 1

    run(test)


def test_follows_hint_and_retries_batch_with_same_sequences() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.leader_id = "n3"
        cluster.node("n3").unanswered_writes = 1
        async with AsyncKVClient(cluster.endpoints, attempt_timeout_seconds=0.2) as client:
            await asyncio.gather(*(client.append("k", "x") for _ in range(10)))
        # n1 refused (twice: again after the lost answer made the client move on), n3 took it.
        refused = cluster.node("n1").writes()
        retried = cluster.node("n3").writes()
        assert len(retried) == 2
        expected = list(range(1, 11))
        for write in refused + retried:
            assert [command.sequence for command in write.commands] == expected
        assert cluster.machine.get("k") == "x" * 10

    run(test)


def test_timeout_is_unknown_outcome_for_every_waiting_call() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.node("n1").swallow_writes = True
        async with AsyncKVClient([cluster.node("n1").address], timeout=0.3) as client:
            outcomes = await asyncio.gather(
                *(client.put(f"k{number}", "v") for number in range(5)), return_exceptions=True
            )
            assert all(isinstance(outcome, UnknownOutcomeError) for outcome in outcomes)
            # Retrying the same calls reuses their sequences.
            cluster.node("n1").swallow_writes = False
            await asyncio.gather(*(client.put(f"k{number}", "v") for number in range(5)))
        last = cluster.node("n1").writes()[-1]
        assert sorted(command.sequence for command in last.commands) == [1, 2, 3, 4, 5]

    run(test)


def test_refused_handshake() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.node("n1").refuse_reason = "protocol version 1 is not supported"
        async with AsyncKVClient([cluster.node("n1").address]) as client:
            with pytest.raises(ConnectionRefusedByNodeError, match="protocol version"):
                await client.put("k", "v")

    run(test)


def test_sequence_window_bounds_what_runs_ahead() -> None:
    async def test(cluster: FakeCluster) -> None:
        async with AsyncKVClient(
            cluster.endpoints, batch_commands_max=3, sequence_window_max=5
        ) as client:
            await asyncio.gather(*(client.put(f"k{number}", "v") for number in range(40)))
        for write in cluster.node("n1").writes():
            highest = max(command.sequence for command in write.commands)
            assert highest - write.first_unacknowledged < 5

    run(test)


def test_close_fails_waiting_calls() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.node("n1").swallow_writes = True
        client = AsyncKVClient(cluster.endpoints, timeout=10)
        waiting = asyncio.ensure_future(client.put("k", "v"))
        async with cluster.node("n1").request_arrived:
            await cluster.node("n1").request_arrived.wait_for(
                lambda: bool(cluster.node("n1").writes())
            )
        await client.close()
        with pytest.raises(ClientError, match="closed"):
            await waiting

    run(test)


def test_reserved_sequences_do_not_block_the_window_forever() -> None:
    async def test(cluster: FakeCluster) -> None:
        cluster.node("n1").swallow_writes = True
        async with AsyncKVClient(cluster.endpoints, timeout=0.2, sequence_window_max=2) as client:
            outcomes = await asyncio.gather(
                client.put("a", "1"), client.put("b", "2"), return_exceptions=True
            )
            assert all(isinstance(outcome, UnknownOutcomeError) for outcome in outcomes)
            cluster.node("n1").swallow_writes = False
            # The window is full of reserved sequences; they are released after `timeout`.
            await client.put("c", "3")
            # No write was answered before "c": it reported 1, so the cluster took the
            # client for a new one. Once answered, released sequences count as done.
            assert cluster.node("n1").writes()[-1].first_unacknowledged == 1
            await client.put("d", "4")
        assert cluster.node("n1").writes()[-1].first_unacknowledged == 4

    run(test)
