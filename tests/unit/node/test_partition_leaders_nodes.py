"""A node lists each partition's leader with the topics when asked (ListTopics with
leaders): the leader of every partition it hosts a replica of, "" for the others."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_consumer_group_nodes import LoopThread

WAIT_SECONDS = 20.0
PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Node id → address of three nodes hosting a topic of 4 partitions on 2 replicas."""
    directory: Path = tmp_path_factory.mktemp("leader-nodes")
    loop = LoopThread()
    settings = node_settings(
        ["n1", "n2", "n3"], directory, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes: list[Node] = loop.run(start_nodes(settings))  # type: ignore[assignment]
    addresses = {node.node_id: f"127.0.0.1:{node.port}" for node in nodes}
    with Admin(list(addresses.values())) as admin:
        admin.create_topic("leaders", partitions=PARTITIONS, replication=2)
    with Producer(list(addresses.values())) as producer:
        # One record acknowledged on each partition: each has elected a leader.
        futures = [producer.send("leaders", b"x", partition=p) for p in range(PARTITIONS)]
        for future in futures:
            future.result(timeout=WAIT_SECONDS)
    try:
        yield addresses
    finally:
        for node in nodes:
            loop.run(node.stop())
        loop.stop()


def listing(admin: Admin, address: str, with_leaders: bool) -> wire.TopicList:
    admin.transport.leaders_wanted = with_leaders
    return admin.run(admin.transport.list_topics_at(address))


def test_each_node_names_the_leaders_of_the_partitions_it_hosts(cluster: dict[str, str]) -> None:
    with Admin(list(cluster.values())) as admin:
        for node_id, address in cluster.items():
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                listed = listing(admin, address, with_leaders=True)
                [descriptor] = [t for t in listed.topics if t.name == "leaders"]
                leaders = listed.leaders["leaders"]
                hosted = [node_id in replicas for replicas in descriptor.replicas]
                # A follower learns its leader from the leader's first message: wait for it.
                if all(leaders[p] for p in range(PARTITIONS) if hosted[p]):
                    break
                assert time.monotonic() < deadline, f"{node_id} names no leader: {leaders}"
                time.sleep(0.05)  # polling interval of the condition above
            for partition, replicas in enumerate(descriptor.replicas):
                if hosted[partition]:
                    assert leaders[partition] in replicas
                else:
                    assert leaders[partition] == ""


def test_a_listing_not_asked_for_leaders_carries_none(cluster: dict[str, str]) -> None:
    with Admin(list(cluster.values())) as admin:
        listed = listing(admin, next(iter(cluster.values())), with_leaders=False)
    assert [t.name for t in listed.topics] == ["leaders"]
    assert listed.leaders == {}
