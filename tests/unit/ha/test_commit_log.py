"""The HA commit logs: byte offsets on MmapLogStore (padded) and on SegmentLogStore (dense,
on the simulator's disk), epoch-bounded reads, truncation. The contract tests run on both."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumlog.ha.commit_log import CommitLog, CommitLogBatch, MmapCommitLog
from quorumlog.ha.segment_commit_log import DENSE_LAYOUT, SegmentCommitLog
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.storage.mmap_format import entry_size
from quorumlog.storage.segment_format import ENTRY_HEADER_BYTES
from quorumlog.testing.sim.filesystem import SimFileSystem

DATA_FILE_BYTES = 1024
"""Small data files: a few messages already fill one, so blanks pad the ends."""

LogOpener = Callable[[Path], CommitLog]


def open_log(path: Path) -> MmapCommitLog:
    return MmapCommitLog.open(path, data_file_bytes=DATA_FILE_BYTES, index_file_bytes=32 * 64)


@pytest.fixture(params=["mmap", "segment"])
def opener(request: pytest.FixtureRequest) -> LogOpener:
    """Opens a commit log of either kind at a path (reopening finds what was written)."""
    if request.param == "mmap":
        return open_log
    disk = SimFileSystem(random.Random(7))

    def open_segment_log(path: Path) -> CommitLog:
        # Small segments, so the logs of these tests span several files.
        return SegmentCommitLog.open(path, segment_bytes_max=600, file_system=disk)

    return open_segment_log


def message(number: int, size: int = 100) -> bytes:
    return bytes([number % 251]) * size


def read_all(log: CommitLog, offset: int = 0) -> list[tuple[int, int, int, list[bytes]]]:
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


def test_dense_offsets_are_entry_positions_across_segments(tmp_path: Path) -> None:
    disk = SimFileSystem(random.Random(3))
    log = SegmentCommitLog.open(tmp_path / "log", segment_bytes_max=500, file_system=disk)
    assert (log.min_offset, log.max_offset, log.last_epoch) == (0, 0, None)
    assert log.data_file_bytes == DENSE_LAYOUT
    ends = [log.append([message(number)], epoch=1) for number in range(20)]
    size = ENTRY_HEADER_BYTES + 100
    assert ends == [size * count for count in range(1, 21)]
    assert log.store.segment_count > 1
    log.sync()
    log.close()
    reopened = SegmentCommitLog.open(tmp_path / "log", segment_bytes_max=500, file_system=disk)
    assert reopened.max_offset == ends[-1]
    batch = CommitLogBatch(ends[9], ends[10], 1, [message(10)])
    assert reopened.read_batch(ends[9], 100) == batch


def test_two_logs_with_the_same_messages_have_the_same_offsets(
    tmp_path: Path, opener: LogOpener
) -> None:
    first, second = opener(tmp_path / "a"), opener(tmp_path / "b")
    sizes = [10, 900, 30, 500, 500, 7, 800, 64]
    first.append([bytes(size) for size in sizes], epoch=1)
    for size in sizes:  # the other one message at a time, as transfers may arrive
        second.append([bytes(size)], epoch=1)
    assert first.max_offset == second.max_offset
    assert read_all(first) == read_all(second)


def test_a_batch_holds_one_epoch_and_about_bytes_max(tmp_path: Path, opener: LogOpener) -> None:
    log = opener(tmp_path / "log")
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


def test_reads_start_only_at_message_boundaries(tmp_path: Path, opener: LogOpener) -> None:
    log = opener(tmp_path / "log")
    ends = [log.append([message(n)], epoch=1) for n in range(10)]
    with pytest.raises(InvariantViolation):
        log.read_batch(8, 100)
    with pytest.raises(InvariantViolation):
        log.read_batch(log.max_offset + 8, 100)
    # The mmap log's sixth message ends its first data file: the next sits after a blank.
    batch = log.read_batch(ends[5], 100)
    assert batch is not None and batch.messages == [message(6)]


def test_truncate_to_a_boundary_is_durable_and_keeps_offsets(
    tmp_path: Path, opener: LogOpener
) -> None:
    log = opener(tmp_path / "log")
    ends = [log.append([message(n)], epoch=1 if n < 5 else 2) for n in range(12)]
    log.sync()
    with pytest.raises(InvariantViolation):
        log.truncate(ends[3] + 8)
    log.truncate(ends[6])
    assert log.max_offset == ends[6]
    assert log.last_epoch == 2
    assert log.append([message(7)], epoch=3) == ends[7]  # the layout does not depend on epochs
    log.close()
    reopened = opener(tmp_path / "log")
    assert reopened.max_offset == ends[7]
    assert [epoch for _, _, epoch, _ in read_all(reopened)] == [1, 2, 3]
    reopened.truncate(0)
    assert (reopened.max_offset, reopened.last_epoch) == (0, None)
    assert reopened.truncate_to_last_whole_message() == 0


def test_reads_of_the_latest_appends_match_a_reopened_log(tmp_path: Path) -> None:
    """The master's transfers read what it just appended from memory; what they get must
    be what the files hold, across blanks, epochs and byte bounds."""
    log = open_log(tmp_path / "log")
    for number in range(30):
        log.append([message(number, 40 + number * 7)], epoch=1 + number // 12)
    log.append([message(number, 60) for number in range(5)], epoch=3)
    offsets = [0]
    while (batch := log.read_batch(offsets[-1], 1)) is not None:
        offsets.append(batch.end_offset)
    expected = {}
    reopened = open_log(tmp_path / "copy")
    for offset in offsets[:-1]:
        for bytes_max in (1, 300, 1 << 20):
            batch = log.read_batch(offset, bytes_max)
            assert batch is not None
            expected[(offset, bytes_max)] = batch
    log.close()
    reopened.close()
    log = open_log(tmp_path / "log")  # nothing in memory now: every read is from the files
    for (offset, bytes_max), batch in expected.items():
        assert log.read_batch(offset, bytes_max) == batch


def test_a_truncation_forgets_the_latest_appends(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    ends = [log.append([message(number)], epoch=1) for number in range(4)]
    log.truncate(ends[1])
    with pytest.raises(InvariantViolation):
        log.read_batch(ends[2], 1 << 20)  # past the end now: not served from memory
    log.append([message(9)], epoch=2)
    batch = log.read_batch(ends[1], 1 << 20)
    assert batch is not None and (batch.epoch, batch.messages) == (2, [message(9)])


# --- durability: a captured sync claims only what it captured ----------------------------


def test_a_captured_sync_claims_what_it_covered_once_finished(
    opener: LogOpener, tmp_path: Path
) -> None:
    log = opener(tmp_path / "log")
    first_end = log.append([message(1), message(2)], epoch=1)
    captured = log.begin_sync()
    second_end = log.append([message(3)], epoch=1)  # during the sync: left for the next
    assert log.durable_offset == 0
    captured.run()
    assert log.durable_offset == 0  # not before the finish is handed back
    assert log.finish_sync(captured, None) == first_end == log.durable_offset
    follow_up = log.begin_sync()
    follow_up.run()
    assert log.finish_sync(follow_up, None) == second_end
    log.close()


def test_a_truncation_during_a_sync_leaves_it_nothing_to_claim(
    opener: LogOpener, tmp_path: Path
) -> None:
    log = opener(tmp_path / "log")
    log.append([message(1)], epoch=1)
    log.sync()
    kept = log.max_offset
    log.append([message(2), message(3)], epoch=1)
    captured = log.begin_sync()
    log.truncate(kept)
    captured.run()
    assert log.finish_sync(captured, None) <= kept
    log.sync()
    assert log.durable_offset == log.max_offset == kept
    log.close()


def test_a_failed_sync_claims_nothing(opener: LogOpener, tmp_path: Path) -> None:
    log = opener(tmp_path / "log")
    log.append([message(1)], epoch=1)
    captured = log.begin_sync()
    assert log.finish_sync(captured, OSError(5, "Input/output error")) == 0
    log.close()
