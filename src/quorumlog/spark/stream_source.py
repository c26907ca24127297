"""Streaming reads: `spark.readStream.format("quorumlog")`.

An offset is, per topic partition, the next offset to read (the end, exclusive, of what
earlier micro-batches read), as Kafka-style JSON `{"topic": {"0": 42}}`. Spark writes each
micro-batch's end offset to its checkpoint before running it, so after a restart the
micro-batch is planned again from the same (start, end) pair; `partitions` and `read` are
pure functions of that pair, so the replay reads exactly the same rows.

`latestOffset` never goes past a partition's committed high watermark at planning time,
and never plans more than the read limit (`maxOffsetsPerTrigger`, or what Spark passes).
A partition that appears while the query runs is read from offset 0, as Kafka does: if
retention already removed its first records, that is data loss (see `failOnDataLoss`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from quorumlog.spark.batch_source import (
    FetchSettings,
    OffsetRange,
    check_data_loss,
    plan_ranges,
    read_range,
)
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import DataLossError
from quorumlog.spark.offsets import (
    PartitionBounds,
    PartitionOffsets,
    TopicPartition,
    offsets_from_checkpoint,
    offsets_to_document,
    resolve_spec,
)
from quorumlog.spark.options import SourceOptions

NEW_PARTITION_START = 0


def limit_offsets(
    starts: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> PartitionOffsets:
    """Ends that take at most `limit` records in all, shared in proportion to each
    partition's backlog (as Kafka's `maxOffsetsPerTrigger`); the rounding remainder goes
    to the largest backlogs first, so the total is exactly min(limit, backlog)."""
    backlogs = {key: max(latest[key] - starts[key], 0) for key in latest}
    total = sum(backlogs.values())
    if total <= limit:
        return dict(latest)
    shares = {key: backlog * limit // total for key, backlog in backlogs.items()}
    remainder = limit - sum(shares.values())
    by_leftover = sorted(backlogs, key=lambda key: (-(backlogs[key] - shares[key]), key))
    for key in by_leftover[:remainder]:
        shares[key] += 1
    return {key: starts[key] + shares[key] for key in latest}


class QuorumLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; reads one offset range per task."""

    def __init__(self, options: SourceOptions) -> None:
        # Spark also builds a reader only to ship `read` to executors: keep this cheap and
        # offline; the cluster is dialled at the first planning call.
        self.options = options
        self.settings = FetchSettings(options)
        self.access: ClusterAccess | None = None
        self.available_now_target: PartitionOffsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["access"] = None  # sockets stay in the process that opened them
        return state

    def cluster(self) -> ClusterAccess:
        if self.access is None:
            self.access = ClusterAccess(self.options.connection, "spark-stream")
        return self.access

    def current_bounds(self) -> dict[TopicPartition, PartitionBounds]:
        access = self.cluster()
        keys = access.topic_partitions(self.options.topics, self.options.topic_option)
        return access.bounds_of(keys)

    # --- offsets ----------------------------------------------------------------------

    def initialOffset(self) -> dict[str, dict[str, int]]:
        bounds = self.current_bounds()
        starts = resolve_spec(self.options.starting, bounds, "startingOffsets")
        starts = check_data_loss(starts, bounds, self.options.fail_on_data_loss)
        return offsets_to_document(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(
        self, start: dict[str, dict[str, int]], limit: ReadLimit
    ) -> dict[str, dict[str, int]]:
        starts = offsets_from_checkpoint(start)
        bounds = self.current_bounds()
        self.check_vanished(starts, bounds)
        latest = {key: bound.end for key, bound in bounds.items()}
        if self.available_now_target is not None:
            target = self.available_now_target
            latest = {key: min(end, target[key]) for key, end in latest.items() if key in target}
        full_starts = {key: starts.get(key, NEW_PARTITION_START) for key in latest}
        # Never plan backwards: a partition whose watermark is below our position (only
        # after data loss) keeps its position.
        latest = {key: max(end, full_starts[key]) for key, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = limit_offsets(full_starts, latest, limit.max_rows)
        return offsets_to_document(latest)

    def check_vanished(
        self, starts: PartitionOffsets, bounds: Mapping[TopicPartition, PartitionBounds]
    ) -> None:
        vanished = sorted(set(starts) - set(bounds))
        if vanished and self.options.fail_on_data_loss:
            names = ", ".join(f"{topic}/{partition}" for topic, partition in vanished)
            raise DataLossError(f"partitions {names} no longer exist")

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_target = {key: bound.end for key, bound in self.current_bounds().items()}

    # --- planning and reading ---------------------------------------------------------

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> list[InputPartition]:
        starts = offsets_from_checkpoint(start)
        ends = offsets_from_checkpoint(end)
        full_starts = {key: starts.get(key, NEW_PARTITION_START) for key in ends}
        return list(plan_ranges(full_starts, ends, self.options.max_records_per_partition, None))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return
        with ClusterAccess(self.settings.connection, "spark-read") as access:
            yield from read_range(access, partition, self.settings)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the query's position lives in Spark's checkpoint, not the cluster."""

    def stop(self) -> None:
        if self.access is not None:
            self.access.close()
            self.access = None
