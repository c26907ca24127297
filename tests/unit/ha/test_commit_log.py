"""The HA commit log: byte offsets on MmapLogStore, epoch-bounded reads, truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.storage.mmap_format import entry_size

DATA_FILE_BYTES = 1024
"""Small data files: a few messages already fill one, so blanks pad the ends."""


def open_log(path: Path) -> MmapCommitLog:
    return MmapCommitLog.open(path, data_file_bytes=DATA_FILE_BYTES, index_file_bytes=32 * 64)


def message(number: int, size: int = 100) -> bytes:
    return bytes([number % 251]) * size


def read_all(log: MmapCommitLog, offset: int = 0) -> list[tuple[int, int, int, list[bytes]]]:
    batches = []
    while (batch := log.read_batch(offset, 1 << 20)) is not None:
        batches.append((batch.start_offset, batch.end_offset, batch.epoch, batch.messages))
        offset = batch.end_offset
    return batches


def test_offsets_are_positions_in_the_data_stream_padding_included(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    assert (log.min_offset, log.max_offset, log.last_epoch) == (0, 0, None)
    ends = [log.append([message(number)], epoch=1) for number in range(20)]
    size = entry_size(100)  # 152 bytes: six fit a 1024-byte file, then a blank fills it
    assert ends[:6] == [size * count for count in range(1, 7)]
    assert ends[6] == DATA_FILE_BYTES + size
    assert ends[-1] == log.max_offset == log.store.data_end
    assert [log.store.entry_span(index)[0] for index in (1, 7)] == [0, DATA_FILE_BYTES]
    assert log.last_epoch == 1


def test_two_logs_with_the_same_messages_have_the_same_offsets(tmp_path: Path) -> None:
    first, second = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    sizes = [10, 900, 30, 500, 500, 7, 800, 64]
    first.append([bytes(size) for size in sizes], epoch=1)
    for size in sizes:  # the other one message at a time, as transfers may arrive
        second.append([bytes(size)], epoch=1)
    assert first.max_offset == second.max_offset
    assert read_all(first) == read_all(second)


def test_a_batch_holds_one_epoch_and_about_bytes_max(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    log.append([message(n) for n in range(5)], epoch=1)
    epoch_two_start = log.append([message(n) for n in range(5, 8)], epoch=2)
    log.append([message(8)], epoch=4)
    batches = read_all(log)
    assert [(epoch, len(messages)) for _, _, epoch, messages in batches] == [(1, 5), (2, 3), (4, 1)]
    assert batches[1][0] == batches[0][1]
    assert batches[2][0] == epoch_two_start
    small = log.read_batch(0, 250)
    assert small is not None and len(small.messages) == 2
    one = log.read_batch(0, 1)  # a message larger than bytes_max still goes alone
    assert one is not None and one.messages == [message(0)]
    assert log.read_batch(log.max_offset, 1 << 20) is None


def test_reads_start_only_at_message_boundaries(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    log.append([message(n) for n in range(10)], epoch=1)
    with pytest.raises(InvariantViolation):
        log.read_batch(8, 100)
    with pytest.raises(InvariantViolation):
        log.read_batch(log.max_offset + 8, 100)
    sixth_end = entry_size(100) * 6  # the end of file 1: the next message sits after a blank
    batch = log.read_batch(sixth_end, 100)
    assert batch is not None and batch.messages == [message(6)]


def test_truncate_to_a_boundary_is_durable_and_keeps_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    ends = [log.append([message(n)], epoch=1 if n < 5 else 2) for n in range(12)]
    log.sync()
    with pytest.raises(InvariantViolation):
        log.truncate(ends[3] + 8)
    log.truncate(ends[6])
    assert log.max_offset == ends[6]
    assert log.last_epoch == 2
    assert log.append([message(7)], epoch=3) == ends[7]  # the layout does not depend on epochs
    log.close()
    reopened = open_log(tmp_path / "log")
    assert reopened.max_offset == ends[7]
    assert [epoch for _, _, epoch, _ in read_all(reopened)] == [1, 2, 3]
    reopened.truncate(0)
    assert (reopened.max_offset, reopened.last_epoch) == (0, None)
    assert reopened.truncate_to_last_whole_message() == 0
