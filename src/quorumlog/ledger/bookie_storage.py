"""Bookie storage: a journal with group commit, an entry log and an index (reference 001).

**Journal and entry log are one file.** BookKeeper writes each add twice: to the journal
(sequential, fsynced before the ack) and to the entry log (flushed later, indexed, read
from), and puts the journal on a disk of its own so its fsyncs never wait behind entry-log
flushes. We run one disk, so that separation buys nothing, while writing twice costs twice
the bytes and a second flush stream on the same device. So each record is written once, to
the end of the current log file, and that file is both: its fsync is the journal's group
commit, and the index points into it to serve reads. Restart replays these files (reading
the journal and rebuilding the index are the same pass, bookie_recovery). What we give up
is BookKeeper's read locality (its entry log is sorted by ledger at flush): entries of one
ledger are spread between others, which costs recovery reads a pread per run of entries.

Layout and bytes: bookie_format. Index: bookie_index (in memory, rebuilt at open, about 20
bytes per entry stored); entry data stays on disk and is read back, checked, by bookie_reads.

**Group commit.** Writes (adds, fences, drops) go to the file at once, on the caller's
thread, and each returns the log position that must be durable before it may be answered.
`begin_sync` hands out a job that fsyncs everything written so far; the caller runs it off
its thread (runtime.resources.Background) and reports back with `finish_sync`, which moves
`durable_position`. Everything written while one sync runs shares the next one: N adds from
any number of ledgers, one fsync. One sync job at a time.

**Files and garbage.** A file is rolled once it passes `file_bytes_max`: it is synced in
full first (so a torn tail can only ever be in the newest file), and the new file starts
with a checkpoint of every live ledger's state. Once no live ledger has entries in a file,
the file is deleted (after the drop that freed it is durable): that is the whole compaction.
A ledger that lives long pins the files with its entries; entries are never copied.

**Errors.** A full disk raises DiskFullError after cutting the partial write off again, so
the storage goes on once there is room. Any other failed write or a failed sync stops all
writes (the file's state is unknown; reads go on) until the storage is reopened.

File I/O goes through the small `BookieFileSystem` interface (bookie_files), so the
simulator can run this on its disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import msgspec

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.errors import DiskFullError, StorageError, StoreClosedError
from quorumlog.ledger.bookie_files import (
    OS_BOOKIE_FILE_SYSTEM,
    BookieDirectoryLock,
    BookieFileHandle,
    BookieFileSystem,
    ensure_directory,
)
from quorumlog.ledger.bookie_format import (
    FILE_HEADER_BYTES,
    LENGTH_UNKNOWN,
    RecordKind,
    encode_checkpoint,
    encode_entries_record,
    encode_file_header,
    encode_record,
    log_file_name,
)
from quorumlog.ledger.bookie_index import StoredEntry
from quorumlog.ledger.bookie_reads import EntryReads
from quorumlog.ledger.bookie_recovery import recover_directory
from quorumlog.ledger.bookie_state import BookieState, LedgerState
from quorumlog.raft.invariants import require
from quorumlog.storage.base import RecoveryReport

_OFFSET_BITS = 32
FILE_OFFSET_LIMIT = 1 << _OFFSET_BITS
"""Offsets in a file are 32-bit (the index packs file number and offset into 64 bits)."""


def log_position(file_number: int, offset: int) -> int:
    """One number that orders every byte of the log: file first, then offset."""
    return (file_number << _OFFSET_BITS) | offset


class BookieStorageSettings(msgspec.Struct, frozen=True):
    file_bytes_max: int = 64 * 1024 * 1024
    """A log file is rolled once a write would take it past this (open reads a file whole,
    so it also bounds the memory open needs)."""
    read_files_open_max: int = 16
    """Files kept open for reads (least recently used closed first)."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        if not FILE_HEADER_BYTES < self.file_bytes_max <= FILE_OFFSET_LIMIT // 2:
            raise ValueError(f"file_bytes_max must be in {FILE_HEADER_BYTES + 1}..2**31")
        if self.read_files_open_max < 1:
            raise ValueError("read_files_open_max must be >= 1")


class SyncJob:
    """An fsync of everything written up to `position`: run `run` off the storage's thread,
    then hand the job back to `BookieStorage.finish_sync` on it."""

    __slots__ = ("handle", "position")

    def __init__(self, handle: BookieFileHandle, position: int) -> None:
        self.handle = handle
        self.position = position

    def run(self) -> None:
        self.handle.sync_data()


class BookieStorage:
    """A bookie's ledgers on disk. Not thread-safe: one thread calls everything but
    `SyncJob.run`."""

    def __init__(
        self,
        directory: Path,
        file_system: BookieFileSystem,
        settings: BookieStorageSettings,
        lock: BookieDirectoryLock,
    ) -> None:
        self.directory = directory
        self.file_system = file_system
        self.settings = settings
        self.lock: BookieDirectoryLock | None = lock
        self.state = BookieState()
        self.recovery = RecoveryReport()
        self.file_numbers: list[int] = []
        self.file_sizes: dict[int, int] = {}
        """Sizes of the files not being written (the one being written: writer_offset)."""
        self.writer: BookieFileHandle | None = None
        self.writer_number = 0
        self.writer_offset = 0
        self.writer_first_record_end = 0
        self.durable_position = 0
        self.sync_in_flight = False
        self.retired_writers: list[BookieFileHandle] = []
        """Writers of rolled files that a sync job may still hold: closed when it reports."""
        self.reads = EntryReads(directory, file_system, settings.read_files_open_max)
        self.garbage_due: list[int] = []
        """Positions of drop records: once one is durable, its ledger's files may go."""
        self.failure: BaseException | None = None

    @classmethod
    def open(
        cls,
        directory: Path | str,
        *,
        file_system: BookieFileSystem = OS_BOOKIE_FILE_SYSTEM,
        settings: BookieStorageSettings | None = None,
    ) -> BookieStorage:
        """Open (or create) the storage in `directory`: replay its files, cut a torn tail,
        and start a new log file whose checkpoint restates what was found."""
        settings = settings or BookieStorageSettings()
        settings.validate()
        directory = Path(directory)
        ensure_directory(file_system, directory)
        lock = file_system.lock_directory(directory)
        storage = cls(directory, file_system, settings, lock)
        try:
            recovered = recover_directory(file_system, directory)
            storage.state = recovered.state
            storage.recovery = recovered.report
            storage.file_numbers = recovered.file_numbers
            storage.file_sizes = recovered.file_sizes
            next_number = recovered.file_numbers[-1] + 1 if recovered.file_numbers else 1
            storage.start_file(next_number)
            storage.collect_garbage()
        except BaseException:
            storage.close()
            raise
        return storage

    # --- views ------------------------------------------------------------------------

    @property
    def written_position(self) -> int:
        return log_position(self.writer_number, self.writer_offset)

    @property
    def writable(self) -> bool:
        return self.lock is not None and self.failure is None

    def ledger(self, ledger_id: int) -> LedgerState | None:
        return self.state.ledgers.get(ledger_id)

    def ledger_ids(self) -> list[int]:
        return sorted(self.state.ledgers)

    @property
    def bytes_on_disk(self) -> int:
        return sum(self.file_sizes.values()) + self.writer_offset

    # --- writes: each returns the position that must be durable before it is answered --

    def add_entries(
        self,
        ledger_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        entry_ids: Sequence[int],
        datas: Sequence[bytes],
        length: int = LENGTH_UNKNOWN,
    ) -> int:
        """Store entries of a ledger (taking `master_key` as its key if it is new here), and
        with them the LAC that rode on them and `length`, the ledger's bytes through it."""
        require(length >= LENGTH_UNKNOWN, f"a ledger length of {length} bytes")
        state = self.state.ledgers.get(ledger_id)
        record, offsets, lengths = encode_entries_record(
            ledger_id, last_add_confirmed, entry_ids, datas, length
        )
        key_record = b""
        if state is None:
            key_record = encode_record(RecordKind.MASTER_KEY, ledger_id, -1, 0, master_key)
            record = key_record + record
        offset = self.write(record)
        if state is None:
            state = self.state.create(ledger_id, master_key)
        base = offset + len(key_record)
        self.state.add_entries(
            ledger_id,
            state,
            last_add_confirmed,
            length,
            self.writer_number,
            base,
            entry_ids,
            offsets,
            lengths,
        )
        return self.written_position

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence a ledger (creating it with `master_key` if it is new here, so the old
        writer cannot start it afresh on this bookie). Idempotent."""
        state = self.state.ledgers.get(ledger_id)
        if state is not None and state.fenced:
            return state.fence_position
        record = encode_record(RecordKind.FENCE, ledger_id, -1, 0, b"")
        if state is None:
            record = encode_record(RecordKind.MASTER_KEY, ledger_id, -1, 0, master_key) + record
        self.write(record)
        if state is None:
            state = self.state.create(ledger_id, master_key)
        state.fenced = True
        state.fence_position = self.written_position
        return state.fence_position

    def drop(self, ledger_id: int) -> int:
        """Forget a ledger; its files go once no live ledger has entries in them."""
        if ledger_id in self.state.ledgers:
            self.write(encode_record(RecordKind.DROP, ledger_id, -1, 0, b""))
            self.state.drop(ledger_id)
            self.garbage_due.append(self.written_position)
        # An unknown ledger: answered once what is written so far is durable (it may be
        # the drop of the same ledger a moment ago).
        return self.written_position

    def write(self, record: bytes) -> int:
        """Append `record` to the file being written; returns the offset it starts at."""
        self.check_writable()
        writer = self.current_writer()
        end = self.writer_offset + len(record)
        if end > self.settings.file_bytes_max and self.writer_offset > self.writer_first_record_end:
            self.roll()
            return self.write(record)
        require(end < FILE_OFFSET_LIMIT, f"a record of {len(record)} bytes does not fit a file")
        offset = self.writer_offset
        try:
            writer.write_at(record, offset)
        except DiskFullError:
            self.cut_back(writer, offset)
            raise
        except StorageError as error:
            self.failure = error
            raise
        self.writer_offset = end
        return offset

    def cut_back(self, writer: BookieFileHandle, offset: int) -> None:
        """Cut a partial write off again, so new records go on from a clean end (open
        tells a torn tail by the zeros after it)."""
        try:
            writer.truncate(offset)
        except StorageError as error:
            self.failure = error

    # --- group commit -----------------------------------------------------------------

    def begin_sync(self) -> SyncJob | None:
        """A job that makes everything written so far durable, or None if it already is."""
        require(not self.sync_in_flight, "a bookie storage runs one sync job at a time")
        self.check_writable()
        if self.durable_position >= self.written_position:
            return None
        self.sync_in_flight = True
        return SyncJob(self.current_writer(), self.written_position)

    def finish_sync(self, job: SyncJob, error: BaseException | None) -> None:
        """The job ran (error None) or failed: then writes stop until reopened, as the
        kernel may have dropped the pages it could not write."""
        self.sync_in_flight = False
        retired, self.retired_writers = self.retired_writers, []
        for handle in retired:
            self.close_quietly(handle)
        if error is not None:
            self.failure = error
            return
        self.durable_position = max(self.durable_position, job.position)
        if self.garbage_due and self.garbage_due[0] <= self.durable_position:
            self.garbage_due = [p for p in self.garbage_due if p > self.durable_position]
            self.collect_garbage()

    # --- files ------------------------------------------------------------------------

    def start_file(self, number: int) -> None:
        """Begin log file `number` with its header and a checkpoint, durable (name too)
        before anything is added to it."""
        path = self.directory / log_file_name(number)
        handle = self.file_system.create_file(path, exclusive=False)
        head = encode_file_header(number) + encode_checkpoint(self.state.checkpoint_items())
        try:
            handle.write_at(head, 0)
            handle.sync_data()
            self.file_system.sync_directory(self.directory)
        except StorageError:
            self.close_quietly(handle)
            self.unlink_quietly(path)
            raise
        self.writer = handle
        self.writer_number = number
        self.writer_offset = len(head)
        self.writer_first_record_end = len(head)
        self.file_numbers.append(number)
        self.durable_position = self.written_position

    def roll(self) -> None:
        """Close the file being written (synced in full) and start the next one."""
        old = self.current_writer()
        try:
            old.sync_data()
        except StorageError as error:
            self.failure = error
            raise
        self.durable_position = self.written_position
        old_number, old_size = self.writer_number, self.writer_offset
        self.start_file(old_number + 1)
        self.file_sizes[old_number] = old_size
        if self.sync_in_flight:
            self.retired_writers.append(old)
        else:
            self.close_quietly(old)
        self.collect_garbage()

    def collect_garbage(self) -> int:
        """Delete the files that hold no entry of a live ledger; returns how many went."""
        deleted = 0
        for number in self.state.garbage_files(self.file_numbers, self.writer_number):
            self.reads.forget(number)
            try:
                self.file_system.unlink(self.directory / log_file_name(number))
            except StorageError:
                continue  # tried again at the next collection
            self.file_numbers.remove(number)
            self.file_sizes.pop(number, None)
            self.state.forget_file(number)
            deleted += 1
        if deleted:
            # A file that comes back after a crash is garbage again at open.
            with suppress(StorageError):
                self.file_system.sync_directory(self.directory)
        return deleted

    # --- reads ------------------------------------------------------------------------

    def read_entries(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        bytes_max: int,
        entries_max: int,
    ) -> list[LedgerEntryData]:
        """Stored entries of first..last in id order (ids not stored here skipped), as many
        as fit `bytes_max` of data and `entries_max` (the first one always fits)."""
        state = self.state.ledgers.get(ledger_id)
        if state is None:
            return []
        picked: list[StoredEntry] = []
        total_bytes = 0
        for stored in state.index.scan(first_entry_id, last_entry_id):
            if picked and (total_bytes + stored.length > bytes_max or len(picked) >= entries_max):
                break
            picked.append(stored)
            total_bytes += stored.length
        return self.reads.read(picked)

    # --- life -------------------------------------------------------------------------

    def current_writer(self) -> BookieFileHandle:
        if self.writer is None:
            raise StoreClosedError(f"bookie storage at {self.directory} is closed")
        return self.writer

    def check_writable(self) -> None:
        if self.lock is None:
            raise StoreClosedError(f"bookie storage at {self.directory} is closed")
        if self.failure is not None:
            raise StorageError(
                f"bookie storage at {self.directory} stopped taking writes after a failed "
                f"write or sync (reopen it): {self.failure}"
            )

    def close(self) -> None:
        """Release files and the lock (no sync: what is not durable yet may be lost)."""
        self.reads.close()
        handles = list(self.retired_writers)
        if self.writer is not None:
            handles.append(self.writer)
        self.retired_writers = []
        self.writer = None
        for handle in handles:
            self.close_quietly(handle)
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def close_quietly(self, handle: BookieFileHandle) -> None:
        # Closing after the data was synced (or given up on) loses nothing more.
        with suppress(StorageError):
            handle.close()

    def unlink_quietly(self, path: Path) -> None:
        # A half-started file left behind is the newest, torn in its checkpoint: open
        # removes it, and the next roll starts it afresh.
        with suppress(StorageError):
            self.file_system.unlink(path)
