"""Consumer groups against three real nodes in one process (their loop on a thread of its
own, the clients blocking in the test's thread): long-polled fetches, pattern
subscriptions, the assignment callbacks, pause/resume, seeks, offsets by time,
commit_async, and a tombstone and the leader's stamp through a real partition."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.node.server import Node
from quorumlog.stream.assignors import TopicPartition
from tests.unit.node.in_process_cluster import node_settings, start_nodes

WAIT_SECONDS = 20.0


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: object) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    directory: Path = tmp_path_factory.mktemp("group-nodes")
    loop = LoopThread()
    settings = node_settings(
        ["n1", "n2", "n3"], directory, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes: list[Node] = loop.run(start_nodes(settings))  # type: ignore[assignment]
    addresses = [f"127.0.0.1:{node.port}" for node in nodes]
    with Admin(addresses) as admin:
        for name in ("orders-eu", "orders-us", "audit"):
            admin.create_topic(name, partitions=2, replication=3)
    try:
        yield addresses
    finally:
        for node in nodes:
            loop.run(node.stop())
        loop.stop()


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def test_a_long_poll_answers_when_records_arrive(endpoints: list[str]) -> None:
    with Consumer(endpoints, group="long", heartbeat_interval_seconds=0.2) as consumer:
        consumer.subscribe(["audit"])
        requests_before = consumer.transport.kv.next_request_id
        started = time.monotonic()
        assert consumer.poll(1.0) == []
        assert time.monotonic() - started >= 1.0
        # Nodes held the fetches (up to half a second each), so a second of waiting took a
        # few requests per partition, not a hundred re-asks.
        assert consumer.transport.kv.next_request_id - requests_before < 20
        started = time.monotonic()
        with Producer(endpoints) as producer:
            timer = threading.Timer(0.3, lambda: producer.send("audit", b"late", partition=1))
            timer.start()
            records = consumer.poll(10.0)
            timer.join()
        assert [r.value for r in records] == [b"late"]
        # The record came while a fetch was held: the poll did not wait out its timeout.
        assert time.monotonic() - started < 5.0


def test_pattern_callbacks_pause_seek_and_commit_async(endpoints: list[str]) -> None:
    assigned: list[set[TopicPartition]] = []
    revoked: list[set[TopicPartition]] = []
    with Producer(endpoints) as producer:
        for number in range(6):
            producer.send(
                f"orders-{'eu' if number % 2 else 'us'}", str(number).encode(), partition=0
            )
        producer.flush(timeout=10)
    first = Consumer(
        endpoints,
        group="orders",
        auto_offset_reset="earliest",
        heartbeat_interval_seconds=0.1,
        on_assign=assigned.append,
        on_revoke=revoked.append,
        partition_assignment_strategy="range",
    )
    with first:
        first.subscribe(pattern="orders-.*")
        every = {(t, p) for t in ("orders-eu", "orders-us") for p in (0, 1)}
        assert first.assignment() == every and assigned == [every]
        records = first.poll(5.0)
        while len(records) < 6:
            records += first.poll(5.0)
        assert sorted(r.value for r in records) == [str(n).encode() for n in range(6)]
        first.seek_to_beginning([("orders-eu", 0)])
        first.pause([("orders-us", 0)])
        again = first.poll(5.0)
        assert {r.topic for r in again} == {"orders-eu"} and len(again) == 3
        first.resume([("orders-us", 0)])
        first.seek_to_end()
        assert first.commit_async().result(timeout=10) is None
        assert first.committed("orders-eu", 0) == 3
        with Consumer(endpoints, group="orders", partition_assignment_strategy="range") as second:
            second.subscribe(pattern="orders-.*")
            wait_for(lambda: first.assignment() != every, "the first member giving up partitions")
            assert first.assignment() | second.assignment() == every
            assert not first.assignment() & second.assignment()
            assert revoked and revoked[-1] == every - first.assignment()


def test_offsets_for_times_tombstones_and_the_leaders_stamp(endpoints: list[str]) -> None:
    with Producer(endpoints, linger_ms=0) as producer:
        stamps = [producer.send("audit", b"t", partition=0).result(10).timestamp for _ in range(3)]
        tombstone = producer.send("audit", None, key=b"gone", partition=0).result(10)
    assert all(stamp > 0 for stamp in stamps) and stamps == sorted(stamps)
    with Consumer(endpoints) as consumer:
        found = consumer.offsets_for_times({("audit", 0): stamps[1], ("audit", 1): 2**62})
        first_at_second = consumer.read("audit", 0, found[("audit", 0)] or 0, 1)[0]
        assert first_at_second.timestamp >= stamps[1]
        assert found[("audit", 1)] is None
        [gone] = consumer.read("audit", 0, tombstone.offset, 1)
    assert (gone.key, gone.value, gone.timestamp) == (b"gone", None, tombstone.timestamp)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_batches_read_back_beside_plain_ones(endpoints: list[str], codec: str) -> None:
    topic = f"packed-{codec}"
    with Admin(endpoints) as admin:
        admin.create_topic(topic, partitions=1, replication=3)
    values = [f"record {number} ".encode() * 20 for number in range(300)]
    with Producer(endpoints) as plain:
        plain.send(topic, b"before", partition=0).result(10)
    with Producer(endpoints, compression=codec, linger_ms=50) as packed:
        futures = [packed.send(topic, value, partition=0) for value in values]
        packed.send(topic, None, key=b"k", partition=0)
        packed.flush(timeout=10)
    assert [f.result(0).offset for f in futures] == list(range(1, 301))
    with Consumer(endpoints) as consumer:
        records = consumer.read(topic, 0, 0, 1000)
        assert [r.value for r in records] == [b"before", *values, None]
        assert [r.offset for r in consumer.read(topic, 0, 150, 2)] == [150, 151]


def test_batches_for_many_partitions_of_one_node_share_a_frame(endpoints: list[str]) -> None:
    """Six partitions over three nodes: a node leads two or more, and the producer sends their
    batches in one ProduceMany, which the node serves part by part (stream_service.py)."""
    topic = "spread"
    partitions = 6
    with Admin(endpoints) as admin:
        admin.create_topic(topic, partitions=partitions, replication=3)
    with Producer(endpoints, linger_ms=math.inf) as producer:
        for partition in range(partitions):  # leaders known: later batches go straight there
            producer.send(topic, b"first", partition=partition)
        producer.flush(timeout=WAIT_SECONDS)
        futures = [
            producer.send(topic, f"v{number}".encode(), partition=number % partitions)
            for number in range(600)
        ]
        producer.flush(timeout=WAIT_SECONDS)  # every partition's batch leaves in one turn
        offsets = [future.result(0).offset for future in futures]
        connections = [task.result() for task in producer.transport.kv.connections.values()]
        assert any(connection.last_produce_frame_id < 0 for connection in connections)
    for partition in range(partitions):
        assert offsets[partition::partitions] == list(range(1, 101))
    with Consumer(endpoints) as consumer:
        records = consumer.read(topic, 5, 0, 1000)
        assert [r.value for r in records] == [b"first"] + [
            f"v{number}".encode() for number in range(5, 600, partitions)
        ]
