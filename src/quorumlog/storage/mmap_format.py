"""On-disk formats of the mmap (DLedger-style) log store: data entries, index slots, meta.

All integers are little-endian. DLedger writes big-endian (Java's ByteBuffer); we are not
byte-compatible with it and take the order that costs nothing on the machines we run on.

Data entry (a 48-byte header, then the body, then zero padding to a multiple of 8)::

    offset  size  field
         0     4  magic        ENTRY_MAGIC
         4     4  size         bytes the entry occupies in the stream, padding included
         8     8  index
        16     8  term
        24     8  position     the entry's own position in the logical data stream
        32     4  channel      our EntryType
        36     4  chain crc    CRC32C of header bytes 0..35 (see below)
        40     4  body crc     CRC32C of the body
        44     4  body size
        48     -  body

DLedger reserves "chain crc" for a running checksum over the whole log. We use the slot as a
checksum of the header instead: recovery must tell a torn or flipped header from a valid
one *before* it trusts `size`, and a running checksum would tie each entry to one that
`truncate_prefix` deletes. Body size and body crc are not covered: `size` (which is) must
agree with body size, and the body crc is checked against the body itself.

Entries are padded to 8 bytes so that the space left at the end of a data file is always
0 or at least 8 bytes, room for an end-of-file blank record: BLANK_MAGIC u32 and the u32
number of bytes from the blank to the end of the file (DLedger's preAppend padding).

Index slot (fixed 32 bytes, slot k of the index stream holds the entry k + slot_base)::

    magic u32 (INDEX_MAGIC), position u64, size u32, index u64, term u64

Index slots carry no checksum of their own: every use checks them against the data header,
which has one.
"""

from __future__ import annotations

import struct
from typing import Final

import google_crc32c
import msgspec

from quorumlog.storage.entry import EntryType, LogEntry

ENTRY_MAGIC: Final = 0xD1ED_E7A1
BLANK_MAGIC: Final = 0xB1A9_CE0F
INDEX_MAGIC: Final = 0x1D7E_C5A2
META_MAGIC: Final = 0x3E7A_F11E
META_VERSION: Final = 1

ENTRY_HEADER_BYTES: Final = 48
HEADER_CHECKED_BYTES: Final = 36
"""The header bytes the chain crc covers: magic through channel."""
ENTRY_ALIGNMENT_BYTES: Final = 8
BLANK_BYTES: Final = 8
INDEX_SLOT_BYTES: Final = 32
ENTRY_SIZE_MAX: Final = 0xFFFF_FFF8
"""The size field is a u32; the largest multiple of the alignment that fits."""

ENTRY_HEADER = struct.Struct("<IIQQQIIII")
ENTRY_HEADER_CHECKED = struct.Struct("<IIQQQI")
ENTRY_HEADER_TAIL = struct.Struct("<III")
BLANK = struct.Struct("<II")
INDEX_SLOT = struct.Struct("<IQIQQ")
MAGIC = struct.Struct("<I")

ENTRY_MAGIC_BYTES: Final = MAGIC.pack(ENTRY_MAGIC)
ZERO_SLOT: Final = bytes(INDEX_SLOT_BYTES)

if ENTRY_HEADER.size != ENTRY_HEADER_BYTES or INDEX_SLOT.size != INDEX_SLOT_BYTES:
    raise RuntimeError("mmap store struct layouts disagree with their documented sizes")

_crc32c = google_crc32c.value
_entry_types = frozenset(int(kind) for kind in EntryType)


def entry_size(data_bytes: int) -> int:
    """Bytes an entry with `data_bytes` of body occupies in the data stream."""
    unaligned = ENTRY_HEADER_BYTES + data_bytes
    return (unaligned + ENTRY_ALIGNMENT_BYTES - 1) & ~(ENTRY_ALIGNMENT_BYTES - 1)


def encode_entry(entry: LogEntry, position: int) -> bytes:
    """One entry as it is laid out at `position` of the data stream (padding included).

    The store's append path inlines the same steps for speed; this is the reference the
    codec tests hold it to.
    """
    data = entry.data
    size = entry_size(len(data))
    buffer = bytearray(size)
    head = ENTRY_HEADER_CHECKED.pack(
        ENTRY_MAGIC, size, entry.index, entry.term, position, entry.type
    )
    buffer[:HEADER_CHECKED_BYTES] = head
    ENTRY_HEADER_TAIL.pack_into(
        buffer, HEADER_CHECKED_BYTES, _crc32c(head), _crc32c(data), len(data)
    )
    buffer[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + len(data)] = data
    return bytes(buffer)


class EntryHeader(msgspec.Struct, frozen=True, gc=False):
    """A data entry header whose own checksum and internal consistency were verified."""

    size: int
    index: int
    term: int
    position: int
    entry_type: EntryType
    body_crc: int
    body_bytes: int


def decode_header(buffer: bytes | bytearray | memoryview) -> EntryHeader | str:
    """Decode and verify a 48-byte header; on failure return the reason instead.

    Checks what the header alone can tell: the magic, the chain crc, that size agrees with
    body size, and that the channel is a known entry type. Does not check the body.
    """
    if len(buffer) < ENTRY_HEADER_BYTES:
        return f"entry header is cut short ({len(buffer)} of {ENTRY_HEADER_BYTES} bytes)"
    magic, size, index, term, position, channel, chain_crc, body_crc, body_bytes = (
        ENTRY_HEADER.unpack_from(buffer, 0)
    )
    if magic != ENTRY_MAGIC:
        return f"bad entry magic {magic:#010x}"
    if _crc32c(bytes(buffer[:HEADER_CHECKED_BYTES])) != chain_crc:
        return "entry header checksum mismatch"
    if size != entry_size(body_bytes):
        return f"entry size {size} disagrees with body size {body_bytes}"
    if channel not in _entry_types:
        return f"unknown entry type {channel}"
    return EntryHeader(size, index, term, position, EntryType(channel), body_crc, body_bytes)


def body_matches(header: EntryHeader, body: bytes) -> bool:
    return len(body) == header.body_bytes and _crc32c(body) == header.body_crc


def encode_index_slot(position: int, size: int, index: int, term: int) -> bytes:
    return INDEX_SLOT.pack(INDEX_MAGIC, position, size, index, term)


class IndexSlot(msgspec.Struct, frozen=True, gc=False):
    magic: int
    position: int
    size: int
    index: int
    term: int


def decode_index_slot(buffer: bytes | bytearray | memoryview, offset: int = 0) -> IndexSlot:
    return IndexSlot(*INDEX_SLOT.unpack_from(buffer, offset))


# --- meta (checkpoint) file -----------------------------------------------------------

META = struct.Struct("<IIQQQqQIQQI")
"""magic, version, data_file_bytes, index_file_bytes, first_index, slot_base_index,
first_data_position, flags, cut_last_kept, cut_data_position, crc of all before it."""

META_FLAG_FIRST_ENTRY_PRESENT: Final = 1
META_FLAG_CUT_PENDING: Final = 2


class Meta(msgspec.Struct, frozen=True):
    """The small checkpoint that says where the log begins. Written atomically.

    `slot_base_index` is the log index whose slot sits at position 0 of the index stream
    (it may be zero or negative after `reset`, which starts the stream at a fresh file).
    `first_data_position` is where entry `first_index` starts, or would start, in the data
    stream. `first_entry_present` says the entry `first_index` existed (and was synced) when
    this meta was written: if it is set, a data stream that ends before that entry lost
    data; if it is clear, an empty log is legal.
    `cut_pending` marks a `truncate_suffix` in progress: until it is cleared, everything
    from `cut_data_position` on (entries after `cut_last_kept`) is being zeroed and open
    must finish the job.
    """

    data_file_bytes: int
    index_file_bytes: int
    first_index: int
    slot_base_index: int
    first_data_position: int
    first_entry_present: bool
    cut_pending: bool = False
    cut_last_kept: int = 0
    cut_data_position: int = 0


def encode_meta(meta: Meta) -> bytes:
    flags = (META_FLAG_FIRST_ENTRY_PRESENT if meta.first_entry_present else 0) | (
        META_FLAG_CUT_PENDING if meta.cut_pending else 0
    )
    fields = (
        META_MAGIC,
        META_VERSION,
        meta.data_file_bytes,
        meta.index_file_bytes,
        meta.first_index,
        meta.slot_base_index,
        meta.first_data_position,
        flags,
        meta.cut_last_kept,
        meta.cut_data_position,
    )
    body = META.pack(*fields, 0)[: META.size - 4]
    return body + MAGIC.pack(_crc32c(body))


def decode_meta(buffer: bytes) -> Meta | str:
    """Decode the meta file; on failure return the reason instead."""
    if len(buffer) != META.size:
        return f"meta file has {len(buffer)} bytes, expected {META.size}"
    fields = META.unpack(buffer)
    magic, version, data_file_bytes, index_file_bytes, first_index, slot_base_index = fields[:6]
    first_data_position, flags, cut_last_kept, cut_data_position, crc = fields[6:]
    if magic != META_MAGIC:
        return f"bad meta magic {magic:#010x}"
    if _crc32c(buffer[: META.size - 4]) != crc:
        return "meta checksum mismatch"
    if version != META_VERSION:
        return f"unknown meta version {version}"
    return Meta(
        data_file_bytes=data_file_bytes,
        index_file_bytes=index_file_bytes,
        first_index=first_index,
        slot_base_index=slot_base_index,
        first_data_position=first_data_position,
        first_entry_present=bool(flags & META_FLAG_FIRST_ENTRY_PRESENT),
        cut_pending=bool(flags & META_FLAG_CUT_PENDING),
        cut_last_kept=cut_last_kept,
        cut_data_position=cut_data_position,
    )
