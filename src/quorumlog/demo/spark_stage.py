"""The demo's Spark side: a quiet local session started (and warmed up) in a thread while
the flights stream in, and the stream job, followed with a progress bar."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from rich.console import Console

from quorumlog.demo import pipeline
from quorumlog.demo.cluster import CLUSTER_ID, DemoCluster
from quorumlog.demo.layout import (
    AIRLINES_TOPIC,
    OUTPUT_TOPIC,
    SPARK_CHECKPOINT_DIRECTORY,
    TOPIC,
)
from quorumlog.demo.pipeline import ClusterConnection, ResultTable
from quorumlog.demo.report import StageClock, progress_bar
from quorumlog.kv.client import KVClient

STREAM_JOB_SECONDS_MAX = 600.0
PROGRESS_POLL_SECONDS = 0.25
MICRO_BATCHES = 3
"""The stream job reads the topic in about this many micro-batches (maxOffsetsPerTrigger),
so the aggregates visibly grow batch by batch; each extra batch costs Spark a second or so."""


class SparkStarter:
    """Starts the Spark session in a thread and, once told (`start_warm_up`), warms it up: the
    airlines go through the sink into their topic and back through the source (the job's
    join reads them from there), and a dry run aggregates a few flights. A fresh JVM spends
    tens of seconds on its first use of each path; here that happens while the flights
    stream in. `ready()` waits for all of it."""

    def __init__(
        self,
        log_path: Path,
        clock: StageClock,
        connection: ClusterConnection,
        master: str | None = None,
    ) -> None:
        self.log_path = log_path
        self.master = master
        self.clock = clock
        self.connection = connection
        self.spark: SparkSession | None = None
        self.airlines: DataFrame | None = None
        self.error: BaseException | None = None
        self.cluster_ready = threading.Event()
        self.airline_names: dict[str, str] = {}
        self.sample_values: list[bytes] = []
        self.abandoned = False
        self.phase = "starting"
        """What the thread is doing now, for the spinner of whoever waits for it."""
        self.thread = threading.Thread(target=self.run, name="demo-spark", daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            self.phase = "starting the JVM and the session"
            with self.clock.stage("start Spark", overlapped=True) as stage:
                spark = self.spark = start_spark(self.log_path, self.master)
                stage.detail = f"{self.master or 'local[2]'}, its log in {self.log_path}"
            self.cluster_ready.wait()
            if self.abandoned:
                return
            self.phase = "warming up (airlines through the sink and the source, a dry run)"
            with self.clock.stage("warm up Spark", overlapped=True) as stage:
                self.airlines = pipeline.load_airlines_topic(
                    spark, self.connection, AIRLINES_TOPIC, self.airline_names
                )
                groups = pipeline.dry_run(spark, self.sample_values, self.airlines)
                stage.detail = (
                    f"airlines through topic {AIRLINES_TOPIC}; dry run of "
                    f"{len(self.sample_values):,} flights -> {groups} groups"
                )
        except BaseException as error:  # handed to the waiting thread by ready()
            self.error = error

    def prepare_warm_up(self, airlines: dict[str, str], sample_values: list[bytes]) -> None:
        self.airline_names = airlines
        self.sample_values = sample_values

    def start_warm_up(self) -> None:
        """Let the warm-up begin (once Spark is up): the topics exist, and every node knows
        them. It waits for the failover to be over because a node that restarted answers
        topic lists from metadata it has not caught up on yet, and the `quorumlog` source
        takes an empty answer for "no such topic". Safe to call more than once."""
        self.cluster_ready.set()

    def ready(self, console: Console) -> tuple[SparkSession, DataFrame]:
        """Wait (with a spinner naming what Spark is doing) until it is started and warm."""
        with console.status("Spark") as status:
            while self.thread.is_alive():
                status.update(f"Spark: {self.phase}")
                self.thread.join(PROGRESS_POLL_SECONDS)
        if self.error is not None:
            raise self.error
        if self.spark is None or self.airlines is None:
            raise RuntimeError("Spark did not start")
        return self.spark, self.airlines

    def stop(self) -> None:
        """Stop the session if it started (also after a failure elsewhere)."""
        self.abandoned = True
        self.cluster_ready.set()
        self.thread.join()
        if self.spark is not None:
            self.spark.stop()
            self.spark = None


def start_spark(log_path: Path, master: str | None = None) -> SparkSession:
    """A session in this process (local), or the driver of an application on `master`:
    its executors must reach the cluster's endpoints and find this Python environment
    (PYSPARK_PYTHON) on their machines, as they do on this one."""
    quiet_spark_warnings()
    # Loopback only: the job is local, and Spark warns when the hostname is a loopback name.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python workers run `python3` from PATH unless told otherwise; the data source
    # code they load lives in this interpreter's environment (a virtualenv, say).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import quorumlog.spark

    with stderr_to(log_path):
        spark = pipeline.build_spark_session(master=master)
    quorumlog.spark.register(spark)
    return spark


def run_stream_job(
    spark: SparkSession,
    cluster: DemoCluster,
    airlines: DataFrame,
    directory: Path,
    expected_records: int,
    console: Console,
) -> ResultTable:
    connection = ClusterConnection(cluster.endpoints, CLUSTER_ID)
    table = pipeline.ResultTable()
    records_per_batch = max(1, -(-expected_records // MICRO_BATCHES))  # rounded up
    stream = pipeline.read_topic_stream(
        spark, connection, TOPIC, {"maxOffsetsPerTrigger": str(records_per_batch)}
    )
    with KVClient(cluster.endpoints, cluster_id=CLUSTER_ID) as kv:
        publisher = pipeline.ClusterPublisher(spark, kv, connection, OUTPUT_TOPIC)
        query = pipeline.start_flight_stats_query(
            stream, airlines, table, publisher, str(directory / SPARK_CHECKPOINT_DIRECTORY)
        )
        try:
            follow_query(query, table, expected_records, console)
        finally:
            if query.isActive:
                query.stop()
    return table


def follow_query(
    query: StreamingQuery, table: ResultTable, expected_records: int, console: Console
) -> None:
    """Show the records aggregated so far until the query stops by itself (availableNow)."""
    deadline = time.monotonic() + STREAM_JOB_SECONDS_MAX
    with progress_bar(console) as progress:
        task = progress.add_task("stream job: aggregated", total=expected_records)
        while query.isActive:
            progress.update(task, completed=table.records_counted())
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stream job did not finish in {STREAM_JOB_SECONDS_MAX}s")
            time.sleep(PROGRESS_POLL_SECONDS)
        progress.update(task, completed=table.records_counted())
    # Raises the query's error, if it failed rather than finished.
    query.awaitTermination()


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `path` for the block. Spark's JVM (and the Python workers
    it forks) inherit the descriptor when they start, so their log lines go to the file for
    the whole run, while ours go back to the terminal after the block."""
    saved = os.dup(2)
    try:
        with open(path, "ab") as log_file:
            os.dup2(log_file.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def quiet_spark_warnings() -> None:
    # pyspark 4 warns that it does not fully support pandas 3 yet; this job uses pandas
    # nowhere near what it warns about, and the warning would clutter the demo's output.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
