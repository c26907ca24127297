"""The producer's loop and its callers wake each other only when it matters: a send wakes
a partition's sender only while that sender waits (for a first record, a full batch or
the end of a linger), and the loop releases buffer room without the lock, waking blocked
senders and flushes once a loop turn. These tests fail if a wake-up is lost."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest

from quorumlog import Admin, Producer
from quorumlog.stream.records import RecordMetadata
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

WAIT_SECONDS = 10.0


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=2)
        yield running  # type: ignore[misc]


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.005)  # polling a condition, with a deadline


def test_a_batch_filled_while_its_sender_lingers_leaves_without_flush(
    cluster: FakeStreamCluster,
) -> None:
    # linger_ms=inf: only a full batch leaves. The first record wakes the idle sender,
    # which then lingers; the third fills the batch while it lingers: it must be woken.
    with Producer(cluster.endpoints, linger_ms=math.inf, batch_records_max=3) as producer:
        first = producer.send("events", b"v", partition=0)
        queue = producer.queues[("events", 0)]
        wait_until(lambda: queue.task is not None and queue.sender_waiting)
        rest = [producer.send("events", b"v", partition=0) for _ in range(2)]
        offsets = [future.result(timeout=WAIT_SECONDS).offset for future in [first, *rest]]
        assert offsets == [0, 1, 2]
        # Three more fill one batch whatever the sender is doing meanwhile.
        futures = [producer.send("events", b"v", partition=0) for _ in range(3)]
        assert [future.result(timeout=WAIT_SECONDS).offset for future in futures] == [3, 4, 5]
    assert [len(part.records) for part in cluster.node("n1").produces()] == [3, 3]


def test_senders_blocked_for_buffer_room_go_on_as_batches_are_acknowledged(
    cluster: FakeStreamCluster,
) -> None:
    # Room for about ten records: every send past the first few blocks until the loop
    # releases room. Without a wake-up each blocked send would sit out max_block_seconds.
    producer = Producer(
        cluster.endpoints,
        linger_ms=1,
        batch_bytes_max=1200,
        buffer_bytes_max=1200,
        max_block_seconds=60,
    )
    futures: list[Future[RecordMetadata]] = []

    def send_all() -> None:
        for number in range(300):
            futures.append(producer.send("events", b"x" * 100, partition=number % 2))

    sender = threading.Thread(target=send_all, daemon=True)
    try:
        sender.start()
        sender.join(WAIT_SECONDS)
        assert not sender.is_alive(), "a sender blocked for room was not woken"
        producer.flush(timeout=WAIT_SECONDS)
        assert [future.result(timeout=0).offset for future in futures[::2]] == list(range(150))
        assert producer.buffered_bytes == 0
    finally:
        producer.close(timeout=WAIT_SECONDS)  # also ends a sender still blocked
