"""Opening a bookie directory: check its format version, replay every log file, cut a torn tail.

Open replays the log files oldest first through `BookieState`, the same methods the writes
use, so the ledgers, fences, master keys, LACs and the entry index come back as they were
written. Journal and entry log are one file, so replaying the journal is reading the log:
anything that reached a file is found again.

What can be on disk after a crash, and what open does about it:

- A torn tail of the newest file (the last write was cut short, or its end reads as zeros
  because the size reached the disk before the data): only unsynced bytes can be torn, and
  an add is acknowledged only after its sync, so cutting them off loses nothing that was
  acknowledged. Open truncates the file to its last whole record, syncs it, and reports the
  bytes dropped; a newest file found whole is synced (after a kill it may hold writes
  never synced, which must not tear once a newer file follows it). A newest file torn
  inside its first record (a crash while a new file was being started, before anything
  was added to it) is removed whole.
- Damage anywhere else (a bad checksum in an older file, a bad header followed by non-zero
  bytes, a file whose header names another number, a record that checks out but makes no
  sense) may hit acknowledged data: CorruptLogError with the file and offset, never a repair.
- A VERSION file (or a file header) naming a format version this code does not read:
  FormatVersionError, one line naming both versions, before anything else is read or
  written. Version 1 is read: its records have no ledger length, so every length found in
  them is -1 ("not known"). Once a version-1 directory has been replayed, VERSION is
  rewritten to the current version before the first file of that version is started, so
  a version-1 program refuses the directory rather than misreading the new files.

The newest file's fresh blocks read as zeros (it is only appended to, and a failed write is
cut off again), so a torn tail is a partial record and then zeros. That is what lets open
tell a torn tail from damage, as the segment store does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quorumlog.errors import CorruptLogError, FormatVersionError
from quorumlog.ledger.bookie_files import BookieFileSystem, atomic_write
from quorumlog.ledger.bookie_format import (
    FILE_HEADER_BYTES,
    FORMAT_VERSION,
    FORMAT_VERSIONS_READ,
    RECORD_LAYOUTS,
    VERSION_FILE_NAME,
    FormatError,
    RecordHeader,
    RecordKind,
    RecordLayout,
    check_body,
    decode_checkpoint,
    decode_entry_table,
    decode_file_header,
    decode_record_header,
    decode_version_file,
    encode_version_file,
    log_file_name,
    parse_log_file_name,
)
from quorumlog.ledger.bookie_state import BookieState
from quorumlog.storage.base import RecoveryReport


@dataclass(slots=True)
class RecoveredBookie:
    state: BookieState
    file_numbers: list[int]
    """The log files left, oldest first."""
    file_sizes: dict[int, int]
    report: RecoveryReport


@dataclass(slots=True)
class _Problem:
    offset: int
    reason: str
    torn: bool


@dataclass(slots=True)
class _FileScan:
    entries_found: int = 0
    problem: _Problem | None = None
    records: int = 0


def recover_directory(file_system: BookieFileSystem, directory: Path) -> RecoveredBookie:
    names = file_system.list_directory(directory)
    numbers = sorted(n for n in map(parse_log_file_name, names) if n is not None)
    directory_version = check_version(file_system, directory, has_data=bool(numbers))
    state = BookieState()
    sizes: dict[int, int] = {}
    entries_found = 0
    torn_bytes_dropped = 0
    torn_file: str | None = None
    for position, number in enumerate(numbers):
        path = directory / log_file_name(number)
        data = file_system.read_file(path)
        scan = _scan_file(state, data, number, path)
        entries_found += scan.entries_found
        sizes[number] = len(data)
        problem = scan.problem
        if problem is None:
            continue
        if not (position == len(numbers) - 1 and problem.torn):
            raise CorruptLogError(str(path), problem.offset, problem.reason)
        torn_file = str(path)
        if scan.records == 0:
            # Torn in its checkpoint: the file was being started, nothing was added to it.
            file_system.unlink(path)
            file_system.sync_directory(directory)
            torn_bytes_dropped = sizes.pop(number)
        else:
            _truncate(file_system, path, problem.offset)
            torn_bytes_dropped = len(data) - problem.offset
            sizes[number] = problem.offset
    if sizes and torn_file is None:
        # What open replayed must stay: after a kill (the OS lived on) the newest file may
        # hold writes never synced, and the storage starts a new file after it, so a later
        # power loss tearing them would leave a torn tail in a file that is no longer the
        # newest — corruption to every later open.
        _sync(file_system, directory / log_file_name(max(sizes)))
    if directory_version != FORMAT_VERSION:
        # Replayed in full: from here on files of the current version are written.
        atomic_write(file_system, directory / VERSION_FILE_NAME, encode_version_file())
    report = RecoveryReport(entries_found, torn_bytes_dropped, torn_file)
    return RecoveredBookie(state, sorted(sizes), sizes, report)


def check_version(file_system: BookieFileSystem, directory: Path, *, has_data: bool) -> int:
    """The directory's format version: refuse one this code does not read; write VERSION
    into a new directory."""
    path = directory / VERSION_FILE_NAME
    if not file_system.exists(path):
        if has_data:
            raise CorruptLogError(str(path), 0, "log files without a VERSION file")
        atomic_write(file_system, path, encode_version_file())
        return FORMAT_VERSION
    try:
        version = decode_version_file(file_system.read_file(path))
    except FormatError as error:
        raise CorruptLogError(str(path), 0, str(error)) from error
    if version not in FORMAT_VERSIONS_READ:
        raise FormatVersionError(str(directory), version, FORMAT_VERSION)
    return version


def _truncate(file_system: BookieFileSystem, path: Path, size: int) -> None:
    handle = file_system.open_file(path, writable=True)
    try:
        handle.truncate(size)
        handle.sync_data()
    finally:
        handle.close()


def _sync(file_system: BookieFileSystem, path: Path) -> None:
    handle = file_system.open_file(path, writable=True)
    try:
        handle.sync_data()
    finally:
        handle.close()


def _scan_file(state: BookieState, data: bytes, number: int, path: Path) -> _FileScan:
    scan = _FileScan()
    try:
        version, header_number = decode_file_header(data)
    except FormatError as error:
        # Torn while the file was being started: nothing but zeros after the header.
        scan.problem = _Problem(0, str(error), torn=_zeros_from(data, FILE_HEADER_BYTES))
        return scan
    if version not in FORMAT_VERSIONS_READ:
        raise FormatVersionError(str(path), version, FORMAT_VERSION)
    if header_number != number:
        scan.problem = _Problem(0, f"file header names file {header_number}", torn=False)
        return scan
    layout = RECORD_LAYOUTS[version]
    offset = FILE_HEADER_BYTES
    while offset < len(data) and scan.problem is None:
        offset = _scan_record(state, data, number, offset, scan, layout)
    return scan


def _scan_record(
    state: BookieState,
    data: bytes,
    number: int,
    offset: int,
    scan: _FileScan,
    layout: RecordLayout,
) -> int:
    """Replay the record at `offset`; returns where the next one starts (or sets a problem)."""
    header_bytes = layout.header_bytes
    if len(data) - offset < header_bytes:
        scan.problem = _Problem(offset, "record header cut short by the end of the file", True)
        return offset
    try:
        header = decode_record_header(data, offset, layout)
    except FormatError as error:
        torn = _zeros_from(data, offset + header_bytes)
        scan.problem = _Problem(offset, str(error), torn)
        return offset
    body_start = offset + header_bytes
    end = body_start + header.body_length
    if end > len(data):
        scan.problem = _Problem(offset, "record body cut short by the end of the file", True)
        return offset
    body = data[body_start:end]
    try:
        check_body(header, body)
    except FormatError as error:
        # A torn write leaves the rest of its record, and everything after, as zeros.
        torn = _zeros_from(data, end) and (not body or body[-1] == 0)
        scan.problem = _Problem(offset, str(error), torn)
        return offset
    if scan.records == 0 and header.kind != RecordKind.CHECKPOINT:
        scan.problem = _Problem(offset, "the first record of a file is not a checkpoint", False)
        return offset
    try:
        scan.entries_found += _apply(state, header, body, number, body_start, layout)
    except FormatError as error:
        scan.problem = _Problem(offset, str(error), torn=False)
        return offset
    scan.records += 1
    return end


def _apply(
    state: BookieState,
    header: RecordHeader,
    body: bytes,
    number: int,
    base: int,
    layout: RecordLayout,
) -> int:
    """Replay one record whose checksums hold; returns the entries it stored."""
    ledger_id = header.ledger_id
    kind = header.kind
    if kind == RecordKind.CHECKPOINT:
        state.apply_checkpoint(decode_checkpoint(body, header.count, layout))
        return 0
    if kind == RecordKind.MASTER_KEY:
        if ledger_id not in state.ledgers:
            state.create(ledger_id, body)
        return 0
    if kind == RecordKind.DROP:
        state.drop(ledger_id)
        return 0
    ledger = state.ledgers.get(ledger_id)
    if ledger is None:
        raise FormatError(f"record of kind {kind} for ledger {ledger_id}, which has no key")
    if kind == RecordKind.FENCE:
        ledger.fenced = True
        return 0
    entry_ids, offsets, lengths = decode_entry_table(body, header.count)
    state.add_entries(
        ledger_id,
        ledger,
        header.last_add_confirmed,
        header.length,
        number,
        base,
        entry_ids,
        offsets,
        lengths,
    )
    return len(entry_ids)


def _zeros_from(data: bytes, start: int) -> bool:
    """Is every byte from `start` to the end zero (or are there none)?"""
    if start >= len(data):
        return True
    return data.count(0, start) == len(data) - start
