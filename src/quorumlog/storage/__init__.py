"""Log stores: one interface (`LogStore`), three implementations, one conformance suite.

- `SegmentLogStore`: braft-style segment files with 24-byte CRC32C entry headers.
- `MmapLogStore`: DLedger-style preallocated data files plus fixed 32-byte index entries.
- `MemoryLogStore`: a list in memory.

The segment store does its file I/O through a `FileSystem` (the OS one by default; the
simulator's `quorumlog.testing.sim.filesystem.SimFileSystem` in simulation).
"""

from quorumlog.errors import (
    CorruptLogError,
    DiskFullError,
    EntryTooLargeError,
    InvalidTruncateError,
    LogIndexError,
    NonContiguousAppendError,
    StorageError,
    StoreClosedError,
)
from quorumlog.storage.base import LogStore, RecoveryReport, SyncPolicy
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.storage.filesystem import FileHandle, FileSystem, OsFileSystem
from quorumlog.storage.memory import MemoryLogStore
from quorumlog.storage.mmap_store import MmapLogStore
from quorumlog.storage.segment import SegmentLogStore

__all__ = [
    "CorruptLogError",
    "DiskFullError",
    "EntryTooLargeError",
    "EntryType",
    "FileHandle",
    "FileSystem",
    "InvalidTruncateError",
    "LogEntry",
    "LogIndexError",
    "LogStore",
    "MemoryLogStore",
    "MmapLogStore",
    "NonContiguousAppendError",
    "OsFileSystem",
    "RecoveryReport",
    "SegmentLogStore",
    "StorageError",
    "StoreClosedError",
    "SyncPolicy",
]
