"""The stream partition state machine: offsets, idempotent producers, retention cuts."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from quorumlog.codec.wire import Record, RecordBatch, encode_record_batch
from quorumlog.stream.partition import (
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionMachine,
    ProduceOutcome,
)


def batch(producer: str, sequence: int, count: int, timestamp_ms: int = 1000) -> bytes:
    records = [Record(value=f"{producer}-{sequence + i:08d}".encode()) for i in range(count)]
    return encode_record_batch(
        RecordBatch(
            producer_id=producer, base_sequence=sequence, timestamp_ms=timestamp_ms, records=records
        )
    )


def test_offsets_are_contiguous_from_zero_across_producers() -> None:
    machine = PartitionMachine()
    assert machine.apply(1, batch("a", 0, 3)) == ProduceOutcome(base_offset=0, count=3)
    assert machine.apply(2, batch("b", 0, 2)) == ProduceOutcome(base_offset=3, count=2)
    assert machine.apply(3, batch("a", 3, 1)) == ProduceOutcome(base_offset=5, count=1)
    assert machine.next_offset == 6
    assert machine.batches_from(0, 100, 1 << 20) == [(1, 0), (2, 3), (3, 5)]
    assert machine.batches_from(4, 100, 1 << 20) == [(2, 3), (3, 5)]
    assert machine.batches_from(6, 100, 1 << 20) == []


def test_a_retried_batch_gets_its_original_offsets_and_writes_nothing() -> None:
    machine = PartitionMachine()
    machine.apply(1, batch("a", 0, 3))
    machine.apply(2, batch("b", 0, 2))
    retried = machine.apply(3, batch("a", 0, 3))
    assert retried == ProduceOutcome(base_offset=0, count=3, duplicate=True)
    assert machine.next_offset == 5
    assert [i for i, _ in machine.batches_from(0, 100, 1 << 20)] == [1, 2]


def test_a_sequence_gap_is_refused_and_changes_nothing() -> None:
    machine = PartitionMachine()
    machine.apply(1, batch("a", 0, 3))
    outcome = machine.apply(2, batch("a", 5, 1))
    assert isinstance(outcome, OutOfOrderSequenceError)
    assert machine.next_offset == 3
    assert machine.apply(3, batch("a", 3, 1)) == ProduceOutcome(base_offset=3, count=1)


def test_reading_outside_the_partition_is_a_clear_error() -> None:
    machine = PartitionMachine()
    machine.apply(1, batch("a", 0, 3))
    with pytest.raises(OffsetOutOfRangeError):
        machine.batches_from(4, 10, 1 << 20)
    with pytest.raises(OffsetOutOfRangeError):
        machine.batches_from(-1, 10, 1 << 20)


def test_retention_by_size_cuts_at_a_checkpoint_and_reads_below_fail() -> None:
    machine = PartitionMachine(checkpoint_entries=2)
    for index in range(1, 11):
        machine.apply(index, batch("a", (index - 1) * 10, 10))
    size = machine.batch_bytes[0]
    checkpoint = machine.retention_cut(now_ms=0, retention_bytes=size * 3, retention_ms=-1)
    assert checkpoint is not None
    assert checkpoint.index <= 7  # at least the 3 newest batches stay
    machine.forget_below(checkpoint)
    assert machine.retained_bytes == sum(machine.batch_bytes)
    assert machine.begin_offset == checkpoint.next_offset == checkpoint.index * 10
    with pytest.raises(OffsetOutOfRangeError):
        machine.batches_from(checkpoint.next_offset - 1, 10, 1 << 20)
    assert machine.batches_from(machine.begin_offset, 1000, 1 << 30)[0][1] == machine.begin_offset


def test_retention_by_age_keeps_young_batches() -> None:
    machine = PartitionMachine(checkpoint_entries=1)
    for index in range(1, 6):
        machine.apply(index, batch("a", index - 1, 1, timestamp_ms=index * 1000))
    checkpoint = machine.retention_cut(now_ms=5500, retention_bytes=-1, retention_ms=2000)
    assert checkpoint is not None and checkpoint.index == 3  # batches at 1s, 2s, 3s expired
    assert machine.retention_cut(now_ms=0, retention_bytes=-1, retention_ms=2000) is None


def test_a_replica_restored_from_a_checkpoint_continues_identically() -> None:
    """What a follower behind the retention cut gets: state at the cut, then the log."""
    leader = PartitionMachine(checkpoint_entries=3)
    entries = [(i, batch("p" + str(i % 3), (i - 1) // 3 * 2, 2)) for i in range(1, 13)]
    for index, data in entries:
        leader.apply(index, data)
    checkpoint = leader.checkpoint_at_or_below(7)
    follower = PartitionMachine(checkpoint_entries=3)
    follower.restore(leader.encode_checkpoint(checkpoint))
    for index, data in entries:
        if index > checkpoint.index:
            follower.apply(index, data)
    assert follower.next_offset == leader.next_offset
    assert follower.producers == leader.producers
    retried = batch("p1", 0, 2)
    assert follower.apply(100, retried) == leader.apply(100, retried)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 5), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_every_record_gets_exactly_one_offset_whatever_the_retries(
    steps: list[tuple[str, int, bool]],
) -> None:
    """Model: producers send batches and sometimes retry the last one; each record must be
    written once, and offsets must count records with no gap."""
    machine = PartitionMachine()
    next_sequence: dict[str, int] = {}
    last_batch: dict[str, tuple[int, int, int]] = {}
    index = 0
    written = 0
    for producer, count, retry in steps:
        index += 1
        if retry and producer in last_batch:
            sequence, last_count, base_offset = last_batch[producer]
            outcome = machine.apply(index, batch(producer, sequence, last_count))
            assert outcome == ProduceOutcome(
                base_offset=base_offset, count=last_count, duplicate=True
            )
            continue
        sequence = next_sequence.get(producer, 0)
        outcome = machine.apply(index, batch(producer, sequence, count))
        assert isinstance(outcome, ProduceOutcome) and not outcome.duplicate
        assert outcome.base_offset == written
        written += count
        next_sequence[producer] = sequence + count
        last_batch[producer] = (sequence, count, outcome.base_offset)
    assert machine.next_offset == written


def test_a_replay_older_than_the_remembered_batches_is_not_written_again() -> None:
    """A restarted Spark task resends every batch of its task under the same producer id."""
    machine = PartitionMachine()
    for sequence in range(0, 40, 4):
        machine.apply(sequence // 4 + 1, batch("task", sequence, 4))
    assert machine.next_offset == 40
    replay = machine.apply(100, batch("task", 0, 4))
    assert replay == ProduceOutcome(base_offset=-1, count=4, duplicate=True)
    straddling = machine.apply(101, batch("task", 38, 4))
    assert isinstance(straddling, OutOfOrderSequenceError)
    assert machine.next_offset == 40


def test_checkpoints_stay_bounded_and_keep_the_oldest() -> None:
    machine = PartitionMachine(checkpoint_entries=1)
    for index in range(1, 1001):
        machine.apply(index, batch("a", index - 1, 1))
    assert len(machine.checkpoints) <= 65
    assert machine.checkpoints[0].index == 0
    indexes = [c.index for c in machine.checkpoints]
    assert indexes == sorted(indexes) and indexes[-1] == 1000
