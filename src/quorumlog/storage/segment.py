"""A braft-style segment log store: append-only segment files, an index in memory.

Directory layout (see segment_format for the bytes):

    log_meta                      first index of the log, replaced atomically
    log_<first>-<last>            closed segments, each exactly the entries first..last
    log_inprogress_<first>        the open segment, appended to

Writes go per batch: a batch is encoded into one buffer, written with one pwrite at the end
of the open segment and made durable with one fdatasync (`sync`, or at once under
SyncPolicy.EVERY_APPEND). The open segment is closed and a new one started before a batch
that would begin at or past `segment_bytes_max`, so a whole batch always lands in one
segment: an append either happens entirely or, on error, not at all. (A segment can thus
pass the bound by up to one batch.)

Reads find the segment by bisecting the segment first indexes, then the entry's byte span
from that segment's packed offset array, and read it with one pread. Terms are answered from
memory. Data checksums are verified on every read.

Every file operation goes through the `FileSystem` given to `open` (the operating system's by
default; the simulator gives its byte-level disk, see storage/filesystem.py for the contract).

Errors: ENOSPC/EDQUOT raise DiskFullError and the partial write is cut off again, so the
store is as it was and appends go on once there is space. A failure in the middle of a
multi-step change of files (a truncation, a reset, closing a segment) or a failed fsync
leaves the files in a state that open knows how to finish, but the store in memory may no
longer match; it then refuses to change anything until reopened.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import google_crc32c

from quorumlog.errors import (
    CorruptLogError,
    NonContiguousAppendError,
    StorageError,
    StoreClosedError,
)
from quorumlog.storage.base import (
    ENTRY_BYTES_MAX_DEFAULT,
    RecoveryReport,
    SyncPolicy,
    check_append,
    check_index,
    check_range,
    check_reset,
    check_truncate_prefix,
    check_truncate_suffix,
)
from quorumlog.storage.entry import LogEntry
from quorumlog.storage.filesystem import (
    OS_FILE_SYSTEM,
    DirectoryLock,
    FileHandle,
    FileSystem,
    atomic_write,
    ensure_directory,
)
from quorumlog.storage.segment_file import SegmentFile
from quorumlog.storage.segment_format import (
    META_FILE_NAME,
    HeaderError,
    decode_entry,
    encode_entries,
    encode_meta,
    index_encoded_batch,
)
from quorumlog.storage.segment_recovery import recover_directory

SEGMENT_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
"""braft uses 8 MiB; rolling a segment costs an fsync and two directory fsyncs, and at 8 MiB
that was a tenth of the time of writing 4 KiB entries (measured), so segments are larger."""
READ_FILES_OPEN_MAX = 64
"""Closed segments whose file descriptors stay open for reads (least recently used go)."""
READ_BYTES_MAX = 1024 * 1024
"""Range reads fetch at most this much per pread (plus one entry), so memory stays bounded."""

_crc32c = google_crc32c.value


class SegmentLogStore:
    """Entries in segment files; index, offsets and terms in memory. See the module docs."""

    def __init__(
        self,
        directory: Path,
        segment_bytes_max: int,
        sync_policy: SyncPolicy,
        entry_bytes_max: int,
        file_system: FileSystem,
    ) -> None:
        if segment_bytes_max < 1:
            raise ValueError(f"segment_bytes_max must be positive, got {segment_bytes_max}")
        if entry_bytes_max < 0:
            raise ValueError(f"entry_bytes_max must not be negative, got {entry_bytes_max}")
        self._directory = directory
        self._file_system = file_system
        self._segment_bytes_max = segment_bytes_max
        self._sync_policy = sync_policy
        self._entry_bytes_max = entry_bytes_max
        self._segments: list[SegmentFile] = []
        self._segment_firsts: list[int] = []
        """first_index of each segment, in order, for bisect."""
        self._read_handles: OrderedDict[int, SegmentFile] = OrderedDict()
        """Closed segments holding an open file for reads, least recently used first."""
        self._first_index = 1
        self._last_index = 0
        self._recovery = RecoveryReport()
        self._unsynced = False
        self._closed = False
        self._failure: str | None = None
        self._lock: DirectoryLock | None = None
        """The directory's lock, held while the store is open: two writers would corrupt it."""

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT,
        sync_policy: SyncPolicy = SyncPolicy.EXPLICIT,
        entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT,
        file_system: FileSystem = OS_FILE_SYSTEM,
    ) -> SegmentLogStore:
        """Open the log in directory `path` (created if missing), repairing a torn tail.

        What open finds counts as persisted, so it makes it durable first (one data sync of
        the open segment and one directory sync): see segment_recovery.
        """
        directory = Path(path)
        store = cls(directory, segment_bytes_max, sync_policy, entry_bytes_max, file_system)
        ensure_directory(file_system, directory)
        store._lock = file_system.lock_directory(directory)  # before anything is read
        try:
            recovered = recover_directory(file_system, directory)
        except BaseException:
            store.close()
            raise
        store._first_index = recovered.first_index
        store._segments = recovered.segments
        store._segment_firsts = [segment.first_index for segment in recovered.segments]
        store._last_index = (
            recovered.segments[-1].last_index if recovered.segments else recovered.first_index - 1
        )
        store._recovery = recovered.report
        return store

    # --- properties ----------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        return self._first_index

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def recovery(self) -> RecoveryReport:
        return self._recovery

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # --- appending -----------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> None:
        """Append entries that run on from last_index + 1; all of them or, on error, none."""
        self._check_writable()
        check_append(entries, self._last_index, self._entry_bytes_max)
        if not entries:
            return
        try:
            encoded, offsets, terms = encode_entries(entries)
        except struct.error as error:
            # A term of 2**64 or more: a bad argument, reported as builtins report those.
            raise ValueError(f"entry does not fit the entry header: {error}") from error
        self._write_batch(encoded, offsets, terms)

    def append_encoded(self, first_index: int, encoded: bytes, count: int) -> None:
        """Append `count` entries already encoded in the segment format, first at first_index.

        The hot path for bytes that arrive encoded (a follower receiving a leader's batch,
        see segment_format.encode_entries): no LogEntry objects are built. Every header and
        data checksum is still verified before anything is written, since the bytes come from
        outside. Raises NonContiguousAppendError, EntryTooLargeError-style ValueError or
        CorruptLogError (for bytes that fail their checks) and changes nothing then.
        """
        self._check_writable()
        if first_index != self._last_index + 1:
            raise NonContiguousAppendError(
                f"append expected index {self._last_index + 1}, got {first_index}"
            )
        try:
            offsets, terms = index_encoded_batch(encoded, count, self._entry_bytes_max)
        except HeaderError as error:
            raise CorruptLogError("<encoded batch>", error.offset, str(error)) from error
        if count == 0:
            return
        self._write_batch(encoded, offsets, terms)

    def _write_batch(self, encoded: bytes, offsets: list[int], terms: list[int]) -> None:
        """Write one encoded batch at the end of the open segment, then index it.

        The index changes only after the whole write succeeded; a failed write is cut off
        again (ftruncate to the old end), so an error leaves the store as it was.
        """
        segment = self._writable_segment()
        handle = segment.writable_handle()
        start = segment.end_bytes
        try:
            handle.write_at(encoded, start)
        except StorageError:
            self._cut_back(handle, start)
            raise
        segment.offsets.fromlist([offset + start for offset in offsets] if start else offsets)
        segment.terms.fromlist(terms)
        segment.end_bytes = start + len(encoded)
        self._last_index += len(offsets)
        self._unsynced = True
        if self._sync_policy is SyncPolicy.EVERY_APPEND:
            self.sync()

    def _cut_back(self, handle: FileHandle, end_bytes: int) -> None:
        """Undo a partial write. Shrinking a file needs no space, so this works on a full disk."""
        try:
            handle.truncate(end_bytes)
        except StorageError as error:
            self._failure = f"could not cut back a failed write of {handle.path}: {error}"

    def prepare_open_segment(self) -> None:
        """Create the open segment now if the log has none (or roll a full one), so the
        next append creates no file and syncs no directory: for a caller that opens a store
        off its event loop and appends on it."""
        self._check_writable()
        self._writable_segment()

    def _writable_segment(self) -> SegmentFile:
        """The open segment, after closing it and starting another if it is full."""
        segment = self._segments[-1] if self._segments else None
        if segment is not None and segment.is_open:
            if segment.end_bytes < self._segment_bytes_max or segment.count == 0:
                return segment
            self._close_open_segment(segment)
        return self._create_open_segment()

    def _close_open_segment(self, segment: SegmentFile) -> None:
        """Turn the full open segment into a closed one.

        Order: fsync its data, rename it to its closed name, fsync the directory. A crash
        before the rename leaves the open segment as it was; after it, a closed segment whose
        name matches its (synced) content. The directory fsync comes before the next open
        segment is created, so no crash leaves two open segments.
        """
        self._fsync_data(segment)
        open_path = segment.path
        segment.is_open = False
        try:
            self._file_system.rename(open_path, segment.path)
        except StorageError:
            segment.is_open = True
            raise
        self._remember_read_handle(segment)
        self._fsync_directory_or_fail("closing a segment")

    def _create_open_segment(self) -> SegmentFile:
        """Create `log_inprogress_<last_index + 1>` and make its name durable."""
        segment = SegmentFile(self._directory, self._last_index + 1, is_open=True)
        path = segment.path
        segment.handle = self._file_system.create_file(path)
        try:
            self._file_system.sync_directory(self._directory)
        except StorageError:
            # An empty file we have not indexed: take it away so a retry can create it.
            segment.close_handle()
            self._file_system.unlink(path)
            raise
        self._segments.append(segment)
        self._segment_firsts.append(segment.first_index)
        return segment

    def sync(self) -> None:
        """Make every entry appended so far durable (one fdatasync of the open segment)."""
        self._check_writable()
        if not self._unsynced:
            return
        segment = self._segments[-1] if self._segments else None
        if segment is not None and segment.is_open:
            self._fsync_data(segment)
        self._unsynced = False

    def _fsync_data(self, segment: SegmentFile) -> None:
        """fdatasync: appends change only the size, which fdatasync flushes too.

        After a failed fsync the kernel may have dropped the dirty pages, so what the file
        holds is unknown: the store refuses further changes until reopened.
        """
        if self._sync_policy is SyncPolicy.NEVER or segment.handle is None:
            return
        try:
            segment.handle.sync_data()
        except StorageError as error:
            self._failure = f"fsync of {segment.path} failed: {error}"
            raise

    # --- reading -------------------------------------------------------------------------

    def entry(self, index: int) -> LogEntry:
        self._check_not_closed()
        check_index(index, self._first_index, self._last_index)
        segment = self._segment_holding(index)
        start, end = segment.entry_span(index)
        raw = self._read(segment, start, end)
        try:
            return decode_entry(index, raw)
        except HeaderError as error:
            raise CorruptLogError(str(segment.path), start, str(error)) from error

    def entries(self, low: int, high: int) -> list[LogEntry]:
        """Entries with low <= index < high."""
        return list(self.iter_entries(low, high))

    def iter_entries(self, low: int, high: int) -> Iterator[LogEntry]:
        """Entries with low <= index < high, read in runs of up to READ_BYTES_MAX bytes."""
        self._check_not_closed()
        check_range(low, high, self._first_index, self._last_index)
        return self._iterate(low, high)

    def _iterate(self, low: int, high: int) -> Iterator[LogEntry]:
        index = low
        while index < high:
            self._check_not_closed()
            segment = self._segment_holding(index)
            run_end = min(high, segment.last_index + 1)
            run_start_bytes = segment.offsets[index - segment.first_index]
            stop = index + 1
            # Grow the run while it stays under READ_BYTES_MAX (at least one entry).
            while stop < run_end and (
                segment.offsets[stop - segment.first_index] - run_start_bytes < READ_BYTES_MAX
            ):
                stop += 1
            _, run_end_bytes = segment.entry_span(stop - 1)
            raw = self._read(segment, run_start_bytes, run_end_bytes)
            for current in range(index, stop):
                start, end = segment.entry_span(current)
                try:
                    entry = decode_entry(
                        current, raw[start - run_start_bytes : end - run_start_bytes]
                    )
                except HeaderError as error:
                    raise CorruptLogError(str(segment.path), start, str(error)) from error
                yield entry
            index = stop

    def term(self, index: int) -> int:
        # The checks written as tests first (the helpers raise): the core asks for terms on
        # every push and acknowledgement, mostly from the open segment.
        if self._closed:
            self._check_not_closed()
        if not self._first_index <= index <= self._last_index:
            check_index(index, self._first_index, self._last_index)
        segment = self._segments[-1]
        if index < segment.first_index:
            segment = self._segment_holding(index)
        return segment.terms[index - segment.first_index]

    def _segment_holding(self, index: int) -> SegmentFile:
        segments = self._segments
        last = segments[-1]
        if index >= last.first_index:
            return last
        return segments[bisect_right(self._segment_firsts, index) - 1]

    def _read(self, segment: SegmentFile, start: int, end: int) -> bytes:
        handle = segment.handle
        if handle is None:
            handle = self._open_for_read(segment)
        elif not segment.is_open:
            self._read_handles.move_to_end(segment.first_index)
        raw = handle.read_at(end - start, start)
        if len(raw) != end - start:
            raise CorruptLogError(
                str(segment.path), start, f"file ends before the indexed entry end {end}"
            )
        return raw

    def _open_for_read(self, segment: SegmentFile) -> FileHandle:
        handle = self._file_system.open_file(segment.path)
        segment.handle = handle
        self._remember_read_handle(segment)
        return handle

    def _remember_read_handle(self, segment: SegmentFile) -> None:
        """Track a closed segment's open file, closing the least recently used beyond the cap."""
        if segment.handle is None:
            return
        self._read_handles[segment.first_index] = segment
        self._read_handles.move_to_end(segment.first_index)
        while len(self._read_handles) > READ_FILES_OPEN_MAX:
            _, oldest = self._read_handles.popitem(last=False)
            oldest.close_handle()

    # --- truncation ----------------------------------------------------------------------

    def truncate_suffix(self, last_kept: int) -> None:
        """Drop every entry after last_kept; durable on return.

        Works from the back: unlink whole segments after last_kept one at a time, newest
        first, with a directory fsync after each, so a crash at any point leaves a prefix of
        the old log and never a hole. Then the segment holding last_kept is cut. If it was
        closed it is first renamed back to an open segment (and the directory synced), and
        only then truncated: a crash in between leaves an open segment with its old, full
        content (a prefix of the old log), whereas truncating first would leave a closed
        segment whose name no longer matches its content, which open rightly calls corrupt.
        """
        self._check_writable()
        check_truncate_suffix(last_kept, self._first_index, self._last_index)
        if last_kept >= self._last_index:
            return
        self._failure = "truncate_suffix did not finish"
        while self._segments and self._segments[-1].first_index > last_kept:
            segment = self._segments[-1]
            self._forget(segment)
            self._file_system.unlink(segment.path)
            self._file_system.sync_directory(self._directory)
            self._segments.pop()
            self._segment_firsts.pop()
            self._last_index = min(self._last_index, segment.first_index - 1)
        if self._segments and self._segments[-1].last_index > last_kept:
            self._cut_segment(self._segments[-1], last_kept)
        self._last_index = last_kept
        self._failure = None

    def _cut_segment(self, segment: SegmentFile, last_kept: int) -> None:
        if not segment.is_open:
            self._forget(segment)
            closed_path = segment.path
            segment.is_open = True
            self._file_system.rename(closed_path, segment.path)
            self._file_system.sync_directory(self._directory)
            segment.handle = self._file_system.open_file(segment.path, writable=True)
        handle = segment.writable_handle()
        keep = last_kept - segment.first_index + 1
        end_bytes = segment.offsets[keep]
        handle.truncate(end_bytes)
        handle.sync()
        del segment.offsets[keep:]
        del segment.terms[keep:]
        segment.end_bytes = end_bytes
        # The fsync above covered every byte kept, synced before or not.
        self._unsynced = False

    def truncate_prefix(self, first_kept: int) -> None:
        """Drop every entry before first_kept; durable on return.

        The meta goes first: once it holds first_kept, a crash before the unlinks finish is
        harmless, since open removes segments wholly below first_index. A segment partly
        below stays; the meta's first_index hides its head.

        Unsynced entries are synced before the meta is written: the meta must not say the log
        starts at first_kept while a crash could still cut the data off below it (open would
        rightly call a meta past the data corrupt). Found by the crash-point tests.
        """
        self._check_writable()
        check_truncate_prefix(first_kept, self._first_index, self._last_index)
        if first_kept == self._first_index:
            return
        self.sync()
        atomic_write(
            self._directory / META_FILE_NAME, encode_meta(first_kept, False), self._file_system
        )
        self._first_index = first_kept
        removed = False
        while self._segments and self._segments[0].last_index < first_kept:
            segment = self._segments[0]
            self._forget(segment)
            self._file_system.unlink(segment.path)
            del self._segments[0]
            del self._segment_firsts[0]
            removed = True
        if removed:
            self._file_system.sync_directory(self._directory)

    def reset(self, next_index: int) -> None:
        """Drop everything; the log becomes empty with first_index == next_index.

        The meta is written first with a reset flag, so a crash while segments are being
        removed makes open remove the rest (it cannot tell old segments from new ones by
        index alone, since next_index may be below the old last index). The flag is cleared
        once the directory is empty and synced, before any new segment can exist.
        """
        self._check_writable()
        check_reset(next_index)
        meta_path = self._directory / META_FILE_NAME
        atomic_write(meta_path, encode_meta(next_index, reset_in_progress=True), self._file_system)
        self._failure = "reset did not finish"
        for segment in reversed(self._segments):
            self._forget(segment)
            self._file_system.unlink(segment.path)
        self._segments = []
        self._segment_firsts = []
        self._file_system.sync_directory(self._directory)
        atomic_write(meta_path, encode_meta(next_index, reset_in_progress=False), self._file_system)
        self._first_index = next_index
        self._last_index = next_index - 1
        self._unsynced = False
        self._failure = None

    def _forget(self, segment: SegmentFile) -> None:
        """Close the segment's file before it is renamed or unlinked."""
        self._read_handles.pop(segment.first_index, None)
        segment.close_handle()

    # --- life cycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close every file. Does not sync: call sync() first for durability."""
        if self._closed:
            return
        self._closed = True
        self._read_handles.clear()
        for segment in self._segments:
            segment.close_handle()
        if self._lock is not None:
            lock = self._lock
            self._lock = None
            lock.release()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the segment log store at {self._directory} is closed")

    def _check_writable(self) -> None:
        self._check_not_closed()
        if self._failure is not None:
            raise StorageError(
                f"the segment log store at {self._directory} must be reopened: {self._failure}"
            )

    def _fsync_directory_or_fail(self, doing: str) -> None:
        try:
            self._file_system.sync_directory(self._directory)
        except StorageError as error:
            self._failure = f"directory fsync failed while {doing}: {error}"
            raise

    def __enter__(self) -> SegmentLogStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SegmentLogStore({str(self._directory)!r}, first_index={self._first_index}, "
            f"last_index={self._last_index}, segments={len(self._segments)})"
        )
