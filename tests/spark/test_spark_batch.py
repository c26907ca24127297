"""Batch reads and writes through Spark against the fake stream cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.spark.fake_stream_cluster import FakeStreamCluster
from tests.spark.helpers import produce_values, read_topic, unique_topic

pytestmark = pytest.mark.slow


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{number}".encode() for number in range(count)]


def test_batch_read_gives_every_record_once_with_kafka_schema(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    topic = unique_topic("batch")
    fake_cluster.create_topic(topic, partitions=2)
    for partition in range(2):
        produce_values(fake_cluster.endpoints, topic, partition, values(f"p{partition}", 500))

    frame = (
        spark.read.format("quorumlog")
        .option("endpoints", fake_cluster.endpoints)
        .option("topic", topic)
        .option("maxRecordsPerPartition", "200")
        .load()
    )
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )  # no headers column unless includeHeaders is true, as in Kafka
    assert frame.rdd.getNumPartitions() == 6  # 500 records in ranges of at most 200
    rows = frame.select("value", "partition", "offset", "topic", "timestampType").collect()
    assert len(rows) == 1000
    for row in rows:
        assert row.value == f"p{row.partition}-{row.offset}".encode()
        assert row.topic == topic
        assert row.timestampType == 1  # stamped by the leader: LogAppendTime


def test_batch_read_between_json_offsets(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    topic = unique_topic("range")
    fake_cluster.create_topic(topic, partitions=2)
    produce_values(fake_cluster.endpoints, topic, 0, values("a", 50))
    produce_values(fake_cluster.endpoints, topic, 1, values("b", 50))

    frame = (
        spark.read.format("quorumlog")
        .option("endpoints", fake_cluster.endpoints)
        .option("topic", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 10, "1": -2}}))
        .option("endingOffsets", json.dumps({topic: {"0": 20, "1": 5}}))
        .load()
    )
    offsets = sorted((row.partition, row.offset) for row in frame.collect())
    assert offsets == [(0, offset) for offset in range(10, 20)] + [(1, o) for o in range(5)]


def read_frame(spark: SparkSession, endpoints: str, **options: str) -> list[object]:
    reader = spark.read.format("quorumlog").option("endpoints", endpoints)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().collect()


@pytest.mark.parametrize(
    ("options", "option_named"),
    [
        ({"topic": "no-such-topic"}, "'topic'"),
        ({"topic": "x", "startingOffsets": "{not json"}, "'startingOffsets'"),
        ({"topic": "x", "startingOffsets": '{"x": {"zero": 1}}'}, "'startingOffsets'"),
        ({"topic": "x", "endingOffsets": "earliest"}, "'endingOffsets'"),
        ({"topic": "x", "maxOffsetsPerTrigger": "10"}, "'maxOffsetsPerTrigger'"),
        ({"topic": "x", "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
        ({"topic": "x", "failOnDataLoss": "perhaps"}, "'failOnDataLoss'"),
    ],
)
def test_bad_options_fail_naming_the_option(
    spark: SparkSession,
    fake_cluster: FakeStreamCluster,
    options: dict[str, str],
    option_named: str,
) -> None:
    with pytest.raises(PySparkException, match=option_named):
        read_frame(spark, fake_cluster.endpoints, **options)


def test_unreachable_endpoints_fail_naming_the_option(spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match=r"'endpoints'.*no node"):
        read_frame(spark, "127.0.0.1:9", topic="t", timeoutMs="500")


def test_fail_on_data_loss_after_retention(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    topic = unique_topic("retention")
    fake_cluster.create_topic(topic, partitions=1)
    produce_values(fake_cluster.endpoints, topic, 0, values("r", 100), chunk=10)
    fake_cluster.remove_before(topic, 0, 30)
    starting = json.dumps({topic: {"0": 0}})

    with pytest.raises(PySparkException, match="failOnDataLoss"):
        read_frame(spark, fake_cluster.endpoints, topic=topic, startingOffsets=starting)

    rows = read_frame(
        spark,
        fake_cluster.endpoints,
        topic=topic,
        startingOffsets=starting,
        failOnDataLoss="false",
    )
    assert sorted(row.offset for row in rows) == list(range(30, 100))  # type: ignore[attr-defined]


def test_batch_write_then_read_back_with_keys_and_partitions(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    topic = unique_topic("write")
    fake_cluster.create_topic(topic, partitions=2)
    frame = spark.range(0, 3000, numPartitions=3).select(
        F.col("id").cast("string").alias("value"),
        F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"),
    )
    frame.write.format("quorumlog").mode("append").option(
        "endpoints", fake_cluster.endpoints
    ).option("topic", topic).save()

    stored = read_topic(fake_cluster.endpoints, topic)
    written = sorted(int(record.value) for records in stored.values() for record in records)
    assert written == list(range(3000))
    for partition, records in stored.items():
        for record in records:
            assert record.key is not None
            # Same key, same partition: a key's records keep their order.
            assert {record.key for record in records} & {
                other.key
                for other_partition, others in stored.items()
                if other_partition != partition
                for other in others
            } == set()


def fail_first_attempt(flag: str, endpoints: str, topic: str):  # type: ignore[no-untyped-def]
    """A mapInArrow function failing task 0's first attempt once the sink has written some
    of its rows (so the retry must resend records the cluster already has)."""

    def run(batches):  # type: ignore[no-untyped-def]
        import time

        from pyspark import TaskContext

        from quorumlog.spark.cluster import ClusterAccess
        from quorumlog.spark.options import ConnectionOptions

        context = TaskContext.get()
        for index, batch in enumerate(batches):
            yield batch
            if index == 2 and context.partitionId() == 0 and not Path(flag).exists():
                Path(flag).write_text("failed once")
                connection = ConnectionOptions(endpoints.split(","), timeout_seconds=10)
                with ClusterAccess(connection) as access:
                    access.list_topics()
                    deadline = time.monotonic() + 10
                    while access.bounds((topic, 0)).end < 1000 and time.monotonic() < deadline:
                        time.sleep(0.05)
                raise RuntimeError("injected failure after writing some records")

    return run


def test_batch_write_task_retry_does_not_duplicate(
    spark: SparkSession, fake_cluster: FakeStreamCluster, tmp_path: Path
) -> None:
    topic = unique_topic("retry")
    fake_cluster.create_topic(topic, partitions=1)
    requests_before = fake_cluster.produce_requests
    # Long values: the rows must outgrow the buffers between Spark's Python workers, so
    # the sink has written some of them when the injected failure comes.
    frame = spark.range(0, 6000, numPartitions=2).select(
        F.lpad(F.col("id").cast("string"), 200, "0").alias("value")
    )
    schema = frame.schema
    flaky = frame.mapInArrow(
        fail_first_attempt(str(tmp_path / "flag"), fake_cluster.endpoints, topic), schema
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        flaky.write.format("quorumlog").mode("append").option(
            "endpoints", fake_cluster.endpoints
        ).option("topic", topic).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert (tmp_path / "flag").exists()  # the failure did happen
    stored = read_topic(fake_cluster.endpoints, topic)[0]
    assert sorted(int(record.value) for record in stored) == list(range(6000))
    assert fake_cluster.produce_requests > requests_before + 6  # the retry resent


def test_kv_table_reads_every_pair_in_key_order(
    spark: SparkSession, fake_cluster: FakeStreamCluster
) -> None:
    fake_cluster.kv.update({f"user/{number:04d}": f"name {number}" for number in range(2500)})
    frame = (
        spark.read.format("quorumlog-kv")
        .option("endpoints", fake_cluster.endpoints)
        .option("startKey", "user/")
        .option("endKey", "user0")
        .option("pageSize", "1000")
        .load()
    )
    assert frame.schema.simpleString() == "struct<key:string,value:string>"
    rows = frame.collect()
    assert [row.key for row in rows] == [f"user/{number:04d}" for number in range(2500)]
    assert rows[7].value == "name 7"


def test_arrow_schema_matches_what_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from quorumlog.spark.arrow import ARROW_SCHEMA, SPARK_SCHEMA

    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert isinstance(ARROW_SCHEMA, pa.Schema)
