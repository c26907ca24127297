"""Opening a segment log directory: rebuild the index from headers, repair a torn tail.

What can be on disk after a crash, and what open does about it:

- A torn tail of the open segment (`log_inprogress_*`): the last write was cut short, so the
  file ends inside an entry, or its end was zero-filled (the size reached disk before the
  data). Only unsynced bytes can be torn, so cutting them off loses nothing acknowledged:
  open truncates the file to the last whole entry, fsyncs it and reports the bytes dropped.
- Damage anywhere else (a bad header checksum followed by non-zero bytes, a bad checksum in a
  closed segment, a gap or overlap between segments, a closed segment holding a different
  number of entries than its name says) may hit acknowledged data: CorruptLogError, never a
  silent repair.
- Segments wholly below the meta's first_index: left by a crash between the meta write and
  the unlinks of truncate_prefix. They are unlinked.
- A meta with the reset flag: a crash in the middle of reset. Every segment is stale; they
  are unlinked and the flag cleared, which finishes the reset.
- Bytes that are readable but not durable: the process died, the OS did not, so writes that
  were never synced are still in the page cache and read back as if they were on disk. The
  Raft core counts every entry open finds as persisted, so open makes them so: it syncs the
  open segment's data and the directory (a rename or creation the dead process did not sync)
  before it returns. Without that, an entry acknowledged after a restart could vanish in a
  later power loss.

The open segment's fresh blocks read as zeros (it is only ever appended to, and a cut-off
tail is truncated away before new data goes there), so a torn tail holds a partial entry
and then zeros, never old non-zero data. That is what lets open tell a torn tail from damage.
"""

from __future__ import annotations

import itertools
import mmap
from array import array
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from quorumlog.errors import CorruptLogError
from quorumlog.storage.base import RecoveryReport
from quorumlog.storage.filesystem import (
    FileHandle,
    FileSystem,
    MappableFileHandle,
    atomic_write,
)
from quorumlog.storage.segment_file import SegmentFile
from quorumlog.storage.segment_format import (
    CHECKSUM_TYPE_CRC32C,
    ENTRY_HEADER_BYTES,
    ENTRY_TYPES,
    HEADER,
    META_FILE_NAME,
    HeaderError,
    closed_segment_name,
    decode_meta,
    encode_meta,
    open_segment_name,
    parse_segment_name,
)

_crc32c = google_crc32c.value


@dataclass(slots=True)
class SegmentScan:
    """What one pass over a segment file's headers found."""

    offsets: array[int]
    terms: array[int]
    valid_bytes: int
    """Bytes from the start of the file up to the end of the last whole, valid entry."""
    file_bytes: int
    problem_offset: int = -1
    """Where the first problem starts, or -1 if every byte belongs to a valid entry."""
    problem: str = ""
    incomplete: bool = False
    """The problem is an entry cut short by the end of the file (a header or its data)."""


@dataclass(slots=True)
class RecoveredLog:
    first_index: int
    segments: list[SegmentFile]
    report: RecoveryReport


def scan_headers(view: mmap.mmap | bytes, file_bytes: int) -> SegmentScan:
    """Walk entry headers from offset 0, checking each header checksum; data is not read.

    Stops at the first header that is incomplete, fails its checks, or whose data runs past
    the end of the file. This loop is the cost of open, so it does the least per entry.
    """
    offsets: array[int] = array("Q")
    terms: array[int] = array("Q")
    add_offset = offsets.append
    add_term = terms.append
    unpack = HEADER.unpack_from
    crc32c = _crc32c
    entry_types = ENTRY_TYPES
    position = 0
    header_end_max = file_bytes - ENTRY_HEADER_BYTES
    while position <= header_end_max:
        term, entry_type, checksum_type, _reserved, length, _data_crc, header_crc = unpack(
            view, position
        )
        if crc32c(view[position : position + 20]) != header_crc:
            return SegmentScan(
                offsets, terms, position, file_bytes, position, "entry header checksum mismatch"
            )
        if checksum_type != CHECKSUM_TYPE_CRC32C or entry_type not in entry_types:
            return SegmentScan(
                offsets,
                terms,
                position,
                file_bytes,
                position,
                f"entry header has checksum type {checksum_type}, entry type {entry_type}",
            )
        end = position + ENTRY_HEADER_BYTES + length
        if end > file_bytes:
            return SegmentScan(
                offsets,
                terms,
                position,
                file_bytes,
                position,
                f"entry of {length} data bytes runs past the end of the file",
                incomplete=True,
            )
        add_offset(position)
        add_term(term)
        position = end
    if position < file_bytes:
        return SegmentScan(
            offsets, terms, position, file_bytes, position, "incomplete entry header", True
        )
    return SegmentScan(offsets, terms, position, file_bytes)


def zero_tail_start(view: mmap.mmap | bytes, low: int, file_bytes: int) -> int:
    """Offset where the run of zero bytes that ends the file begins (searching from `low`)."""
    tail = view[low:file_bytes]
    return low + len(tail.rstrip(b"\x00"))


def data_checksum_ok(view: mmap.mmap | bytes, start: int, end: int) -> bool:
    _term, _type, _checksum_type, _reserved, _length, data_crc, _header_crc = HEADER.unpack_from(
        view, start
    )
    return bool(_crc32c(view[start + ENTRY_HEADER_BYTES : end]) == data_crc)


def scan_file(handle: FileHandle, is_open: bool) -> SegmentScan:
    """Scan one segment file; for the open segment, also classify its tail.

    In the open segment a problem is a torn tail (its `problem` is cleared and `valid_bytes`
    says where to cut) when the problem is an incomplete entry, or when the zeros that end
    the file reach into the bad header. The last whole entry of the open segment also has its
    data checksum checked, since a zero-filled tail can start inside its data.
    Any other problem stays in `problem` for the caller to raise as corruption.
    The file is read through a mapping where the file system offers one (no copy), and read
    whole otherwise.
    """
    file_bytes = handle.size()
    if file_bytes == 0:
        return SegmentScan(array("Q"), array("Q"), 0, 0)
    if isinstance(handle, MappableFileHandle):
        with handle.map_for_reading() as view:
            return scan_view(view, file_bytes, is_open)
    return scan_view(handle.read_at(file_bytes, 0), file_bytes, is_open)


def scan_view(view: mmap.mmap | bytes, file_bytes: int, is_open: bool) -> SegmentScan:
    scan = scan_headers(view, file_bytes)
    if is_open:
        classify_open_tail(view, scan)
    return scan


def classify_open_tail(view: mmap.mmap | bytes, scan: SegmentScan) -> None:
    file_bytes = scan.file_bytes
    if scan.problem:
        zeros_from = zero_tail_start(view, scan.problem_offset, file_bytes)
        if scan.incomplete or zeros_from < scan.problem_offset + ENTRY_HEADER_BYTES:
            scan.problem = ""
            scan.problem_offset = -1
        else:
            return
    if not scan.offsets:
        return
    # The last whole entry: its header is fine, but a zero-filled tail may start in its data.
    start = scan.offsets[-1]
    end = scan.valid_bytes
    if data_checksum_ok(view, start, end):
        return
    if zero_tail_start(view, start, file_bytes) < end:
        scan.offsets.pop()
        scan.terms.pop()
        scan.valid_bytes = start
        return
    scan.problem_offset = start
    scan.problem = "entry data checksum mismatch"


# --- the directory ---------------------------------------------------------------------


def list_segments(
    file_system: FileSystem, directory: Path
) -> tuple[list[tuple[int, int]], int | None]:
    """(closed segments as (first, last) sorted by first, first index of the open one)."""
    closed: list[tuple[int, int]] = []
    open_firsts: list[int] = []
    for name in file_system.list_directory(directory):
        try:
            parsed = parse_segment_name(name)
        except HeaderError as error:
            raise CorruptLogError(str(directory / name), 0, str(error)) from error
        if parsed is None:
            continue
        first, last = parsed
        if last is None:
            open_firsts.append(first)
        elif last < first:
            raise CorruptLogError(str(directory / name), 0, "closed segment with last < first")
        else:
            closed.append((first, last))
    if len(open_firsts) > 1:
        raise CorruptLogError(
            str(directory), 0, f"{len(open_firsts)} open segments, at most one is allowed"
        )
    closed.sort()
    return closed, (open_firsts[0] if open_firsts else None)


def read_meta(file_system: FileSystem, directory: Path, segments_present: bool) -> int:
    """The first index from the meta file, finishing an interrupted reset first.

    A missing meta file is normal for a new directory (it gets one holding 1), and damage if
    segments exist: without it, entries compacted away would come back.
    """
    meta_path = directory / META_FILE_NAME
    if not file_system.exists(meta_path):
        if segments_present:
            raise CorruptLogError(str(meta_path), 0, "meta file missing while segments exist")
        atomic_write(meta_path, encode_meta(1, reset_in_progress=False), file_system)
        return 1
    raw = file_system.read_file(meta_path)
    try:
        first_index, reset_in_progress = decode_meta(raw)
    except HeaderError as error:
        raise CorruptLogError(str(meta_path), 0, str(error)) from error
    if reset_in_progress:
        closed, open_first = list_segments(file_system, directory)
        names = [directory / closed_segment_name(first, last) for first, last in closed]
        if open_first is not None:
            names.append(directory / open_segment_name(open_first))
        for name in reversed(names):
            file_system.unlink(name)
        file_system.sync_directory(directory)
        atomic_write(meta_path, encode_meta(first_index, reset_in_progress=False), file_system)
    return first_index


def check_contiguous(directory: Path, closed: list[tuple[int, int]]) -> None:
    for (_first, last), (next_first, next_last) in itertools.pairwise(closed):
        if next_first != last + 1:
            kind = "gap" if next_first > last + 1 else "overlap"
            name = directory / closed_segment_name(next_first, next_last)
            raise CorruptLogError(
                str(name),
                0,
                f"{kind}: previous segment ends at {last}, this starts at {next_first}",
            )


def recover_directory(file_system: FileSystem, directory: Path) -> RecoveredLog:
    """Check and repair the directory, and build the index of every segment kept."""
    segments: list[SegmentFile] = []
    try:
        return recover_into(file_system, directory, segments)
    except BaseException:
        for segment in segments:
            segment.close_handle()
        raise


def recover_into(
    file_system: FileSystem, directory: Path, segments: list[SegmentFile]
) -> RecoveredLog:
    closed, open_first = list_segments(file_system, directory)
    first_index = read_meta(file_system, directory, bool(closed) or open_first is not None)
    closed, open_first = list_segments(file_system, directory)

    # Segments wholly below first_index hold only compacted entries: a crash after the meta
    # write of truncate_prefix left them. Gaps among them do not matter (unlinks that had not
    # reached disk need not have happened in order), so only the kept ones are checked.
    highest_removed = 0
    removed_any = False
    below = [(first, last) for first, last in closed if last < first_index]
    for first, last in below:
        file_system.unlink(directory / closed_segment_name(first, last))
        highest_removed = max(highest_removed, last)
        removed_any = True
    closed = closed[len(below) :]
    check_contiguous(directory, closed)

    for first, last in closed:
        segments.append(load_closed(file_system, directory, first, last))

    report = RecoveryReport()
    if open_first is not None:
        previous_last = closed[-1][1] if closed else None
        if previous_last is not None and open_first != previous_last + 1:
            raise CorruptLogError(
                str(directory / open_segment_name(open_first)),
                0,
                f"open segment starts at {open_first}, previous segment ends at {previous_last}",
            )
        segment, report = load_open(file_system, directory, open_first)
        segments.append(segment)
        if segment.last_index < first_index:
            # Only possible when no closed segment is kept: all of it is compacted away.
            segments.pop()
            segment.close_handle()
            file_system.unlink(segment.path)
            highest_removed = max(highest_removed, segment.last_index)
            removed_any = True
    # Always, not only after an unlink: names the dead process created or renamed without
    # syncing must be durable before the entries behind them count as persisted.
    file_system.sync_directory(directory)

    check_first_index(directory, first_index, segments, highest_removed, removed_any)
    last_index = segments[-1].last_index if segments else first_index - 1
    report = RecoveryReport(
        entries_found=max(0, last_index - first_index + 1),
        torn_bytes_dropped=report.torn_bytes_dropped,
        torn_file=report.torn_file,
    )
    return RecoveredLog(first_index, segments, report)


def check_first_index(
    directory: Path,
    first_index: int,
    segments: list[SegmentFile],
    highest_removed: int,
    removed_any: bool,
) -> None:
    """The data must reach first_index: it may start at or below it, never above.

    An empty log is fine if first_index is at most one past the last entry removed (that is
    truncate_prefix(last_index + 1), which empties the log), or if nothing was there at all.
    """
    meta_path = str(directory / META_FILE_NAME)
    if segments:
        if segments[0].first_index > first_index:
            raise CorruptLogError(
                meta_path,
                0,
                f"meta first_index {first_index} is below the first segment, which starts at "
                f"{segments[0].first_index}: entries are missing",
            )
        return
    if removed_any and highest_removed + 1 < first_index:
        raise CorruptLogError(
            meta_path,
            0,
            f"meta first_index {first_index} is past the data, which ends at {highest_removed}",
        )


def load_closed(file_system: FileSystem, directory: Path, first: int, last: int) -> SegmentFile:
    segment = SegmentFile(directory, first, is_open=False)
    path = directory / closed_segment_name(first, last)
    handle = file_system.open_file(path)
    try:
        scan = scan_file(handle, is_open=False)
    finally:
        handle.close()
    if scan.problem:
        raise CorruptLogError(str(path), scan.problem_offset, scan.problem)
    if len(scan.offsets) != last - first + 1:
        raise CorruptLogError(
            str(path), 0, f"holds {len(scan.offsets)} entries, its name says {last - first + 1}"
        )
    segment.offsets = scan.offsets
    segment.terms = scan.terms
    segment.end_bytes = scan.valid_bytes
    return segment


def load_open(
    file_system: FileSystem, directory: Path, first: int
) -> tuple[SegmentFile, RecoveryReport]:
    """Load the open segment, cut off a torn tail if it has one, and make what is kept
    durable (see the module docs: bytes readable now may never have been synced)."""
    segment = SegmentFile(directory, first, is_open=True)
    path = segment.path
    segment.handle = handle = file_system.open_file(path, writable=True)
    try:
        scan = scan_open_tail_twice(handle)
        if scan.problem:
            raise CorruptLogError(str(path), scan.problem_offset, scan.problem)
        torn_bytes = scan.file_bytes - scan.valid_bytes
        if torn_bytes:
            handle.truncate(scan.valid_bytes)
        handle.sync_data()
    except BaseException:
        segment.close_handle()
        raise
    segment.offsets = scan.offsets
    segment.terms = scan.terms
    segment.end_bytes = scan.valid_bytes
    if torn_bytes == 0:
        return segment, RecoveryReport()
    return segment, RecoveryReport(torn_bytes_dropped=torn_bytes, torn_file=str(path))


def scan_open_tail_twice(handle: FileHandle) -> SegmentScan:
    """Scan the open segment; if its tail is to be cut off, read it again first.

    Cutting is for good, so it must not rest on one read: a bit flipped on the way from the
    disk (in the header of the last entry, or in zeros that end its data) can look like a
    torn write. A torn tail reads the same every time; a transient flip does not, and then
    open refuses (CorruptLogError) rather than cut what may be durable. (Damage that reads
    the same every time in those places cannot be told from a torn write by the bytes.)
    """
    scan = scan_file(handle, is_open=True)
    if scan.problem or scan.valid_bytes == scan.file_bytes:
        return scan
    again = scan_file(handle, is_open=True)
    if (again.valid_bytes, again.file_bytes, again.problem) != (
        scan.valid_bytes,
        scan.file_bytes,
        scan.problem,
    ):
        raise CorruptLogError(
            str(handle.path),
            min(scan.valid_bytes, again.valid_bytes),
            "two reads of the tail disagree (the disk returns unstable data); nothing is cut",
        )
    return scan


def segment_name_closed(first: int, last: int) -> str:
    return closed_segment_name(first, last)
