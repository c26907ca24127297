"""The demo's Spark job: per carrier and month, flights and departure delays, from a stream.

    stream of flight records (value = JSON, see flights.py)
      -> parse_flights            typed columns
      -> aggregate_flights        per (carrier, month): flights, cancelled, mean and p90
                                  departure delay, and two checksums of the flight ids
      -> foreachBatch(publish)    changed groups: named (joined with the airlines),
                                  put in the KV and sent to the output topic

The query is a streaming aggregation in "update" mode with trigger(availableNow=True): it
reads what the topic holds when it starts, in one or more micro-batches, and stops.
Spark keeps the running aggregates in its state store and the source offsets in the
checkpoint, so each record is aggregated once however the input is cut into batches;
each batch hands over only the groups that changed, and the newest row of a group is
its total. What reaches the sinks is idempotent per group (a KV put of the group's key,
a record keyed by the group in the output topic, whose newest record per key wins).

Exactly once, checked rather than assumed: each flight carries `id` (its row number). A
group's rows also hold the sum of the ids and of their squares; over all groups, the count,
the id sum and the id square sum must equal those of 0..N-1. A lost record lowers the
count, a duplicate raises it, and a lost record hidden by a duplicate would have to leave
both sums unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from quorumlog.kv.client import KVClient

FLIGHT_VALUE_SCHEMA = StructType(
    [
        StructField("id", LongType(), nullable=False),
        StructField("month", IntegerType()),
        StructField("carrier", StringType()),
        StructField("dep_delay", IntegerType()),
    ]
)
"""The JSON of a flight record's value (flights.Flight)."""


@dataclass(frozen=True)
class ClusterConnection:
    """Where the cluster is, as the `quorumlog` formats take it."""

    endpoints: list[str]
    cluster_id: str

    def options(self) -> dict[str, str]:
        return {"endpoints": ",".join(self.endpoints), "clusterId": self.cluster_id}


PERCENTILE_ACCURACY = 10_000
"""percentile_approx's accuracy: relative rank error 1/10,000, i.e. exact for groups of
up to 10,000 flights, and within a rank or two beyond (the largest group has ~5,000)."""
RESULT_KEY_PREFIX = "results/flights/"
STATS_RECORD_SCHEMA = StructType(
    [StructField("key", BinaryType(), nullable=False), StructField("value", BinaryType())]
)
"""Records to write to a topic: a key and a value, both bytes."""
STREAM_SOURCE_FORMAT = "quorumlog"


# --- the session ---------------------------------------------------------------------------


def build_spark_session(
    app_name: str = "quorumlog-demo", cores: int = 2, master: str | None = None
) -> SparkSession:
    """A quiet, small session: no UI, no console progress bars, few shuffle partitions.

    `master`: a cluster's master URL (spark://host:port for a standalone cluster), whose
    executors take at most `cores` cores in all; None runs Spark in this process
    (local[cores]). The JVM runs its JIT at tier 1 only: this job is short, and on a
    small machine the full (C2) compiler spends more CPU compiling than it saves,
    doubling start-up."""
    builder = SparkSession.builder.master(master or f"local[{cores}]")
    if master is not None:
        builder = builder.config("spark.cores.max", str(cores)).config(
            "spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        )
    spark = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.sql.streaming.metricsEnabled", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


# --- the transformation, for streams and tables alike ----------------------------------------


def parse_flights(records: DataFrame) -> DataFrame:
    """Records (a binary or string `value` holding a flight's JSON) → one typed column each."""
    parsed = F.from_json(F.col("value").cast("string"), FLIGHT_VALUE_SCHEMA)
    return records.select(parsed.alias("flight")).select("flight.*")


def aggregate_flights(flights: DataFrame) -> DataFrame:
    """Per (carrier, month): flights, cancelled (no departure delay), mean and p90 departure
    delay in minutes over the flights that departed, and the id checksums."""
    identifier = F.col("id").cast("long")
    delay = F.col("dep_delay")
    return flights.groupBy("carrier", "month").agg(
        F.count(F.lit(1)).alias("flights"),
        F.count_if(delay.isNull()).alias("cancelled"),
        F.avg(delay).alias("mean_dep_delay"),
        F.percentile_approx(delay, 0.9, PERCENTILE_ACCURACY).alias("p90_dep_delay"),
        F.sum(identifier).alias("id_sum"),
        F.sum(identifier * identifier).alias("id_square_sum"),
    )


def name_carriers(stats: DataFrame, airlines: DataFrame) -> DataFrame:
    """Adds `carrier_name` from the airlines table (carrier, name); an unknown carrier keeps
    its code as its name rather than losing its rows."""
    named = stats.join(F.broadcast(airlines), on="carrier", how="left")
    return named.withColumn("carrier_name", F.coalesce(F.col("name"), F.col("carrier"))).drop(
        "name"
    )


def airlines_frame(spark: SparkSession, airlines: dict[str, str]) -> DataFrame:
    schema = StructType([StructField("carrier", StringType()), StructField("name", StringType())])
    return spark.createDataFrame(sorted(airlines.items()), schema)


# --- topics as tables, and the warm-up --------------------------------------------------------


def write_topic(frame: DataFrame, connection: ClusterConnection, topic: str) -> None:
    """Append `frame` (key, value) to `topic` through the `quorumlog` sink."""
    (
        frame.write.format(STREAM_SOURCE_FORMAT)
        .mode("append")
        .options(**connection.options())
        .option("topic", topic)
        .save()
    )


def read_topic(spark: SparkSession, connection: ClusterConnection, topic: str) -> DataFrame:
    """All of `topic` now, through the `quorumlog` batch source."""
    return (
        spark.read.format(STREAM_SOURCE_FORMAT)
        .options(**connection.options())
        .option("topic", topic)
        .load()
    )


def load_airlines_topic(
    spark: SparkSession, connection: ClusterConnection, topic: str, airlines: dict[str, str]
) -> DataFrame:
    """Write the airlines (key = carrier code, value = name) to `topic` and read them back:
    the job joins the stream with the names the cluster holds. The newest name of a code
    wins, as in a compacted topic. The result is cached: the join reads it every batch.

    On a fresh JVM, this is also what warms up the sink and the source before the stream
    job (their first use costs seconds of class loading, Python workers and JIT)."""
    rows = [(code.encode(), name.encode()) for code, name in sorted(airlines.items())]
    write_topic(spark.createDataFrame(rows, STATS_RECORD_SCHEMA), connection, topic)
    names = (
        read_topic(spark, connection, topic)
        .groupBy(F.col("key").cast("string"))
        .agg(F.max_by(F.col("value").cast("string"), F.col("offset")).alias("name"))
    )
    table = names.toDF("carrier", "name").cache()
    table.count()
    return table


def dry_run(spark: SparkSession, values: list[bytes], airlines: DataFrame) -> int:
    """The job's transformation, as a batch over a few flight values: checks it before the
    stream starts, and compiles its code (JSON parsing, aggregation, the join) on the way.
    Returns the number of groups."""
    schema = StructType([StructField("value", BinaryType())])
    frame = spark.createDataFrame([(value,) for value in values], schema)
    return len(name_carriers(aggregate_flights(parse_flights(frame)), airlines).collect())


# --- results ---------------------------------------------------------------------------------


class FlightStats(msgspec.Struct, frozen=True):
    """One result: a carrier's flights in one month (the JSON of the KV value and topic)."""

    carrier: str
    carrier_name: str
    month: int
    flights: int
    cancelled: int
    mean_dep_delay: float | None
    """Minutes, over the flights that departed; None if every one was cancelled."""
    p90_dep_delay: int | None

    @property
    def key(self) -> str:
        # The month zero-padded, so a scan of one carrier's keys comes back in month order.
        return f"{self.carrier}/{self.month:02d}"

    @property
    def kv_key(self) -> str:
        return RESULT_KEY_PREFIX + self.key


@dataclass(frozen=True)
class GroupTotals:
    """The checksums that prove exactly once (see the module docstring)."""

    flights: int
    id_sum: int
    id_square_sum: int

    @staticmethod
    def expected(count: int) -> GroupTotals:
        """What ids 0..count-1, each seen once, add up to."""
        return GroupTotals(
            flights=count,
            id_sum=count * (count - 1) // 2,
            id_square_sum=(count - 1) * count * (2 * count - 1) // 6,
        )


def stats_from_row(row: Row) -> FlightStats:
    mean = row["mean_dep_delay"]
    return FlightStats(
        carrier=row["carrier"],
        carrier_name=row["carrier_name"],
        month=int(row["month"]),
        flights=int(row["flights"]),
        cancelled=int(row["cancelled"]),
        mean_dep_delay=None if mean is None else round(float(mean), 2),
        p90_dep_delay=row["p90_dep_delay"],
    )


class ResultTable:
    """The newest row of each group, as the micro-batches hand them over (driver side).

    foreachBatch calls `update` on Spark's streaming thread while the demo's thread reads
    `records_counted` for its progress bar, hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats: dict[str, FlightStats] = {}
        self.totals: dict[str, GroupTotals] = {}
        self.batches = 0
        self.updates = 0
        """Group rows handed over, over all batches: what each sink received."""

    def update(self, rows: Iterable[Row]) -> list[FlightStats]:
        changed = []
        with self.lock:
            for row in rows:
                stats = stats_from_row(row)
                self.stats[stats.key] = stats
                self.totals[stats.key] = GroupTotals(
                    flights=stats.flights,
                    id_sum=int(row["id_sum"]),
                    id_square_sum=int(row["id_square_sum"]),
                )
                changed.append(stats)
            self.batches += 1
            self.updates += len(changed)
        return changed

    def records_counted(self) -> int:
        with self.lock:
            return sum(totals.flights for totals in self.totals.values())

    def total(self) -> GroupTotals:
        with self.lock:
            return GroupTotals(
                flights=sum(totals.flights for totals in self.totals.values()),
                id_sum=sum(totals.id_sum for totals in self.totals.values()),
                id_square_sum=sum(totals.id_square_sum for totals in self.totals.values()),
            )

    def rows(self) -> list[FlightStats]:
        """Sorted by carrier, then month."""
        with self.lock:
            return [self.stats[key] for key in sorted(self.stats)]


Publish = Callable[[list[FlightStats]], None]
"""Sends one micro-batch's changed groups on."""


def make_batch_handler(
    airlines: DataFrame, table: ResultTable, publish: Publish
) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function: name the changed groups, record them, publish them."""

    def handle_batch(batch: DataFrame, batch_id: int) -> None:
        named = name_carriers(batch, airlines).cache()
        try:
            changed = table.update(named.collect())
            if changed:
                publish(changed)
        finally:
            named.unpersist()

    return handle_batch


def encode_stats(stats: FlightStats) -> bytes:
    return msgspec.json.encode(stats)


def decode_stats(value: bytes | str) -> FlightStats:
    return msgspec.json.decode(value, type=FlightStats)


class ClusterPublisher:
    """Puts each changed group in the KV and sends it to the output topic (key = group).

    Both are idempotent per group, which is what makes a replayed micro-batch harmless: a
    put writes the same value again, and the topic's newest record per key is still the
    group's total. The topic write goes through the `quorumlog` sink; the values are encoded
    here, once, so the KV and the topic hold byte-identical JSON."""

    def __init__(
        self, spark: SparkSession, kv: KVClient, connection: ClusterConnection, output_topic: str
    ) -> None:
        self.spark = spark
        self.kv = kv
        self.connection = connection
        self.output_topic = output_topic

    def __call__(self, changed: list[FlightStats]) -> None:
        for stats in changed:
            self.kv.put(stats.kv_key, encode_stats(stats).decode())
        rows = [(stats.key.encode(), encode_stats(stats)) for stats in changed]
        frame = self.spark.createDataFrame(rows, STATS_RECORD_SCHEMA)
        write_topic(frame, self.connection, self.output_topic)


def start_flight_stats_query(
    records: DataFrame,
    airlines: DataFrame,
    table: ResultTable,
    publish: Publish,
    checkpoint_directory: str,
    query_name: str = "flight_stats",
) -> StreamingQuery:
    """Start the streaming aggregation over `records` (a streaming frame with `value`);
    it stops by itself once it has caught up with what was there at its start."""
    stats = aggregate_flights(parse_flights(records))
    writer = (
        stats.writeStream.queryName(query_name)
        .outputMode("update")
        .option("checkpointLocation", checkpoint_directory)
        .trigger(availableNow=True)
        .foreachBatch(make_batch_handler(airlines, table, publish))
    )
    return writer.start()


def read_topic_stream(
    spark: SparkSession,
    connection: ClusterConnection,
    topic: str,
    options: dict[str, str] | None = None,
) -> DataFrame:
    """The topic as a streaming frame (Kafka-like rows: key, value, partition, offset, ...)."""
    return (
        spark.readStream.format(STREAM_SOURCE_FORMAT)
        .options(**connection.options())
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .options(**(options or {}))
        .load()
    )


__all__ = [
    "FLIGHT_VALUE_SCHEMA",
    "ClusterConnection",
    "ClusterPublisher",
    "FlightStats",
    "GroupTotals",
    "ResultTable",
    "aggregate_flights",
    "airlines_frame",
    "build_spark_session",
    "decode_stats",
    "dry_run",
    "encode_stats",
    "load_airlines_topic",
    "make_batch_handler",
    "name_carriers",
    "parse_flights",
    "read_topic",
    "read_topic_stream",
    "start_flight_stats_query",
    "write_topic",
]
