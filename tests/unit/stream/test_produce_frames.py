"""The producer sends the batches of one loop turn bound for one node in one ProduceMany
frame (Kafka's ProduceRequest), each part answered on its own: offsets, sequences and
errors stay per partition."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from quorumlog.errors import RequestRejectedError
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

PARTITIONS = 6
"""Two partitions led by each of the fake cluster's three nodes (partition p by n(p%3+1))."""


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=PARTITIONS)
        yield running  # type: ignore[misc]


def frames_of(cluster: FakeStreamCluster, kind: type) -> list[wire.Frame]:
    return [
        frame
        for node_id in ("n1", "n2", "n3")
        for frame in cluster.node(node_id).requests
        if isinstance(frame, kind)
    ]


def test_batches_for_one_node_go_in_one_frame_and_are_answered_per_partition(
    cluster: FakeStreamCluster,
) -> None:
    records = 600
    with Producer(cluster.endpoints, linger_ms=20) as producer:
        futures = [
            producer.send("events", f"v{number}".encode(), partition=number % PARTITIONS)
            for number in range(records)
        ]
        producer.flush()
        metadata = [future.result(timeout=0) for future in futures]
    frames = frames_of(cluster, wire.ProduceMany)
    assert frames, "no produce went in a shared frame"
    for frame in frames:
        assert isinstance(frame, wire.ProduceMany)
        assert len({(part.topic, part.partition) for part in frame.parts}) == len(frame.parts)
    for partition in range(PARTITIONS):
        offsets = [m.offset for m in metadata if m.partition == partition]
        assert offsets == list(range(records // PARTITIONS))
        leader = cluster.node(f"n{partition % 3 + 1}")
        batches = [p for p in leader.produces() if p.partition == partition]
        counts = [len(batch.records) for batch in batches]
        assert [batch.base_sequence for batch in batches] == [
            sum(counts[:index]) for index in range(len(counts))
        ]
        assert cluster.partition("events", partition).machine.next_offset == offsets[-1] + 1


def test_a_refusal_of_the_whole_frame_reaches_every_part(cluster: FakeStreamCluster) -> None:
    n1 = cluster.node("n1")
    n1.refuse_produce_frames = wire.ErrorCode.PERMISSION_DENIED
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        producer.partition_count("events")  # asked now: the loop is held below
        # Partitions 0 and 3 are both led by n1: their batches leave in one frame. The
        # producer's loop is held while both are queued, so both partitions wake in one loop
        # turn (two lingers timed on a loaded machine could end in two turns, two frames).
        queued = threading.Event()
        producer.io.call_soon(queued.wait)
        futures = [producer.send("events", b"x", partition=partition) for partition in (0, 3)]
        queued.set()
        for future in futures:
            with pytest.raises(RequestRejectedError, match="permission_denied"):
                future.result(timeout=10)
    assert frames_of(cluster, wire.ProduceMany)
    assert cluster.partition("events", 0).machine.next_offset == 0
    assert cluster.partition("events", 3).machine.next_offset == 0


def test_a_node_that_does_not_say_it_serves_them_gets_each_produce_alone(
    cluster: FakeStreamCluster,
) -> None:
    """A node from before ProduceMany (its Welcome has no `produce_many`) would close a
    connection that sent one: its clients send each Produce on its own."""
    for node_id in ("n1", "n2", "n3"):
        cluster.node(node_id).produce_many = False
    with Producer(cluster.endpoints, linger_ms=20) as producer:
        futures = [producer.send("events", b"x", partition=p) for p in range(PARTITIONS)]
        assert [future.result(timeout=10).offset for future in futures] == [0] * PARTITIONS
    assert frames_of(cluster, wire.ProduceMany) == []
    assert len(frames_of(cluster, wire.Produce)) == PARTITIONS
