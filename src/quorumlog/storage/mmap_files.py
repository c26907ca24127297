"""A list of fixed-size, preallocated, memory-mapped files that make one logical byte stream.

Like DLedger's MmapFileList (RocketMQ's MappedFileQueue): file k of the stream covers
positions [start, start + file_bytes) and is named by `start`, zero-padded to 20 digits.
Files are contiguous; the first one may start anywhere on a file boundary because a prefix
of the stream can be deleted.

Files are allocated with `os.posix_fallocate` before they are mapped: a full disk then shows
up as ENOSPC (a `DiskFullError`) when the file is created, not as SIGBUS when a store into
a mapped page finds no block behind it.

Reads and recovery go through the mappings; appends go through `os.pwrite` on the same
file. Both reach the same page cache pages, so the mapping sees every write at once. pwrite
is there for speed: the first store into each page of a shared file mapping takes a page
fault, which made copying a batch into a fresh mapping about 4x slower than writing it.

posix_fallocate leaves its blocks "unwritten": the first write-back of each block turns it
into a written one, a change of file metadata, so a sync of fresh blocks commits the
filesystem journal on top of writing the data. `zero_ahead` has zeros written over the blocks
past the end of the stream, well ahead of the appends, by a thread that also syncs them
(mmap_zeroing), so that the conversion happens off the sync path and a sync only overwrites
blocks that are written already (on the bench VM's ext4: a 38 KB sync about 160 µs instead
of about 280 µs).

What that costs in bytes (session 9; bios the store's threads submitted, counted with `perf
record -e block:block_bio_queue`, 800 batches of 256 x 100 B with a sync each): 103 KB per
batch, against 38 KB for the segment store (whose journal commits, written by jbd2, are not
in that count): the batch's 39 KB and its partly filled last page again at the next sync,
as many bytes of zeros, 8 KB of index slots and 8 KB of zeros for them. (Session 10: the
index gets no zeros ahead any more, and its slots ride the data's syncs; see
`MmapLogStore._flush`.) On a virtual disk
whose device flush persists everything written before it, the zeros' chunk is paid for by
the syncs that come while it is written (`python -m quorumlog.bench.storage_stalls`: at load
5, syncs that overlapped a chunk added about 100 µs a batch over plain ones of about 250
µs); without zeros every sync commits the journal, which measured about 10% slower still.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from quorumlog.errors import CorruptLogError, StorageError
from quorumlog.storage.files import disk_errors, fsync_directory, storage_error
from quorumlog.storage.mmap_format import ENTRY_ALIGNMENT_BYTES, ENTRY_MAGIC_BYTES
from quorumlog.storage.mmap_writeback import write_back, writeback_available
from quorumlog.storage.mmap_zeroing import ZeroQueue

FILE_NAME_DIGITS = 20
ZERO_SCAN_CHUNK_BYTES = 1024 * 1024
_PAGE_BYTES = mmap.PAGESIZE
_IOV_MAX = os.sysconf("SC_IOV_MAX") if os.sysconf("SC_IOV_MAX") > 0 else 1024
"""Buffers one pwritev may take (Linux: 1024)."""
ZERO_AHEAD_BYTES = 1024 * 1024
"""Zeros queued past the end of a stream in one chunk (see `MappedFileList.zero_ahead`).

Written on the appending thread (session 7), each chunk made the sync after it take 2-4 ms
(a journal commit that waited for the chunk), which gave back much of what the other syncs
saved (their median fell from about 330 to 210 µs). The zeroing thread (mmap_zeroing) now
writes and commits each chunk off that path. Measured in one process, stores alternating in
blocks of 25 batches of 256 x 100 B, loaded machine (load 6-9): the thread against the
chunks written on the appending thread 0.98-1.15 (mean 1.05 over 5 runs); writing the chunk
and only starting its write-back on the thread (no sync there) was no better than inline."""
ZERO_AHEAD_LEAD_BYTES = 2 * 1024 * 1024
"""How far past the end the zeros must reach after an append; below that, another chunk is
queued. The lead gives the zeroing thread time to finish a chunk (many appends) before the
appends reach it; an append that reaches a chunk still queued waits for it."""
_ZERO_CHUNK = bytes(ZERO_SCAN_CHUNK_BYTES)


class MappedFile:
    """One file of the stream and its shared, writable mapping."""

    __slots__ = ("map", "path", "start")

    def __init__(self, start: int, path: Path, mapping: mmap.mmap) -> None:
        self.start = start
        self.path = path
        self.map = mapping


def file_name(start: int) -> str:
    return f"{start:0{FILE_NAME_DIGITS}d}"


def _map_file(path: Path, file_bytes: int, *, create: bool) -> mmap.mmap:
    """Open (or create), make `file_bytes` long with real blocks behind it, and map."""
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    with disk_errors(path):
        descriptor = os.open(path, flags, 0o644)
        try:
            if os.fstat(descriptor).st_size < file_bytes:
                os.posix_fallocate(descriptor, 0, file_bytes)
            return mmap.mmap(descriptor, file_bytes, mmap.MAP_SHARED)
        finally:
            # mmap keeps a duplicate of the descriptor; ours is no longer needed.
            os.close(descriptor)


class MappedFileList:
    """The files of one stream in one directory (the store's data/ or index/)."""

    def __init__(self, directory: Path, file_bytes: int) -> None:
        self.directory = directory
        self.file_bytes = file_bytes
        self.files: list[MappedFile] = []
        self.directory_dirty = False
        """Files were created or removed since the directory was last fsynced."""
        self._write_path: Path | None = None
        self._write_descriptor = -1
        """A descriptor of the file last written, kept open: appends hit one file for long."""
        self.zeroed_end = 0
        """Zeros were queued (by `zero_ahead`) up to this position of the stream."""
        self.zeros = ZeroQueue()

    # --- loading ----------------------------------------------------------------------

    def load(self, keep_from: int) -> None:
        """Map the files on disk. Files wholly below `keep_from` are leftovers of a prefix
        truncation that crashed before its unlinks, and are deleted now."""
        starts: list[int] = []
        for name in os.listdir(self.directory):
            if len(name) == FILE_NAME_DIGITS and name.isdigit():
                starts.append(int(name))
        starts.sort()
        for start in starts:
            if start % self.file_bytes != 0:
                raise CorruptLogError(
                    str(self.directory / file_name(start)),
                    0,
                    f"file start is not a multiple of the file size {self.file_bytes}",
                )
        removable = [start for start in starts if start + self.file_bytes <= keep_from]
        for start in removable:
            self._unlink(self.directory / file_name(start))
        kept = starts[len(removable) :]
        if kept and kept[0] > self.start_of(keep_from):
            raise CorruptLogError(
                str(self.directory / file_name(self.start_of(keep_from))),
                0,
                f"the file holding stream position {keep_from} is missing",
            )
        for number, start in enumerate(kept):
            path = self.directory / file_name(start)
            if number > 0 and start != kept[number - 1] + self.file_bytes:
                raise CorruptLogError(
                    str(path),
                    0,
                    f"gap in the file list: previous file starts at {kept[number - 1]}",
                )
            size = path.stat().st_size
            is_last = number == len(kept) - 1
            if size > self.file_bytes or (size < self.file_bytes and not is_last):
                raise CorruptLogError(
                    str(path), size, f"file has {size} bytes, expected {self.file_bytes}"
                )
            # A short last file was cut (by a crash while it was created, or by hand): the
            # missing bytes come back as zeros and the tail rules decide what that means.
            self.files.append(
                MappedFile(start, path, _map_file(path, self.file_bytes, create=False))
            )
        self.sync_directory()

    # --- lookups ------------------------------------------------------------------------

    def file_at(self, position: int) -> MappedFile | None:
        """The file holding stream `position`, in O(1)."""
        files = self.files
        if not files:
            return None
        number = (position - files[0].start) // self.file_bytes
        if 0 <= number < len(files) and position >= files[0].start:
            return files[number]
        return None

    def start_of(self, position: int) -> int:
        return position - position % self.file_bytes

    @property
    def end(self) -> int | None:
        """The position just past the last file, or None if there are no files."""
        return self.files[-1].start + self.file_bytes if self.files else None

    def covers(self, low: int, high: int) -> bool:
        """Whether files exist for every position in [low, high) (the files are contiguous)."""
        files = self.files
        return bool(files) and files[0].start <= low and high <= files[-1].start + self.file_bytes

    def require(self, position: int) -> MappedFile:
        mapped = self.file_at(position)
        if mapped is None:
            raise StorageError(f"no file in {self.directory} holds position {position}")
        return mapped

    # --- creating and removing files ----------------------------------------------------

    def ensure(self, low: int, high: int) -> int:
        """Make files exist for every position in [low, high); return how many were created.

        On failure (a full disk) the files created by this call are removed again, so the
        list is as it was.
        """
        created = 0
        if high <= low:
            return 0
        try:
            start = self.start_of(low)
            while start < high:
                if self.file_at(start) is None:
                    self._create(start)
                    created += 1
                start += self.file_bytes
        except BaseException:
            self.remove_last(created)
            raise
        return created

    def _create(self, start: int) -> None:
        if self.files and start != self.files[-1].start + self.file_bytes:
            raise StorageError(
                f"cannot create {file_name(start)} in {self.directory}: files must be contiguous"
            )
        path = self.directory / file_name(start)
        try:
            mapping = _map_file(path, self.file_bytes, create=True)
        except BaseException:
            # The file may exist with no (or some) blocks allocated: leave no trace of it.
            if path.exists():
                self._unlink(path)
            raise
        self.files.append(MappedFile(start, path, mapping))
        self.directory_dirty = True

    def remove_last(self, count: int) -> None:
        self.zeros.drain()
        for _ in range(count):
            # Unlink first: if that fails the file stays listed and mapped, and the list
            # still matches the directory.
            self._unlink(self.files[-1].path)
            self.files.pop().map.close()
        # A file made again at the same place has fresh, unwritten blocks.
        self.zeroed_end = min(self.zeroed_end, self.end or 0)

    def remove_below(self, position: int) -> None:
        """Delete the files that lie wholly below `position`."""
        self.zeros.drain()
        while self.files and self.files[0].start + self.file_bytes <= position:
            self._unlink(self.files[0].path)
            self.files.pop(0).map.close()

    def remove_above(self, position: int) -> None:
        """Delete the files that start after the file holding `position`. (If `position` is a
        file boundary, the file starting there stays, as an empty preallocated file.)"""
        keep = self.start_of(position)
        while self.files and self.files[-1].start > keep:
            self.remove_last(1)

    def remove_all(self) -> None:
        self.remove_last(len(self.files))

    def _unlink(self, path: Path) -> None:
        if path == self._write_path:
            self._close_descriptor()
        with disk_errors(path):
            os.unlink(path)
        self.directory_dirty = True

    # --- bytes ------------------------------------------------------------------------

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Write `data` into the stream at `position`, across file boundaries if needed."""
        self.wait_for_zeros(position + len(data))
        mapped = self.file_at(position)
        if mapped is not None and position - mapped.start + len(data) <= self.file_bytes:
            # The usual case (a batch's index slots): one pwrite into one file, without the
            # context manager and the slicing of the general loop below.
            descriptor = self._descriptor(mapped)
            try:
                written = os.pwrite(descriptor, data, position - mapped.start)
            except OSError as error:
                raise storage_error(mapped.path, error) from error
            if written == len(data):
                return
            # A short write: the loop below writes it all again (the same bytes).
        with memoryview(data) as view:
            done = 0
            while done < len(view):
                mapped = self.require(position + done)
                offset = position + done - mapped.start
                length = min(len(view) - done, self.file_bytes - offset)
                descriptor = self._descriptor(mapped)
                with disk_errors(mapped.path), view[done : done + length] as part:
                    while part:
                        written = os.pwrite(descriptor, part, offset)
                        part = part[written:]
                        offset += written
                done += length

    def write_vectors(
        self, position: int, buffers: Sequence[bytes | bytearray | memoryview]
    ) -> None:
        """Write `buffers` back to back at `position` with pwritev (a gather write). They
        must fit in the file that holds `position`."""
        mapped = self.require(position)
        offset = position - mapped.start
        total = sum(map(len, buffers))
        if offset + total > self.file_bytes:
            raise StorageError(f"a write of {total} bytes at {position} crosses a file end")
        self.wait_for_zeros(position + total)
        descriptor = self._descriptor(mapped)
        if len(buffers) <= _IOV_MAX:
            # The usual case: one pwritev, without the context manager of the loop below.
            try:
                written = os.pwritev(descriptor, buffers, offset)
            except OSError as error:
                raise storage_error(mapped.path, error) from error
            if written == total:
                return
            # A short write: the loop below writes it all again (the same bytes).
        with disk_errors(mapped.path):
            for first in range(0, len(buffers), _IOV_MAX):
                chunk = buffers[first : first + _IOV_MAX]
                chunk_bytes = sum(len(buffer) for buffer in chunk)
                written = os.pwritev(descriptor, chunk, offset)
                if written < chunk_bytes:
                    # Short writes are rare on regular files; finish this chunk plainly.
                    rest = memoryview(b"".join(chunk))[written:]
                    while rest:
                        done = os.pwrite(descriptor, rest, offset + written)
                        rest = rest[done:]
                        written += done
                offset += chunk_bytes

    def zero_ahead(self, end: int) -> None:
        """Queue zeros from the page after `end` on for the zeroing thread, unless they reach
        far enough already (see the module docstring and mmap_zeroing).

        `end` must be the end of the stream, or past it: everything after the end is zero
        (the store keeps it so), so this changes no content, only which blocks are written.
        Zeros go only into files that exist; a batch that opens a new file pays for its
        first blocks itself, and the next call zeroes ahead in that file. Nothing is done
        where write-back cannot be started early (see mmap_writeback), nor after a chunk of
        this stream failed.
        """
        if self.zeroed_end >= end + ZERO_AHEAD_LEAD_BYTES or not writeback_available():
            return
        if self.zeros.failed:
            return
        low = max(self.zeroed_end, -(-end // _PAGE_BYTES) * _PAGE_BYTES)
        mapped = self.file_at(low)
        if mapped is None:
            return
        high = min(low + ZERO_AHEAD_BYTES, mapped.start + self.file_bytes)
        with disk_errors(mapped.path):
            descriptor = os.dup(self._descriptor(mapped))
        self.zeros.submit(descriptor, low - mapped.start, low, high)
        self.zeroed_end = high

    def wait_for_zeros(self, high: int) -> None:
        """Wait until no queued zeros begin below stream position `high`, before bytes are
        written there; raise the error of a chunk of zeros that failed (once)."""
        zeros = self.zeros
        if not zeros.pending and zeros.failure is None:
            return  # the usual case, without the cost of a context manager
        with disk_errors(self.directory):
            zeros.wait_below(high)

    def _descriptor(self, mapped: MappedFile) -> int:
        if mapped.path != self._write_path:
            self._close_descriptor()
            with disk_errors(mapped.path):
                self._write_descriptor = os.open(mapped.path, os.O_WRONLY)
            self._write_path = mapped.path
        return self._write_descriptor

    def _close_descriptor(self) -> None:
        if self._write_path is not None:
            self._write_path = None
            os.close(self._write_descriptor)
            self._write_descriptor = -1

    def zero(self, low: int, high: int) -> None:
        """Zero [low, high) of the stream, in the files that exist."""
        self.zeros.drain()
        for mapped in self.files:
            first = max(low, mapped.start)
            last = min(high, mapped.start + self.file_bytes)
            if first < last:
                mapped.map[first - mapped.start : last - mapped.start] = bytes(last - first)

    def flush(self, low: int, high: int) -> None:
        """msync [low, high) of the stream (rounded out to pages) to stable storage.

        Only the files the range touches are visited: a sync flushes the tail of a log that
        may hold many files.
        """
        files = self.files
        if high <= low or not files:
            return
        number = max(0, (low - files[0].start) // self.file_bytes)
        while number < len(files):
            mapped = files[number]
            if mapped.start >= high:
                break
            first = max(low, mapped.start)
            last = min(high, mapped.start + self.file_bytes)
            if first < last:
                offset = (first - mapped.start) // _PAGE_BYTES * _PAGE_BYTES
                try:
                    mapped.map.flush(offset, last - mapped.start - offset)
                except OSError as error:
                    raise storage_error(mapped.path, error) from error
            number += 1

    def write_back(self, low: int, high: int) -> bool:
        """Write [low, high) of the stream (rounded out to pages) to the disk and wait for
        it, without a device flush or a journal commit: a flush that follows, of any file,
        makes the bytes durable (see `MmapLogStore._flush`). Returns False, having done
        nothing, where the system cannot (see mmap_writeback)."""
        files = self.files
        if high <= low or not files:
            return True
        number = max(0, (low - files[0].start) // self.file_bytes)
        while number < len(files):
            mapped = files[number]
            if mapped.start >= high:
                break
            first = max(low, mapped.start) - mapped.start
            last = min(high, mapped.start + self.file_bytes) - mapped.start
            if first < last:
                descriptor = self._descriptor(mapped)
                try:
                    if not write_back(descriptor, first, last - first):
                        return False
                except OSError as error:
                    raise storage_error(mapped.path, error) from error
            number += 1
        return True

    def sync_directory(self) -> None:
        if self.directory_dirty:
            with disk_errors(self.directory):
                fsync_directory(self.directory)
            self.directory_dirty = False

    def nonzero_end(self, low: int) -> int:
        """The position just past the last non-zero byte at or after `low`, or `low`."""
        for mapped in reversed(self.files):
            file_end = mapped.start + self.file_bytes
            if file_end <= low:
                break
            floor = max(low, mapped.start) - mapped.start
            high = self.file_bytes
            while high > floor:
                chunk_low = max(floor, high - ZERO_SCAN_CHUNK_BYTES)
                chunk = mapped.map[chunk_low:high]
                if chunk != _ZERO_CHUNK[: len(chunk)]:
                    return mapped.start + chunk_low + len(chunk.rstrip(b"\0"))
                high = chunk_low
        return low

    def entry_magic_positions(self, low: int, high: int) -> list[int]:
        """Aligned stream positions in [low, high) where the entry magic appears."""
        found: list[int] = []
        for mapped in self.files:
            first = max(low, mapped.start) - mapped.start
            last = min(high, mapped.start + self.file_bytes) - mapped.start
            offset = mapped.map.find(ENTRY_MAGIC_BYTES, first, last) if first < last else -1
            while offset >= 0:
                if offset % ENTRY_ALIGNMENT_BYTES == 0:
                    found.append(mapped.start + offset)
                offset = mapped.map.find(ENTRY_MAGIC_BYTES, offset + 1, last)
        return found

    def close(self) -> None:
        # A chunk still queued must not land after the files are reopened and appended to.
        self.zeros.drain()
        self._close_descriptor()
        for mapped in self.files:
            mapped.map.close()
        self.files = []
