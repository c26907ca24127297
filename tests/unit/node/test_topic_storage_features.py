"""Compression and timestamps on ledger and HA topics, end to end on three real nodes in
one process (issue 16): a producer compressing its batches, the partition keeping them,
consumers reading the records decompressed with their times, `RecordMetadata` carrying
the owner's or master's stamp, and offsets by time (the Consumer's and the one Spark's
`startingTimestamp` uses) answering on these storage modes as on raft topics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.ha.controller_client import HAControllerClient
from quorumlog.node.server import Node
from quorumlog.stream import offsets_for_times
from quorumlog.stream.fetching import batch_decoder, fetch
from quorumlog.stream.topics import group_id
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_consumer_group_nodes import LoopThread, wait_for

FUTURE_MS = 10**6
"""How far ahead of the clock a record's own time is set (so times stay in order)."""


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    directory: Path = tmp_path_factory.mktemp("topic-features")
    loop = LoopThread()
    settings = node_settings(
        ["n1", "n2", "n3"],
        directory,
        tick_ms=10,
        election_ticks=5,
        fsync=False,
        bookie_heartbeat_ms=100,
        ledger_owner_renew_ms=100,
        ledger_owner_stale_ms=600,
        ha_broker_heartbeat_timeout_ms=800,
        ha_controller_check_ms=100,
    )
    nodes: list[Node] = loop.run(start_nodes(settings))  # type: ignore[assignment]
    addresses = [f"127.0.0.1:{node.port}" for node in nodes]
    with Admin(addresses) as admin:
        admin.create_topic("packed-ledger", 1, 3, storage="ledger")
        admin.create_topic("packed-ha", 1, 3, storage="ha")
        ha_group = group_id(admin.topic_descriptor("packed-ha"), 0)

    def ha_in_sync() -> bool:
        with HAControllerClient(addresses, timeout=5.0) as client:
            try:
                return len(client.get_group(ha_group).sync_state_set) >= 2
            except KeyError:
                return False

    wait_for(ha_in_sync, "the HA partition's SyncStateSet")
    try:
        yield addresses
    finally:
        for node in nodes:
            loop.run(node.stop())
        loop.stop()


@pytest.mark.parametrize(("storage", "codec"), [("ledger", "zstd"), ("ha", "lz4")])
def test_compressed_batches_and_times_round_trip(
    endpoints: list[str], storage: str, codec: str
) -> None:
    topic = f"packed-{storage}"
    values = [f"record {number} ".encode() * 20 for number in range(300)]
    started_ms = int(time.time() * 1000)
    with Producer(endpoints, linger_ms=0) as plain:
        before = plain.send(topic, b"before", partition=0).result(30)
    with Producer(endpoints, compression=codec, linger_ms=50) as packed:
        futures = [packed.send(topic, value, partition=0) for value in values]
        own_ms = started_ms + FUTURE_MS
        last = packed.send(topic, None, key=b"k", partition=0, timestamp_ms=own_ms)
        packed.flush(timeout=30)
    written = [future.result(0) for future in futures]
    assert [meta.offset for meta in written] == list(range(1, 301))
    # The owner's (master's) stamp comes back, as on raft topics; a record's own time wins.
    assert started_ms <= before.timestamp <= written[0].timestamp <= written[-1].timestamp
    assert (last.result(0).offset, last.result(0).timestamp) == (301, own_ms)
    with Consumer(endpoints) as consumer:
        records = consumer.read(topic, 0, 0, 1000)
        assert [r.value for r in records] == [b"before", *values, None]
        assert [r.timestamp for r in records] == [
            before.timestamp,
            *(meta.timestamp for meta in written),
            own_ms,
        ]
        assert [r.offset for r in consumer.read(topic, 0, 150, 2)] == [150, 151]
        middle = written[150].timestamp
        expected = next(meta.offset for meta in written if meta.timestamp >= middle)
        found = consumer.offsets_for_times({(topic, 0): middle})
        assert found[(topic, 0)] == expected
        # What Spark's startingTimestamp asks (it reads the batches' own times).
        spark_found = consumer.run(
            offsets_for_times.offset_for_time(consumer.transport, topic, 0, own_ms)
        )
        assert spark_found == 301
        if storage == "ha":
            # The commit log holds the producer's compressed bytes, as raft logs do.
            result = consumer.run(fetch(consumer.transport, topic, 0, 1, 1, 1, leader_only=True))
            assert batch_decoder.decode(result.batches[0].data).compression == codec
