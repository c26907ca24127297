"""Streaming reads and writes through Spark against the fake stream cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.spark.fake_stream_cluster import FakeStreamCluster
from tests.spark.helpers import produce_values, read_topic, unique_topic

pytestmark = pytest.mark.slow


def source(spark: SparkSession, endpoints: str, topic: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("quorumlog")
        .option("endpoints", endpoints)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(frame: DataFrame, endpoints: str, topic: str, checkpoint: Path) -> list[int]:
    """Run the query until it has read what was there at its start; rows per micro-batch."""
    query = (
        frame.writeStream.format("quorumlog")
        .option("endpoints", endpoints)
        .option("topic", topic)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [progress["numInputRows"] for progress in query.recentProgress]


def stored_values(endpoints: str, topic: str) -> list[bytes]:
    return [record.value for records in read_topic(endpoints, topic).values() for record in records]


def test_stream_reads_limited_micro_batches_and_resumes_from_checkpoint(
    spark: SparkSession, fake_cluster: FakeStreamCluster, tmp_path: Path
) -> None:
    endpoints = fake_cluster.endpoints
    source_topic, sink_topic = unique_topic("stream-in"), unique_topic("stream-out")
    fake_cluster.create_topic(source_topic, partitions=2)
    fake_cluster.create_topic(sink_topic, partitions=1)
    for partition in range(2):
        produce_values(
            endpoints, source_topic, partition, [b"%d-%d" % (partition, n) for n in range(300)]
        )
    frame = source(spark, endpoints, source_topic, maxOffsetsPerTrigger="250").select("value")

    batches = run_available_now(frame, endpoints, sink_topic, tmp_path / "checkpoint")
    assert sum(batches) == 600
    assert max(batches) <= 250
    assert len(stored_values(endpoints, sink_topic)) == 600

    # More records, then the same query again from its checkpoint: only the new ones.
    produce_values(endpoints, source_topic, 1, [b"1-%d" % n for n in range(300, 400)])
    batches = run_available_now(frame, endpoints, sink_topic, tmp_path / "checkpoint")
    assert sum(batches) == 100
    stored = stored_values(endpoints, sink_topic)
    expected = [b"0-%d" % n for n in range(300)] + [b"1-%d" % n for n in range(400)]
    assert sorted(stored) == sorted(expected)  # nothing lost, nothing twice


def fail_while_armed(armed: str, endpoints: str, topic: str):  # type: ignore[no-untyped-def]
    """A mapInArrow function that fails every attempt while the file `armed` exists, once
    the sink has written part of the micro-batch (so a replay must resend those records)."""

    def run(batches):  # type: ignore[no-untyped-def]
        import time

        from quorumlog.spark.cluster import ClusterAccess
        from quorumlog.spark.options import ConnectionOptions

        rows = 0
        for batch in batches:
            yield batch
            rows += batch.num_rows
            if rows >= 1500 and Path(armed).exists():
                connection = ConnectionOptions(endpoints.split(","), timeout_seconds=10)
                with ClusterAccess(connection) as access:
                    access.list_topics()
                    deadline = time.monotonic() + 10
                    while access.bounds((topic, 0)).end < 1000 and time.monotonic() < deadline:
                        time.sleep(0.05)
                raise RuntimeError("injected failure in the middle of a micro-batch")

    return run


def test_replayed_micro_batch_after_a_failure_writes_each_record_once(
    spark: SparkSession, fake_cluster: FakeStreamCluster, tmp_path: Path
) -> None:
    endpoints = fake_cluster.endpoints
    source_topic, sink_topic = unique_topic("replay-in"), unique_topic("replay-out")
    fake_cluster.create_topic(source_topic, partitions=1)
    fake_cluster.create_topic(sink_topic, partitions=1)
    values = [b"%06d" % number + b"x" * 200 for number in range(3000)]
    produce_values(endpoints, source_topic, 0, values)
    armed = tmp_path / "armed"
    armed.write_text("fail")
    frame = source(spark, endpoints, source_topic, fetchRecordsMax="500").select("value")
    flaky = frame.mapInArrow(fail_while_armed(str(armed), endpoints, sink_topic), frame.schema)
    checkpoint = tmp_path / "checkpoint"

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        with pytest.raises(PySparkException, match="injected failure"):
            run_available_now(flaky, endpoints, sink_topic, checkpoint)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    written_before_restart = fake_cluster.end_offset(sink_topic, 0)
    assert written_before_restart >= 1000  # part of the micro-batch reached the topic

    armed.unlink()
    run_available_now(flaky, endpoints, sink_topic, checkpoint)
    assert stored_values(endpoints, sink_topic) == values  # each once, in order


def test_stream_fails_on_data_loss_unless_told_not_to(
    spark: SparkSession, fake_cluster: FakeStreamCluster, tmp_path: Path
) -> None:
    endpoints = fake_cluster.endpoints
    source_topic, sink_topic = unique_topic("loss-in"), unique_topic("loss-out")
    fake_cluster.create_topic(source_topic, partitions=1)
    fake_cluster.create_topic(sink_topic, partitions=1)
    produce_values(endpoints, source_topic, 0, [b"%d" % n for n in range(100)], chunk=10)
    starting = json.dumps({source_topic: {"0": 0}})
    fake_cluster.remove_before(source_topic, 0, 40)

    frame = source(spark, endpoints, source_topic, startingOffsets=starting).select("value")
    with pytest.raises(PySparkException, match="failOnDataLoss"):
        run_available_now(frame, endpoints, sink_topic, tmp_path / "first")

    frame = source(
        spark, endpoints, source_topic, startingOffsets=starting, failOnDataLoss="false"
    ).select(F.col("value"))
    run_available_now(frame, endpoints, sink_topic, tmp_path / "second")
    assert stored_values(endpoints, sink_topic) == [b"%d" % n for n in range(40, 100)]
