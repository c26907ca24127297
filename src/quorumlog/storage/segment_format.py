"""On-disk format of the segment log store: entry headers, segment file names, the meta file.

Entry layout (little-endian, 24-byte header then the data):

    offset  size  field
    0       8     term            u64
    8       1     entry type      u8   (EntryType value)
    9       1     checksum type   u8   (1 = CRC32C, the only one written or accepted)
    10      2     reserved        u16  (written as 0)
    12      4     data length     u32
    16      4     data checksum   u32  (CRC32C of the data)
    20      4     header checksum u32  (CRC32C of bytes 0..19)
    24      n     data

Little-endian because every machine we run on is, so packing costs no byte swaps.

Segment files: `log_<first>-<last>` for a closed segment holding exactly the entries
first..last, `log_inprogress_<first>` for the one open segment. Indexes are zero-padded to 20
digits (the width of the largest u64) so that names sort in index order.

The meta file `log_meta` holds the first index of the log (entries below it are compacted
away even if a segment still holds them) and a flag that marks a reset in progress.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from itertools import accumulate, chain, repeat

import google_crc32c

from quorumlog.storage.entry import EntryType, LogEntry

ENTRY_HEADER_BYTES = 24
CHECKSUM_TYPE_CRC32C = 1
INDEX_DIGITS = 20

HEADER = struct.Struct("<QBBHIII")
"""The whole 24-byte header."""
HEADER_PREFIX = struct.Struct("<QBBHII")
"""The first 20 bytes: everything the header checksum covers."""
UNSIGNED_32 = struct.Struct("<I")

ZERO_HEADER = bytes(ENTRY_HEADER_BYTES)

ENTRY_TYPES: dict[int, EntryType] = {member.value: member for member in EntryType}
"""Entry type byte to EntryType, without the cost of calling the enum on the read path."""

_crc32c = google_crc32c.value

META_FILE_NAME = "log_meta"
META_MAGIC = b"QLSEGMET"
META_VERSION = 1
META_FLAG_RESET = 1
"""Set while `reset` runs: every segment present at open is stale and must go."""
_META = struct.Struct("<8sIIQ")
_META_BYTES = _META.size + UNSIGNED_32.size

_CLOSED_NAME = re.compile(r"log_(\d{20})-(\d{20})")
_OPEN_NAME = re.compile(r"log_inprogress_(\d{20})")


class HeaderError(ValueError):
    """Bytes that fail their own checks; the caller turns this into CorruptLogError."""

    def __init__(self, reason: str, offset: int = 0) -> None:
        super().__init__(reason)
        self.offset = offset


def encode_entries(entries: Sequence[LogEntry]) -> tuple[bytes, list[int], list[int]]:
    """Encode a batch into one buffer: returns (bytes, offset of each entry, term of each).

    Column by column with map() over C functions, so the per-entry work runs in C rather
    than in Python bytecode (about half the cost of a per-entry loop, measured).
    google_crc32c wants real `bytes` (not memoryviews), which is why each header prefix is
    packed into its own small bytes object and the buffer is joined at the end.
    """
    datas = [entry.data for entry in entries]
    terms = [entry.term for entry in entries]
    lengths = list(map(len, datas))
    prefixes = list(
        map(
            HEADER_PREFIX.pack,
            terms,
            [entry.type for entry in entries],
            repeat(CHECKSUM_TYPE_CRC32C),
            repeat(0),
            lengths,
            map(_crc32c, datas),
        )
    )
    header_checksums = map(UNSIGNED_32.pack, map(_crc32c, prefixes))
    encoded = b"".join(chain.from_iterable(zip(prefixes, header_checksums, datas, strict=True)))
    offsets = list(accumulate((ENTRY_HEADER_BYTES + length for length in lengths), initial=0))
    offsets.pop()
    return encoded, offsets, terms


def index_encoded_batch(
    encoded: bytes, count: int, entry_bytes_max: int
) -> tuple[list[int], list[int]]:
    """Check a batch made by encode_entries and return (offsets, terms) of its entries.

    Every header and data checksum is verified: the bytes come from outside the store.
    Raises HeaderError (with the offset of the bad entry) for bytes that fail a check, or
    ValueError if the batch does not hold exactly `count` entries or one is too large.
    """
    offsets: list[int] = []
    terms: list[int] = []
    unpack = HEADER.unpack_from
    crc32c = _crc32c
    total_bytes = len(encoded)
    position = 0
    while position < total_bytes:
        if position + ENTRY_HEADER_BYTES > total_bytes:
            raise HeaderError("incomplete entry header", position)
        term, entry_type, checksum_type, _reserved, length, data_crc, header_crc = unpack(
            encoded, position
        )
        data_start = position + ENTRY_HEADER_BYTES
        end = data_start + length
        if (
            crc32c(encoded[position : position + 20]) != header_crc
            or checksum_type != CHECKSUM_TYPE_CRC32C
            or entry_type not in ENTRY_TYPES
            or end > total_bytes
            or crc32c(encoded[data_start:end]) != data_crc
        ):
            raise HeaderError("entry fails its header or data checks", position)
        if length > entry_bytes_max:
            raise ValueError(
                f"entry {len(offsets)} of the batch has {length} bytes of data, "
                f"over entry_bytes_max={entry_bytes_max}"
            )
        offsets.append(position)
        terms.append(term)
        position = end
    if len(offsets) != count:
        raise ValueError(f"encoded batch holds {len(offsets)} entries, count says {count}")
    return offsets, terms


def encode_entry(entry: LogEntry) -> bytes:
    """One entry, header and data (for tests and tools; the stores encode whole batches)."""
    return encode_entries([entry])[0]


def decode_header(header: bytes) -> tuple[int, int, int]:
    """Check a 24-byte header and return (term, entry type, data length).

    Raises HeaderError if the header checksum, the checksum type or the entry type is wrong.
    """
    term, entry_type, checksum_type, _reserved, length, _data_crc, header_crc = HEADER.unpack(
        header
    )
    if _crc32c(header[:20]) != header_crc:
        raise HeaderError("entry header checksum mismatch")
    if checksum_type != CHECKSUM_TYPE_CRC32C:
        raise HeaderError(f"unknown checksum type {checksum_type}")
    if entry_type not in ENTRY_TYPES:
        raise HeaderError(f"unknown entry type {entry_type}")
    return term, entry_type, length


def decode_entry(index: int, raw: bytes) -> LogEntry:
    """Check and decode one whole entry (header and exactly its data) read from disk.

    Raises HeaderError on any checksum, type or length mismatch.
    """
    if len(raw) < ENTRY_HEADER_BYTES:
        raise HeaderError(f"entry is {len(raw)} bytes, shorter than its header")
    term, entry_type, checksum_type, _reserved, length, data_crc, header_crc = HEADER.unpack_from(
        raw
    )
    if _crc32c(raw[:20]) != header_crc:
        raise HeaderError("entry header checksum mismatch")
    if length != len(raw) - ENTRY_HEADER_BYTES:
        raise HeaderError(f"header says {length} data bytes, index says {len(raw) - 24}")
    if checksum_type != CHECKSUM_TYPE_CRC32C:
        raise HeaderError(f"unknown checksum type {checksum_type}")
    data = raw[ENTRY_HEADER_BYTES:]
    if _crc32c(data) != data_crc:
        raise HeaderError("entry data checksum mismatch")
    kind = ENTRY_TYPES.get(entry_type)
    if kind is None:
        raise HeaderError(f"unknown entry type {entry_type}")
    return LogEntry(index=index, term=term, data=data, type=kind)


# --- file names ------------------------------------------------------------------------


def closed_segment_name(first_index: int, last_index: int) -> str:
    return f"log_{first_index:020d}-{last_index:020d}"


def open_segment_name(first_index: int) -> str:
    return f"log_inprogress_{first_index:020d}"


def parse_segment_name(name: str) -> tuple[int, int | None] | None:
    """(first, last) of a closed segment, (first, None) of an open one, None if not a segment.

    Names that start like a segment but do not parse raise HeaderError: a stray file that
    looks like log data is never silently ignored.
    """
    if name == META_FILE_NAME or name == META_FILE_NAME + ".tmp" or not name.startswith("log_"):
        return None
    closed = _CLOSED_NAME.fullmatch(name)
    if closed is not None:
        return int(closed.group(1)), int(closed.group(2))
    opened = _OPEN_NAME.fullmatch(name)
    if opened is not None:
        return int(opened.group(1)), None
    raise HeaderError(f"file name {name!r} looks like a segment but does not parse")


# --- meta file -------------------------------------------------------------------------


def encode_meta(first_index: int, reset_in_progress: bool) -> bytes:
    flags = META_FLAG_RESET if reset_in_progress else 0
    body = _META.pack(META_MAGIC, META_VERSION, flags, first_index)
    return body + UNSIGNED_32.pack(_crc32c(body))


def decode_meta(raw: bytes) -> tuple[int, bool]:
    """(first_index, reset_in_progress) from the meta file; raises HeaderError if damaged."""
    if len(raw) != _META_BYTES:
        raise HeaderError(f"meta file is {len(raw)} bytes, expected {_META_BYTES}")
    body = raw[: _META.size]
    (checksum,) = UNSIGNED_32.unpack_from(raw, _META.size)
    if _crc32c(body) != checksum:
        raise HeaderError("meta file checksum mismatch")
    magic, version, flags, first_index = _META.unpack(body)
    if magic != META_MAGIC or version != META_VERSION:
        raise HeaderError(f"meta file has magic {magic!r} version {version}")
    if first_index < 1:
        raise HeaderError(f"meta file has first_index {first_index}")
    return first_index, bool(flags & META_FLAG_RESET)
