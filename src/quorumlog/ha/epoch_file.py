"""The epoch file: the durable list of <MasterEpoch, startOffset> of a broker's commit log.

Reference 003: every master of a broker group has a MasterEpoch (issued by the controller,
monotonic) and the commit log offset where its writes began. Entry k's range of the log is
[start_k, start_{k+1}), the last one's [start_last, log end). A slave compares its list with
its master's at handshake to find where their logs part (`handshake.find_consistent_point`).

The file is small (one entry per change of master) and is replaced whole on every change:
temp file, fsync, rename, fsync directory (`storage.filesystem.atomic_write`), so a crash
leaves the old list or the new one. Every operation goes through a `FileSystem`, so the
simulator's disk runs this very code.

Layout, little-endian::

    magic u32 (EPOCH_FILE_MAGIC), version u32, count u32, checksum u32
    count x (epoch u64, start_offset u64)

The checksum is the CRC32C of the whole file with the checksum field zeroed. A file whose
version is newer than this program's is refused (`FormatVersionError`, one line naming
both) before anything else in it is trusted.

Rules the list keeps (checked on every change and at load):

- epochs strictly increase; start offsets never decrease (an epoch whose master wrote
  nothing has start == the next one's start: an empty range, kept as the reference does);
- `truncate_from(offset)` drops every entry that starts at or after `offset` (RocketMQ's
  truncateSuffixByOffset): what the log no longer holds no epoch may describe.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Final

import google_crc32c
import msgspec

from quorumlog.errors import CorruptLogError, FormatVersionError
from quorumlog.raft.invariants import InvariantViolation, require
from quorumlog.storage.filesystem import (
    OS_FILE_SYSTEM,
    FileSystem,
    atomic_write,
    ensure_directory,
)

EPOCH_FILE_MAGIC: Final = 0xE90C_F11E
EPOCH_FILE_VERSION: Final = 1
HEADER = struct.Struct("<IIII")
ENTRY = struct.Struct("<QQ")
_CHECKSUM_FIELD_OFFSET: Final = 12


class EpochEntry(msgspec.Struct, frozen=True, array_like=True):
    """A master's term: its MasterEpoch and the log offset where its writes began."""

    epoch: int
    start_offset: int


class EpochRange(msgspec.Struct, frozen=True):
    """An epoch with the end of its range of the log (exclusive)."""

    epoch: int
    start_offset: int
    end_offset: int


def check_entries(entries: tuple[EpochEntry, ...] | list[EpochEntry], where: str) -> None:
    """Raise InvariantViolation unless epochs increase and starts never decrease."""
    for earlier, later in itertools.pairwise(entries):
        require(
            later.epoch > earlier.epoch and later.start_offset >= earlier.start_offset,
            f"{where}: epoch entry {later} does not follow {earlier}",
        )
    for entry in entries:
        require(entry.epoch >= 0 and entry.start_offset >= 0, f"{where}: negative {entry}")


def epoch_ranges(
    entries: tuple[EpochEntry, ...] | list[EpochEntry], log_end: int
) -> list[EpochRange]:
    """Each entry with its end: the next entry's start, the log end for the last, and never
    past the log end (a crash between a log truncation and the epoch file's may leave
    entries beyond it; see replication_slave for why that order)."""
    ranges = []
    for position, entry in enumerate(entries):
        following = entries[position + 1].start_offset if position + 1 < len(entries) else log_end
        ranges.append(EpochRange(entry.epoch, entry.start_offset, min(following, log_end)))
    return ranges


def epoch_at(entries: tuple[EpochEntry, ...] | list[EpochEntry], offset: int) -> int | None:
    """The epoch whose range holds `offset` (the last entry's range is open-ended)."""
    found = None
    for entry in entries:
        if entry.start_offset > offset:
            break
        found = entry.epoch  # a later entry with the same start (empty range before) wins
    return found


def encode_epoch_file(entries: tuple[EpochEntry, ...] | list[EpochEntry]) -> bytes:
    buffer = bytearray(HEADER.size + ENTRY.size * len(entries))
    HEADER.pack_into(buffer, 0, EPOCH_FILE_MAGIC, EPOCH_FILE_VERSION, len(entries), 0)
    for position, entry in enumerate(entries):
        ENTRY.pack_into(
            buffer, HEADER.size + position * ENTRY.size, entry.epoch, entry.start_offset
        )
    struct.pack_into("<I", buffer, _CHECKSUM_FIELD_OFFSET, google_crc32c.value(bytes(buffer)))
    return bytes(buffer)


def decode_epoch_file(path: Path, data: bytes) -> tuple[EpochEntry, ...]:
    """The entries of an epoch file's bytes; CorruptLogError or FormatVersionError if bad."""
    if len(data) < HEADER.size:
        raise CorruptLogError(str(path), 0, f"epoch file of {len(data)} bytes has no header")
    magic, version, count, checksum = HEADER.unpack_from(data)
    if magic != EPOCH_FILE_MAGIC:
        raise CorruptLogError(str(path), 0, f"not an epoch file (magic {magic:#x})")
    if version > EPOCH_FILE_VERSION:
        raise FormatVersionError(str(path), version, EPOCH_FILE_VERSION)
    if version < 1:
        raise CorruptLogError(str(path), 4, f"epoch file version {version}")
    zeroed = bytearray(data)
    struct.pack_into("<I", zeroed, _CHECKSUM_FIELD_OFFSET, 0)
    if google_crc32c.value(bytes(zeroed)) != checksum:
        raise CorruptLogError(str(path), 0, "epoch file checksum mismatch")
    if len(data) != HEADER.size + count * ENTRY.size:
        raise CorruptLogError(str(path), 8, f"epoch file of {len(data)} bytes for {count} entries")
    entries = tuple(
        EpochEntry(*ENTRY.unpack_from(data, HEADER.size + position * ENTRY.size))
        for position in range(count)
    )
    try:
        check_entries(entries, str(path))
    except InvariantViolation as error:
        raise CorruptLogError(str(path), HEADER.size, str(error)) from error
    return entries


class EpochFile:
    """A broker's epoch file, loaded at construction; every change is durable on return."""

    def __init__(self, path: Path, file_system: FileSystem = OS_FILE_SYSTEM) -> None:
        self.path = path
        self._file_system = file_system
        ensure_directory(file_system, path.parent)
        self._entries: tuple[EpochEntry, ...] = ()
        if file_system.exists(path):
            self._entries = decode_epoch_file(path, file_system.read_file(path))

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    @property
    def last(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def last_epoch(self) -> int:
        """The newest epoch, or 0 for an empty file (MasterEpochs start at 1)."""
        return self._entries[-1].epoch if self._entries else 0

    def start_of(self, epoch: int) -> int | None:
        for entry in self._entries:
            if entry.epoch == epoch:
                return entry.start_offset
        return None

    def epoch_at(self, offset: int) -> int | None:
        return epoch_at(self._entries, offset)

    def ranges(self, log_end: int) -> list[EpochRange]:
        return epoch_ranges(self._entries, log_end)

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` begins at `start_offset`; durable when it returns. Appending
        the last entry again is a no-op (a master restarted under the same epoch)."""
        entry = EpochEntry(epoch, start_offset)
        if self._entries and self._entries[-1] == entry:
            return
        entries = (*self._entries, entry)
        check_entries(entries, str(self.path))
        self._write(entries)

    def truncate_from(self, offset: int) -> None:
        """Drop every entry that starts at or after `offset`; durable when it returns."""
        kept = tuple(entry for entry in self._entries if entry.start_offset < offset)
        if kept != self._entries:
            self._write(kept)

    def _write(self, entries: tuple[EpochEntry, ...]) -> None:
        atomic_write(self.path, encode_epoch_file(entries), self._file_system)
        self._entries = entries


__all__ = [
    "EPOCH_FILE_VERSION",
    "EpochEntry",
    "EpochFile",
    "EpochRange",
    "epoch_at",
    "epoch_ranges",
]
