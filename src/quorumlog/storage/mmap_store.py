"""A DLedger-style log store: preallocated, memory-mapped data files plus fixed-size index slots.

Layout under the store directory::

    meta                       first index and where it lives (mmap_format.Meta), atomic
    data/00000000000000000000  data files: entries back to back, blank padding at the end
    data/00000000000000004096
    index/00000000000000000000 index files: one 32-byte slot per entry

Both directories hold one logical byte stream each, cut into fixed-size files named by their
starting position (mmap_files). Entry i's slot is at index-stream position
(i - slot_base_index) * 32, so a lookup is two O(1) steps: slot, then data. No per-entry
Python objects are kept: the index files are the index.

An entry that does not fit in the rest of a data file is preceded by a blank record that
fills the file (DLedger's preAppend), and goes at the start of the next file.

Appends are written with pwrite/pwritev into the files (faster than storing into fresh
mapped pages; see mmap_files); reads and recovery go through the mappings. While syncs are
small, appends queue zeros well past their end for a thread to write and sync, so that
syncs overwrite blocks already written (see `MappedFileList.zero_ahead`). `sync` msyncs the
data written since the last sync and fsyncs directories that changed. `begin_sync` captures
that range for a sync on another thread while appends go on (mmap_sync); `durable_data_end`
moves only when such a sync has returned and `finish_sync` is told. Index slots are
flushed lazily, a bounded number behind: they are rebuilt from the data, at open for the
tail and on read for a hole. A sync writes them back ahead of the data's msync, which
carries them to the disk, and msyncs them only once a mebibyte waits (see `_flush`).
Files are created with posix_fallocate before any byte is written, so a full disk fails the
append cleanly.

What open does with damage is in mmap_recovery. The rules it relies on, kept here:
- nothing but zeros follows the end of either stream (truncations zero what they drop);
- `truncate_suffix` records the cut in the meta before zeroing and clears it after, so a
  crash in between is finished at open instead of looking like a hole in the log;
- `truncate_prefix` and `reset` write the meta first and delete files after; open deletes
  files wholly below the meta's first positions, so a crash in between is harmless.
- open flushes everything it found before returning (see `make_found_durable`).

This store works on real files only, not through a `storage.filesystem.FileSystem`: memory
mappings cannot be simulated cheaply. The simulator's byte-level disk runs `SegmentLogStore`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import google_crc32c
import msgspec

from quorumlog.errors import CorruptLogError, StorageError, StoreClosedError
from quorumlog.raft.invariants import require
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
from quorumlog.storage.files import disk_errors, fsync_directory, lock_directory
from quorumlog.storage.filesystem import atomic_write
from quorumlog.storage.mmap_encode import EntryColumns, encode
from quorumlog.storage.mmap_files import MappedFile, MappedFileList
from quorumlog.storage.mmap_format import (
    ENTRY_HEADER_BYTES,
    INDEX_MAGIC,
    INDEX_SLOT,
    INDEX_SLOT_BYTES,
    EntryHeader,
    Meta,
    decode_header,
    encode_meta,
)
from quorumlog.storage.mmap_meta import (
    DATA_DIRECTORY,
    INDEX_DIRECTORY,
    META_FILE,
    check_options,
    largest_entry_bytes,
    open_meta,
)
from quorumlog.storage.mmap_recovery import (
    IndexRepair,
    recover_tail,
    redo_pending_cut,
    slot_position,
    walk_to,
)
from quorumlog.storage.mmap_sync import CapturedSync, capture_pieces, close_pieces

_crc32c = google_crc32c.value


INDEX_WRITE_BACK_LAG_BYTES = 256 * 1024
"""Index slots (8192 entries) that `sync` may leave in the page cache; more are written back
ahead of the data's msync, whose device flush makes them durable too (see `_flush`)."""
INDEX_FLUSH_LAG_BYTES = 1024 * 1024
"""Index slots (32768 entries) that `sync` may leave without an msync of their own; see
`_flush`. This bounds how much data open parses after a power failure."""

ZERO_AHEAD_SYNC_BYTES_MAX = 64 * 1024
"""Zeros are written ahead of appends (see mmap_files) only while syncs flush this much data
or less, on average. The zeros cost as many bytes of disk writes as the data they make room
for; what they save is a fixed cost per sync (a journal commit, about 100 µs on the bench
VM). Syncs of 38 KB got about 40% faster with them, syncs of 1 MiB 25-40% slower."""
SYNC_BYTES_AVERAGE_WEIGHT = 8
"""The average of data bytes per sync moves 1/8 of the way to each new sync's bytes."""

DATA_FILE_BYTES_DEFAULT = 64 * 1024 * 1024
INDEX_FILE_BYTES_DEFAULT = 32 * 1024 * 1024


def _round_up(position: int, file_bytes: int) -> int:
    return -(-position // file_bytes) * file_bytes


def make_found_durable(root: Path, data: MappedFileList, data_end: int) -> None:
    """Sync every entry open found, and the names of the files and the meta.

    The Raft core counts whatever the store holds at open as persisted. If the process that
    wrote it died without syncing but the OS lived on, those bytes are readable from the page
    cache without being on disk, and a later power loss would take entries that were
    acknowledged after the restart. Which files hold unsynced data is unknown (appends may
    have filled several since the last sync), so the whole data stream is flushed: msync of
    clean pages costs little. The index needs nothing: it is rebuilt from the data.
    """
    if data.files:
        data.flush(data.files[0].start, data_end)
    for directory in (root / DATA_DIRECTORY, root / INDEX_DIRECTORY, root):
        with disk_errors(directory):
            fsync_directory(directory)


class MmapLogStore:
    """A log store of preallocated, memory-mapped data and index files (DLedger's layout)."""

    def __init__(
        self,
        root: Path,
        data: MappedFileList,
        index: MappedFileList,
        meta: Meta,
        last_index: int,
        data_end: int,
        recovery: RecoveryReport,
        sync_policy: SyncPolicy,
        entry_bytes_max: int,
    ) -> None:
        """Use `MmapLogStore.open`; this takes the pieces open has checked."""
        self._root = root
        self._meta_path = root / META_FILE
        self._data = data
        self._index = index
        self._data_file_bytes = meta.data_file_bytes
        self._index_file_bytes = meta.index_file_bytes
        self._first_index = meta.first_index
        self._slot_base_index = meta.slot_base_index
        self._first_data_position = meta.first_data_position
        self._first_entry_present = meta.first_entry_present
        self._last_index = last_index
        self._data_end = data_end
        """Where the next entry (or the blank before it) goes in the data stream."""
        self._data_dirty_low: int | None = None
        self._sync_bytes_average = 0
        """Data bytes each sync flushed, averaged over the recent ones (see
        ZERO_AHEAD_SYNC_BYTES_MAX)."""
        self._index_dirty_low: int | None = None
        """The lowest index slot position written since the index was last msynced."""
        self._index_unwritten_low: int | None = None
        """The lowest index slot position written since the index was last written back
        (or msynced): what the next write-back starts from."""
        self._recovery = recovery
        self._sync_policy = sync_policy
        self._entry_bytes_max = entry_bytes_max
        self._closed = False
        self._failure: str | None = None
        """Set when an operation failed halfway; only reopening (which repairs) is safe."""
        self._lock_descriptor = -1
        """Holds the directory's lock (see `lock_directory`) while the store is open."""
        self._durable_data_end = data_end
        """Every data byte below this was covered by a sync that returned (open syncs
        what it found). See `begin_sync`."""
        self._sync_in_flight: CapturedSync | None = None
        """The background sync captured and not yet finished (one at a time)."""
        self._syncing_low: int | None = None
        """Where the data range of the sync in flight starts: a sync or cut made meanwhile
        on this thread flushes from there too, as that range is not durable yet."""
        self._syncing_directories: list[Path] = []
        """Directories the sync in flight fsyncs (a sync made meanwhile fsyncs them too)."""
        self._truncations = 0
        """Counts suffix truncations and resets: a background sync captured before one
        claims nothing when it finishes (the truncation made durable what it kept)."""

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        data_file_bytes: int = DATA_FILE_BYTES_DEFAULT,
        index_file_bytes: int = INDEX_FILE_BYTES_DEFAULT,
        sync_policy: SyncPolicy = SyncPolicy.EXPLICIT,
        entry_bytes_max: int | None = None,
    ) -> MmapLogStore:
        """Open the store at `path`, creating it if missing, and recover its tail.

        `entry_bytes_max` defaults to ENTRY_BYTES_MAX_DEFAULT, or to the largest entry data
        one data file can hold if that is smaller (an entry never spans files, and the
        64 MiB defaults would otherwise clash by the 48 bytes of a header). A value given
        explicitly must fit a data file.
        """
        if entry_bytes_max is None:
            entry_bytes_max = min(ENTRY_BYTES_MAX_DEFAULT, largest_entry_bytes(data_file_bytes))
        check_options(data_file_bytes, index_file_bytes, entry_bytes_max)
        if not isinstance(sync_policy, SyncPolicy):
            raise ValueError(f"sync_policy must be a SyncPolicy, got {sync_policy!r}")
        root = Path(path)
        with disk_errors(root):
            root.mkdir(parents=True, exist_ok=True)
        lock = lock_directory(root)  # before anything is read or written
        try:
            meta = open_meta(root, data_file_bytes, index_file_bytes)
        except BaseException:
            os.close(lock)
            raise
        data = MappedFileList(root / DATA_DIRECTORY, data_file_bytes)
        index = MappedFileList(root / INDEX_DIRECTORY, index_file_bytes)
        try:
            data.load(keep_from=meta.first_data_position)
            index.load(keep_from=slot_position(meta.first_index, meta.slot_base_index))
            if meta.cut_pending:
                redo_pending_cut(data, index, meta)
                meta = msgspec.structs.replace(meta, cut_pending=False)
                atomic_write(root / META_FILE, encode_meta(meta))
            tail = recover_tail(data, index, meta, str(root / META_FILE))
            make_found_durable(root, data, tail.data_end)
        except BaseException:
            data.close()
            index.close()
            os.close(lock)
            raise
        report = RecoveryReport(
            entries_found=tail.last_index - meta.first_index + 1,
            torn_bytes_dropped=tail.torn_bytes_dropped,
            torn_file=tail.torn_file,
        )
        store = cls(
            root, data, index, meta, tail.last_index, tail.data_end, report, sync_policy,
            entry_bytes_max,
        )  # fmt: skip
        store._lock_descriptor = lock
        return store

    # --- state ------------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        return self._first_index

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def recovery(self) -> RecoveryReport:
        return self._recovery

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the mmap log store at {self._root} is closed")
        if self._failure is not None:
            raise StorageError(
                f"the mmap log store at {self._root} failed ({self._failure}); "
                "close and reopen it to repair"
            )

    def _meta(self, **changes: object) -> Meta:
        meta = Meta(
            data_file_bytes=self._data_file_bytes,
            index_file_bytes=self._index_file_bytes,
            first_index=self._first_index,
            slot_base_index=self._slot_base_index,
            first_data_position=self._first_data_position,
            first_entry_present=self._first_entry_present,
        )
        return msgspec.structs.replace(meta, **changes)

    def _write_meta(self, meta: Meta) -> None:
        atomic_write(self._meta_path, encode_meta(meta))

    # --- appending --------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> None:
        """Append `entries` (indexes last_index + 1, ...). All or nothing: on a full disk
        (`DiskFullError`) nothing is written and the store can be appended to later."""
        self._check_usable()
        if not entries:
            return
        columns = EntryColumns(entries)
        if not columns.follow(self._last_index, self._entry_bytes_max):
            check_append(entries, self._last_index, self._entry_bytes_max)  # names the culprit
        start = self._data_end
        slot_low = slot_position(entries[0].index, self._slot_base_index)
        batch = encode(columns, start, self._data_file_bytes)
        end = batch.data_end
        slot_high = slot_low + len(batch.index_buffer)
        self._prepare_files(start, end, slot_low, slot_high)
        try:
            for position, buffers in batch.pieces:
                self._data.write_vectors(position, buffers)
            self._index.write(slot_low, batch.index_buffer)
        except BaseException as error:
            # Part of the batch may be in the files past the end. Appending on could leave
            # its entries after different ones, a log that never was; reopening treats them
            # as the tail of an interrupted append, which they are.
            self._failure = f"append failed while writing: {error}"
            raise
        if self._data_dirty_low is None:
            self._data_dirty_low = start
        if self._index_dirty_low is None:
            self._index_dirty_low = slot_low
        if self._index_unwritten_low is None:
            self._index_unwritten_low = slot_low
        self._data_end = end
        self._last_index = entries[-1].index
        if self._sync_policy is SyncPolicy.EVERY_APPEND:
            self._flush(index_lag_bytes=INDEX_FLUSH_LAG_BYTES)

    def _prepare_files(self, start: int, end: int, slot_low: int, slot_high: int) -> None:
        """Allocate every file a batch needs and write zeros ahead of its data, before a
        byte of the batch is written; on failure remove the files made here, so nothing
        changed.

        The zeros past the batch make later syncs overwrite written blocks (see mmap_files);
        they are past the end, where everything is zero already. Zeros still queued where
        the batch goes are waited for first, and a failed chunk of them fails this append
        before anything is made or written. The index gets no zeros ahead: its slots are
        msynced once per INDEX_FLUSH_LAG_BYTES, so its blocks' conversion is committed that
        rarely, where zeros would cost as many bytes of disk writes as the slots (8 KB a
        batch of 256 entries).
        """
        self._data.wait_for_zeros(end)
        if self._data.covers(start, end) and self._index.covers(slot_low, slot_high):
            # The usual case: the files exist, nothing can be left half made.
            if self._zeros_pay():
                self._data.zero_ahead(end)
            return
        data_created = self._data.ensure(start, end)
        index_created = 0
        try:
            index_created = self._index.ensure(slot_low, slot_high)
            if self._zeros_pay():
                self._data.zero_ahead(end)
        except BaseException:
            self._index.remove_last(index_created)
            self._data.remove_last(data_created)
            raise

    def _zeros_pay(self) -> bool:
        """Whether writing zeros ahead saves more than it costs: only for syncs (none
        under `SyncPolicy.NEVER`) that flush little data each."""
        return (
            self._sync_policy is not SyncPolicy.NEVER
            and self._sync_bytes_average <= ZERO_AHEAD_SYNC_BYTES_MAX
        )

    # --- durability -------------------------------------------------------------------

    def sync(self) -> None:
        """Make every append so far durable (nothing, under `SyncPolicy.NEVER`). It also
        covers the range of a background sync still in flight."""
        self._check_usable()
        if self._sync_policy is not SyncPolicy.NEVER:
            self._flush(index_lag_bytes=INDEX_FLUSH_LAG_BYTES)
        else:
            self._durable_data_end = self._data_end  # as durable as this policy makes data

    @property
    def durable_data_end(self) -> int:
        """Every data byte below this was covered by a sync that returned (under
        `SyncPolicy.NEVER`: by a `sync` or `finish_sync` call, which flush nothing)."""
        return self._durable_data_end

    def begin_sync(self) -> CapturedSync:
        """Capture what is written and not yet synced, for a sync off this thread.

        Run the result's `run` on any thread, then pass it to `finish_sync` here. Appends
        may go on meanwhile (they stay dirty for the next sync); so may `sync` and the
        truncations, which flush the captured range themselves. One at a time.
        """
        self._check_usable()
        require(self._sync_in_flight is None, "a background sync is already in flight")
        data_low, data_end = self._data_dirty_low, self._data_end
        if self._sync_policy is SyncPolicy.NEVER:
            captured = CapturedSync(data_low=data_end, data_end=data_end, pieces=[],
                                    directories=[], generation=self._truncations)  # fmt: skip
            self._sync_in_flight = captured
            return captured
        pieces = []
        try:
            if data_low is not None:
                pieces = capture_pieces(self._data, data_low, data_end)
            index_low, slot_end = self._index_dirty_low, self._slot_end()
            index_captured = index_low is not None and slot_end - index_low > INDEX_FLUSH_LAG_BYTES
            if index_captured and index_low is not None:
                pieces += capture_pieces(self._index, index_low, slot_end)
        except BaseException:
            close_pieces(pieces)
            raise
        # Forget only what was captured: appends go at data_end or past it, so whatever
        # is written from now on sets the dirty marks again and the next sync covers it.
        if data_low is not None:
            self._note_sync_bytes(data_end - data_low)
            self._data_dirty_low = None
        if index_captured:
            self._index_dirty_low = self._index_unwritten_low = None
        directories = [d.directory for d in (self._data, self._index) if d.directory_dirty]
        self._data.directory_dirty = self._index.directory_dirty = False
        captured = CapturedSync(
            data_low=data_end if data_low is None else data_low,
            data_end=data_end,
            pieces=pieces,
            directories=directories,
            generation=self._truncations,
        )
        self._sync_in_flight = captured
        self._syncing_low = data_low
        self._syncing_directories = directories
        return captured

    def finish_sync(self, captured: CapturedSync, error: BaseException | None) -> int:
        """Back on this thread after `captured.run` returned (`error`: what it raised).
        Returns the durable data end, advanced to the captured end only if the sync ran
        and no truncation came between. A failed sync fails the store (reopen repairs):
        after a failed msync the kernel may have dropped the dirty pages."""
        require(self._sync_in_flight is captured, "finish_sync of a sync not in flight")
        self._sync_in_flight = None
        self._syncing_low = None
        self._syncing_directories = []
        if error is not None or not captured.ran:
            captured.discard()
            if not self._closed:
                self._failure = f"sync failed: {error or 'it did not run'}"
            return self._durable_data_end
        if captured.generation == self._truncations:
            self._durable_data_end = max(self._durable_data_end, captured.data_end)
        require(
            self._durable_data_end <= self._data_end,
            "durable data end %d is past the data end %d",
            self._durable_data_end,
            self._data_end,
        )
        return self._durable_data_end

    def _note_sync_bytes(self, flushed: int) -> None:
        average = self._sync_bytes_average
        self._sync_bytes_average = average + (flushed - average) // SYNC_BYTES_AVERAGE_WEIGHT

    def _flush(self, *, index_lag_bytes: int = 0) -> None:
        """msync the data written since the last flush, and the index slots too once more
        than `index_lag_bytes` of them were not msynced; fsync directories that changed.

        msync of the written range rather than fdatasync of the file: fdatasync would also
        write and wait for the zeros written ahead (see mmap_files), whose write-back is
        meant to run off this path.

        The index may lag: it is rebuilt from the data, at open for its tail and on read
        for any hole. Slots past INDEX_WRITE_BACK_LAG_BYTES are written back (without a
        flush) just before the data's msync, whose device flush then carries them to the
        disk: no flush of their own. Their blocks' conversion from unwritten to written
        (see mmap_files) is committed by the journal's next commit, or by the index's own
        msync once `index_lag_bytes` are waiting; a power failure before that loses only
        slots, which open rebuilds. Bounding the lag bounds how much data open must parse
        after a crash.
        """
        try:
            data_low = self._unsynced_data_low()
            slot_end = self._slot_end()
            if data_low is not None:
                self._write_back_index(slot_end)
                self._data.flush(data_low, self._data_end)
                self._note_sync_bytes(self._data_end - data_low)
                self._data_dirty_low = None
                self._syncing_low = None  # a sync in flight covers nothing more than this
            self._durable_data_end = self._data_end
            index_low = self._index_dirty_low
            if index_low is not None and slot_end - index_low > index_lag_bytes:
                self._index.flush(index_low, slot_end)
                self._index_dirty_low = self._index_unwritten_low = None
            self._sync_captured_directories()
            self._data.sync_directory()
            self._index.sync_directory()
        except BaseException as error:
            # After a failed msync/fsync the kernel may have dropped the dirty pages; what
            # is on disk is unknown until open checks it again.
            self._failure = f"sync failed: {error}"
            raise

    def _write_back_index(self, slot_end: int) -> None:
        """Write back the index slots not yet written, once more than
        INDEX_WRITE_BACK_LAG_BYTES of them wait (see `_flush`); msync them where write-back
        is not available."""
        low = self._index_unwritten_low
        if low is None or slot_end - low <= INDEX_WRITE_BACK_LAG_BYTES:
            return
        if not self._index.write_back(low, slot_end):
            dirty_low = self._index_dirty_low
            self._index.flush(low if dirty_low is None else min(low, dirty_low), slot_end)
            self._index_dirty_low = None
        self._index_unwritten_low = None

    def _sync_captured_directories(self) -> None:
        """fsync the directories a sync in flight captured: a sync on this thread that
        reports everything durable must not wait for that one to have done it."""
        directories, self._syncing_directories = self._syncing_directories, []
        for directory in directories:
            with disk_errors(directory):
                fsync_directory(directory)

    def _unsynced_data_low(self) -> int | None:
        """The lowest data position not known durable: dirty, or in a sync in flight."""
        dirty_low, syncing_low = self._data_dirty_low, self._syncing_low
        if syncing_low is None:
            return dirty_low
        return syncing_low if dirty_low is None else min(dirty_low, syncing_low)

    def _slot_end(self) -> int:
        return slot_position(self._last_index + 1, self._slot_base_index)

    # --- reading ----------------------------------------------------------------------

    def _locate(self, index: int) -> tuple[MappedFile, int, EntryHeader]:
        """The data file, offset and verified header of entry `index` (known to be in range).

        A slot that is missing or disagrees with the data (the index is flushed lazily, so a
        crash can leave holes in its tail) is rebuilt from the data, walking forward from
        the nearest earlier slot that agrees; if the data there is bad, that raises.
        """
        found = self._locate_by_slot(index)
        if found is not None:
            return found
        anchor = index - 1
        position = self._first_data_position
        while anchor >= self._first_index:
            earlier = self._locate_by_slot(anchor)
            if earlier is not None:
                position = earlier[2].position + earlier[2].size
                break
            anchor -= 1
        repair = IndexRepair(self._index, self._slot_base_index)
        header = walk_to(self._data, repair, position, anchor + 1, index)
        if repair.low is not None:
            dirty_low, unwritten_low = self._index_dirty_low, self._index_unwritten_low
            self._index_dirty_low = repair.low if dirty_low is None else min(dirty_low, repair.low)
            self._index_unwritten_low = (
                repair.low if unwritten_low is None else min(unwritten_low, repair.low)
            )
        data_file = self._data.require(header.position)
        return data_file, header.position - data_file.start, header

    def _locate_by_slot(self, index: int) -> tuple[MappedFile, int, EntryHeader] | None:
        """Like `_locate`, by the slot alone; None if the slot does not lead to the entry."""
        position = slot_position(index, self._slot_base_index)
        index_file = self._index.file_at(position)
        if index_file is None:
            return None
        magic, data_position, size, slot_index, term = INDEX_SLOT.unpack_from(
            index_file.map, position - index_file.start
        )
        if magic != INDEX_MAGIC or slot_index != index:
            return None
        data_file = self._data.file_at(data_position)
        if data_file is None:
            return None
        offset = data_position - data_file.start
        header = decode_header(data_file.map[offset : offset + ENTRY_HEADER_BYTES])
        if isinstance(header, str):
            return None
        if (header.index, header.term, header.position, header.size) != (
            index,
            term,
            data_position,
            size,
        ) or offset + size > self._data_file_bytes:
            return None
        return data_file, offset, header

    def _read(self, index: int) -> LogEntry:
        data_file, offset, header = self._locate(index)
        body_offset = offset + ENTRY_HEADER_BYTES
        body = data_file.map[body_offset : body_offset + header.body_bytes]
        if _crc32c(body) != header.body_crc:
            raise CorruptLogError(str(data_file.path), offset, f"entry {index}: body checksum")
        return LogEntry(index=index, term=header.term, data=body, type=header.entry_type)

    def _check_readable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the mmap log store at {self._root} is closed")

    def entry(self, index: int) -> LogEntry:
        self._check_readable()
        check_index(index, self._first_index, self._last_index)
        return self._read(index)

    def entries(self, low: int, high: int) -> list[LogEntry]:
        """Entries with low <= index < high."""
        self._check_readable()
        check_range(low, high, self._first_index, self._last_index)
        return [self._read(index) for index in range(low, high)]

    def iter_entries(self, low: int, high: int) -> Iterator[LogEntry]:
        """Entries with low <= index < high, read one at a time (the range is checked now)."""
        self._check_readable()
        check_range(low, high, self._first_index, self._last_index)
        return self._iterate(low, high)

    def _iterate(self, low: int, high: int) -> Iterator[LogEntry]:
        for index in range(low, high):
            self._check_readable()
            yield self._read(index)

    def term(self, index: int) -> int:
        self._check_readable()
        check_index(index, self._first_index, self._last_index)
        return self._locate(index)[2].term

    # --- byte positions (the HA commit log addresses messages by them) ------------------

    @property
    def first_data_position(self) -> int:
        """Where the first entry (or the blank before it) lies in the data stream."""
        return self._first_data_position

    @property
    def data_end(self) -> int:
        """The data stream position just past the last entry (where the next one, or the
        blank before it, goes)."""
        return self._data_end

    def entry_span(self, index: int) -> tuple[int, int]:
        """Entry `index`'s position in the data stream and the bytes it occupies there."""
        self._check_readable()
        check_index(index, self._first_index, self._last_index)
        header = self._locate(index)[2]
        return header.position, header.size

    # --- truncation -------------------------------------------------------------------

    def truncate_suffix(self, last_kept: int) -> None:
        """Drop every entry after `last_kept`; durable when it returns."""
        self._check_usable()
        check_truncate_suffix(last_kept, self._first_index, self._last_index)
        if last_kept >= self._last_index:
            return
        if last_kept >= self._first_index:
            header = self._locate(last_kept)[2]
            cut_position = header.position + header.size
        else:
            cut_position = self._first_data_position
        present = self._first_entry_present and last_kept >= self._first_index
        self._write_meta(
            self._meta(
                first_entry_present=present,
                cut_pending=True,
                cut_last_kept=last_kept,
                cut_data_position=cut_position,
            )
        )
        try:
            self._cut(last_kept, cut_position)
            self._first_entry_present = present
            self._write_meta(self._meta())
        except BaseException as error:
            self._failure = f"truncate_suffix({last_kept}) failed: {error}"
            raise

    def _cut(self, last_kept: int, cut_position: int) -> None:
        """Zero the data and slots after `last_kept`, flush, and drop files past the cut."""
        slot_cut = slot_position(last_kept + 1, self._slot_base_index)
        # Flush from the lowest byte that changed since the last flush: the zeros, and any
        # appends before the cut that were not synced yet.
        data_low = cut_position
        unsynced_low = self._unsynced_data_low()
        if unsynced_low is not None:
            data_low = min(data_low, unsynced_low)
        index_low = slot_cut
        if self._index_dirty_low is not None:
            index_low = min(index_low, self._index_dirty_low)
        data_high = self._data_end
        index_high = self._slot_end()
        self._data.zero(cut_position, data_high)
        self._index.zero(slot_cut, index_high)
        self._data.flush(data_low, data_high)
        self._index.flush(index_low, index_high)
        self._data_dirty_low = self._index_dirty_low = self._index_unwritten_low = None
        self._data.remove_above(cut_position)
        self._index.remove_above(slot_cut)
        self._sync_captured_directories()
        self._data.sync_directory()
        self._index.sync_directory()
        self._last_index = last_kept
        self._data_end = cut_position
        self._durable_data_end = cut_position
        self._syncing_low = None  # flushed above: the sync in flight now claims nothing
        self._truncations += 1

    def truncate_prefix(self, first_kept: int) -> None:
        """Drop every entry before `first_kept`; durable when it returns.

        If deleting the old files fails, the truncation has still taken effect (the meta is
        written first) and the error is raised; the next open deletes the leftovers.
        """
        self._check_usable()
        check_truncate_prefix(first_kept, self._first_index, self._last_index)
        if first_kept == self._first_index:
            return
        # The meta is about to say entry first_kept exists: it must be on disk first.
        self._flush()
        present = first_kept <= self._last_index
        first_data_position = self._locate(first_kept)[2].position if present else self._data_end
        self._write_meta(
            self._meta(
                first_index=first_kept,
                first_data_position=first_data_position,
                first_entry_present=present,
            )
        )
        self._first_index = first_kept
        self._first_data_position = first_data_position
        self._first_entry_present = present
        self._data.remove_below(first_data_position)
        self._index.remove_below(slot_position(first_kept, self._slot_base_index))
        self._data.sync_directory()
        self._index.sync_directory()

    def reset(self, next_index: int) -> None:
        """Drop everything; the log is empty with first_index == next_index. Durable.

        The streams go on at fresh file boundaries past every existing file, so that files
        a crash leaves behind are all below the new start and open deletes them.
        """
        self._check_usable()
        check_reset(next_index)
        data_start = self._data.end
        if data_start is None:
            data_start = _round_up(self._data_end, self._data_file_bytes)
        slot_start = self._index.end
        if slot_start is None:
            slot_start = _round_up(self._slot_end(), self._index_file_bytes)
        slot_base_index = next_index - slot_start // INDEX_SLOT_BYTES
        self._write_meta(
            Meta(
                data_file_bytes=self._data_file_bytes,
                index_file_bytes=self._index_file_bytes,
                first_index=next_index,
                slot_base_index=slot_base_index,
                first_data_position=data_start,
                first_entry_present=False,
            )
        )
        self._first_index = next_index
        self._last_index = next_index - 1
        self._slot_base_index = slot_base_index
        self._first_data_position = data_start
        self._first_entry_present = False
        self._data_end = data_start
        self._data_dirty_low = self._index_dirty_low = self._index_unwritten_low = None
        self._durable_data_end = data_start
        self._syncing_low = None  # nothing it covered is kept: it now claims nothing
        self._truncations += 1
        try:
            self._data.remove_all()
            self._index.remove_all()
            self._data.sync_directory()
            self._index.sync_directory()
        except BaseException as error:
            self._failure = f"reset({next_index}) could not delete old files: {error}"
            raise

    def close(self) -> None:
        """Unmap every file. Does not sync: call `sync` first for durability."""
        if self._closed:
            return
        self._closed = True
        self._data.close()
        self._index.close()
        if self._lock_descriptor >= 0:
            os.close(self._lock_descriptor)
            self._lock_descriptor = -1


__all__ = ["DATA_FILE_BYTES_DEFAULT", "INDEX_FILE_BYTES_DEFAULT", "MmapLogStore"]
