"""Encoding a batch of entries for the mmap store's data and index streams (the hot path).

Every entry of a batch is copied into one buffer, written with one system call per data file
the batch touches (mmap_format documents the layout). A gather write (pwritev of headers and
the callers' bodies, no copy) was tried for 4 KiB entries and cost the same CPU: the kernel's
copy into the page cache dominates, not ours.

The zero bytes after a blank record are not written: everything after the end of the log is
zero already (the store keeps it so), so only the blank's 8 bytes need writing.

A batch that fits in the current data file (nearly every one) is encoded column by column
with map() over C functions, as the segment store does, so the per-entry work runs in C, not
in Python bytecode. A batch that crosses a file boundary takes the loop, written out flat on
purpose: per-entry helper calls would cost more than the rest of its body.
`mmap_format.encode_entry` is the plain reference both are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain, repeat

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

_crc32c = google_crc32c.value
_SIZE_ROUNDING = ENTRY_HEADER_BYTES + ENTRY_ALIGNMENT_BYTES - 1
_SIZE_MASK = ~(ENTRY_ALIGNMENT_BYTES - 1)

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


_PADDINGS = [bytes(count) for count in range(ENTRY_ALIGNMENT_BYTES)]
"""The zero bytes after an entry's data up to the alignment, by count."""


def encode(entries: Sequence[LogEntry], start: int, file_bytes: int) -> EncodedBatch:
    """Lay out `entries` from data stream position `start` in files of `file_bytes`."""
    datas = [entry.data for entry in entries]
    lengths = list(map(len, datas))
    sizes = [(length + _SIZE_ROUNDING) & _SIZE_MASK for length in lengths]
    file_end = start - start % file_bytes + file_bytes
    positions = list(accumulate(sizes, initial=start))
    data_end = positions.pop()
    if data_end <= file_end:
        return _encode_in_one_file(entries, datas, lengths, sizes, positions, data_end)
    return _encode_across_files(entries, sizes, start, file_bytes)


def _encode_in_one_file(
    entries: Sequence[LogEntry],
    datas: list[bytes],
    lengths: list[int],
    sizes: list[int],
    positions: list[int],
    data_end: int,
) -> EncodedBatch:
    indexes = [entry.index for entry in entries]
    terms = [entry.term for entry in entries]
    count = len(entries)
    heads = list(
        map(
            ENTRY_HEADER_CHECKED.pack,
            repeat(ENTRY_MAGIC, count),
            sizes,
            indexes,
            terms,
            positions,
            [entry.type for entry in entries],
        )
    )
    tails = map(ENTRY_HEADER_TAIL.pack, map(_crc32c, heads), map(_crc32c, datas), lengths)
    paddings = map(
        _PADDINGS.__getitem__,
        [size - ENTRY_HEADER_BYTES - length for size, length in zip(sizes, lengths, strict=True)],
    )
    data = b"".join(chain.from_iterable(zip(heads, tails, datas, paddings, strict=True)))
    slots = map(INDEX_SLOT.pack, repeat(INDEX_MAGIC, count), positions, sizes, indexes, terms)
    index_buffer = bytearray(b"".join(slots))
    return EncodedBatch([(positions[0], [data])], index_buffer, data_end)


def _encode_across_files(
    entries: Sequence[LogEntry], sizes: list[int], start: int, file_bytes: int
) -> EncodedBatch:
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
