"""The producer's loop and its callers wake each other only when it matters: a send wakes
a partition's sender only while that sender waits (for a first record, a full batch or
the end of a linger), and the loop releases buffer room without the lock, waking blocked
senders and flushes once a loop turn. These tests fail if a wake-up is lost."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from quorumlog import Admin, Producer
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

WAIT_SECONDS = 10.0


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=2)
        yield running  # type: ignore[misc]


def test_a_batch_filled_while_its_sender_lingers_or_is_in_flight_leaves_without_flush(
    cluster: FakeStreamCluster,
) -> None:
    # linger_ms=inf: only a full batch leaves. The first record finds the sender idle (and
    # wakes it to linger); the third fills the batch while it lingers (it must be woken);
    # the next three fill one while the first is in flight or after (no wake needed then,
    # the sender looks at its queue once the partition answers).
    with Producer(cluster.endpoints, linger_ms=math.inf, batch_records_max=3) as producer:
        futures = [producer.send("events", b"v", partition=0) for _ in range(6)]
        offsets = [future.result(timeout=WAIT_SECONDS).offset for future in futures]
    assert offsets == list(range(6))
    counts = [len(part.records) for part in cluster.node("n1").produces()]
    assert counts == [3, 3]


def test_senders_blocked_for_buffer_room_go_on_as_batches_are_acknowledged(
    cluster: FakeStreamCluster,
) -> None:
    # Room for about ten records: every send past the first few blocks until the loop
    # releases room; a lost wake-up would end in BufferFullError after max_block_seconds.
    with Producer(
        cluster.endpoints,
        linger_ms=1,
        batch_bytes_max=1200,
        buffer_bytes_max=1200,
        max_block_seconds=WAIT_SECONDS,
    ) as producer:
        futures = [
            producer.send("events", b"x" * 100, partition=number % 2) for number in range(300)
        ]
        producer.flush(timeout=WAIT_SECONDS)
        assert all(future.done() for future in futures)
        assert [future.result().offset for future in futures[::2]] == list(range(150))
        assert producer.buffered_bytes == 0
