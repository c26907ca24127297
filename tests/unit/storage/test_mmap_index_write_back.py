"""The mmap store's index slots ride the data's sync: written back (no flush of their own)
before the data's msync once INDEX_WRITE_BACK_LAG_BYTES wait, msynced only once
INDEX_FLUSH_LAG_BYTES wait (see `MmapLogStore._flush`); slots a power failure takes are
rebuilt from the data at open."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.storage import LogEntry, MmapLogStore, mmap_files, mmap_store, mmap_writeback
from quorumlog.storage.mmap_format import INDEX_SLOT_BYTES

Call = tuple[str, str]
"""(what was done: "flush" or "write_back", the stream's directory name)."""


def record_calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    calls: list[Call] = []
    real_flush = mmap_files.MappedFileList.flush
    real_write_back = mmap_files.MappedFileList.write_back

    def flush(files: mmap_files.MappedFileList, low: int, high: int) -> None:
        calls.append(("flush", files.directory.name))
        real_flush(files, low, high)

    def write_back(files: mmap_files.MappedFileList, low: int, high: int) -> bool:
        calls.append(("write_back", files.directory.name))
        return real_write_back(files, low, high)

    monkeypatch.setattr(mmap_files.MappedFileList, "flush", flush)
    monkeypatch.setattr(mmap_files.MappedFileList, "write_back", write_back)
    return calls


def make_entries(first: int, count: int, size: int = 1) -> list[LogEntry]:
    return [
        LogEntry(index=index, term=1, data=bytes([1 + index % 250]) * size)
        for index in range(first, first + count)
    ]


def open_store(path: Path) -> MmapLogStore:
    return MmapLogStore.open(
        path, data_file_bytes=64 * 1024 * 1024, index_file_bytes=4 * 1024 * 1024
    )


def test_syncs_msync_the_index_once_a_mebibyte_of_slots_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """160 batches of 256 entries, a sync after each: 1.25 MiB of index slots, msynced
    once (each msync of the index is a flush and a journal commit of its own), the rest
    written back ahead of the data's msyncs. (Before: an msync every 256 KiB, five.)"""
    calls = record_calls(monkeypatch)
    path = tmp_path / "log"
    store = open_store(path)
    calls.clear()  # open flushes what it found
    for batch in range(160):
        store.append(make_entries(1 + 256 * batch, 256))
        store.sync()
    store.close()
    assert calls.count(("flush", "index")) == 1
    assert calls.count(("flush", "data")) == 160
    assert calls.count(("write_back", "index")) >= 3
    store = open_store(path)
    assert store.last_index == 160 * 256
    assert store.entries(40_000, 40_961) == make_entries(40_000, 961)
    store.close()


def test_slots_are_written_back_before_the_data_msync_whose_flush_carries_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_calls(monkeypatch)
    monkeypatch.setattr(mmap_store, "INDEX_WRITE_BACK_LAG_BYTES", 10 * INDEX_SLOT_BYTES)
    monkeypatch.setattr(mmap_store, "INDEX_FLUSH_LAG_BYTES", 30 * INDEX_SLOT_BYTES)
    store = open_store(tmp_path / "log")
    calls.clear()
    store.append(make_entries(1, 10))
    store.sync()
    assert calls == [("flush", "data")]  # within the write-back lag: slots stay in memory
    store.append(make_entries(11, 10))
    store.sync()
    assert calls[1:] == [("write_back", "index"), ("flush", "data")]
    store.append(make_entries(21, 11))
    store.sync()  # 31 slots since the last msync of the index: past the flush lag
    assert calls[3:] == [("write_back", "index"), ("flush", "data"), ("flush", "index")]
    store.append(make_entries(32, 1))
    store.sync()
    assert calls[6:] == [("flush", "data")]
    store.close()


def test_where_write_back_is_missing_the_slots_are_msynced_at_the_write_back_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_calls(monkeypatch)
    monkeypatch.setattr(mmap_writeback, "_sync_file_range", None)
    monkeypatch.setattr(mmap_store, "INDEX_WRITE_BACK_LAG_BYTES", 10 * INDEX_SLOT_BYTES)
    monkeypatch.setattr(mmap_store, "INDEX_FLUSH_LAG_BYTES", 30 * INDEX_SLOT_BYTES)
    path = tmp_path / "log"
    store = open_store(path)
    calls.clear()
    store.append(make_entries(1, 11))
    store.sync()
    assert calls == [("write_back", "index"), ("flush", "index"), ("flush", "data")]
    store.append(make_entries(12, 5))
    store.sync()
    assert calls[3:] == [("flush", "data")]
    store.close()
    store = open_store(path)
    assert store.entries(1, 17) == make_entries(1, 16)
    store.close()


def index_file(path: Path) -> Path:
    return path / "index" / mmap_files.file_name(0)


@pytest.mark.parametrize("lost", ["tail", "middle"])
def test_slots_written_back_but_never_committed_are_rebuilt_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """A power failure before the journal commits the slots' block conversion: those
    blocks read as zeros after it. Open (the tail) or the first read (a hole) rebuilds
    them from the data."""
    monkeypatch.setattr(mmap_store, "INDEX_WRITE_BACK_LAG_BYTES", 10 * INDEX_SLOT_BYTES)
    monkeypatch.setattr(mmap_store, "INDEX_FLUSH_LAG_BYTES", 1000 * INDEX_SLOT_BYTES)
    path = tmp_path / "log"
    store = open_store(path)
    entries = make_entries(1, 300, size=30)
    for first in range(0, 300, 30):
        store.append(entries[first : first + 30])
        store.sync()
    store.close()
    slots = bytearray(index_file(path).read_bytes())
    low, high = (100, 300) if lost == "tail" else (100, 200)
    kept = bytes(slots[low * INDEX_SLOT_BYTES : high * INDEX_SLOT_BYTES])
    assert kept.count(0) < len(kept)  # written back: the slots were there
    slots[low * INDEX_SLOT_BYTES : high * INDEX_SLOT_BYTES] = bytes(len(kept))
    index_file(path).write_bytes(slots)
    store = open_store(path)
    assert store.last_index == 300
    assert store.entries(1, 301) == entries
    store.sync()
    store.close()
    slots_after = index_file(path).read_bytes()
    assert slots_after[low * INDEX_SLOT_BYTES : high * INDEX_SLOT_BYTES] == kept
