"""The driver of a job on a Spark standalone cluster, run as its own process (a test
process already holds a local SparkContext, and a process has at most one).

    python -m tests.spark.standalone_job MASTER_URL ENDPOINTS CLUSTER_ID SOURCE SINK FLAG

Reads SOURCE with the `quorumlog` format in at least four Spark partitions, notes which
executor process read each one, and writes the values to SINK through the `quorumlog`
sink, failing one task's first attempt after it has written part of its rows (the
file FLAG marks that the failure happened). Prints one JSON line: what it saw. The test
reads the sink topic back itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

import quorumlog.spark

EXECUTORS = 2
EXECUTORS_SECONDS_MAX = 180.0
READ_PARTITIONS_MIN = 4


def session(master_url: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master_url)
        .appName("quorumlog-standalone-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(EXECUTORS))
        .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.task.maxFailures", "3")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    quorumlog.spark.register(spark)
    return spark


def wait_for_executors(spark: SparkSession) -> int:
    """Until both executors have registered (else one would take every task)."""
    tracker = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    deadline = time.monotonic() + EXECUTORS_SECONDS_MAX
    while True:
        # The driver counts itself among the block managers.
        executors = int(tracker.getExecutorMemoryStatus().size()) - 1
        if executors >= EXECUTORS or time.monotonic() > deadline:
            return executors
        time.sleep(0.2)


def tag_with_reader(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each row of a task with its Spark partition and its executor's Python daemon (the
    parent of this worker process: one per executor)."""
    context = TaskContext.get()
    partition = context.partitionId() if context else -1
    for batch in batches:
        rows = batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [
                batch.column("offset"),
                pa.array([partition] * rows, pa.int32()),
                pa.array([os.getppid()] * rows, pa.int64()),
            ],
            names=["offset", "task", "daemon"],
        )


def fail_first_attempt(flag: str, endpoints: str, cluster_id: str, sink: str):  # type: ignore[no-untyped-def]
    """Each task's rows go to the sink partition of its own number. Task 0's first attempt
    fails once its partition holds a request (rows of 4 KiB: the sink cuts a request at
    1 MiB) and more rows are on their way: Spark then ends the sink's input as if complete,
    the sink sends the rest as a short request, and the retry, maybe on the other
    executor, must resend all of it without a duplicate. FLAG keeps how many records were
    stored when it failed."""

    def run(batches):  # type: ignore[no-untyped-def]
        from quorumlog.spark.cluster import ClusterAccess
        from quorumlog.spark.options import ConnectionOptions

        context = TaskContext.get()
        task = context.partitionId()
        for index, batch in enumerate(batches):
            partition = pa.array([task] * batch.num_rows, pa.int32())
            yield pa.RecordBatch.from_arrays(
                [batch.column("value"), partition], names=["value", "partition"]
            )
            if index == 3 and task == 0 and not Path(flag).exists():
                connection = ConnectionOptions(endpoints.split(","), cluster_id, 30.0)
                with ClusterAccess(connection) as access:
                    access.list_topics()
                    deadline = time.monotonic() + 60
                    stored = 0
                    while stored == 0 and time.monotonic() < deadline:
                        stored = access.bounds((sink, 0)).end
                        time.sleep(0.05)
                Path(flag).write_text(str(stored))
                raise RuntimeError("injected failure after writing some records")

    return run


def main(
    master_url: str, endpoints: str, cluster_id: str, source: str, sink: str, flag: str
) -> None:
    spark = session(master_url)
    try:
        executors = wait_for_executors(spark)
        reader = (
            spark.read.format("quorumlog")
            .option("endpoints", endpoints)
            .option("clusterId", cluster_id)
            .option("topic", source)
            .option("minPartitions", str(READ_PARTITIONS_MIN))
        )
        frame = reader.load()
        tag_schema = StructType(
            [
                StructField("offset", LongType()),
                StructField("task", IntegerType()),
                StructField("daemon", LongType()),
            ]
        )
        tagged = frame.mapInArrow(tag_with_reader, tag_schema).collect()
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")
        values = reader.load().select("value")
        failing = fail_first_attempt(flag, endpoints, cluster_id, sink)
        written_schema = StructType(
            [StructField("value", BinaryType()), StructField("partition", IntegerType())]
        )
        values.mapInArrow(failing, written_schema).write.format("quorumlog").mode("append").option(
            "endpoints", endpoints
        ).option("clusterId", cluster_id).option("topic", sink).save()
        print(
            json.dumps(
                {
                    "executors": executors,
                    "read_partitions": frame.rdd.getNumPartitions(),
                    "rows_read": len(tagged),
                    "daemons": sorted({row.daemon for row in tagged}),
                    "tasks": len({row.task for row in tagged}),
                    "driver_pid": os.getpid(),
                    "stored_before_failure": (
                        int(Path(flag).read_text()) if Path(flag).exists() else -1
                    ),
                }
            )
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
