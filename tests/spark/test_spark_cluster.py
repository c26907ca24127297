"""Spark against real node processes (3 nodes, fsync on): a streaming query whose source
partition leader is SIGKILLed while it runs still writes every record exactly once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from quorumlog import Admin, Producer
from quorumlog.kv.client import KVClient
from quorumlog.ledger.metadata_kv import KVMetadataStore
from tests.integration.process_cluster import ProcessCluster, wait_until
from tests.spark.helpers import unique_topic

pytestmark = pytest.mark.slow

WAIT_SECONDS = 30.0
CLUSTER_ID = "integration"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("spark-cluster"), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield running


def partition_leader(admin: Admin, topic: str, partition: int) -> str:
    return wait_until(
        lambda: admin.describe_topic(topic).partitions[partition].leader,
        WAIT_SECONDS,
        f"a leader of {topic}/{partition}",
    )


def test_stream_survives_a_killed_partition_leader_without_loss_or_duplicates(
    spark: SparkSession, cluster: ProcessCluster, tmp_path: Path
) -> None:
    source_topic, sink_topic = unique_topic("kill-in"), unique_topic("kill-out")
    values = [b"record-%05d" % number for number in range(6000)]
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(source_topic, partitions=2)
        admin.create_topic(sink_topic, partitions=1)
        victim = partition_leader(admin, source_topic, 0)
        partition_leader(admin, sink_topic, 0)
    with Producer(cluster.endpoints, cluster_id=CLUSTER_ID) as producer:
        for number, value in enumerate(values):
            producer.send(source_topic, value, partition=number % 2)
        producer.flush()

    endpoints = ",".join(cluster.endpoints)
    query = (
        spark.readStream.format("quorumlog")
        .option("endpoints", endpoints)
        .option("clusterId", CLUSTER_ID)
        .option("topic", source_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1000")
        .load()
        .select("value")
        .writeStream.format("quorumlog")
        .option("endpoints", endpoints)
        .option("clusterId", CLUSTER_ID)
        .option("topic", sink_topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    killed = threading.Event()

    def kill_after_first_batch() -> None:
        wait_until(lambda: query.recentProgress or None, WAIT_SECONDS * 4, "a first batch")
        cluster.kill(victim)
        killed.set()

    killer = threading.Thread(target=kill_after_first_batch, daemon=True)
    killer.start()
    try:
        query.awaitTermination()
        killer.join(timeout=WAIT_SECONDS)
    finally:
        if killed.is_set():
            # The cluster is shared by the module: later tests need every node (a ledger
            # topic's ensemble of 3 needs the three bookies the nodes host).
            cluster.restart(victim)
    assert killed.is_set()
    assert len(query.recentProgress) >= 6  # six micro-batches of at most 1000 records

    stored = (
        spark.read.format("quorumlog")
        .option("endpoints", endpoints)
        .option("clusterId", CLUSTER_ID)
        .option("topic", sink_topic)
        .load()
        .select("value")
        .collect()
    )
    assert sorted(row.value for row in stored) == values


def test_fail_on_data_loss_after_retention_on_real_nodes(
    spark: SparkSession, cluster: ProcessCluster
) -> None:
    """Retention deletes the oldest records; a batch read asked to start at offset 0 fails
    with failOnDataLoss true (the default) and reads what is left with it false."""
    from quorumlog import Consumer

    topic = unique_topic("retention")
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(topic, partitions=1, retention_bytes=20_000)
        partition_leader(admin, topic, 0)
    # Many small batches: retention cuts at checkpoints, taken every 64 log entries.
    with Producer(cluster.endpoints, cluster_id=CLUSTER_ID) as producer:
        for batch in range(300):
            for number in range(5):
                producer.send(topic, b"r%06d" % (batch * 5 + number), partition=0)
            producer.flush()
    with Consumer(cluster.endpoints, cluster_id=CLUSTER_ID) as consumer:
        begin = wait_until(
            lambda: consumer.begin_offset(topic, 0) or None, WAIT_SECONDS, "retention to cut"
        )
        end = consumer.end_offset(topic, 0)
    assert 0 < begin < end == 1500

    def read(fail_on_data_loss: str) -> int:
        return (
            spark.read.format("quorumlog")
            .option("endpoints", ",".join(cluster.endpoints))
            .option("clusterId", CLUSTER_ID)
            .option("topic", topic)
            .option("startingOffsets", json.dumps({topic: {"0": 0}}))
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
            .count()
        )

    with pytest.raises(Exception, match=r"(?i)lost|data loss|retention|begin"):
        read("true")
    counted = read("false")
    # What is left: at least what was retained when we looked (retention may cut more).
    assert 0 < counted <= end - begin


def wait_for_writable_bookies(cluster: ProcessCluster, count: int) -> None:
    """Until `count` bookies are registered and writable (a node restarted by an earlier
    test registers its bookie a heartbeat after it starts)."""
    with KVClient(cluster.endpoints, timeout=WAIT_SECONDS, cluster_id=CLUSTER_ID) as client:
        store = KVMetadataStore(client)
        wait_until(
            lambda: len(store.writable_bookies()) >= count or None,
            WAIT_SECONDS,
            f"{count} writable bookies",
        )


def test_batch_read_of_a_ledger_topic_sees_every_record_once(
    spark: SparkSession, cluster: ProcessCluster
) -> None:
    """The Spark source reads a ledger-backed topic as it reads a Raft one."""
    topic = unique_topic("ledger-source")
    wait_for_writable_bookies(cluster, 3)
    values = [b"ledger-%04d" % number for number in range(400)]
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(topic, partitions=2, storage="ledger", ensemble=3, write_quorum=2)
    with Producer(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as producer:
        for number, value in enumerate(values):
            producer.send(topic, value, partition=number % 2)
        producer.flush()
    rows = (
        spark.read.format("quorumlog")
        .option("endpoints", ",".join(cluster.endpoints))
        .option("clusterId", CLUSTER_ID)
        .option("topic", topic)
        .load()
        .select("partition", "offset", "value")
        .collect()
    )
    assert sorted(row.value for row in rows) == values
    for partition in (0, 1):
        offsets = sorted(row.offset for row in rows if row.partition == partition)
        assert offsets == list(range(len(values) // 2)), f"partition {partition}"


@pytest.mark.parametrize(("storage", "codec"), [("ledger", "zstd"), ("ha", "lz4")])
def test_compressed_records_read_decompressed_from_a_starting_timestamp(
    spark: SparkSession, cluster: ProcessCluster, storage: str, codec: str
) -> None:
    """Issue 16: a producer compressing its batches into a ledger or HA topic; Spark reads
    the records decompressed, from the first offset at `startingTimestamp` (the owner's or
    master's stamps, which the producer got back)."""
    topic = unique_topic(f"{storage}-packed")
    if storage == "ledger":
        wait_for_writable_bookies(cluster, 3)
    values = [b"%s-%04d" % (storage.encode(), number) for number in range(400)]
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(topic, partitions=2, replication=3, storage=storage)
    with Producer(
        cluster.endpoints,
        cluster_id=CLUSTER_ID,
        timeout=WAIT_SECONDS,
        compression=codec,
        linger_ms=0,
        batch_records_max=40,
    ) as producer:
        futures = [
            producer.send(topic, value, partition=number % 2) for number, value in enumerate(values)
        ]
        producer.flush()
    stamps = [future.result().timestamp for future in futures]
    assert all(stamp > 0 for stamp in stamps)
    starting_ms = stamps[len(values) // 2]
    rows = (
        spark.read.format("quorumlog")
        .option("endpoints", ",".join(cluster.endpoints))
        .option("clusterId", CLUSTER_ID)
        .option("topic", topic)
        .option("startingTimestamp", str(starting_ms))
        .load()
        .select("value", "timestamp")
        .collect()
    )
    expected = [v for v, stamp in zip(values, stamps, strict=True) if stamp >= starting_ms]
    assert sorted(row.value for row in rows) == expected
    assert min(row.timestamp.timestamp() * 1000 for row in rows) >= starting_ms - 1


def test_spark_sink_writes_a_ledger_topic_once(
    spark: SparkSession, cluster: ProcessCluster
) -> None:
    """The Spark sink's idempotent producer works on a ledger-backed topic: every row once."""
    topic = unique_topic("ledger-sink")
    wait_for_writable_bookies(cluster, 3)
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(topic, partitions=2, storage="ledger", ensemble=3, write_quorum=2)
    frame = spark.range(0, 2000, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    frame.write.format("quorumlog").mode("append").option(
        "endpoints", ",".join(cluster.endpoints)
    ).option("clusterId", CLUSTER_ID).option("topic", topic).save()
    rows = (
        spark.read.format("quorumlog")
        .option("endpoints", ",".join(cluster.endpoints))
        .option("clusterId", CLUSTER_ID)
        .option("topic", topic)
        .load()
        .select("value")
        .collect()
    )
    assert sorted(int(row.value) for row in rows) == list(range(2000))
