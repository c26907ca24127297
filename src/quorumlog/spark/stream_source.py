"""Streaming reads: `spark.readStream.format("quorumlog")`.

An offset is, per topic partition, the next offset to read (the end, exclusive, of what
earlier micro-batches read), as Kafka-style JSON `{"topic": {"0": 42}}`. Spark writes each
micro-batch's end offset to its checkpoint before running it, so after a restart the
micro-batch is planned again from the same (start, end) pair; `partitions` and `read` are
pure functions of that pair, so the replay reads exactly the same rows.

`latestOffset` never goes past a partition's committed high watermark at planning time,
and never plans more than the read limit (`maxOffsetsPerTrigger`, or what Spark passes).
With `minOffsetsPerTrigger` it plans nothing (Spark then runs no micro-batch) until that
many records wait or `maxTriggerDelay` has passed since the last micro-batch; unlike
Kafka's source, whose clock starts at zero, the first micro-batch waits as well (the
clock starts when the query plans first). `reportLatestOffset` hands Spark the
watermarks seen at the last planning, so query progress shows how far the query lags.

A partition that appears while the query runs (a new partition, or a new topic matching
`subscribePattern`) is read from offset 0, as Kafka does: if retention already removed its
first records, that is data loss (see `failOnDataLoss`).

A micro-batch's tasks (offset ranges) depend only on its (start, end) and the options
`maxRecordsPerPartition` and `minPartitions`: a query restarted with other values of
those replans a pending micro-batch into other tasks, and a sink that deduplicates by
task (ours does) may then write part of it twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from quorumlog.spark.batch_source import (
    FetchSettings,
    OffsetRange,
    check_data_loss,
    plan_ranges,
    read_range,
    resolve_offsets,
)
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import DataLossError
from quorumlog.spark.offsets import (
    PartitionBounds,
    PartitionOffsets,
    TopicPartition,
    offsets_from_checkpoint,
    offsets_to_document,
)
from quorumlog.spark.options import SourceOptions
from quorumlog.spark.shared_access import borrowed_access

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
        self.latest_seen: PartitionOffsets | None = None
        """Every partition's watermark at the last planning (reportLatestOffset)."""
        self.last_trigger_seconds: float | None = None
        """When the last micro-batch was planned (by `clock`), for minOffsetsPerTrigger."""
        self.clock: Callable[[], float] = time.monotonic

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
        return access.bounds_of(access.selected_partitions(self.options.selection))

    # --- offsets ----------------------------------------------------------------------

    def initialOffset(self) -> dict[str, dict[str, int]]:
        options = self.options
        bounds = self.current_bounds()
        starts = resolve_offsets(
            self.cluster(),
            options.starting,
            bounds,
            options.starting_option,
            options.starting_none_found,
        )
        starts = check_data_loss(starts, bounds, options.fail_on_data_loss)
        return offsets_to_document(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        """ReadMinRows with minOffsetsPerTrigger (maxOffsetsPerTrigger, if also given, is
        applied from the options: Python sources cannot hand Spark a composite limit)."""
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self.latest_seen is None else offsets_to_document(self.latest_seen)

    def latestOffset(
        self, start: dict[str, dict[str, int]], limit: ReadLimit
    ) -> dict[str, dict[str, int]]:
        starts = offsets_from_checkpoint(start)
        bounds = self.current_bounds()
        self.check_vanished(starts, bounds)
        latest = {key: bound.end for key, bound in bounds.items()}
        self.latest_seen = dict(latest)
        if self.available_now_target is not None:
            target = self.available_now_target
            latest = {key: min(end, target[key]) for key, end in latest.items() if key in target}
        full_starts = {key: starts.get(key, NEW_PARTITION_START) for key in latest}
        # Never plan backwards: a partition whose watermark is below our position (only
        # after data loss) keeps its position.
        latest = {key: max(end, full_starts[key]) for key, end in latest.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if isinstance(limit, ReadMinRows):
            if self.too_few_yet(full_starts, latest, limit.min_rows):
                return start  # Spark runs no micro-batch for an unchanged offset
            max_rows = self.options.max_offsets_per_trigger
        if max_rows is not None:
            latest = limit_offsets(full_starts, latest, max_rows)
        return offsets_to_document(latest)

    def too_few_yet(
        self, starts: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], rows: int
    ) -> bool:
        """True: wait for more records (fewer than `rows` wait and `maxTriggerDelay` has not
        passed since the last micro-batch). Never waits for an availableNow query, which
        must end."""
        now = self.clock()
        if self.last_trigger_seconds is None:
            self.last_trigger_seconds = now
        waited = now - self.last_trigger_seconds
        backlog = sum(max(latest[key] - starts[key], 0) for key in latest)
        if (
            self.available_now_target is None
            and backlog < rows
            and waited < self.options.max_trigger_delay_seconds
        ):
            return True
        self.last_trigger_seconds = now
        return False

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
        options = self.options
        return list(
            plan_ranges(
                full_starts, ends, options.max_records_per_partition, options.min_partitions
            )
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return
        with borrowed_access(self.settings.connection, "spark-read") as access:
            yield from read_range(access, partition, self.settings)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the query's position lives in Spark's checkpoint, not the cluster."""

    def stop(self) -> None:
        if self.access is not None:
            self.access.close()
            self.access = None
