"""Reading stored entries back: one pread per run of entries that lie end to end, every
entry checked against its header and data checksum on the way out.

A batch of adds is one record, so entries written together sit end to end in the file and
a range read of them costs one pread, not one per entry (recovery reads ranges). Files are
opened for reading on demand and kept open, the least recently used closed beyond a bound.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import suppress
from pathlib import Path

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.errors import CorruptLogError, StorageError
from quorumlog.ledger.bookie_files import BookieFileHandle, BookieFileSystem
from quorumlog.ledger.bookie_format import (
    ENTRY_HEADER_BYTES,
    FormatError,
    decode_stored_entry,
    log_file_name,
)
from quorumlog.ledger.bookie_index import StoredEntry


class EntryReads:
    def __init__(self, directory: Path, file_system: BookieFileSystem, open_files_max: int) -> None:
        self.directory = directory
        self.file_system = file_system
        self.open_files_max = open_files_max
        self.handles: OrderedDict[int, BookieFileHandle] = OrderedDict()

    def read(self, picked: list[StoredEntry]) -> list[LedgerEntryData]:
        """The data of `picked` (in its order). CorruptLogError for an entry that fails its
        checks; StorageError if a file cannot be read."""
        results: list[LedgerEntryData] = []
        start = 0
        while start < len(picked):
            end = start + 1
            while end < len(picked) and _follows(picked[end - 1], picked[end]):
                end += 1
            results.extend(self.read_run(picked[start:end]))
            start = end
        return results

    def read_run(self, run: list[StoredEntry]) -> list[LedgerEntryData]:
        first, last = run[0], run[-1]
        span = last.offset + ENTRY_HEADER_BYTES + last.length - first.offset
        path = self.directory / log_file_name(first.file_number)
        raw = self.handle(first.file_number).read_at(span, first.offset)
        if len(raw) != span:
            raise CorruptLogError(str(path), first.offset, "the file ends inside an entry")
        results: list[LedgerEntryData] = []
        for stored in run:
            start = stored.offset - first.offset
            piece = raw[start : start + ENTRY_HEADER_BYTES + stored.length]
            try:
                data = decode_stored_entry(piece, stored.entry_id)
            except FormatError as error:
                raise CorruptLogError(str(path), stored.offset, str(error)) from error
            results.append(LedgerEntryData(stored.entry_id, data))
        return results

    def handle(self, number: int) -> BookieFileHandle:
        handle = self.handles.get(number)
        if handle is not None:
            self.handles.move_to_end(number)
            return handle
        handle = self.file_system.open_file(self.directory / log_file_name(number))
        self.handles[number] = handle
        if len(self.handles) > self.open_files_max:
            _number, oldest = self.handles.popitem(last=False)
            _close_quietly(oldest)
        return handle

    def forget(self, number: int) -> None:
        """Close file `number` (it is being deleted)."""
        handle = self.handles.pop(number, None)
        if handle is not None:
            _close_quietly(handle)

    def close(self) -> None:
        handles = list(self.handles.values())
        self.handles.clear()
        for handle in handles:
            _close_quietly(handle)


def _follows(previous: StoredEntry, current: StoredEntry) -> bool:
    return (
        current.file_number == previous.file_number
        and current.offset == previous.offset + ENTRY_HEADER_BYTES + previous.length
    )


def _close_quietly(handle: BookieFileHandle) -> None:
    # A file only read from loses nothing when its close fails.
    with suppress(StorageError):
        handle.close()
