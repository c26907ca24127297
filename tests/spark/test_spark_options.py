"""The Kafka source options through Spark itself, against the fake stream cluster: what
Spark makes of the schema, the planned partitions, the read limits and the progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from quorumlog.codec.wire import Record
from tests.spark.fake_stream_cluster import FakeStreamCluster
from tests.spark.helpers import produce_records, produce_values, unique_topic

pytestmark = pytest.mark.slow


def test_batch_read_with_kafka_options(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    """A Kafka job's options, with only the format and the servers changed: pattern,
    headers, a start time, more Spark partitions than topic partitions."""
    prefix = unique_topic("kafka-job")
    topic, other = f"{prefix}-orders", f"x{prefix}-other"
    fake_cluster.create_topic(topic, partitions=2)
    fake_cluster.create_topic(other, partitions=1)
    produce_values(fake_cluster.endpoints, other, 0, [b"not read"] * 5)
    for partition in range(2):
        records = [
            Record(
                value=b"%d-%d" % (partition, offset),
                timestamp_ms=10_000 + offset,
                headers=[("trace", b"t%d" % offset)] if offset % 2 else [],
            )
            for offset in range(100)
        ]
        produce_records(fake_cluster.endpoints, topic, partition, records, chunk=10)

    frame = (
        spark.read.format("quorumlog")
        .option("kafka.bootstrap.servers", fake_cluster.endpoints)
        .option("subscribePattern", f"{prefix}-.*")
        .option("startingTimestamp", "10040")
        .option("includeHeaders", "true")
        .option("minPartitions", "6")
        .load()
    )
    assert frame.columns[-1] == "headers"
    assert frame.rdd.getNumPartitions() >= 6
    rows = frame.select("topic", "partition", "offset", "value", "timestamp", "headers").collect()
    assert {row.topic for row in rows} == {topic}
    assert sorted((row.partition, row.offset) for row in rows) == [
        (partition, offset) for partition in range(2) for offset in range(40, 100)
    ]
    for row in rows:
        assert row.value == b"%d-%d" % (row.partition, row.offset)
        if row.offset % 2:
            assert [(header.key, header.value) for header in row.headers] == [
                ("trace", b"t%d" % row.offset)
            ]
        else:
            assert row.headers is None

    assigned = (
        spark.read.format("quorumlog")
        .option("endpoints", fake_cluster.endpoints)
        .option("assign", json.dumps({topic: [1]}))
        .option("endingOffsetsByTimestamp", json.dumps({topic: {"1": 10_010}}))
        .load()
    )
    assert "headers" not in assigned.columns
    assert sorted(row.offset for row in assigned.collect()) == list(range(10))


def test_stream_reports_its_latest_offsets_and_honours_both_trigger_sizes(
    spark: SparkSession, fake_cluster: FakeStreamCluster, tmp_path: Path
) -> None:
    """minOffsetsPerTrigger travels to Spark as ReadMinRows (an availableNow query never
    waits on it); maxOffsetsPerTrigger still caps each micro-batch; each progress shows
    the latest offsets, ahead of the batch's end while the query lags."""
    topic = unique_topic("progress")
    fake_cluster.create_topic(topic, partitions=1)
    produce_values(fake_cluster.endpoints, topic, 0, [b"v%d" % n for n in range(250)])
    query = (
        spark.readStream.format("quorumlog")
        .option("endpoints", fake_cluster.endpoints)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "100")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .writeStream.format("memory")
        .queryName("progress_" + topic.replace("-", "_"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in progress] == [100, 100, 50]
    source = progress[0]["sources"][0]
    assert json.loads(source["endOffset"]) == {topic: {"0": 100}}
    assert json.loads(source["latestOffset"]) == {topic: {"0": 250}}  # lag: 150 records
