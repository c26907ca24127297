"""Open-time recovery of the mmap log store: find the end of the log without re-reading it.

The data files are the truth; the index files are derived from them and may be repaired.
Opening a 1 GiB log must not parse every entry, so recovery trusts the index up to the last
slot that agrees with the data, and checks and repairs only what lies after it:

1. Find the last non-zero slot of the index stream and walk back from it to the first slot
   that agrees with the data: same index, term, position and size as a data header whose
   header and body checksums hold. This is the anchor. (No agreeing slot: the anchor is
   "just before `first_index`", at the meta's `first_data_position`.)
2. Parse the data forward from the anchor: every complete, checksummed entry with the next
   index at its own recorded position extends the log, and its index slot is rewritten if
   it differs (an index that lost its tail is rebuilt). End-of-file blank records move the
   parse to the next file.
3. The parse stops at position p. Everything after p must be zero; what is not is judged:

   - The thing at p is a complete entry whose checksums hold but whose index or position is
     wrong: corruption. A torn write leaves zeros or a failing checksum, never a valid
     entry in the wrong place.
   - A complete, checksummed entry (at its own recorded position) starts anywhere after p:
     the damage at p is followed by good data, so it is not the tail: corruption, reported
     with the file and offset of p.
   - Otherwise the bytes from p on are the remains of the last write, torn by a crash
     (a header cut short, a body whose end never reached the disk, a blank half written):
     they are zeroed, synced and reported. A single flipped bit in the last entry looks the
     same as a torn write and is handled the same way; that entry was the newest, and
     every log with per-entry checksums (braft, etcd's WAL) makes the same call.

   Index slots after the last entry are zeroed, so after open nothing but zeros follows
   the end of either stream, which is what the rules above rely on at the next open.
4. If the meta says entry `first_index` was present and synced, a log that now ends before
   it lost data: corruption.

Limit: a power failure can write back the pages of an unsynced batch out of order, leaving
a hole followed by complete entries. Those entries were never acknowledged, but the rule
above cannot tell them from acknowledged ones, so it reports corruption instead of
guessing. Holes below the anchor are not looked for at open; reads find them.
"""

from __future__ import annotations

import msgspec

from quorumlog.errors import CorruptLogError
from quorumlog.storage.mmap_files import MappedFile, MappedFileList
from quorumlog.storage.mmap_format import (
    BLANK,
    BLANK_BYTES,
    BLANK_MAGIC,
    ENTRY_ALIGNMENT_BYTES,
    ENTRY_HEADER_BYTES,
    ENTRY_MAGIC,
    INDEX_MAGIC,
    INDEX_SLOT,
    INDEX_SLOT_BYTES,
    MAGIC,
    EntryHeader,
    Meta,
    body_matches,
    decode_header,
    encode_index_slot,
)


class RecoveredTail(msgspec.Struct, frozen=True):
    last_index: int
    data_end: int
    torn_bytes_dropped: int
    torn_file: str | None


def slot_position(index: int, slot_base_index: int) -> int:
    return (index - slot_base_index) * INDEX_SLOT_BYTES


def complete_entry_at(data: MappedFileList, position: int) -> EntryHeader | str:
    """The verified header of a whole entry at `position` (checksums hold, it fits its file
    and records `position` as its own), or the reason there is none."""
    if position % ENTRY_ALIGNMENT_BYTES:
        return f"position {position} is not aligned to {ENTRY_ALIGNMENT_BYTES} bytes"
    mapped = data.file_at(position)
    if mapped is None:
        return "no data file holds this position"
    offset = position - mapped.start
    header = decode_header(mapped.map[offset : offset + ENTRY_HEADER_BYTES])
    if isinstance(header, str):
        return header
    if offset + header.size > data.file_bytes:
        return f"entry of {header.size} bytes runs past the end of its file"
    body_offset = offset + ENTRY_HEADER_BYTES
    if not body_matches(header, mapped.map[body_offset : body_offset + header.body_bytes]):
        return "entry body checksum mismatch"
    if header.position != position:
        return f"entry records position {header.position} but sits at {position}"
    return header


def redo_pending_cut(data: MappedFileList, index: MappedFileList, meta: Meta) -> None:
    """Finish a `truncate_suffix` that a crash interrupted: zero everything after the cut."""
    data_high = data.nonzero_end(meta.cut_data_position)
    data.zero(meta.cut_data_position, data_high)
    data.flush(meta.cut_data_position, data_high)
    slot_low = max(0, slot_position(meta.cut_last_kept + 1, meta.slot_base_index))
    index_high = index.nonzero_end(slot_low)
    index.zero(slot_low, index_high)
    index.flush(slot_low, index_high)


def _find_anchor(data: MappedFileList, index: MappedFileList, meta: Meta) -> tuple[int, int]:
    """(index, end position) of the last entry whose slot agrees with the data, or
    (first_index - 1, first_data_position) when none does."""
    first_slot = slot_position(meta.first_index, meta.slot_base_index)
    index_end = index.nonzero_end(first_slot)
    last_candidate = meta.slot_base_index + (index_end + INDEX_SLOT_BYTES - 1) // INDEX_SLOT_BYTES
    for candidate in range(last_candidate - 1, meta.first_index - 1, -1):
        position = slot_position(candidate, meta.slot_base_index)
        mapped = index.file_at(position)
        if mapped is None:
            break
        magic, data_position, size, slot_index, term = INDEX_SLOT.unpack_from(
            mapped.map, position - mapped.start
        )
        if magic != INDEX_MAGIC or slot_index != candidate:
            continue
        if data_position < meta.first_data_position:
            continue
        header = complete_entry_at(data, data_position)
        if isinstance(header, str):
            continue
        if (header.index, header.term, header.size) == (candidate, term, size):
            return candidate, data_position + size
    return meta.first_index - 1, meta.first_data_position


def skip_blank(data: MappedFileList, position: int) -> int:
    """Past a valid end-of-file blank record at `position`, or `position` itself."""
    mapped = data.file_at(position)
    if mapped is None:
        return position
    offset = position - mapped.start
    if offset + BLANK_BYTES > data.file_bytes:
        return position
    magic, blank_bytes = BLANK.unpack_from(mapped.map, offset)
    if magic == BLANK_MAGIC and blank_bytes == data.file_bytes - offset:
        return mapped.start + data.file_bytes
    return position


def walk_to(
    data: MappedFileList, repair: IndexRepair, position: int, expected: int, target: int
) -> EntryHeader:
    """Walk the data from `position` (where entry `expected` starts, or the blank before it)
    to entry `target`, rewriting slots that differ; return target's header. Used by reads
    that find a slot lost in a crash. Raise CorruptLogError where the data is not the next
    good entry: then the data itself is damaged, not just the index."""
    while True:
        position = skip_blank(data, position)
        header = complete_entry_at(data, position)
        if isinstance(header, str) or header.index != expected:
            reason = header if isinstance(header, str) else f"found entry {header.index}"
            mapped = data.file_at(position)
            raise CorruptLogError(
                str(mapped.path if mapped is not None else data.directory),
                position - mapped.start if mapped is not None else position,
                f"entry {expected} should start here: {reason}",
            )
        repair.put(header)
        if expected == target:
            return header
        position += header.size
        expected += 1


class IndexRepair:
    """Rewrites index slots that differ from the data, remembering what to flush."""

    def __init__(self, index: MappedFileList, slot_base_index: int) -> None:
        self.index = index
        self.slot_base_index = slot_base_index
        self.low: int | None = None
        self.high = 0

    def put(self, header: EntryHeader) -> None:
        position = slot_position(header.index, self.slot_base_index)
        slot = encode_index_slot(header.position, header.size, header.index, header.term)
        mapped = self.index.file_at(position)
        if mapped is not None:
            offset = position - mapped.start
            if mapped.map[offset : offset + INDEX_SLOT_BYTES] == slot:
                return
        self.index.ensure(position, position + INDEX_SLOT_BYTES)
        self.index.write(position, slot)
        self.low = position if self.low is None else min(self.low, position)
        self.high = max(self.high, position + INDEX_SLOT_BYTES)


def _parse_forward(
    data: MappedFileList, repair: IndexRepair, position: int, expected: int
) -> tuple[int, int, str | None]:
    """Walk good entries from `position`; return (stop position, next index, why it stopped)."""
    while True:
        mapped = data.file_at(position)
        if mapped is None:
            return position, expected, None
        offset = position - mapped.start
        (magic,) = MAGIC.unpack_from(mapped.map, offset)
        if magic == BLANK_MAGIC:
            after_blank = skip_blank(data, position)
            if after_blank == position:
                return position, expected, "bad end-of-file blank record"
            position = after_blank
            continue
        if magic != ENTRY_MAGIC:
            return position, expected, "end of data" if magic == 0 else f"bad magic {magic:#x}"
        header = complete_entry_at(data, position)
        if isinstance(header, str):
            return position, expected, header
        if header.index != expected:
            raise CorruptLogError(
                str(mapped.path),
                offset,
                f"a valid entry with index {header.index} where index {expected} belongs",
            )
        repair.put(header)
        position += header.size
        expected += 1


def _judge_tail(data: MappedFileList, stop: int, reason: str | None) -> int:
    """Past the parse's stop lie only zeros or the remains of a torn write; return where
    the non-zero bytes end (== stop when there are none). Raise if good data follows."""
    nonzero_end = data.nonzero_end(stop)
    if nonzero_end == stop:
        return stop
    for candidate in data.entry_magic_positions(stop + 1, nonzero_end):
        if not isinstance(complete_entry_at(data, candidate), str):
            mapped = data.require(stop)
            raise CorruptLogError(
                str(mapped.path),
                stop - mapped.start,
                f"{reason}; a valid entry follows at stream position {candidate}, "
                "so this is damage inside the log, not a torn tail",
            )
    return nonzero_end


def recover_tail(
    data: MappedFileList, index: MappedFileList, meta: Meta, meta_path: str
) -> RecoveredTail:
    """Find the end of the log, repair a torn tail and the index tail; see the module doc."""
    anchor_index, anchor_end = _find_anchor(data, index, meta)
    repair = IndexRepair(index, meta.slot_base_index)
    stop, next_index, reason = _parse_forward(data, repair, anchor_end, anchor_index + 1)
    torn_end = _judge_tail(data, stop, reason)
    last_index = next_index - 1
    if meta.first_entry_present and last_index < meta.first_index:
        raise CorruptLogError(
            meta_path,
            0,
            f"meta says entry {meta.first_index} was written, but the data ends before it "
            f"(at stream position {stop})",
        )
    torn_file: MappedFile | None = None
    if torn_end > stop:
        torn_file = data.require(stop)
        data.zero(stop, torn_end)
        data.flush(stop, torn_end)
    slot_end = slot_position(next_index, meta.slot_base_index)
    index_nonzero_end = index.nonzero_end(slot_end)
    index.zero(slot_end, index_nonzero_end)
    if repair.low is not None:
        index.flush(repair.low, repair.high)
    index.flush(slot_end, index_nonzero_end)
    index.sync_directory()
    return RecoveredTail(
        last_index=last_index,
        data_end=stop,
        torn_bytes_dropped=torn_end - stop,
        torn_file=str(torn_file.path) if torn_file is not None else None,
    )
