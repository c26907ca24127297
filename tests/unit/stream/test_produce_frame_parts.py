"""Parts of one ProduceMany frame stand alone: a part refused NOT_LEADER is re-routed while
the others are written, and a frame sent again after its answers were lost writes nothing
twice (each part's sequence is checked by its own partition)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

WAIT_SECONDS = 10.0
SHARED = (0, 3)
"""Two partitions led by n1 (partition p by n(p%3+1)): their batches share a frame."""


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=6)
        yield running  # type: ignore[misc]


def frames_at(cluster: FakeStreamCluster, node_id: str) -> list[wire.ProduceMany]:
    return [f for f in cluster.node(node_id).requests if isinstance(f, wire.ProduceMany)]


def test_a_part_refused_not_leader_is_rerouted_and_the_others_are_written(
    cluster: FakeStreamCluster,
) -> None:
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        producer.partition_count("events")  # leaders learned: both go to n1
        cluster.partition("events", 0).leader_id = "n2"  # moved since the listing
        futures = [producer.send("events", b"x", partition=p) for p in SHARED]
        offsets = [future.result(timeout=WAIT_SECONDS).offset for future in futures]
    assert offsets == [0, 0]
    [frame] = frames_at(cluster, "n1")
    assert sorted(part.partition for part in frame.parts) == list(SHARED)
    assert [part.partition for part in cluster.node("n2").produces()] == [0]
    assert cluster.partition("events", 0).machine.next_offset == 1
    assert cluster.partition("events", 3).machine.next_offset == 1


def test_a_frame_sent_again_after_its_answers_were_lost_writes_each_part_once(
    cluster: FakeStreamCluster,
) -> None:
    cluster.node("n1").unanswered_produces = len(SHARED)  # applied, never answered
    with Producer(cluster.endpoints, linger_ms=0, attempt_timeout_seconds=0.3) as producer:
        producer.partition_count("events")
        futures = [producer.send("events", b"x", partition=p) for p in SHARED]
        offsets = [future.result(timeout=WAIT_SECONDS).offset for future in futures]
    assert offsets == [0, 0]  # the originals' offsets, answered to the resent parts
    parts = [(part.partition, part.base_sequence) for part in cluster.node("n1").produces()]
    for partition in SHARED:
        assert parts.count((partition, 0)) >= 2  # sent again, same sequence
        assert cluster.partition("events", partition).machine.next_offset == 1
