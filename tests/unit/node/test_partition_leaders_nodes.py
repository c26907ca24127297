"""A node lists each partition's leader with the topics when asked (ListTopics with
leaders): the leader of every partition it hosts a replica of, "" for the others. And a
node serves the parts of one ProduceMany each on its own: a part for a partition it hosts
but does not lead is answered NOT_LEADER, with a hint, while the parts it leads are
written."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from quorumlog.kv.async_client import StreamConnection
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.node.server import Node
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_consumer_group_nodes import LoopThread

WAIT_SECONDS = 20.0
PARTITIONS = 4
SPREAD_PARTITIONS = 9
"""On all three nodes: one node leading all nine (so that none leads some and follows
others) has a chance of 3 / 3**9."""


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
        admin.create_topic("spread", partitions=SPREAD_PARTITIONS, replication=3)
    with Producer(list(addresses.values())) as producer:
        # One record acknowledged on each partition: each has elected a leader.
        futures = [producer.send("leaders", b"x", partition=p) for p in range(PARTITIONS)]
        futures += [producer.send("spread", b"x", partition=p) for p in range(SPREAD_PARTITIONS)]
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
    assert sorted(t.name for t in listed.topics) == ["leaders", "spread"]
    assert listed.leaders == {}


def one_record_part(request_id: int, partition: int) -> wire.Produce:
    return wire.Produce(
        request_id=request_id,
        topic="spread",
        partition=partition,
        producer_id=f"raw-{uuid.uuid4().hex}",
        base_sequence=0,
        records=[wire.Record(b"raw")],
    )


async def send_in_one_frame(address: str, parts: list[wire.Produce]) -> list[wire.Frame]:
    """Requests made in one loop turn go out as one ProduceMany (StreamConnection)."""
    connection = await StreamConnection.open(address, CLUSTER_ID_DEFAULT, "raw", WAIT_SECONDS)
    try:
        assert connection.produce_many
        deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
        requests = [connection.request(part, part.request_id, deadline) for part in parts]
        return list(await asyncio.gather(*requests))
    finally:
        await connection.close()


def pick_leader_and_follower(admin: Admin, cluster: dict[str, str]) -> tuple[str, int, int, str]:
    """A node, a partition of 'spread' it leads, one it follows, and that one's leader."""
    for node_id, address in cluster.items():
        leaders = listing(admin, address, with_leaders=True).leaders["spread"]
        led = [p for p, leader in enumerate(leaders) if leader == node_id]
        followed = [p for p, leader in enumerate(leaders) if leader and leader != node_id]
        if led and followed:
            return address, led[0], followed[0], leaders[followed[0]]
    raise AssertionError("no node both leads and follows a partition of 'spread'")


def test_a_frame_part_this_node_does_not_lead_is_refused_alone(cluster: dict[str, str]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    with Admin(list(cluster.values())) as admin:
        while True:
            address, led, followed, leader_id = pick_leader_and_follower(admin, cluster)
            parts = [one_record_part(1, led), one_record_part(2, followed)]
            written, refused = admin.run(send_in_one_frame(address, parts))
            if isinstance(written, wire.ProduceResult) or time.monotonic() > deadline:
                break
            # Leadership moved between the listing and the frame (short election timeouts
            # on a busy machine): pick again.
    assert isinstance(written, wire.ProduceResult), written
    assert (written.request_id, written.count) == (1, 1)
    assert isinstance(refused, wire.ErrorResponse), refused
    assert (refused.request_id, refused.code) == (2, wire.ErrorCode.NOT_LEADER)
    assert refused.leader_hint in (None, cluster[leader_id])
