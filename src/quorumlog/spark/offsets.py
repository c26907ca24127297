"""Offsets as the Kafka source writes them: JSON `{"topic": {"0": 23, "1": -2}}`.

In a starting or ending offset spec, -2 means "earliest" and -1 means "latest"; every
other value is an exact offset. Resolved offsets (what a batch read plans with, and what
a streaming query checkpoints) hold only exact offsets: for a stream, each partition's
value is the end (exclusive) of what the query has read, the next offset it will read.

Nothing here talks to a cluster: resolving takes each partition's bounds as an argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec

from quorumlog.spark.errors import OptionError

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]
"""(topic, partition)."""

PartitionOffsets = dict[TopicPartition, int]


class PartitionBounds(msgspec.Struct, frozen=True):
    """What a partition holds now: offsets [begin, end); end is the high watermark."""

    begin: int
    end: int


class OffsetSpec(msgspec.Struct, frozen=True):
    """Where a read starts or ends: "earliest", "latest", per partition, or by time."""

    kind: str
    """"earliest", "latest", "specific" (`startingOffsets` JSON), "timestamp" (one time
    for every partition: `startingTimestamp`) or "timestamps" (a time per partition:
    `startingOffsetsByTimestamp`); the same for the ending options."""
    specific: PartitionOffsets = {}
    """For "specific": an offset (or EARLIEST / LATEST) for every partition; for
    "timestamps": a time in milliseconds since the epoch for every partition."""
    timestamp_ms: int = 0
    """For "timestamp": the time for every partition."""

    @property
    def by_time(self) -> bool:
        return self.kind in ("timestamp", "timestamps")


def parse_offset_spec(
    text: str, option: str, allow_earliest: bool = True, allow_latest: bool = True
) -> OffsetSpec:
    """`earliest`, `latest` or Kafka-style JSON; OptionError naming `option` if malformed."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("earliest", "latest"):
        if lowered == "earliest" and not allow_earliest:
            raise OptionError(option, "'earliest' is not allowed here")
        if lowered == "latest" and not allow_latest:
            raise OptionError(option, "'latest' is not allowed here")
        return OffsetSpec(kind=lowered)
    offsets = parse_offsets_json(stripped, option)
    for (topic, partition), offset in offsets.items():
        if offset == EARLIEST and not allow_earliest:
            raise OptionError(option, f"{topic}/{partition}: -2 (earliest) is not allowed here")
        if offset == LATEST and not allow_latest:
            raise OptionError(option, f"{topic}/{partition}: -1 (latest) is not allowed here")
    return OffsetSpec(kind="specific", specific=offsets)


def parse_offsets_json(text: str, option: str) -> PartitionOffsets:
    """{"topic": {"0": 23}} → {("topic", 0): 23}; checks every level, names `option`."""
    expected = 'like {"topic": {"0": 23, "1": -2}}, or earliest / latest'
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(option, f"not valid JSON ({error.msg}); expected {expected}") from None
    if not isinstance(document, dict) or not document:
        raise OptionError(option, f"expected a non-empty JSON object {expected}")
    return offsets_from_document(document, option)


def offsets_from_document(document: Mapping[str, object], option: str) -> PartitionOffsets:
    offsets: PartitionOffsets = {}
    for topic, partitions in document.items():
        if not topic:
            raise OptionError(option, "a topic name is empty")
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(
                option, f"topic {topic!r} must map to a non-empty object of partition: offset"
            )
        for partition_text, offset in partitions.items():
            partition = parse_partition(partition_text, topic, option)
            # bool is an int in Python; JSON true/false as an offset is a mistake.
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise OptionError(
                    option, f"{topic}/{partition}: offset {offset!r} is not an integer"
                )
            if offset < EARLIEST:
                raise OptionError(
                    option,
                    f"{topic}/{partition}: offset {offset} is negative "
                    "(only -2 for earliest and -1 for latest are allowed)",
                )
            offsets[(topic, partition)] = offset
    return offsets


def parse_partition(text: str, topic: str, option: str) -> int:
    if not text.isdigit():
        raise OptionError(
            option, f"topic {topic!r}: partition {text!r} is not a non-negative integer"
        )
    return int(text)


def parse_timestamp(text: str, option: str) -> OffsetSpec:
    """`startingTimestamp` / `endingTimestamp`: milliseconds since the epoch."""
    try:
        timestamp_ms = int(text.strip())
    except ValueError:
        raise OptionError(
            option, f"{text!r} is not a time in milliseconds since the epoch"
        ) from None
    if timestamp_ms < 0:
        raise OptionError(option, f"a time is not negative, got {timestamp_ms}")
    return OffsetSpec(kind="timestamp", timestamp_ms=timestamp_ms)


def parse_timestamps_json(text: str, option: str) -> OffsetSpec:
    """`startingOffsetsByTimestamp` / `endingOffsetsByTimestamp`: {"t": {"0": 1700000000000}}."""
    times = parse_offsets_json(text, option)
    for (topic, partition), timestamp_ms in times.items():
        if timestamp_ms < 0:
            raise OptionError(option, f"{topic}/{partition}: a time is not negative")
    return OffsetSpec(kind="timestamps", specific=times)


# --- the streaming offset form ------------------------------------------------------------


def offsets_to_document(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """The dict Spark checkpoints: sorted, so equal offsets always serialise the same."""
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return document


def offsets_from_checkpoint(document: Mapping[str, object]) -> PartitionOffsets:
    """Offsets Spark hands back (from `offsets_to_document`, maybe via a checkpoint)."""
    offsets = offsets_from_document(document, "checkpointed offsets") if document else {}
    for (topic, partition), offset in offsets.items():
        if offset < 0:
            raise OptionError(
                "checkpointed offsets", f"{topic}/{partition}: {offset} is not an exact offset"
            )
    return offsets


def offsets_to_json(offsets: PartitionOffsets) -> str:
    return json.dumps(offsets_to_document(offsets), sort_keys=True)


# --- resolving against what the cluster holds --------------------------------------------


def resolve_spec(
    spec: OffsetSpec, bounds: Mapping[TopicPartition, PartitionBounds], option: str
) -> PartitionOffsets:
    """Exact offsets for every partition in `bounds`, from `spec`.

    As the Kafka source does, a JSON spec must name exactly the partitions that exist: a
    missing or unknown partition is an error, not a silent default. Offsets past a
    partition's end are errors too (they would wait for data that may never come); offsets
    below its begin are kept, for the caller to treat as data loss (see `failOnDataLoss`).
    """
    if spec.kind == "earliest":
        return {key: bound.begin for key, bound in bounds.items()}
    if spec.kind == "latest":
        return {key: bound.end for key, bound in bounds.items()}
    check_same_partitions(spec.specific, bounds, option)
    resolved: PartitionOffsets = {}
    for key, offset in spec.specific.items():
        bound = bounds[key]
        if offset == EARLIEST:
            resolved[key] = bound.begin
        elif offset == LATEST:
            resolved[key] = bound.end
        elif offset > bound.end:
            topic, partition = key
            raise OptionError(
                option,
                f"{topic}/{partition}: offset {offset} is past the partition's end {bound.end}",
            )
        else:
            resolved[key] = offset
    return resolved


def times_to_search(
    spec: OffsetSpec, bounds: Mapping[TopicPartition, PartitionBounds], option: str
) -> PartitionOffsets:
    """The time to look up in each partition of `bounds`, for a by-time `spec` (whose
    JSON, as `startingOffsets` JSON, must name exactly the partitions read)."""
    if spec.kind == "timestamp":
        return {key: spec.timestamp_ms for key in bounds}
    check_same_partitions(spec.specific, bounds, option)
    return dict(spec.specific)


def resolve_found_times(
    found: Mapping[TopicPartition, int | None],
    times_ms: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, PartitionBounds],
    option: str,
    none_found: str,
) -> PartitionOffsets:
    """Exact offsets from what the time search found in each partition. Where every record
    is older than the time (nothing found): the partition's end when `none_found` is
    "latest", else an OptionError naming `option`, as Kafka's default strategy "error"."""
    resolved: PartitionOffsets = {}
    for key, bound in bounds.items():
        offset = found[key]
        if offset is None:
            if none_found != "latest":
                topic, partition = key
                raise OptionError(
                    option,
                    f"{topic}/{partition} has no record at or after time {times_ms[key]} "
                    "(to start such partitions at their end, set "
                    "startingOffsetsByTimestampStrategy to latest)",
                )
            offset = bound.end
        resolved[key] = offset
    return resolved


def check_same_partitions(
    offsets: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, PartitionBounds],
    option: str,
) -> None:
    missing = sorted(set(bounds) - set(offsets))
    unknown = sorted(set(offsets) - set(bounds))
    if unknown:
        raise OptionError(option, f"no such topic partitions: {describe_partitions(unknown)}")
    if missing:
        raise OptionError(
            option,
            "JSON offsets must name every partition of the topics read; missing: "
            + describe_partitions(missing),
        )


def describe_partitions(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{topic}/{partition}" for topic, partition in partitions)
