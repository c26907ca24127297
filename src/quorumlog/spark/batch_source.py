"""Batch reads: `spark.read.format("quorumlog")`.

The driver resolves where to start and end (`startingOffsets` / `endingOffsets`, or the
time options) against each partition's bounds once, splits every partition's
[start, end) into offset ranges of at most
`maxRecordsPerPartition` records (more, smaller ones if `minPartitions` asks for more),
and each range becomes one Spark task that fetches exactly its offsets and hands them over
as Arrow batches. `read_range` is shared with the streaming source.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, InputPartition

from quorumlog.codec.wire import FetchResult
from quorumlog.errors import UnavailableError
from quorumlog.raft.invariants import require
from quorumlog.spark.arrow import RecordColumns, StoredEntry, decode_entry, entry_record_count
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import DataLossError, OptionError
from quorumlog.spark.offsets import (
    OffsetSpec,
    PartitionBounds,
    PartitionOffsets,
    TopicPartition,
    resolve_found_times,
    resolve_spec,
    times_to_search,
)
from quorumlog.spark.options import SourceOptions
from quorumlog.spark.range_fetches import RangeFetches
from quorumlog.spark.shared_access import borrowed_access
from quorumlog.stream.client_common import OffsetOutOfRangeError

ARROW_BATCH_ROWS_MAX = 65_536
"""Rows per Arrow batch handed to Spark: large enough to amortise Spark's cost per batch
(10,000 rows read about 10% slower on the 2-core bench machine)."""
ARROW_BATCH_BYTES_MAX = 16 * 1024 * 1024
"""Encoded bytes per Arrow batch, so that batches of large values stay small."""
STALL_PAUSE_SECONDS = 0.02
"""Pause before fetching again when a fetch brought nothing new (a lagging replica)."""


class OffsetRange(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark task's share."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)

    def __len__(self) -> int:
        return self.end - self.start

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRange) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"OffsetRange({self.topic}/{self.partition} [{self.start}, {self.end}))"


def plan_ranges(
    starts: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    max_records_per_partition: int,
    min_partitions: int | None = None,
) -> list[OffsetRange]:
    """Split each partition's [start, end) into ranges of near-equal size.

    Each range holds at most `max_records_per_partition` records; with `min_partitions`,
    ranges shrink until there are at least that many (when there are that many records).
    Empty partitions get no range. The order is by topic, partition, then offset, so the
    same offsets always plan the same ranges (a replayed micro-batch reads the same tasks).
    """
    total = sum(max(ends[key] - starts[key], 0) for key in starts)
    size_max = max_records_per_partition
    if min_partitions is not None and total > 0:
        size_max = min(size_max, max(math.ceil(total / min_partitions), 1))
    ranges: list[OffsetRange] = []
    for key in sorted(starts):
        start, end = starts[key], ends[key]
        count = end - start
        if count <= 0:
            continue
        pieces = math.ceil(count / size_max)
        topic, partition = key
        for piece in range(pieces):
            # Even split: piece boundaries at start + count * i / pieces.
            piece_start = start + count * piece // pieces
            piece_end = start + count * (piece + 1) // pieces
            ranges.append(OffsetRange(topic, partition, piece_start, piece_end))
    return ranges


def check_data_loss(
    starts: PartitionOffsets,
    bounds: Mapping[TopicPartition, PartitionBounds],
    fail_on_data_loss: bool,
) -> PartitionOffsets:
    """Starts moved up to each partition's begin where retention removed the offsets;
    DataLossError instead when `failOnDataLoss` is true."""
    checked: PartitionOffsets = {}
    for key, start in starts.items():
        begin = bounds[key].begin
        if start < begin:
            topic, partition = key
            if fail_on_data_loss:
                raise DataLossError(
                    f"{topic}/{partition}: offsets [{start}, {begin}) are no longer available "
                    f"(the partition now begins at {begin})"
                )
            start = begin
        checked[key] = start
    return checked


class FetchSettings:
    """What a task needs to read a range (picklable; shipped to executors)."""

    def __init__(self, options: SourceOptions) -> None:
        self.connection = options.connection
        self.fail_on_data_loss = options.fail_on_data_loss
        self.fetch_records_max = options.fetch_records_max
        self.fetch_bytes_max = options.fetch_bytes_max
        self.include_headers = options.include_headers


def read_range(
    access: ClusterAccess, offset_range: OffsetRange, settings: FetchSettings
) -> Iterator[pa.RecordBatch]:
    """Exactly the records of `offset_range` (less what retention removed, if allowed).

    The range is fetched in chunks with several fetches in flight (`RangeFetches`), so the
    node serves the next chunks while this task turns an answer into Arrow columns and
    Spark takes them."""
    key = offset_range.topic_partition
    columns = RecordColumns(offset_range.topic, offset_range.partition, settings.include_headers)
    offset, end = offset_range.start, offset_range.end
    if offset >= end:
        return

    def fetch_from(position: int, records_max: int) -> Future[FetchResult]:
        return access.fetch_soon(key, position, records_max, settings.fetch_bytes_max)

    fetches = RangeFetches(offset, end, settings.fetch_records_max, fetch_from)
    stalled_since: float | None = None
    try:
        while offset < end:
            try:
                chunk_start, chunk_end, result = fetches.next_answer()
            except OffsetOutOfRangeError as error:
                offset = skip_lost_offsets(offset_range, offset, error, settings)
                fetches.restart_at(offset)
                continue
            require(chunk_start == offset, "chunk at %d, read up to %d", chunk_start, offset)
            entries, offset = decode_answer(result, offset, chunk_end)
            for base_offset, batch, start, encoded_bytes in entries:
                columns.add_batch(base_offset, batch, start, chunk_end, encoded_bytes)
            if columns.full(ARROW_BATCH_ROWS_MAX, ARROW_BATCH_BYTES_MAX):
                yield columns.take()
            if offset > chunk_start:
                stalled_since = None
                if offset < chunk_end:
                    fetches.ask_again(offset, chunk_end)  # a short answer: the chunk's rest
                continue
            # Nothing new: the node answering lags behind the watermark the range was
            # planned with (a new leader catching up). Ask again until the deadline.
            now = time.monotonic()
            stalled_since = now if stalled_since is None else stalled_since
            if now - stalled_since > settings.connection.timeout_seconds:
                offset = give_up_stalled_range(offset_range, offset, result.end_offset, settings)
                break
            time.sleep(STALL_PAUSE_SECONDS)
            fetches.ask_again(offset, chunk_end)
    finally:
        fetches.cancel()  # fetches still in flight when the reader stops early
    if len(columns):
        yield columns.take()


DecodedEntry = tuple[int, StoredEntry, int, int]
"""(base offset, decoded entry, first offset to take from it, encoded bytes)."""


def decode_answer(result: FetchResult, offset: int, end: int) -> tuple[list[DecodedEntry], int]:
    """The answer's entries decoded, each with the offset to start taking from, and the
    offset after the last record of [offset, end) the answer holds."""
    entries: list[DecodedEntry] = []
    for fetched in result.batches:
        batch = decode_entry(fetched.data)
        entries.append((fetched.base_offset, batch, offset, len(fetched.data)))
        offset = max(offset, min(end, fetched.base_offset + entry_record_count(batch)))
    return entries, offset


def skip_lost_offsets(
    offset_range: OffsetRange, offset: int, error: OffsetOutOfRangeError, settings: FetchSettings
) -> int:
    """`offset` is gone: fail (failOnDataLoss) or go on from the partition's begin."""
    begin, end = error.begin_offset, error.end_offset
    description = (
        f"{offset_range.topic}/{offset_range.partition}: offset {offset} is no longer "
        f"available (the partition now holds [{begin}, {end}))"
    )
    if settings.fail_on_data_loss:
        raise DataLossError(description)
    if offset < begin:
        return min(begin, offset_range.end)
    return offset_range.end  # the partition lost its tail (recreated): nothing more to read


def give_up_stalled_range(
    offset_range: OffsetRange, offset: int, end_offset: int, settings: FetchSettings
) -> int:
    description = (
        f"{offset_range.topic}/{offset_range.partition}: offsets from {offset} were planned "
        f"(up to {offset_range.end}) but the partition ends at {end_offset}"
    )
    if end_offset > offset:
        raise UnavailableError(f"{description}; no records came back in time")
    if settings.fail_on_data_loss:
        raise DataLossError(description)
    return offset_range.end


class QuorumLogBatchReader(DataSourceReader):
    """Plans offset ranges on the driver (at construction); reads one range per task."""

    def __init__(self, options: SourceOptions) -> None:
        self.settings = FetchSettings(options)
        with borrowed_access(options.connection, "spark-plan") as access:
            starts, ends = resolve_batch_offsets(access, options)
        self.ranges = plan_ranges(
            starts, ends, options.max_records_per_partition, options.min_partitions
        )

    def partitions(self) -> list[InputPartition]:
        return list(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return  # Spark's stand-in partition when there is nothing to read
        with borrowed_access(self.settings.connection, "spark-read") as access:
            yield from read_range(access, partition, self.settings)


def resolve_batch_offsets(
    access: ClusterAccess, options: SourceOptions
) -> tuple[PartitionOffsets, PartitionOffsets]:
    """Exact (starts, ends) for every partition read, checked."""
    keys = access.selected_partitions(options.selection)
    bounds = access.bounds_of(keys)
    starts = resolve_offsets(
        access, options.starting, bounds, options.starting_option, options.starting_none_found
    )
    # An ending time that no record reaches means latest, as in Kafka.
    ends = resolve_offsets(access, options.ending, bounds, options.ending_option, "latest")
    starts = check_data_loss(starts, bounds, options.fail_on_data_loss)
    for key in keys:
        if starts[key] > ends[key]:
            topic, partition = key
            raise OptionError(
                options.starting_option,
                f"{topic}/{partition}: starts at {starts[key]}, after the end {ends[key]} "
                f"({options.ending_option})",
            )
    return starts, ends


def resolve_offsets(
    access: ClusterAccess,
    spec: OffsetSpec,
    bounds: Mapping[TopicPartition, PartitionBounds],
    option: str,
    none_found: str,
) -> PartitionOffsets:
    """Exact offsets for every partition of `bounds`: by offset, or by searching times."""
    if not spec.by_time:
        return resolve_spec(spec, bounds, option)
    times_ms = times_to_search(spec, bounds, option)
    found = access.offsets_for_times(times_ms, dict(bounds))
    return resolve_found_times(found, times_ms, bounds, option, none_found)
