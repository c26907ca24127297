"""A record a producer had acknowledged is readable at once (the leader answers reads)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.cli.node_commands import start_dev_cluster, stop_dev_cluster
from quorumlog.errors import QuorumLogError

CLUSTER_ID = "read-your-writes"


@pytest.fixture
def endpoints(tmp_path: Path) -> Iterator[list[str]]:
    state = start_dev_cluster(str(tmp_path / "cluster"), 3, CLUSTER_ID, ["--tick-ms", "20"])
    try:
        yield str(state["endpoints"]).split(",")
    finally:
        stop_dev_cluster(str(tmp_path / "cluster"))


def create_topic(endpoints: list[str]) -> None:
    admin = Admin(endpoints, cluster_id=CLUSTER_ID)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                admin.create_topic("events", partitions=1, replication=3)
                return
            except QuorumLogError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the metadata group is still electing
    finally:
        admin.close()


def test_every_acknowledged_record_is_read_right_after_the_flush(endpoints: list[str]) -> None:
    create_topic(endpoints)
    producer = Producer(endpoints, cluster_id=CLUSTER_ID)
    consumer = Consumer(endpoints, cluster_id=CLUSTER_ID)
    try:
        expected: list[bytes] = []
        for round_number in range(20):
            values = [f"{round_number}-{n}".encode() for n in range(50)]
            futures = [producer.send("events", value, partition=0) for value in values]
            producer.flush()
            assert all(future.exception() is None for future in futures)
            expected += values
            # A fresh read, no retry: everything acknowledged so far must be there.
            read = consumer.read("events", 0, 0, max_records=len(expected) + 10)
            assert [record.value for record in read] == expected
    finally:
        producer.close()
        consumer.close()
