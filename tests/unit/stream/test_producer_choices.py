"""The producer's Kafka choices against the in-process fake stream cluster: tombstones,
timestamps in RecordMetadata, serializers and acks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from quorumlog import Admin, Consumer, Producer
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=1)
        yield running  # type: ignore[misc]


def test_a_tombstone_reads_back_as_a_null_value(cluster: FakeStreamCluster) -> None:
    with Producer(cluster.endpoints) as producer:
        producer.send("events", b"v", key=b"k").result(timeout=10)
        producer.send("events", None, key=b"k").result(timeout=10)
    with Consumer(cluster.endpoints) as consumer:
        records = consumer.read("events", 0, 0)
    assert [(r.key, r.value) for r in records] == [(b"k", b"v"), (b"k", None)]


def test_metadata_has_the_producers_stamp_else_the_leaders(cluster: FakeStreamCluster) -> None:
    with Producer(cluster.endpoints) as producer:
        own = producer.send("events", b"a", timestamp_ms=1234).result(timeout=10)
        stamped = producer.send("events", b"b").result(timeout=10)
    assert own.timestamp == 1234
    assert stamped.timestamp == cluster.clock_ms


def test_serializers_turn_objects_into_bytes(cluster: FakeStreamCluster) -> None:
    def encode(value: object) -> bytes:
        return json.dumps(value).encode()

    with Producer(
        cluster.endpoints, key_serializer=str.encode, value_serializer=encode
    ) as producer:
        producer.send("events", {"n": 1}, key="user-7").result(timeout=10)
        producer.send("events", None, key="user-7").result(timeout=10)  # no serializing None
    with Consumer(cluster.endpoints) as consumer:
        records = consumer.read("events", 0, 0)
    assert [(r.key, r.value) for r in records] == [(b"user-7", b'{"n": 1}'), (b"user-7", None)]


def test_acks_zero_answers_at_once_and_still_delivers(cluster: FakeStreamCluster) -> None:
    with Producer(cluster.endpoints, acks=0) as producer:
        metadata = producer.send("events", b"x").result(timeout=10)
        assert (metadata.offset, metadata.timestamp) == (-1, -1)
        producer.flush(timeout=10)
    with Consumer(cluster.endpoints) as consumer:
        assert [r.value for r in consumer.read("events", 0, 0)] == [b"x"]
    with pytest.raises(ValueError, match="acks"):
        Producer(cluster.endpoints, acks=1)
