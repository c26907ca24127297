"""Streams on real node processes: Admin, Producer, Consumer and the CLI against a 3-node
cluster (fsync on) on free loopback ports; see `process_cluster.py`.

The leader-kill test checks with the queue checker that nothing acknowledged is lost or
written twice when the partition leader is SIGKILLed in the middle of producing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from quorumlog import Admin, Consumer, Producer
from quorumlog.cli.main import cli
from quorumlog.errors import UnknownOutcomeError
from quorumlog.stream.client_common import OffsetOutOfRangeError
from quorumlog.stream.records import Record, RecordMetadata
from quorumlog.testing.queue_checker import (
    ConsumedRecord,
    ProducedRecord,
    ProduceStatus,
    check_queue,
)

from .process_cluster import ProcessCluster, wait_until

WAIT_SECONDS = 20.0
ENTRIES_FOR_A_CUT = 1400
PRODUCERS_FOR_A_CUT = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("streams"), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield running


def read_all(consumer: Consumer, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    offset = consumer.begin_offset(topic, partition)
    while batch := consumer.read(topic, partition, offset, 5000):
        records += batch
        offset = batch[-1].offset + 1
    return records


def wait_for_partition_leader(admin: Admin, topic: str, partition: int) -> str:
    def leader() -> str | None:
        return admin.describe_topic(topic).partitions[partition].leader

    return wait_until(leader, WAIT_SECONDS, f"a leader of {topic}/{partition}")


def outcome(value: str, future: Future[RecordMetadata]) -> ProducedRecord:
    error = future.exception()
    if error is None:
        metadata = future.result()
        return ProducedRecord(
            value, ProduceStatus.ACKNOWLEDGED, metadata.partition, metadata.offset
        )
    if isinstance(error, UnknownOutcomeError):
        return ProducedRecord(value, ProduceStatus.UNKNOWN)
    return ProducedRecord(value, ProduceStatus.FAILED)


def test_produce_consume_and_describe(cluster: ProcessCluster) -> None:
    cluster_id = cluster.cluster_id
    with Admin(cluster.endpoints, cluster_id=cluster_id) as admin:
        admin.create_topic("orders", partitions=2, replication=3)
        assert "orders" in admin.list_topics()
        with Producer(cluster.endpoints, cluster_id=cluster_id) as producer:
            sent = [
                (f"order-{i}", producer.send("orders", f"order-{i}".encode(), key=str(i).encode()))
                for i in range(2000)
            ]
            producer.flush()
        produced = [outcome(value, future) for value, future in sent]
        assert all(p.status is ProduceStatus.ACKNOWLEDGED for p in produced)
        with Consumer(cluster.endpoints, cluster_id=cluster_id, group="audit") as consumer:
            consumed = [
                ConsumedRecord(record.partition, record.offset, record.value.decode())
                for partition in (0, 1)
                for record in read_all(consumer, "orders", partition)
            ]
            ends = [consumer.end_offset("orders", partition) for partition in (0, 1)]
            consumer.commit("orders", 1, 7)
            assert consumer.committed("orders", 1) == 7
            assert consumer.committed("orders", 0) is None
        result = check_queue(produced, consumed, all_acknowledged_read=True)
        assert result.ok, result.explanation
        assert sum(ends) == 2000
        description = admin.describe_topic("orders")
        for partition in description.partitions:
            assert partition.leader in partition.replicas
            assert partition.begin_offset == 0
            assert partition.end_offset == ends[partition.partition]
            assert set(partition.in_sync) <= set(partition.replicas)
            assert partition.leader in partition.in_sync


def test_cli_topic_produce_consume(cluster: ProcessCluster) -> None:
    runner = CliRunner()
    common = ["--endpoints", ",".join(cluster.endpoints), "--cluster-id", cluster.cluster_id]
    created = runner.invoke(
        cli, ["topic", "create", "lines", "--partitions", "1", "--replication", "3", *common]
    )
    assert created.exit_code == 0, created.output
    produced = runner.invoke(
        cli, ["produce", "lines", "--key-separator", ":", *common], input="a:one\nb:two\n"
    )
    assert produced.exit_code == 0, produced.output
    consumed = runner.invoke(
        cli,
        [
            "consume",
            "lines",
            "--from-beginning",
            "--max-messages",
            "2",
            "--print-key",
            "--print-offset",
            *common,
        ],
    )
    assert consumed.exit_code == 0, consumed.output
    assert consumed.output.splitlines() == ["Offset:0\ta\tone", "Offset:1\tb\ttwo"]
    described = runner.invoke(cli, ["topic", "describe", "lines", *common])
    assert described.exit_code == 0, described.output
    assert "PartitionCount: 1" in described.output
    assert "EndOffset: 2" in described.output
    listed = runner.invoke(cli, ["topic", "list", *common])
    assert "lines" in listed.output.splitlines()
    deleted = runner.invoke(cli, ["topic", "delete", "lines", *common])
    assert deleted.exit_code == 0, deleted.output
    missing = runner.invoke(cli, ["topic", "delete", "lines", *common])
    assert missing.exit_code != 0


def test_retention_deletes_old_records_and_reading_them_is_a_clear_error(
    cluster: ProcessCluster,
) -> None:
    cluster_id = cluster.cluster_id
    with Admin(cluster.endpoints, cluster_id=cluster_id) as admin:
        admin.create_topic("short", partitions=1, replication=3, retention_bytes=10_000)

    def produce_one_by_one(worker: int) -> None:
        # One batch (one log entry) per record: retention cuts at checkpoints the partition
        # takes every 1000 entries, so it needs well over 1000 entries to cut anything.
        with Producer(cluster.endpoints, cluster_id=cluster_id, linger_ms=0) as producer:
            for i in range(ENTRIES_FOR_A_CUT // PRODUCERS_FOR_A_CUT):
                value = f"{worker}-{i}".encode()
                producer.send("short", value * 10).result(timeout=WAIT_SECONDS)

    with ThreadPoolExecutor(PRODUCERS_FOR_A_CUT) as pool:
        list(pool.map(produce_one_by_one, range(PRODUCERS_FOR_A_CUT)))
    with Consumer(cluster.endpoints, cluster_id=cluster_id) as consumer:
        begin = wait_until(
            lambda: consumer.begin_offset("short", 0) or None,
            WAIT_SECONDS,
            "retention to cut the partition",
        )
        with pytest.raises(OffsetOutOfRangeError, match="deleted by retention") as raised:
            consumer.read("short", 0, 0, 10)
        assert raised.value.begin_offset >= begin
        assert consumer.read("short", 0, raised.value.begin_offset, 1)


def test_partition_leader_killed_mid_produce_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    with ProcessCluster(tmp_path, node_count=3) as cluster:
        cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        cluster_id = cluster.cluster_id
        with Admin(cluster.endpoints, cluster_id=cluster_id) as admin:
            admin.create_topic("ledger", partitions=1, replication=3)
            leader = wait_for_partition_leader(admin, "ledger", 0)
        sent: list[tuple[str, Future[RecordMetadata]]] = []
        stop = threading.Event()
        killed = threading.Event()
        with Producer(cluster.endpoints, cluster_id=cluster_id, linger_ms=1) as producer:

            def produce_until_stopped() -> None:
                number = 0
                while not stop.is_set():
                    value = f"value-{number}"
                    sent.append((value, producer.send("ledger", value.encode())))
                    number += 1
                    if number % 50 == 0:
                        sent[-1][1].exception(timeout=WAIT_SECONDS)

            worker = threading.Thread(target=produce_until_stopped, daemon=True)
            worker.start()
            try:
                wait_until(lambda: acknowledged(sent) >= 2000, WAIT_SECONDS, "2000 acks")
                cluster.kill(leader)
                killed.set()
                after_kill = acknowledged(sent)
                wait_until(
                    lambda: acknowledged(sent) >= after_kill + 2000,
                    WAIT_SECONDS * 2,
                    "2000 more acks after the kill",
                )
            finally:
                stop.set()
                worker.join(timeout=WAIT_SECONDS)
            producer.flush()
        produced = [outcome(value, future) for value, future in sent]
        with Consumer(cluster.endpoints, cluster_id=cluster_id) as consumer:
            consumed = [
                ConsumedRecord(record.partition, record.offset, record.value.decode())
                for record in read_all(consumer, "ledger", 0)
            ]
    assert killed.is_set()
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok, result.explanation
    assert result.acknowledged_count >= 4000


def acknowledged(sent: list[tuple[str, Future[RecordMetadata]]]) -> int:
    """How many of the records sent so far are acknowledged."""
    return sum(1 for _, future in list(sent) if future.done() and future.exception() is None)
