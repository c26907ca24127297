"""`quorumlog bench stream`: produce, Spark batch read and consume rates on a real cluster.

Phases, each one JSON object with a "phase" name, then a summary line:

- `produce`: one `Producer` sends 100-byte records to one partition replicated 3 ways
  (3 `quorumlog node` processes on loopback, fsync on); the rate counts records whose
  futures resolved (committed), from the first send to the last acknowledgement.
- `consume`: one `Consumer` reads the partition from offset 0 to its end.
- `spark-read`: `spark.read.format("quorumlog")` (local[2]) counts `--spark-records`
  records spread over 4 partitions; timed five times in one Spark session. The figure is
  the median of runs 3-5: a long-running job's steady rate, once the JVM has compiled
  Spark's own scan and driver code (the JIT still cost 0.55-0.9 s CPU of a 1M-record
  count in run 2). The first (cold) and the second run are reported too.

Summary: produce_records_per_s, consume_records_per_s, spark_read_records_per_s.
Figures, never pass or fail; the load average at the start is in every phase line.
Two trees side by side, alternated run by run: `python -m quorumlog.bench.stream_ab`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

VALUE_BYTES = 100
CLUSTER_ID = "bench-stream"


def emit(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(line, sort_keys=True), flush=True)
    else:
        print("  ".join(f"{key}={value}" for key, value in line.items()), flush=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def create_topic(
    endpoints: list[str], name: str, partitions: int, cluster_id: str = CLUSTER_ID
) -> None:
    from quorumlog import Admin
    from quorumlog.errors import QuorumLogError

    admin = Admin(endpoints, cluster_id=cluster_id)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_topic(name, partitions=partitions, replication=3)
            break
        except QuorumLogError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the cluster is still electing its metadata leader
    admin.close()


def produce(
    endpoints: list[str], topic: str, records: int, partitions: int, cluster_id: str = CLUSTER_ID
) -> float:
    """Seconds from the first send to the last acknowledgement of `records` records."""
    from quorumlog import Producer

    producer = Producer(endpoints, cluster_id=cluster_id)
    value = b"x" * VALUE_BYTES
    for partition in range(partitions):
        producer.send(topic, value, partition=partition).result(timeout=30)  # warm routes
    started = time.perf_counter()
    futures = [
        producer.send(topic, value, partition=number % partitions) for number in range(records)
    ]
    producer.flush()
    elapsed = time.perf_counter() - started
    failed = sum(1 for future in futures if future.exception() is not None)
    producer.close()
    if failed:
        raise RuntimeError(f"{failed} of {records} records failed")
    return elapsed


def consume(endpoints: list[str], topic: str, end_offset: int) -> tuple[int, float]:
    from quorumlog import Consumer

    consumer = Consumer(endpoints, cluster_id=CLUSTER_ID)
    started = time.perf_counter()
    offset = 0
    count = 0
    deadline = started + 60
    while offset < end_offset:
        records = consumer.read(topic, 0, offset, 50_000)
        if not records:
            # A follower may answer, and it serves what it has applied, which can trail
            # the leader's acknowledgement by a moment: ask again.
            if time.perf_counter() > deadline:
                raise RuntimeError(f"read {count} of {end_offset} records in 60 s")
            time.sleep(0.001)
            continue
        count += len(records)
        offset = records[-1].offset + 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return count, elapsed


SPARK_READ_RUNS = 5
SPARK_READ_STEADY_FROM = 2
"""Runs from this index on (0-based) count toward the steady figure."""


def spark_read(endpoints: list[str], topic: str) -> tuple[int, list[float]]:
    """The count and the seconds of each of `SPARK_READ_RUNS` counts in one session."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import quorumlog.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("quorumlog-bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        quorumlog.spark.register(session)
        times: list[float] = []
        count = 0
        for _ in range(SPARK_READ_RUNS):
            frame = (
                session.read.format("quorumlog")
                .option("endpoints", ",".join(endpoints))
                .option("clusterId", CLUSTER_ID)
                .option("topic", topic)
                .option("startingOffsets", "earliest")
                .load()
            )
            started = time.perf_counter()
            count = frame.count()
            times.append(time.perf_counter() - started)
        return count, times
    finally:
        session.stop()


def run_stream_benchmark(
    as_json: bool, records: int, spark_records: int, directory: str | None, skip_spark: bool
) -> None:
    from quorumlog.cli.node_commands import start_dev_cluster, stop_dev_cluster

    base = tempfile.mkdtemp(prefix="quorumlog-bench-stream-", dir=directory)
    summary: dict[str, Any] = {}
    try:
        state = start_dev_cluster(base, 3, CLUSTER_ID)
        endpoints = str(state["endpoints"]).split(",")
        create_topic(endpoints, "bench-produce", 1)
        load = load_average()
        elapsed = produce(endpoints, "bench-produce", records, 1)
        summary["produce_records_per_s"] = round(records / elapsed)
        emit(
            {
                "phase": "produce",
                "records": records,
                "value_bytes": VALUE_BYTES,
                "partitions": 1,
                "replication": 3,
                "fsync": True,
                "seconds": round(elapsed, 3),
                "produce_records_per_s": summary["produce_records_per_s"],
                "load_average_at_start": load,
            },
            as_json,
        )
        load = load_average()
        count, elapsed = consume(endpoints, "bench-produce", records + 1)  # + the warm-up
        summary["consume_records_per_s"] = round(count / elapsed)
        emit(
            {
                "phase": "consume",
                "records": count,
                "seconds": round(elapsed, 3),
                "consume_records_per_s": summary["consume_records_per_s"],
                "load_average_at_start": load,
            },
            as_json,
        )
        if not skip_spark:
            create_topic(endpoints, "bench-spark", 4)
            produce(endpoints, "bench-spark", spark_records, 4)
            load = load_average()
            count, times = spark_read(endpoints, "bench-spark")
            expected = spark_records + 4  # and one warm-up record per partition
            if count != expected:
                raise RuntimeError(f"Spark counted {count} of {expected} records")
            steady = statistics.median(times[SPARK_READ_STEADY_FROM:])
            summary["spark_read_records_per_s"] = round(count / steady)
            emit(
                {
                    "phase": "spark-read",
                    "records": count,
                    "partitions": 4,
                    "seconds_cold": round(times[0], 3),
                    "seconds_each_run": [round(seconds, 3) for seconds in times],
                    "spark_read_second_run_records_per_s": round(count / times[1]),
                    "spark_read_records_per_s": summary["spark_read_records_per_s"],
                    "load_average_at_start": load,
                },
                as_json,
            )
    finally:
        stop_dev_cluster(base)
        shutil.rmtree(base, ignore_errors=True)
    emit(summary, as_json)
