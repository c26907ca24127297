"""Consumer groups against three real nodes in one process (their loop on a thread of its
own, the clients blocking in the test's thread): long-polled fetches, pattern
subscriptions, the assignment callbacks, pause/resume, seeks, offsets by time,
commit_async, a tombstone and the leader's stamp through a real partition, and a member
that stops polling (max_poll_interval_ms)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.errors import CommitFailedError
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
        # Both partitions assigned and positioned (at "latest") before the record is sent: on
        # a loaded machine the assignment may come late, and a position taken after the
        # send would start past the record.
        deadline = time.monotonic() + WAIT_SECONDS
        while len(consumer.current_positions()) < 2:
            assert consumer.poll(0.1) == []
            assert time.monotonic() < deadline, "the consumer never positioned both partitions"
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
            # Given up first, then given to the second member (its next heartbeat).
            wait_for(
                lambda: first.assignment() | second.assignment() == every,
                "the second member taking them",
            )
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


class RecordingConsumer(Consumer):
    """A Consumer that notes each fetch it starts (partition and position) in `events`."""

    def __init__(self, events: list[tuple[object, ...]], name: str, **settings: Any) -> None:
        super().__init__(**settings)
        self.events = events
        self.name = name

    async def fetch_one(self, key: TopicPartition, max_records: int, wait_ms: int) -> list[Any]:
        self.events.append(("fetch", self.name, key, self.positions[key]))
        return await super().fetch_one(key, max_records, wait_ms)


def test_on_revoke_runs_and_commits_before_the_new_owner_reads(endpoints: list[str]) -> None:
    """Kafka's cooperative order: the second member's join takes a partition from the
    first; the first commits its position there and runs on_revoke, and only then does the
    second fetch it, from that commit (so nothing is read twice)."""
    topic = "handoff"
    with Admin(endpoints) as admin:
        admin.create_topic(topic, partitions=2, replication=3)
    with Producer(endpoints) as producer:
        for number in range(10):
            producer.send(topic, b"%d" % number, partition=number % 2)
        producer.flush(timeout=10)
    events: list[tuple[object, ...]] = []
    settings: dict[str, Any] = {
        "endpoints": endpoints,
        "group": "handoff",
        "auto_offset_reset": "earliest",
        "heartbeat_interval_seconds": 0.2,
    }
    first = RecordingConsumer(events, "first", **settings)

    def revoked(partitions: set[TopicPartition]) -> None:
        committed = {key: first.committed(*key) for key in sorted(partitions)}
        events.append(("revoked", "first", sorted(partitions), committed))

    first.on_revoke = revoked
    second = RecordingConsumer(events, "second", **settings)
    stop = threading.Event()
    with first, second:
        first.subscribe([topic])
        read = first.poll(5.0)
        while len(read) < 10:
            read += first.poll(5.0)
        polling = threading.Thread(
            target=lambda: [first.poll(0.1) for _ in iter(stop.is_set, True)]
        )
        polling.start()
        try:
            second.subscribe([topic])
            deadline = time.monotonic() + WAIT_SECONDS
            while not any(event[:2] == ("fetch", "second") for event in events):
                second.poll(0.2)
                assert time.monotonic() < deadline, "the second member never read"
        finally:
            stop.set()
            polling.join()
        [moved] = second.assignment()
    revocations = [event for event in events if event[0] == "revoked"]
    first_fetch = next(event for event in events if event[:2] == ("fetch", "second"))
    assert revocations, "on_revoke never ran before the second member read"
    assert events.index(revocations[0]) < events.index(first_fetch)
    assert revocations[0][2] == [moved]
    assert revocations[0][3] == {moved: 5}, "the first member committed where it stood"
    assert first_fetch[2:] == (moved, 5), "the new owner starts at that commit"


def test_a_member_that_stops_polling_gives_its_partitions_up_and_rejoins(
    endpoints: list[str],
) -> None:
    """Kafka's max.poll.interval.ms on real nodes: the first member reads everything and
    then stops polling while a second joins. The partition moving to the second waits on
    the first; once the first has not polled for its interval it leaves, and the second gets
    every partition, reading from the last commit (the first's positions are not
    committed). The first's late commit is refused; its next poll joins again."""
    topic = "stalled"
    interval_seconds = 1.5
    with Admin(endpoints) as admin:
        admin.create_topic(topic, partitions=2, replication=3)
    with Producer(endpoints) as producer:
        for number in range(10):
            producer.send(topic, b"%d" % number, partition=number % 2)
        producer.flush(timeout=10)
    both = {(topic, 0), (topic, 1)}
    settings: dict[str, Any] = {
        "endpoints": endpoints,
        "group": "stalled",
        "auto_offset_reset": "earliest",
        "heartbeat_interval_seconds": 0.2,
    }
    started = time.monotonic()
    stuck = Consumer(**settings, max_poll_interval_ms=int(interval_seconds * 1000))
    live = Consumer(**settings)
    with stuck, live:
        stuck.subscribe([topic])
        read: list[Any] = []
        while len(read) < 10:
            read += stuck.poll(1.0)
            assert time.monotonic() - started < WAIT_SECONDS, "the records were never read"
        last_poll = time.monotonic()  # stuck from here on
        live.subscribe([topic])
        again: list[Any] = []
        deadline = last_poll + interval_seconds + WAIT_SECONDS
        while live.assignment() != both:
            assert not live.assignment(), "a partition moved before its owner let go"
            again += live.poll(0.1)
            assert time.monotonic() < deadline, "the stuck member's partitions never moved"
        assert time.monotonic() - last_poll >= interval_seconds, "it left before its interval"
        with pytest.raises(CommitFailedError):
            stuck.commit()
        deadline = time.monotonic() + WAIT_SECONDS
        while len(again) < 10:  # nothing was committed: the survivor reads everything
            again += live.poll(1.0)
            assert time.monotonic() < deadline, "the survivor never read the records"
        assert sorted((r.partition, r.offset) for r in again) == sorted(
            (r.partition, r.offset) for r in read
        )
        live.commit()
        # The stuck member's next poll joins again, as a new member: what it gets is
        # withheld until the other lets go, and then the two share the partitions.
        assert stuck.poll(0.1) == [] and stuck.assignment() == set()
        deadline = time.monotonic() + WAIT_SECONDS
        while not (stuck.assignment() and live.assignment()):
            assert stuck.poll(0.1) == [], "a rejoined member reads from the last commit"
            live.poll(0.1)
            assert time.monotonic() < deadline, "the stuck member never got a partition back"
        assert stuck.assignment() | live.assignment() == both
        assert not stuck.assignment() & live.assignment()


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
