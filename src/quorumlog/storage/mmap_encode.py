"""Encoding a batch of entries for the mmap store's data and index streams (the hot path).

Every entry of a batch is copied into one buffer, written with one system call per data file
the batch touches (mmap_format documents the layout). A gather write (pwritev of headers and
the callers' bodies, no copy) was tried for 4 KiB entries and cost the same CPU: the kernel's
copy into the page cache dominates, not ours.

The zero bytes after a blank record are not written: everything after the end of the log is
zero already (the store keeps it so), so only the blank's 8 bytes need writing.

A batch that fits in the current data file (nearly every one) is encoded column by column
with map() over C functions, as the segment store does, so the per-entry work runs in C, not
in Python bytecode: each attribute is read once (`EntryColumns`), sizes and paddings of
small entries are table lookups, the pieces are placed by slice assignment and joined once,
and the index slots are packed by one Struct for the whole batch. A batch of one entry
length (the usual one: like records) takes its sizes, positions and padding from one size.
What is left per entry is a header pack, two checksums and a tail pack. A batch that
crosses a file boundary takes the loop, written out flat on purpose: per-entry helper calls
would cost more than the rest of its body. `mmap_format.encode_entry` is the plain reference
both are tested against.

Tried and left out (measured on the 2-core bench VM): numpy columns (converting 256-item
lists costs about what it saves), writing the index slots through the mapping, and
prefaulting page-cache pages ahead of the writes (the cost only moves). Also tried: the
whole header in one numpy structured array, its chain crc from per-byte tables (CRC32C is
affine, so a 36-byte header's crc is a constant xor one table entry per byte): 1.3x the
time of this encoder on 256 x 100 B, A/B in one process; the same with one 2-D array for
batches of equal lengths (no join): break-even. At 100 B a sync (about 280 us quiet, 500+
under the other engineers' load) costs as much as the encode and the writes together.
Zero-filling the preallocated files makes each sync about 100 us cheaper (no
unwritten-extent conversion to journal); zero-filling a whole file at once costs as much disk
time as it saves, so the store has zeros written a little ahead of its appends, by a thread
that also syncs them (mmap_zeroing), only while syncs are small (`MappedFileList.zero_ahead`,
`mmap_store.ZERO_AHEAD_SYNC_BYTES_MAX`).

Session 9 measured where 256 x 100 B goes (best of many runs, in one process): columns and
`follow` 38 us, this encoder 131 us: header packs 26, header crcs 27, body crcs 29, tail
packs 19, the join 14, index slots 17. One `google_crc32c.value` call costs about 100 ns, of
which the CRC itself is a tenth (the rest is argument parsing); it takes only `bytes` (a
memoryview slice is refused), so a header must become its own bytes object before its crc.
Also tried then: a uniform batch packed whole by one cached Struct (nine header fields, the
body as an `s` field and the padding, for every entry), the chain crcs taken from slices of
the packed bytes and written back through a strided 32-bit view: 115 us without the index
slots, against 128 us for this encoder with them, so level (the 512 crc calls and 256 header
slices stay) and left out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate, repeat

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


class EntryColumns:
    """A batch's entries as columns, read once: the append checks and the encoders share
    them (reading each attribute of 256 entries costs about 5 µs a column)."""

    __slots__ = ("datas", "indexes", "length_max", "lengths", "terms", "types", "uniform")

    def __init__(self, entries: Sequence[LogEntry]) -> None:
        self.datas = [entry.data for entry in entries]
        self.indexes = [entry.index for entry in entries]
        self.terms = [entry.term for entry in entries]
        self.types = [entry.type for entry in entries]
        lengths = list(map(len, self.datas))
        self.lengths = lengths
        self.uniform = bool(lengths) and lengths.count(lengths[0]) == len(lengths)
        """Every entry has the same data length (batches of like records, the usual
        case): a count in C costs a sixth of a max over the same list."""
        self.length_max = lengths[0] if self.uniform else max(lengths, default=0)

    def __len__(self) -> int:
        return len(self.datas)

    def follow(self, last_index: int, entry_bytes_max: int) -> bool:
        """Whether the entries run on from `last_index` + 1, each within
        `entry_bytes_max` and with a term >= 0: `base.check_append`'s fast path, on the
        columns. On False, `check_append` names the culprit."""
        first = last_index + 1
        terms = self.terms
        if terms and terms.count(terms[0]) == len(terms):
            terms_valid = terms[0] >= 0  # one term (the usual batch): no min over the list
        else:
            terms_valid = min(terms, default=0) >= 0
        return (
            self.indexes == list(range(first, first + len(self.indexes)))
            and self.length_max <= entry_bytes_max
            and terms_valid
        )


class EncodedBatch:
    __slots__ = ("data_end", "index_buffer", "pieces")

    def __init__(self, pieces: list[Piece], index_buffer: Buffer, data_end: int) -> None:
        self.pieces = pieces
        self.index_buffer = index_buffer
        """The batch's index slots, back to back from the first entry's slot."""
        self.data_end = data_end
        """The data stream position just past the batch."""


_PADDINGS = [bytes(count) for count in range(ENTRY_ALIGNMENT_BYTES)]
"""The zero bytes after an entry's data up to the alignment, by count."""

TABLE_LENGTH_MAX = 4096
"""Entry sizes and paddings of data lengths below this come from tables: one list lookup
per entry in C instead of arithmetic in Python bytecode."""
_SIZE_BY_LENGTH = [(length + _SIZE_ROUNDING) & _SIZE_MASK for length in range(TABLE_LENGTH_MAX)]
_PADDING_BY_LENGTH = [
    _PADDINGS[size - ENTRY_HEADER_BYTES - length] for length, size in enumerate(_SIZE_BY_LENGTH)
]

SLOT_STRUCTS_MAX = 64
"""Batch sizes whose whole-batch index slot Struct is kept (see `_slots`)."""
SLOT_STRUCT_ENTRIES_MAX = 4096
"""Larger batches pack slot by slot: a Struct of their size is not worth compiling."""
_slot_structs: dict[int, struct.Struct] = {}
INDEX_SLOT_FIELDS = 5


def encode(columns: EntryColumns, start: int, file_bytes: int) -> EncodedBatch:
    """Lay out the entries from data stream position `start` in files of `file_bytes`.

    The entries must have passed `EntryColumns.follow` (or `check_append`)."""
    lengths = columns.lengths
    count = len(lengths)
    if columns.uniform:
        # Entries of one length (batches of like records, the bench's): sizes and positions
        # in C from one size, without a lookup or a sum per entry.
        size = (lengths[0] + _SIZE_ROUNDING) & _SIZE_MASK
        sizes = [size] * count
        positions = list(range(start, start + (count + 1) * size, size))
    else:
        if columns.length_max < TABLE_LENGTH_MAX:
            sizes = list(map(_SIZE_BY_LENGTH.__getitem__, lengths))
        else:
            sizes = [(length + _SIZE_ROUNDING) & _SIZE_MASK for length in lengths]
        positions = list(accumulate(sizes, initial=start))
    file_end = start - start % file_bytes + file_bytes
    data_end = positions.pop()
    if data_end <= file_end:
        return _encode_in_one_file(columns, sizes, positions, data_end)
    return _encode_across_files(columns, sizes, start, file_bytes)


def _encode_in_one_file(
    columns: EntryColumns, sizes: list[int], positions: list[int], data_end: int
) -> EncodedBatch:
    count = len(columns)
    datas = columns.datas
    lengths = columns.lengths
    heads = list(
        map(
            ENTRY_HEADER_CHECKED.pack,
            repeat(ENTRY_MAGIC, count),
            sizes,
            columns.indexes,
            columns.terms,
            positions,
            columns.types,
        )
    )
    # Four pieces an entry, placed by slice assignment (C) and joined once: half the cost
    # of joining a chain of zips.
    pieces: list[bytes] = [b""] * (4 * count)
    pieces[0::4] = heads
    pieces[1::4] = map(ENTRY_HEADER_TAIL.pack, map(_crc32c, heads), map(_crc32c, datas), lengths)
    pieces[2::4] = datas
    if columns.uniform:
        # One length (see `encode`): one padding.
        pieces[3::4] = [_PADDINGS[sizes[0] - ENTRY_HEADER_BYTES - lengths[0]]] * count
    elif columns.length_max < TABLE_LENGTH_MAX:
        pieces[3::4] = map(_PADDING_BY_LENGTH.__getitem__, lengths)
    else:
        pieces[3::4] = [
            _PADDINGS[size - ENTRY_HEADER_BYTES - length]
            for size, length in zip(sizes, lengths, strict=True)
        ]
    data = b"".join(pieces)
    index_buffer = _slots(positions, sizes, columns.indexes, columns.terms)
    return EncodedBatch([(positions[0], [data])], index_buffer, data_end)


def _slots(positions: list[int], sizes: list[int], indexes: list[int], terms: list[int]) -> bytes:
    """The index slots of a batch, packed by one Struct for the whole batch (cached per
    batch size; a pack per slot costs half again as much)."""
    count = len(positions)
    if count > SLOT_STRUCT_ENTRIES_MAX:
        return b"".join(
            map(INDEX_SLOT.pack, repeat(INDEX_MAGIC, count), positions, sizes, indexes, terms)
        )
    layout = _slot_structs.get(count)
    if layout is None:
        if len(_slot_structs) >= SLOT_STRUCTS_MAX:
            _slot_structs.clear()
        layout = struct.Struct("<" + INDEX_SLOT.format.lstrip("<") * count)
        _slot_structs[count] = layout
    fields: list[int] = [INDEX_MAGIC] * (INDEX_SLOT_FIELDS * count)
    fields[1::INDEX_SLOT_FIELDS] = positions
    fields[2::INDEX_SLOT_FIELDS] = sizes
    fields[3::INDEX_SLOT_FIELDS] = indexes
    fields[4::INDEX_SLOT_FIELDS] = terms
    return layout.pack(*fields)


def _encode_across_files(
    columns: EntryColumns, sizes: list[int], start: int, file_bytes: int
) -> EncodedBatch:
    buffer = bytearray(sum(sizes))
    view = memoryview(buffer)
    index_buffer = bytearray(INDEX_SLOT_BYTES * len(columns))
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
    entries = zip(columns.indexes, columns.terms, columns.datas, columns.types, strict=True)
    for (index, term, data, entry_type), size in zip(entries, sizes, strict=True):
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
        head = head_pack(ENTRY_MAGIC, size, index, term, position, entry_type)
        buffer[offset : offset + HEADER_CHECKED_BYTES] = head
        tail_pack_into(buffer, offset + HEADER_CHECKED_BYTES, crc32c(head), crc32c(data), len(data))
        buffer[offset + ENTRY_HEADER_BYTES : offset + ENTRY_HEADER_BYTES + len(data)] = data
        slot_pack_into(index_buffer, slot, INDEX_MAGIC, position, size, index, term)
        position += size
        offset += size
        slot += INDEX_SLOT_BYTES
    pieces.append((piece_start, [view[piece_offset:offset]]))
    return EncodedBatch(pieces, index_buffer, position)
