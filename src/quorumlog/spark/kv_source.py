"""The replicated KV as a table: `spark.read.format("quorumlog-kv")` gives (key, value).

Keys come in key order, a page (`pageSize` keys) per KVScan request, from `startKey`
(inclusive) to `endKey` (exclusive; none: to the last key). Reads are linearizable page by
page (each page is read at the leader) unless `stale` is true; the table as a whole is not
one snapshot: a key written during the scan may or may not show, as with any paged scan.
One Spark partition reads the whole range, since key spread is unknown before reading.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from quorumlog.spark.arrow import TABLE_SPARK_SCHEMA, table_batch
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.options import TableOptions, parse_table_options


class KeyRange(InputPartition):
    def __init__(self, start: str, end: str | None) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class QuorumLogTableReader(DataSourceReader):
    def __init__(self, options: TableOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [KeyRange(self.options.start_key, self.options.end_key)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KeyRange):
            return
        options = self.options
        with ClusterAccess(options.connection, "spark-kv") as access:
            start: str | None = partition.start
            while start is not None:
                page = access.scan(start, partition.end, options.page_size, options.stale)
                if page.items:
                    yield table_batch(page.items)
                start = page.next_start


class QuorumLogTableSource(DataSource):
    """The `quorumlog-kv` format (read only)."""

    @classmethod
    def name(cls) -> str:
        return "quorumlog-kv"

    def schema(self) -> StructType:
        parse_table_options(self.options)  # fail at load() for bad options, not at the action
        return TABLE_SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_table_options(self.options)
        # Dial once on the driver so unreachable endpoints fail here, naming the option.
        with ClusterAccess(options.connection, "spark-kv-plan") as access:
            access.check_reachable()
        return QuorumLogTableReader(options)
