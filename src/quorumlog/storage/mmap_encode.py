"""Encoding a batch of entries for the mmap store's data and index streams (the hot path).

Two ways to lay out the same bytes (mmap_format documents them):

- `encode_copied`: every entry copied into one buffer, written with one pwrite. Best for
  small entries, where one system call per batch is what counts.
- `encode_gathered`: headers packed into a small buffer, bodies left where they are, and
  the pieces written with pwritev. Best for large entries, where copying each body once more
  costs as much as the write.

Neither writes the zero bytes after a blank record: everything after the end of the log is
zero already (the store keeps it so), so only the blank's 8 bytes need writing.

The two loops repeat each other on purpose: per-entry helper calls would cost more than the
rest of the loop body.
"""

from __future__ import annotations

from collections.abc import Sequence

import google_crc32c

from quorumlog.storage.entry import LogEntry
from quorumlog.storage.mmap_format import (
    BLANK,
    BLANK_MAGIC,
    ENTRY_ALIGNMENT_BYTES,
    ENTRY_HEADER_BYTES,
    ENTRY_HEADER_CHECKED,
    ENTRY_HEADER_TAIL,
    ENTRY_MAGIC,
    HEADER_CHECKED_BYTES,
    INDEX_MAGIC,
    INDEX_SLOT,
    INDEX_SLOT_BYTES,
)

GATHER_AVERAGE_DATA_BYTES_MIN = 1024
"""Batches whose entries average at least this much data are gathered, not copied."""

_crc32c = google_crc32c.value
_SIZE_ROUNDING = ENTRY_HEADER_BYTES + ENTRY_ALIGNMENT_BYTES - 1
_SIZE_MASK = ~(ENTRY_ALIGNMENT_BYTES - 1)
_PADDING = [bytes(length) for length in range(ENTRY_ALIGNMENT_BYTES)]

Buffer = bytes | bytearray | memoryview
Piece = tuple[int, list[Buffer]]
"""Bytes to write at one stream position; a piece never crosses a file boundary."""


class EncodedBatch:
    __slots__ = ("data_end", "index_buffer", "pieces")

    def __init__(self, pieces: list[Piece], index_buffer: bytearray, data_end: int) -> None:
        self.pieces = pieces
        self.index_buffer = index_buffer
        """The batch's index slots, back to back from the first entry's slot."""
        self.data_end = data_end
        """The data stream position just past the batch."""


def encode(entries: Sequence[LogEntry], start: int, file_bytes: int) -> EncodedBatch:
    """Lay out `entries` from data stream position `start` in files of `file_bytes`."""
    data_bytes = sum(len(entry.data) for entry in entries)
    if data_bytes >= GATHER_AVERAGE_DATA_BYTES_MIN * len(entries):
        return encode_gathered(entries, start, file_bytes)
    return encode_copied(entries, start, file_bytes)


def encode_copied(entries: Sequence[LogEntry], start: int, file_bytes: int) -> EncodedBatch:
    sizes = [(len(entry.data) + _SIZE_ROUNDING) & _SIZE_MASK for entry in entries]
    buffer = bytearray(sum(sizes))
    view = memoryview(buffer)
    index_buffer = bytearray(INDEX_SLOT_BYTES * len(entries))
    pieces: list[Piece] = []
    piece_start = start
    piece_offset = 0
    file_end = start - start % file_bytes + file_bytes
    head_pack = ENTRY_HEADER_CHECKED.pack
    tail_pack_into = ENTRY_HEADER_TAIL.pack_into
    slot_pack_into = INDEX_SLOT.pack_into
    crc32c = _crc32c
    position = start
    offset = 0  # in `buffer`, which holds the entries but not the blanks
    slot = 0
    for entry, size in zip(entries, sizes, strict=True):
        if position + size > file_end:
            # preAppend: a blank fills the rest of this file (if the entries did not fill it
            # exactly); the entry starts the next one.
            piece: list[Buffer] = [view[piece_offset:offset]]
            if position < file_end:
                piece.append(BLANK.pack(BLANK_MAGIC, file_end - position))
            pieces.append((piece_start, piece))
            piece_offset = offset
            position = piece_start = file_end
            file_end += file_bytes
        data = entry.data
        index = entry.index
        term = entry.term
        head = head_pack(ENTRY_MAGIC, size, index, term, position, entry.type)
        buffer[offset : offset + HEADER_CHECKED_BYTES] = head
        tail_pack_into(buffer, offset + HEADER_CHECKED_BYTES, crc32c(head), crc32c(data), len(data))
        buffer[offset + ENTRY_HEADER_BYTES : offset + ENTRY_HEADER_BYTES + len(data)] = data
        slot_pack_into(index_buffer, slot, INDEX_MAGIC, position, size, index, term)
        position += size
        offset += size
        slot += INDEX_SLOT_BYTES
    pieces.append((piece_start, [view[piece_offset:offset]]))
    return EncodedBatch(pieces, index_buffer, position)


def encode_gathered(entries: Sequence[LogEntry], start: int, file_bytes: int) -> EncodedBatch:
    headers = bytearray(ENTRY_HEADER_BYTES * len(entries))
    header_view = memoryview(headers)
    index_buffer = bytearray(INDEX_SLOT_BYTES * len(entries))
    pieces: list[Piece] = []
    buffers: list[Buffer] = []
    piece_start = start
    file_end = start - start % file_bytes + file_bytes
    head_pack = ENTRY_HEADER_CHECKED.pack
    tail_pack_into = ENTRY_HEADER_TAIL.pack_into
    slot_pack_into = INDEX_SLOT.pack_into
    crc32c = _crc32c
    padding = _PADDING
    position = start
    header = 0
    slot = 0
    for entry in entries:
        data = entry.data
        data_bytes = len(data)
        size = (data_bytes + _SIZE_ROUNDING) & _SIZE_MASK
        if position + size > file_end:
            if position < file_end:
                buffers.append(BLANK.pack(BLANK_MAGIC, file_end - position))
            pieces.append((piece_start, buffers))
            buffers = []
            position = piece_start = file_end
            file_end += file_bytes
        index = entry.index
        term = entry.term
        head = head_pack(ENTRY_MAGIC, size, index, term, position, entry.type)
        headers[header : header + HEADER_CHECKED_BYTES] = head
        tail_pack_into(
            headers, header + HEADER_CHECKED_BYTES, crc32c(head), crc32c(data), data_bytes
        )
        buffers.append(header_view[header : header + ENTRY_HEADER_BYTES])
        buffers.append(data)
        if size - ENTRY_HEADER_BYTES - data_bytes:
            buffers.append(padding[size - ENTRY_HEADER_BYTES - data_bytes])
        slot_pack_into(index_buffer, slot, INDEX_MAGIC, position, size, index, term)
        position += size
        header += ENTRY_HEADER_BYTES
        slot += INDEX_SLOT_BYTES
    pieces.append((piece_start, buffers))
    return EncodedBatch(pieces, index_buffer, position)
