"""A checker for stream histories: what producers were told against what consumers read.

Producers record each produce call with a value unique to that call and its outcome:
acknowledged (with the partition and offset the broker gave), unknown (a timeout or a
crash: it may or may not be in the log) or failed (definitely not in the log). Consumers
record every record they read: partition, offset, value. Reads may overlap (several
consumers, re-reads after a rebalance); the same value read twice at the same place is
fine.

What counts as an anomaly:

- lost: an acknowledged value nobody read, although reads covered its acknowledged offset
  (or, with `all_acknowledged_read`, at all: the test drained every partition);
- misplaced: an acknowledged value read, but never at the offset it was acknowledged at;
- duplicate: one value read at two or more places (the log holds it twice);
- conflicting offset: two different values read at one partition and offset;
- gap: an offset never read between the lowest and highest offsets read in a partition;
- unexpected: a value read that no producer produced;
- failed but read: a value whose produce call definitely failed, read from the log.

Unknown produce calls are never anomalies, read or not. The checker is pure: no I/O.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from quorumlog.testing.history import HistoryError

EXAMPLES_MAX_DEFAULT: Final = 5
"""Examples kept per kind of anomaly: enough to start debugging, small enough to print."""


class ProduceStatus(enum.Enum):
    """How a produce call ended, as its producer saw it."""

    ACKNOWLEDGED = "acknowledged"
    UNKNOWN = "unknown"
    FAILED = "failed"


class ProducedRecord(msgspec.Struct, frozen=True):
    """One produce call. `partition` and `offset` are what the broker acknowledged; an
    acknowledged record must have both, the others may have None."""

    value: Any
    """Unique per produce call, and hashable."""
    status: ProduceStatus
    partition: int | None = None
    offset: int | None = None


class ConsumedRecord(msgspec.Struct, frozen=True):
    """One record read by a consumer."""

    partition: int
    offset: int
    value: Any
    consumer_id: int | str | None = None
    """Who read it; shown in examples only."""


class Duplicate(msgspec.Struct, frozen=True):
    """A value read at more than one place."""

    value: Any
    positions: tuple[tuple[int, int], ...]
    """(partition, offset) pairs, sorted."""


class OffsetConflict(msgspec.Struct, frozen=True):
    """Different values read at one place."""

    partition: int
    offset: int
    values: tuple[Any, ...]


class OffsetGap(msgspec.Struct, frozen=True):
    """A run of offsets never read, inside the range read in a partition."""

    partition: int
    first_offset: int
    last_offset: int
    """Inclusive."""


class Misplaced(msgspec.Struct, frozen=True):
    """An acknowledged value read, but not where it was acknowledged."""

    record: ProducedRecord
    positions: tuple[tuple[int, int], ...]


class QueueCheckResult(msgspec.Struct, frozen=True):
    """Counts of every anomaly with a few examples of each; `ok` when there are none."""

    ok: bool
    produced_count: int
    acknowledged_count: int
    unknown_count: int
    failed_count: int
    consumed_count: int
    """Reads, counting re-reads."""
    positions_read_count: int
    """Distinct (partition, offset) pairs read."""
    unknown_read_count: int
    """Unknown produce calls found in the log: not an anomaly, but worth seeing."""
    lost_count: int
    lost_examples: tuple[ProducedRecord, ...]
    misplaced_count: int
    misplaced_examples: tuple[Misplaced, ...]
    duplicate_count: int
    duplicate_examples: tuple[Duplicate, ...]
    conflicting_offset_count: int
    conflicting_offset_examples: tuple[OffsetConflict, ...]
    gap_offset_count: int
    """Offsets missing, summed over every gap."""
    gap_examples: tuple[OffsetGap, ...]
    unexpected_count: int
    unexpected_examples: tuple[ConsumedRecord, ...]
    failed_read_count: int
    failed_read_examples: tuple[ProducedRecord, ...]
    explanation: str


class _Reads:
    """The consumed records indexed both ways."""

    def __init__(self, consumed: Iterable[ConsumedRecord]) -> None:
        self.count = 0
        self.values_at: dict[tuple[int, int], dict[Any, ConsumedRecord]] = {}
        self.positions_of: dict[Any, set[tuple[int, int]]] = {}
        self.offsets_by_partition: dict[int, set[int]] = {}
        for record in consumed:
            if record.offset < 0:
                raise HistoryError(f"a consumed record has a negative offset: {record}")
            self.count += 1
            position = (record.partition, record.offset)
            self.values_at.setdefault(position, {}).setdefault(record.value, record)
            self.positions_of.setdefault(record.value, set()).add(position)
            self.offsets_by_partition.setdefault(record.partition, set()).add(record.offset)

        self.ranges = {
            partition: (min(offsets), max(offsets))
            for partition, offsets in self.offsets_by_partition.items()
        }

    def covers(self, partition: int, offset: int) -> bool:
        """Whether `offset` lies between the lowest and highest offsets read in `partition`."""
        lowest, highest = self.ranges.get(partition, (0, -1))
        return lowest <= offset <= highest


def _index_produced(produced: Iterable[ProducedRecord]) -> dict[Any, ProducedRecord]:
    by_value: dict[Any, ProducedRecord] = {}
    for record in produced:
        if record.value in by_value:
            raise HistoryError(f"value {record.value!r} was produced twice; values must be unique")
        if record.status is ProduceStatus.ACKNOWLEDGED and (
            record.partition is None or record.offset is None
        ):
            raise HistoryError(f"an acknowledged record needs a partition and offset: {record}")
        by_value[record.value] = record
    return by_value


def check_queue(
    produced: Iterable[ProducedRecord],
    consumed: Iterable[ConsumedRecord],
    *,
    all_acknowledged_read: bool = False,
    examples_max: int = EXAMPLES_MAX_DEFAULT,
) -> QueueCheckResult:
    """Compare what producers were told with what consumers read; see the module doc.

    Set `all_acknowledged_read` when consumers read every partition to its end after the
    last acknowledgement: then every acknowledged value nobody read is lost, not only those
    inside the offsets read.
    """
    by_value = _index_produced(produced)
    reads = _Reads(consumed)
    statuses = [record.status for record in by_value.values()]
    acknowledged = [
        record for record in by_value.values() if record.status is ProduceStatus.ACKNOWLEDGED
    ]

    lost = [
        record
        for record in acknowledged
        if record.value not in reads.positions_of
        and (all_acknowledged_read or reads.covers(_partition(record), _offset(record)))
    ]
    misplaced = [
        Misplaced(record, tuple(sorted(reads.positions_of[record.value])))
        for record in acknowledged
        if record.value in reads.positions_of
        and (record.partition, record.offset) not in reads.positions_of[record.value]
    ]
    duplicates = [
        Duplicate(value, tuple(sorted(positions)))
        for value, positions in reads.positions_of.items()
        if len(positions) > 1
    ]
    conflicts = [
        OffsetConflict(partition, offset, tuple(values))
        for (partition, offset), values in sorted(reads.values_at.items())
        if len(values) > 1
    ]
    gaps = _gaps(reads.offsets_by_partition)
    unexpected = [
        record
        for values in reads.values_at.values()
        for value, record in values.items()
        if value not in by_value
    ]
    failed_read = [
        record
        for record in by_value.values()
        if record.status is ProduceStatus.FAILED and record.value in reads.positions_of
    ]
    unknown_read_count = sum(
        1
        for record in by_value.values()
        if record.status is ProduceStatus.UNKNOWN and record.value in reads.positions_of
    )

    def first(items: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(items[:examples_max])

    anomalies: dict[str, Sequence[Any]] = {
        "lost acknowledged records": lost,
        "acknowledged records read at another offset": misplaced,
        "values read at more than one offset": duplicates,
        "offsets read with different values": conflicts,
        "gaps in the offsets read": gaps,
        "values read that were never produced": unexpected,
        "values read whose produce call failed": failed_read,
    }
    return QueueCheckResult(
        ok=not any(anomalies.values()),
        produced_count=len(by_value),
        acknowledged_count=len(acknowledged),
        unknown_count=statuses.count(ProduceStatus.UNKNOWN),
        failed_count=statuses.count(ProduceStatus.FAILED),
        consumed_count=reads.count,
        positions_read_count=len(reads.values_at),
        unknown_read_count=unknown_read_count,
        lost_count=len(lost),
        lost_examples=first(lost),
        misplaced_count=len(misplaced),
        misplaced_examples=first(misplaced),
        duplicate_count=len(duplicates),
        duplicate_examples=first(duplicates),
        conflicting_offset_count=len(conflicts),
        conflicting_offset_examples=first(conflicts),
        gap_offset_count=sum(gap.last_offset - gap.first_offset + 1 for gap in gaps),
        gap_examples=first(gaps),
        unexpected_count=len(unexpected),
        unexpected_examples=first(unexpected),
        failed_read_count=len(failed_read),
        failed_read_examples=first(failed_read),
        explanation=_explain(anomalies, len(by_value), len(acknowledged), reads),
    )


def _partition(record: ProducedRecord) -> int:
    if record.partition is None:
        raise HistoryError(f"an acknowledged record needs a partition: {record}")
    return record.partition


def _offset(record: ProducedRecord) -> int:
    if record.offset is None:
        raise HistoryError(f"an acknowledged record needs an offset: {record}")
    return record.offset


def _gaps(offsets_by_partition: dict[int, set[int]]) -> list[OffsetGap]:
    gaps = []
    for partition in sorted(offsets_by_partition):
        offsets = sorted(offsets_by_partition[partition])
        for lower, upper in itertools.pairwise(offsets):
            if upper > lower + 1:
                gaps.append(OffsetGap(partition, lower + 1, upper - 1))
    return gaps


def _explain(
    anomalies: dict[str, Sequence[Any]], produced_count: int, acknowledged_count: int, reads: _Reads
) -> str:
    summary = (
        f"{produced_count} produced ({acknowledged_count} acknowledged), {reads.count} reads "
        f"at {len(reads.values_at)} offsets"
    )
    found = [
        f"{len(items)} {name}, for example {items[0]!r}"
        for name, items in anomalies.items()
        if items
    ]
    if not found:
        return f"ok: {summary}"
    return f"not ok: {summary}; " + "; ".join(found)
