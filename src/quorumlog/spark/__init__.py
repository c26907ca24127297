"""PySpark data source and sink for quorumlog streams and the replicated KV.

    import quorumlog.spark

    quorumlog.spark.register(spark)
    df = (
        spark.read.format("quorumlog")
        .option("endpoints", "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
        .option("topic", "events")
        .load()
    )  # key, value, topic, partition, offset, timestamp, timestampType (+ headers)

Formats: `quorumlog` (batch and streaming reads and writes of topics, with the Kafka
source's schema and option names; see `options.py`) and `quorumlog-kv` (the replicated
KV as a (key, value) table). Streaming reads replay micro-batches exactly; writes are
exactly once through idempotent producers (see `sink.py`).
"""

from __future__ import annotations

# Before pyspark: one clear line when the Spark extra is not installed.
import quorumlog.spark.extra_check  # noqa: F401

# isort: split
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from quorumlog.spark.arrow import source_schema
from quorumlog.spark.batch_source import QuorumLogBatchReader
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import DataLossError, OptionError
from quorumlog.spark.kv_source import QuorumLogTableSource
from quorumlog.spark.options import (
    SinkOptions,
    parse_include_headers,
    parse_sink_options,
    parse_source_options,
)
from quorumlog.spark.sink import QuorumLogBatchWriter, QuorumLogStreamWriter, check_sink_schema
from quorumlog.spark.stream_source import QuorumLogStreamReader

__all__ = [
    "DataLossError",
    "OptionError",
    "QuorumLogSource",
    "QuorumLogTableSource",
    "register",
]


class QuorumLogSource(DataSource):
    """The `quorumlog` format: topics as Kafka-shaped rows, read and written."""

    @classmethod
    def name(cls) -> str:
        return "quorumlog"

    def schema(self) -> StructType:
        """Kafka's source schema; the `headers` column only with includeHeaders true."""
        return source_schema(parse_include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return QuorumLogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QuorumLogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        check_append_only(overwrite)
        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        check_sink_cluster(options)
        return QuorumLogBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_append_only(overwrite)
        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        check_sink_cluster(options)
        return QuorumLogStreamWriter(options)


def check_append_only(overwrite: bool) -> None:
    if overwrite:
        raise OptionError(
            "mode", "a topic is append-only: write with .mode('append') (or outputMode append)"
        )


def check_sink_cluster(options: SinkOptions) -> None:
    """Fail on the driver, naming the option, for an unknown topic or unreachable cluster."""
    with ClusterAccess(options.connection, "spark-write-plan") as access:
        if options.topic is None:
            access.list_topics()
        else:
            access.describe_topics([options.topic], "topic")


def register(spark: SparkSession) -> None:
    """Make the `quorumlog` and `quorumlog-kv` formats available in `spark`."""
    spark.dataSource.register(QuorumLogSource)
    spark.dataSource.register(QuorumLogTableSource)
