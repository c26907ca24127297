"""`SegmentLogStore.prepare_open_segment`: a store opened off the event loop does its file
creation and directory sync there, so the first append (on the loop) syncs no directory;
and the prepared, still empty, open segment survives a reopen and a reset."""

from __future__ import annotations

from pathlib import Path

from quorumlog.storage.entry import LogEntry
from quorumlog.storage.filesystem import OsFileSystem
from quorumlog.storage.segment import SegmentLogStore


class CountingFileSystem(OsFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.directory_syncs = 0

    def sync_directory(self, path: Path) -> None:
        self.directory_syncs += 1
        super().sync_directory(path)


def entry(index: int) -> LogEntry:
    return LogEntry(index=index, term=1, data=b"x%d" % index)


def test_a_prepared_store_appends_without_syncing_its_directory(tmp_path: Path) -> None:
    file_system = CountingFileSystem()
    store = SegmentLogStore.open(tmp_path / "log", file_system=file_system)
    store.prepare_open_segment()
    before = file_system.directory_syncs
    store.append([entry(1), entry(2)])
    store.sync()
    assert file_system.directory_syncs == before
    store.close()


def test_an_unprepared_store_syncs_its_directory_at_the_first_append(tmp_path: Path) -> None:
    """The cost the preparation moves: without it the first append syncs the directory."""
    file_system = CountingFileSystem()
    store = SegmentLogStore.open(tmp_path / "log", file_system=file_system)
    before = file_system.directory_syncs
    store.append([entry(1)])
    assert file_system.directory_syncs == before + 1
    store.close()


def test_an_empty_prepared_segment_reopens_and_resets(tmp_path: Path) -> None:
    store = SegmentLogStore.open(tmp_path / "log")
    store.prepare_open_segment()
    store.close()
    reopened = SegmentLogStore.open(tmp_path / "log")
    assert (reopened.first_index, reopened.last_index) == (1, 0)
    reopened.prepare_open_segment()
    reopened.reset(50)
    reopened.append([entry(50)])
    reopened.sync()
    reopened.close()
    again = SegmentLogStore.open(tmp_path / "log")
    assert (again.first_index, again.last_index) == (50, 50)
    assert again.entries(50, 51)[0].data == b"x50"
    again.close()
