"""The stream checker: each anomaly on its own, clean histories, and simulated logs."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import assume, given, settings

from quorumlog.testing.history import HistoryError
from quorumlog.testing.queue_checker import (
    ConsumedRecord,
    Duplicate,
    Misplaced,
    OffsetConflict,
    OffsetGap,
    ProducedRecord,
    ProduceStatus,
    QueueCheckResult,
    check_queue,
)

ACKNOWLEDGED = ProduceStatus.ACKNOWLEDGED
UNKNOWN = ProduceStatus.UNKNOWN
FAILED = ProduceStatus.FAILED


def acknowledged(value: str, partition: int, offset: int) -> ProducedRecord:
    return ProducedRecord(value, ACKNOWLEDGED, partition, offset)


def read(partition: int, offset: int, value: str, consumer: str = "c1") -> ConsumedRecord:
    return ConsumedRecord(partition, offset, value, consumer)


def clean_history() -> tuple[list[ProducedRecord], list[ConsumedRecord]]:
    produced = [
        acknowledged("a", 0, 0),
        acknowledged("b", 0, 1),
        ProducedRecord("c", UNKNOWN),
        acknowledged("d", 0, 3),
        acknowledged("e", 1, 0),
        ProducedRecord("f", FAILED),
        ProducedRecord("g", UNKNOWN),
    ]
    consumed = [
        read(0, 0, "a"),
        read(0, 1, "b"),
        read(0, 2, "c"),
        read(0, 3, "d"),
        read(1, 0, "e"),
        # A second consumer re-reads part of partition 0: the same values, no anomaly.
        read(0, 1, "b", "c2"),
        read(0, 2, "c", "c2"),
    ]
    return produced, consumed


ANOMALY_COUNTS = (
    "lost_count",
    "misplaced_count",
    "duplicate_count",
    "conflicting_offset_count",
    "gap_offset_count",
    "unexpected_count",
    "failed_read_count",
)


def anomaly_counts(result: QueueCheckResult) -> dict[str, int]:
    counts = {name: getattr(result, name) for name in ANOMALY_COUNTS}
    return {name: count for name, count in counts.items() if count}


def test_a_clean_history_is_ok() -> None:
    produced, consumed = clean_history()
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok
    assert anomaly_counts(result) == {}
    assert (result.produced_count, result.acknowledged_count) == (7, 4)
    assert (result.unknown_count, result.failed_count) == (2, 1)
    assert (result.consumed_count, result.positions_read_count) == (7, 5)
    assert result.unknown_read_count == 1
    assert result.explanation == "ok: 7 produced (4 acknowledged), 7 reads at 5 offsets"


def test_nothing_produced_and_nothing_read_is_ok() -> None:
    assert check_queue([], []).ok


def test_an_acknowledged_record_missing_inside_the_offsets_read_is_lost() -> None:
    produced, consumed = clean_history()
    consumed = [record for record in consumed if record.value != "b"]
    consumed.append(read(0, 1, "x-overwritten"))
    produced.append(ProducedRecord("x-overwritten", UNKNOWN))
    result = check_queue(produced, consumed)
    assert not result.ok
    assert anomaly_counts(result) == {"lost_count": 1}
    assert result.lost_examples == (acknowledged("b", 0, 1),)
    assert "1 lost acknowledged records" in result.explanation


def test_an_unread_acknowledged_record_beyond_the_reads_is_lost_only_after_draining() -> None:
    produced, consumed = clean_history()
    produced.append(acknowledged("late", 1, 1))
    assert check_queue(produced, consumed).ok
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert anomaly_counts(result) == {"lost_count": 1}
    assert result.lost_examples[0].value == "late"


def test_unknown_records_are_never_anomalies_read_or_not() -> None:
    produced, consumed = clean_history()
    produced.append(ProducedRecord("never-seen", UNKNOWN))
    assert check_queue(produced, consumed, all_acknowledged_read=True).ok


def test_a_value_read_at_two_offsets_is_a_duplicate() -> None:
    produced, consumed = clean_history()
    consumed.append(read(0, 4, "a"))
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"duplicate_count": 1}
    assert result.duplicate_examples == (Duplicate("a", ((0, 0), (0, 4))),)


def test_an_unknown_value_read_twice_is_also_a_duplicate() -> None:
    produced, consumed = clean_history()
    consumed.append(read(1, 1, "c"))
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"duplicate_count": 1}


def test_two_values_at_one_offset_conflict() -> None:
    produced, consumed = clean_history()
    consumed.append(read(0, 2, "g", "c3"))
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"conflicting_offset_count": 1}
    assert result.conflicting_offset_examples == (OffsetConflict(0, 2, ("c", "g")),)


def test_offsets_never_read_between_offsets_read_are_gaps() -> None:
    produced = [acknowledged(f"v{offset}", 0, offset) for offset in range(10)]
    kept = {0, 1, 5, 9}
    consumed = [read(0, offset, f"v{offset}") for offset in sorted(kept)]
    result = check_queue(produced, consumed, examples_max=1)
    assert result.gap_offset_count == 6
    assert result.gap_examples == (OffsetGap(0, 2, 4),)
    # The acknowledged records in the gaps were not read either: they are lost as well.
    assert result.lost_count == 6


def test_a_gap_with_no_acknowledged_record_in_it_is_still_reported() -> None:
    produced = [ProducedRecord("a", UNKNOWN), ProducedRecord("b", UNKNOWN)]
    consumed = [read(3, 10, "a"), read(3, 12, "b")]
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"gap_offset_count": 1}
    assert result.gap_examples == (OffsetGap(3, 11, 11),)


def test_a_value_nobody_produced_is_unexpected() -> None:
    produced, consumed = clean_history()
    consumed.append(read(1, 1, "ghost", "c9"))
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"unexpected_count": 1}
    assert result.unexpected_examples == (read(1, 1, "ghost", "c9"),)


def test_a_value_whose_produce_failed_must_not_be_read() -> None:
    produced, consumed = clean_history()
    consumed.append(read(1, 1, "f"))
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"failed_read_count": 1}
    assert result.failed_read_examples == (ProducedRecord("f", FAILED),)


def test_an_acknowledged_value_read_at_another_offset_is_misplaced() -> None:
    produced = [acknowledged("a", 0, 0), acknowledged("b", 0, 1)]
    consumed = [read(0, 0, "b"), read(0, 1, "a")]
    result = check_queue(produced, consumed)
    assert anomaly_counts(result) == {"misplaced_count": 2}
    assert result.misplaced_examples[0] == Misplaced(acknowledged("a", 0, 0), ((0, 1),))


def test_examples_are_capped_but_counts_are_not() -> None:
    produced = [acknowledged(f"v{offset}", 0, offset) for offset in range(20)]
    consumed = [read(0, offset, f"v{offset}") for offset in range(20)]
    consumed += [read(0, offset, f"ghost{offset}") for offset in range(20)]
    result = check_queue(produced, consumed, examples_max=3)
    assert result.unexpected_count == 20
    assert len(result.unexpected_examples) == 3
    assert result.conflicting_offset_count == 20
    assert len(result.conflicting_offset_examples) == 3


def test_malformed_input_is_refused() -> None:
    with pytest.raises(HistoryError, match="produced twice"):
        check_queue([ProducedRecord("a", UNKNOWN), ProducedRecord("a", FAILED)], [])
    with pytest.raises(HistoryError, match="needs a partition and offset"):
        check_queue([ProducedRecord("a", ACKNOWLEDGED, 0, None)], [])
    with pytest.raises(HistoryError, match="negative offset"):
        check_queue([], [read(0, -1, "a")])


# --- simulated logs --------------------------------------------------------------------


class Produce(msgspec.Struct, frozen=True):
    partition: int
    outcome: str
    """"acknowledged", "unknown-appended", "unknown-dropped" or "failed"."""


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[ProducedRecord], list[ConsumedRecord]]:
    """A correct broker: each partition is a list; reads are ranges of it."""
    produces = draw(
        st.lists(
            st.builds(
                Produce,
                partition=st.integers(0, 2),
                outcome=st.sampled_from(
                    [
                        "acknowledged",
                        "acknowledged",
                        "unknown-appended",
                        "unknown-dropped",
                        "failed",
                    ]
                ),
            ),
            max_size=40,
        )
    )
    partitions: dict[int, list[str]] = {0: [], 1: [], 2: []}
    produced = []
    for index, produce in enumerate(produces):
        value = f"value-{index}"
        log = partitions[produce.partition]
        if produce.outcome in ("acknowledged", "unknown-appended"):
            log.append(value)
        if produce.outcome == "acknowledged":
            produced.append(acknowledged(value, produce.partition, len(log) - 1))
        else:
            status = FAILED if produce.outcome == "failed" else UNKNOWN
            produced.append(ProducedRecord(value, status))
    consumed = []
    for partition, log in partitions.items():
        # Every partition is drained once from 0, then re-read over a random range.
        consumed += [read(partition, offset, value) for offset, value in enumerate(log)]
        start = draw(st.integers(0, len(log)))
        end = draw(st.integers(start, len(log)))
        consumed += [read(partition, offset, log[offset], "again") for offset in range(start, end)]
    return produced, consumed


@settings(max_examples=100, deadline=None)
@given(logs())
def test_a_correct_broker_is_ok(log: tuple[list[ProducedRecord], list[ConsumedRecord]]) -> None:
    produced, consumed = log
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok, result.explanation


@settings(max_examples=100, deadline=None)
@given(logs(), st.data())
def test_a_read_moved_to_another_value_is_caught(
    log: tuple[list[ProducedRecord], list[ConsumedRecord]], data: st.DataObject
) -> None:
    produced, consumed = log
    values = sorted({record.value for record in consumed})
    assume(len(values) >= 2)
    index = data.draw(st.integers(0, len(consumed) - 1))
    victim = consumed[index]
    other = data.draw(st.sampled_from([value for value in values if value != victim.value]))
    consumed[index] = msgspec.structs.replace(victim, value=other)
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert not result.ok
    # The other value is now read at a second offset: a duplicate. And when the changed read
    # was one of two reads of its offset, that offset now holds two values: a conflict.
    assert result.duplicate_count == 1


@settings(max_examples=100, deadline=None)
@given(logs(), st.data())
def test_an_acknowledged_record_dropped_from_every_read_is_lost(
    log: tuple[list[ProducedRecord], list[ConsumedRecord]], data: st.DataObject
) -> None:
    produced, consumed = log
    acknowledged_values = [record.value for record in produced if record.status is ACKNOWLEDGED]
    assume(acknowledged_values)
    victim = data.draw(st.sampled_from(acknowledged_values))
    consumed = [record for record in consumed if record.value != victim]
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert not result.ok
    assert result.lost_count == 1
    assert result.lost_examples[0].value == victim
