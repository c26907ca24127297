"""Fault injection for SegmentLogStore: torn tails, bit flips, crashes mid-truncation, ENOSPC.

A crash is simulated by editing the files the way a power cut could leave them (cutting,
zero-filling, flipping bits) or by making one system call fail in the middle of an operation,
then reopening the directory as a restarted process would.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quorumlog.storage import (
    CorruptLogError,
    DiskFullError,
    LogEntry,
    SegmentLogStore,
    StorageError,
    SyncPolicy,
)
from quorumlog.storage.segment_format import (
    META_FILE_NAME,
    closed_segment_name,
    encode_meta,
    open_segment_name,
)

BIG_SEGMENT_BYTES = 1 << 20
SMALL_SEGMENT_BYTES = 600


def make_entries(first: int, count: int, term: int = 1, size: int = 40) -> list[LogEntry]:
    """Entries whose data has no zero byte, so zeros on disk always mean damage."""
    return [
        LogEntry(index=i, term=term, data=bytes([1 + (i * 7 + j) % 250 for j in range(size)]))
        for i in range(first, first + count)
    ]


def entry_bytes(entry: LogEntry) -> int:
    return 24 + len(entry.data)


def open_store(path: Path, segment_bytes_max: int = BIG_SEGMENT_BYTES) -> SegmentLogStore:
    return SegmentLogStore.open(path, segment_bytes_max=segment_bytes_max)


def segment_files(path: Path) -> list[str]:
    names = os.listdir(path)
    return sorted(name for name in names if name.startswith("log_") and name != META_FILE_NAME)


def write_log(path: Path, entries: list[LogEntry], segment_bytes_max: int) -> None:
    with open_store(path, segment_bytes_max) as store:
        for start in range(0, len(entries), 5):
            store.append(entries[start : start + 5])
            store.sync()


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1 << bit
    path.write_bytes(bytes(raw))


# --- torn tails of the open segment ----------------------------------------------------


def test_cut_at_every_byte_of_the_tail_recovers_the_whole_prefix(tmp_path: Path) -> None:
    entries = make_entries(1, 12, size=30) + make_entries(13, 3, size=7)
    original = tmp_path / "original"
    write_log(original, entries, BIG_SEGMENT_BYTES)
    segment_name = open_segment_name(1)
    full = (original / segment_name).read_bytes()
    ends = []
    position = 0
    for entry in entries:
        position += entry_bytes(entry)
        ends.append(position)
    assert ends[-1] == len(full)

    tail_start = ends[-5]  # the last four entries, cut at each of their bytes
    work = tmp_path / "work"
    for cut in range(tail_start, len(full)):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(original, work)
        (work / segment_name).write_bytes(full[:cut])
        complete = sum(1 for end in ends if end <= cut)
        kept_bytes = ends[complete - 1]
        with open_store(work) as store:
            assert store.last_index == complete, cut
            assert store.entries(1, complete + 1) == entries[:complete]
            assert store.recovery.torn_bytes_dropped == cut - kept_bytes
            assert store.recovery.entries_found == complete
            if cut > kept_bytes:
                assert store.recovery.torn_file == str(work / segment_name)
            # The cut is made on disk too, and the log goes on from there.
            assert (work / segment_name).stat().st_size == kept_bytes
            store.append(entries[complete : complete + 1])
            store.sync()
        with open_store(work) as store:
            assert store.entries(1, complete + 2) == entries[: complete + 1]
            assert store.recovery.torn_bytes_dropped == 0


@pytest.mark.parametrize("zero_bytes", [1, 24, 100, 512])
def test_zero_filled_tail_is_cut_off(tmp_path: Path, zero_bytes: int) -> None:
    entries = make_entries(1, 30, size=50)
    write_log(tmp_path, entries, BIG_SEGMENT_BYTES)
    segment = tmp_path / open_segment_name(1)
    raw = bytearray(segment.read_bytes())
    size = len(raw)
    raw[size - zero_bytes :] = bytes(zero_bytes)
    segment.write_bytes(bytes(raw))
    intact = sum(1 for i in range(30) if (i + 1) * 74 <= size - zero_bytes)
    with open_store(tmp_path) as store:
        assert store.last_index == intact
        assert store.entries(1, intact + 1) == entries[:intact]
        assert store.recovery.torn_bytes_dropped == size - intact * 74


def test_zeros_past_the_last_entry_are_cut_off(tmp_path: Path) -> None:
    """The size reached disk but the data did not: the file ends in a block of zeros."""
    entries = make_entries(1, 10)
    write_log(tmp_path, entries, BIG_SEGMENT_BYTES)
    segment = tmp_path / open_segment_name(1)
    with segment.open("ab") as file:
        file.write(bytes(4096))
    with open_store(tmp_path) as store:
        assert store.last_index == 10
        assert store.recovery.torn_bytes_dropped == 4096
        assert store.entries(1, 11) == entries


def test_zeros_in_the_middle_of_the_open_segment_are_corruption(tmp_path: Path) -> None:
    entries = make_entries(1, 20, size=50)
    write_log(tmp_path, entries, BIG_SEGMENT_BYTES)
    segment = tmp_path / open_segment_name(1)
    raw = bytearray(segment.read_bytes())
    raw[74 * 5 : 74 * 5 + 100] = bytes(100)  # entry 6's header and more, but not the tail
    segment.write_bytes(bytes(raw))
    with pytest.raises(CorruptLogError) as caught:
        open_store(tmp_path)
    assert caught.value.path == str(segment)
    assert caught.value.offset == 74 * 5


# --- bit flips ---------------------------------------------------------------------------


def closed_layout(tmp_path: Path) -> tuple[list[LogEntry], Path]:
    entries = make_entries(1, 60, size=40)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    names = segment_files(tmp_path)
    assert len(names) > 3
    return entries, tmp_path / names[1]


@pytest.mark.parametrize("byte_in_header", [0, 7, 8, 9, 10, 12, 16, 20, 23])
def test_header_bit_flip_in_a_closed_segment_names_file_and_offset(
    tmp_path: Path, byte_in_header: int
) -> None:
    _, segment = closed_layout(tmp_path)
    entry_offset = 64 * 2  # the third entry of the segment (24 + 40 bytes each)
    flip_bit(segment, entry_offset + byte_in_header, bit=3)
    with pytest.raises(CorruptLogError) as caught:
        open_store(tmp_path, SMALL_SEGMENT_BYTES)
    assert caught.value.path == str(segment)
    assert caught.value.offset == entry_offset


def test_data_bit_flip_in_a_closed_segment_fails_the_read(tmp_path: Path) -> None:
    entries, segment = closed_layout(tmp_path)
    flip_bit(segment, 64 * 2 + 24 + 17, bit=5)
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        first_in_segment = int(segment.name.split("_")[1].split("-")[0])
        damaged = first_in_segment + 2
        with pytest.raises(CorruptLogError) as caught:
            store.entry(damaged)
        assert caught.value.path == str(segment)
        assert caught.value.offset == 64 * 2
        with pytest.raises(CorruptLogError):
            store.entries(1, 61)
        assert store.term(damaged) == 1  # terms come from memory
        assert store.entry(damaged + 1) == entries[damaged]


def test_header_bit_flip_in_the_last_entry_of_the_open_segment_is_corruption(
    tmp_path: Path,
) -> None:
    write_log(tmp_path, make_entries(1, 10, size=40), BIG_SEGMENT_BYTES)
    segment = tmp_path / open_segment_name(1)
    flip_bit(segment, 64 * 9 + 4, bit=1)
    with pytest.raises(CorruptLogError) as caught:
        open_store(tmp_path)
    assert (caught.value.path, caught.value.offset) == (str(segment), 64 * 9)


def test_data_bit_flip_in_the_last_entry_of_the_open_segment_is_corruption(
    tmp_path: Path,
) -> None:
    """Not a torn write (no zeros): the entry may have been acknowledged, so never dropped."""
    write_log(tmp_path, make_entries(1, 10, size=40), BIG_SEGMENT_BYTES)
    segment = tmp_path / open_segment_name(1)
    flip_bit(segment, 64 * 9 + 30, bit=6)
    with pytest.raises(CorruptLogError) as caught:
        open_store(tmp_path)
    assert (caught.value.path, caught.value.offset) == (str(segment), 64 * 9)


def test_data_bit_flip_inside_the_open_segment_fails_the_read(tmp_path: Path) -> None:
    entries = make_entries(1, 10, size=40)
    write_log(tmp_path, entries, BIG_SEGMENT_BYTES)
    flip_bit(tmp_path / open_segment_name(1), 64 * 4 + 30)
    with open_store(tmp_path) as store:
        with pytest.raises(CorruptLogError):
            store.entry(5)
        assert store.entry(6) == entries[5]


# --- damage to the layout ----------------------------------------------------------------


def test_missing_middle_segment_is_a_gap(tmp_path: Path) -> None:
    _, segment = closed_layout(tmp_path)
    segment.unlink()
    with pytest.raises(CorruptLogError, match="gap"):
        open_store(tmp_path, SMALL_SEGMENT_BYTES)


def test_closed_segment_whose_name_disagrees_with_its_content(tmp_path: Path) -> None:
    _, segment = closed_layout(tmp_path)
    first, last = (int(part) for part in segment.name[len("log_") :].split("-"))
    segment.rename(tmp_path / closed_segment_name(first, last + 1))
    with pytest.raises(CorruptLogError):
        open_store(tmp_path, SMALL_SEGMENT_BYTES)


def test_overlapping_segments(tmp_path: Path) -> None:
    _, segment = closed_layout(tmp_path)
    first, last = (int(part) for part in segment.name[len("log_") :].split("-"))
    shutil.copy(segment, tmp_path / closed_segment_name(first + 1, last + 1))
    with pytest.raises(CorruptLogError):
        open_store(tmp_path, SMALL_SEGMENT_BYTES)


def test_two_open_segments(tmp_path: Path) -> None:
    write_log(tmp_path, make_entries(1, 5), BIG_SEGMENT_BYTES)
    (tmp_path / open_segment_name(6)).write_bytes(b"")
    with pytest.raises(CorruptLogError, match="open segments"):
        open_store(tmp_path)


def test_missing_meta_with_segments_present(tmp_path: Path) -> None:
    write_log(tmp_path, make_entries(1, 5), BIG_SEGMENT_BYTES)
    (tmp_path / META_FILE_NAME).unlink()
    with pytest.raises(CorruptLogError, match="meta"):
        open_store(tmp_path)


def test_meta_past_the_data_is_corruption_but_one_past_is_an_empty_log(tmp_path: Path) -> None:
    write_log(tmp_path, make_entries(1, 20), SMALL_SEGMENT_BYTES)
    (tmp_path / META_FILE_NAME).write_bytes(encode_meta(23, reset_in_progress=False))
    with pytest.raises(CorruptLogError, match="past the data"):
        open_store(tmp_path, SMALL_SEGMENT_BYTES)
    (tmp_path / META_FILE_NAME).write_bytes(encode_meta(21, reset_in_progress=False))
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert (store.first_index, store.last_index) == (21, 20)
    assert segment_files(tmp_path) == []


def test_meta_below_a_missing_head_is_corruption(tmp_path: Path) -> None:
    write_log(tmp_path, make_entries(1, 40), SMALL_SEGMENT_BYTES)
    (tmp_path / segment_files(tmp_path)[0]).unlink()
    with pytest.raises(CorruptLogError, match="entries are missing"):
        open_store(tmp_path, SMALL_SEGMENT_BYTES)


# --- crashes in the middle of truncations ------------------------------------------------


def fail_on(monkeypatch: pytest.MonkeyPatch, name: str, after_calls: int = 0) -> list[int]:
    """Make os.<name> raise EIO after `after_calls` successful calls; returns the call count."""
    real: Callable[..., Any] = getattr(os, name)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > after_calls:
            raise OSError(errno.EIO, f"injected failure of {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, failing)
    return calls


def test_crash_between_meta_write_and_unlinks_of_truncate_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = make_entries(1, 60)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    files_before = segment_files(tmp_path)
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    with monkeypatch.context() as patch:
        fail_on(patch, "unlink")
        with pytest.raises(StorageError):
            store.truncate_prefix(45)
    store.close()
    assert segment_files(tmp_path) == files_before  # nothing was unlinked
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert (store.first_index, store.last_index) == (45, 60)
        assert store.entries(45, 61) == entries[44:]
    remaining = segment_files(tmp_path)
    assert len(remaining) < len(files_before)
    assert all(int(name.rsplit("-", 1)[-1]) >= 45 for name in remaining if "-" in name)


def test_meta_written_by_hand_past_whole_segments(tmp_path: Path) -> None:
    entries = make_entries(1, 60)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    (tmp_path / META_FILE_NAME).write_bytes(encode_meta(61, reset_in_progress=False))
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert (store.first_index, store.last_index) == (61, 60)
        store.append(make_entries(61, 2))
    assert segment_files(tmp_path) == [open_segment_name(61)]


@pytest.mark.parametrize("next_index", [5, 1000])
def test_crash_in_the_middle_of_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, next_index: int
) -> None:
    write_log(tmp_path, make_entries(1, 60), SMALL_SEGMENT_BYTES)
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    with monkeypatch.context() as patch:
        fail_on(patch, "unlink", after_calls=1)
        with pytest.raises(StorageError):
            store.reset(next_index)
    # The store knows it is half-way and refuses changes until reopened.
    with pytest.raises(StorageError, match="reopened"):
        store.append(make_entries(next_index, 1))
    store.close()
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert (store.first_index, store.last_index) == (next_index, next_index - 1)
        store.append(make_entries(next_index, 3, term=9))
    assert segment_files(tmp_path) == [open_segment_name(next_index)]


def test_crash_after_truncate_suffix_renamed_a_closed_segment_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = make_entries(1, 60)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    with monkeypatch.context() as patch:
        fail_on(patch, "ftruncate")
        with pytest.raises(StorageError):
            store.truncate_suffix(12)
    store.close()
    # The later segments are gone, the one holding 12 is open again with its old content:
    # a prefix of the old log, never a hole.
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert store.first_index == 1
        assert 12 <= store.last_index < 60
        assert store.entries(1, store.last_index + 1) == entries[: store.last_index]
        store.truncate_suffix(12)
        store.append(make_entries(13, 4, term=2))
        store.sync()
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert store.entries(1, 17) == entries[:12] + make_entries(13, 4, term=2)
    names = segment_files(tmp_path)
    assert sum(name.startswith("log_inprogress_") for name in names) == 1


def test_crash_before_truncate_suffix_renamed_a_closed_segment_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash after the later segments are unlinked, before the rename: a closed segment must
    still hold exactly what its name says (it is cut only once renamed open)."""
    entries = make_entries(1, 60)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    with monkeypatch.context() as patch:
        fail_on(patch, "rename")
        with pytest.raises(StorageError):
            store.truncate_suffix(12)
    store.close()
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert 12 <= store.last_index < 60
        assert store.entries(1, store.last_index + 1) == entries[: store.last_index]


def test_truncate_suffix_at_every_point_keeps_names_and_content_in_step(tmp_path: Path) -> None:
    entries = make_entries(1, 40)
    for last_kept in range(0, 41, 3):
        directory = tmp_path / str(last_kept)
        write_log(directory, entries, SMALL_SEGMENT_BYTES)
        with open_store(directory, SMALL_SEGMENT_BYTES) as store:
            store.truncate_suffix(last_kept)
        with open_store(directory, SMALL_SEGMENT_BYTES) as store:
            assert store.last_index == last_kept
            assert store.entries(1, last_kept + 1) == entries[:last_kept]


# --- a full disk ---------------------------------------------------------------------------


def disk_full_after(monkeypatch: pytest.MonkeyPatch, byte_budget: int) -> None:
    """os.pwrite writes at most `byte_budget` bytes in all, then raises ENOSPC."""
    real = os.pwrite
    budget = [byte_budget]

    def pwrite(descriptor: int, data: Any, offset: int) -> int:
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        view = memoryview(data)[: budget[0]]
        written = real(descriptor, view, offset)
        budget[0] -= written
        return written

    monkeypatch.setattr(os, "pwrite", pwrite)


@pytest.mark.parametrize("byte_budget", [0, 1, 23, 24, 100, 319])
def test_disk_full_mid_batch_rolls_back_and_appends_go_on_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, byte_budget: int
) -> None:
    entries = make_entries(1, 20)
    store = open_store(tmp_path)
    store.append(entries[:10])
    store.sync()
    segment = tmp_path / open_segment_name(1)
    size_before = segment.stat().st_size
    with monkeypatch.context() as patch:
        disk_full_after(patch, byte_budget)
        with pytest.raises(DiskFullError):
            store.append(entries[10:15])
        assert store.last_index == 10
        assert segment.stat().st_size == size_before
        assert store.entries(1, 11) == entries[:10]
        with pytest.raises(DiskFullError):
            store.append(entries[10:15])
    # Space is back.
    store.append(entries[10:20])
    store.sync()
    store.close()
    with open_store(tmp_path) as store:
        assert store.entries(1, 21) == entries
        assert store.recovery.torn_bytes_dropped == 0


def test_disk_full_when_starting_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = make_entries(1, 30)
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    store.append(entries[:10])  # 640 bytes: the next append starts a new segment
    store.sync()
    real_open = os.open

    def open_without_space(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT and "inprogress" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return int(real_open(path, flags, *args))

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", open_without_space)
        with pytest.raises(DiskFullError):
            store.append(entries[10:12])
    assert store.last_index == 10
    assert store.entries(1, 11) == entries[:10]
    store.append(entries[10:30])
    store.sync()
    store.close()
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert store.entries(1, 31) == entries


def test_disk_full_on_the_meta_write_of_truncate_prefix_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path, SMALL_SEGMENT_BYTES)
    store.append(make_entries(1, 30))
    with monkeypatch.context() as patch:

        def write_without_space(*_: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        patch.setattr(os, "pwrite", write_without_space)
        with pytest.raises(DiskFullError):
            store.truncate_prefix(20)
    assert store.first_index == 1
    store.truncate_prefix(20)
    store.close()
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert (store.first_index, store.last_index) == (20, 30)


def test_failed_fsync_makes_the_store_refuse_changes_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = make_entries(1, 10)
    store = open_store(tmp_path)
    store.append(entries[:5])
    store.sync()
    store.append(entries[5:])
    with monkeypatch.context() as patch:
        fail_on(patch, "fdatasync")
        with pytest.raises(StorageError):
            store.sync()
    with pytest.raises(StorageError, match="reopened"):
        store.append(make_entries(11, 1))
    assert store.entries(1, 6) == entries[:5]  # reads still work
    store.close()
    with open_store(tmp_path) as store:
        assert store.last_index >= 5
        assert store.entries(1, 6) == entries[:5]


# --- rolling, sync policy, pre-encoded appends ---------------------------------------------


def test_rolling_closes_segments_under_names_that_match_their_content(tmp_path: Path) -> None:
    entries = make_entries(1, 50)
    write_log(tmp_path, entries, SMALL_SEGMENT_BYTES)
    names = segment_files(tmp_path)
    assert names[-1].startswith("log_inprogress_")
    expected_first = 1
    for name in names[:-1]:
        first, last = (int(part) for part in name[len("log_") :].split("-"))
        assert first == expected_first
        assert (tmp_path / name).stat().st_size == (last - first + 1) * 64
        expected_first = last + 1
    assert names[-1] == open_segment_name(expected_first)


def test_every_append_policy_syncs_each_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SegmentLogStore.open(tmp_path, sync_policy=SyncPolicy.EVERY_APPEND)
    calls = fail_on(monkeypatch, "fdatasync", after_calls=10**9)
    store.append(make_entries(1, 3))
    store.append(make_entries(4, 3))
    assert calls[0] == 2
    store.sync()
    assert calls[0] == 2  # nothing left unsynced
    store.close()


def test_append_encoded_takes_the_bytes_as_they_are(tmp_path: Path) -> None:
    from quorumlog.storage.segment_format import encode_entries

    entries = make_entries(1, 30)
    encoded, _, _ = encode_entries(entries[10:30])
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        store.append(entries[:10])
        store.append_encoded(11, encoded, 20)
        assert store.entries(1, 31) == entries
        damaged = bytearray(encode_entries(make_entries(31, 2))[0])
        damaged[-1] ^= 1
        with pytest.raises(CorruptLogError):
            store.append_encoded(31, bytes(damaged), 2)
        with pytest.raises(ValueError):
            store.append_encoded(31, encode_entries(make_entries(31, 2))[0], 3)
        with pytest.raises(ValueError):
            store.append_encoded(32, encode_entries(make_entries(32, 1))[0], 1)
        assert store.last_index == 30
    with open_store(tmp_path, SMALL_SEGMENT_BYTES) as store:
        assert store.entries(1, 31) == entries
