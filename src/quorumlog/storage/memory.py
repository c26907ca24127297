"""A log store in memory: for tests, the simulator's reference, and users who want no disk."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from quorumlog.errors import StoreClosedError
from quorumlog.storage.base import (
    ENTRY_BYTES_MAX_DEFAULT,
    RecoveryReport,
    check_append,
    check_index,
    check_range,
    check_reset,
    check_truncate_prefix,
    check_truncate_suffix,
)
from quorumlog.storage.entry import LogEntry


class MemoryLogStore:
    """Entries in a Python list; `sync` is free and nothing survives the process."""

    def __init__(self, first_index: int = 1, entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT):
        check_reset(first_index)
        self._first_index = first_index
        self._entries: list[LogEntry] = []
        self._entry_bytes_max = entry_bytes_max
        self._closed = False

    @property
    def first_index(self) -> int:
        return self._first_index

    @property
    def last_index(self) -> int:
        return self._first_index + len(self._entries) - 1

    @property
    def recovery(self) -> RecoveryReport:
        return RecoveryReport(entries_found=0)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the memory log store is closed")

    def append(self, entries: Sequence[LogEntry]) -> None:
        self._check_open()
        check_append(entries, self.last_index, self._entry_bytes_max)
        self._entries.extend(entries)

    def sync(self) -> None:
        self._check_open()

    def entry(self, index: int) -> LogEntry:
        check_index(index, self._first_index, self.last_index)
        return self._entries[index - self._first_index]

    def entries(self, low: int, high: int) -> list[LogEntry]:
        check_range(low, high, self._first_index, self.last_index)
        return self._entries[low - self._first_index : high - self._first_index]

    def iter_entries(self, low: int, high: int) -> Iterator[LogEntry]:
        return iter(self.entries(low, high))

    def term(self, index: int) -> int:
        return self.entry(index).term

    def truncate_suffix(self, last_kept: int) -> None:
        self._check_open()
        check_truncate_suffix(last_kept, self._first_index, self.last_index)
        del self._entries[last_kept - self._first_index + 1 :]

    def truncate_prefix(self, first_kept: int) -> None:
        self._check_open()
        check_truncate_prefix(first_kept, self._first_index, self.last_index)
        del self._entries[: first_kept - self._first_index]
        self._first_index = first_kept

    def reset(self, next_index: int) -> None:
        self._check_open()
        check_reset(next_index)
        self._entries = []
        self._first_index = next_index

    def close(self) -> None:
        self._closed = True
