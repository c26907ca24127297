"""Producer and Consumer find partition replicas where the nodes listen now, not where the
topic descriptor (stored when the topic was created) says they listened then."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import msgspec
import pytest

from quorumlog import Admin, Consumer, Producer
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

TIMEOUT_SECONDS = 3.0


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def stale_address() -> Iterator[str]:
    """An address nobody listens at: a port we hold bound, without listening on it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{held.getsockname()[1]}"
    finally:
        held.close()


def test_replicas_are_reached_at_their_current_addresses_not_the_stored_ones(
    cluster: FakeStreamCluster, stale_address: str
) -> None:
    with Admin(cluster.endpoints) as admin:
        admin.create_topic("events", partitions=2)
    # The nodes restarted elsewhere since the topic was made: its descriptor is stale.
    descriptor = cluster.topics["events"]
    stale = {node_id: stale_address for node_id in descriptor.addresses}
    cluster.topics["events"] = msgspec.structs.replace(descriptor, addresses=stale)

    with Producer(
        cluster.endpoints, delivery_timeout_seconds=TIMEOUT_SECONDS, timeout=TIMEOUT_SECONDS
    ) as producer:
        sent = [producer.send("events", b"v", partition=p) for p in (0, 1)]
        producer.flush()
        assert [future.result(timeout=0).offset for future in sent] == [0, 0]
    with Consumer(cluster.endpoints, timeout=TIMEOUT_SECONDS) as consumer:
        assert [record.value for record in consumer.read("events", 1, 0, 10)] == [b"v"]
        assert consumer.end_offset("events", 0) == 1
