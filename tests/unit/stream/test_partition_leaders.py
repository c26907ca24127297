"""A producer learns every partition's leader with the topic listing (ListTopics with
leaders, Kafka's Metadata request): its first send to each fresh partition goes straight to
the leader. A node from before the listing of leaders is served as before: a replica that
does not lead answers NOT_LEADER with a hint, and the producer follows it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

PARTITIONS = 6
NODES = ("n1", "n2", "n3")


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=PARTITIONS)
        # Each partition is led by its second replica: a producer guessing its first
        # replica would be told NOT_LEADER.
        for partition in range(PARTITIONS):
            found = running.partition("events", partition)  # type: ignore[attr-defined]
            found.leader_id = f"n{(partition + 1) % 3 + 1}"
        yield running  # type: ignore[misc]


def produces_at_non_leaders(cluster: FakeStreamCluster) -> int:
    return sum(
        1
        for node_id in NODES
        for part in cluster.node(node_id).produces()
        if cluster.partition("events", part.partition).leader_id != node_id
    )


def send_one_to_each(cluster: FakeStreamCluster) -> list[int]:
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        futures = [producer.send("events", b"x", partition=p) for p in range(PARTITIONS)]
        return [future.result(timeout=10).offset for future in futures]


def test_the_first_send_to_each_partition_goes_to_its_leader(
    cluster: FakeStreamCluster,
) -> None:
    assert send_one_to_each(cluster) == [0] * PARTITIONS
    assert produces_at_non_leaders(cluster) == 0
    listings = [
        frame
        for node_id in NODES
        for frame in cluster.node(node_id).requests
        if isinstance(frame, wire.ListTopics)
    ]
    assert [frame.with_leaders for frame in listings] == [True]


def test_a_node_that_lists_no_leaders_is_served_through_not_leader_hints(
    cluster: FakeStreamCluster,
) -> None:
    for node_id in NODES:
        cluster.node(node_id).lists_leaders = False
    assert send_one_to_each(cluster) == [0] * PARTITIONS
    assert produces_at_non_leaders(cluster) == PARTITIONS
