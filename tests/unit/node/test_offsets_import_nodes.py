"""An upgraded cluster keeps its consumer groups' offsets: three real nodes in one process
hold an offset where the previous release kept it (`__offsets/g/t/0` in the "kv" group),
are restarted (a new coordinator leadership, as after an upgrade), and a consumer of the
group resumes at that offset, not at "latest"; the old key is gone."""

from __future__ import annotations

import time
from pathlib import Path

from quorumlog import Admin, Consumer, GroupAdmin, Producer
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.node.server import Node
from quorumlog.stream.records import Record
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_consumer_group_nodes import WAIT_SECONDS, LoopThread

RECORDS = 10
OLD_OFFSET = 7


def test_a_restarted_cluster_carries_over_the_previous_releases_offsets(tmp_path: Path) -> None:
    loop = LoopThread()
    settings = node_settings(
        ["n1", "n2", "n3"], tmp_path, tick_ms=10, election_ticks=5, fsync=False, bookie=False
    )
    nodes: list[Node] = loop.run(start_nodes(settings))  # type: ignore[assignment]
    try:
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        with Admin(addresses) as admin:
            admin.create_topic("t", partitions=1, replication=3)
        with Producer(addresses) as producer:
            for number in range(RECORDS):
                producer.send("t", str(number).encode(), partition=0)
            producer.flush(timeout=10)
        with GroupAdmin(addresses) as groups:
            # Served only once this leadership's import (of nothing) is done.
            assert groups.list_groups() == []
        with KVClient(addresses) as kv:
            InternalKeys(kv).put("__offsets/g/t/0", str(OLD_OFFSET))
        for node in nodes:
            loop.run(node.stop())
        nodes = loop.run(start_nodes(settings))  # type: ignore[assignment]
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        with GroupAdmin(addresses) as groups:
            described = groups.describe_group("g")
        assert [(p.topic, p.partition, p.committed_offset) for p in described.partitions] == [
            ("t", 0, OLD_OFFSET)
        ]
        with KVClient(addresses) as kv:
            assert InternalKeys(kv).scan_prefix("__offsets/") == []
        with Consumer(addresses, group="g", heartbeat_interval_seconds=0.1) as consumer:
            consumer.subscribe(["t"])
            records: list[Record] = []
            deadline = time.monotonic() + WAIT_SECONDS
            while not records:
                assert time.monotonic() < deadline, "no records polled"
                records = consumer.poll(0.5)
            # Where the group left off before the upgrade, not "latest" (which has nothing).
            assert records[0].offset == OLD_OFFSET
    finally:
        for node in nodes:
            loop.run(node.stop())
        loop.stop()
