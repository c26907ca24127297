"""Reads back what the run left in the cluster and hands it to the checks (checks.py)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from quorumlog.demo import pipeline
from quorumlog.demo.checks import Check, CheckInputs, run_checks
from quorumlog.demo.cluster import CLUSTER_ID, DemoCluster
from quorumlog.demo.layout import OUTPUT_TOPIC, TOPIC
from quorumlog.demo.pipeline import (
    RESULT_KEY_PREFIX,
    ClusterConnection,
    FlightStats,
    ResultTable,
)
from quorumlog.demo.produce import ProduceReport
from quorumlog.errors import ClientError
from quorumlog.kv.requests import prefix_end
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.consumer import Consumer

READ_RECORDS_MAX = 10_000
KV_TABLE_FORMAT = "quorumlog-kv"


def verify(
    spark: SparkSession,
    cluster: DemoCluster,
    admin: Admin,
    expected_records: int,
    produced: ProduceReport,
    table: ResultTable,
) -> list[Check]:
    connection = ClusterConnection(cluster.endpoints, CLUSTER_ID)
    inputs = CheckInputs(
        expected_records=expected_records,
        produced=produced,
        stored_records=stored_records(admin),
        counted=table.total(),
        results=table.rows(),
        kv_results=read_kv_results(spark, connection),
        topic_results=read_topic_results(cluster),
    )
    return run_checks(inputs)


def stored_records(admin: Admin) -> int:
    """Records the input topic holds: its partitions' end offsets minus begin offsets."""
    stored = 0
    for partition in admin.describe_topic(TOPIC).partitions:
        if partition.end_offset is None or partition.begin_offset is None:
            raise ClientError(f"no offsets for {TOPIC}/{partition.partition}: {partition.error}")
        stored += partition.end_offset - partition.begin_offset
    return stored


def read_kv_results(spark: SparkSession, connection: ClusterConnection) -> dict[str, FlightStats]:
    """Every key under the results prefix, through the `quorumlog-kv` table source (so keys
    nobody expected show up too), by result key."""
    table = (
        spark.read.format(KV_TABLE_FORMAT)
        .options(**connection.options())
        .option("startKey", RESULT_KEY_PREFIX)
        .option("endKey", prefix_end(RESULT_KEY_PREFIX))
        .load()
    )
    return {
        row["key"][len(RESULT_KEY_PREFIX) :]: pipeline.decode_stats(row["value"])
        for row in table.collect()
    }


def read_topic_results(cluster: DemoCluster) -> dict[str, FlightStats]:
    """The newest record per key of the output topic (a changelog of the groups)."""
    newest: dict[str, FlightStats] = {}
    with Consumer(cluster.endpoints, cluster_id=CLUSTER_ID) as consumer:
        for partition in consumer.partitions(OUTPUT_TOPIC):
            offset = consumer.begin_offset(OUTPUT_TOPIC, partition)
            while records := consumer.read(OUTPUT_TOPIC, partition, offset, READ_RECORDS_MAX):
                for record in records:
                    key = (record.key or b"").decode()
                    if record.value is not None:  # the demo writes no tombstones
                        newest[key] = pipeline.decode_stats(record.value)
                offset = records[-1].offset + 1
    return newest
