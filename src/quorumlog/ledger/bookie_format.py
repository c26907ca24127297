"""On-disk format of bookie storage: the version file, log file headers, records, entries.

One directory holds a bookie's data:

    LOCK                          the directory lock (one open storage at a time)
    VERSION                       magic and format version, written once, atomically
    entries_<number>.log          the log files, numbered from 1, appended in order

Journal and entry log are one file (see bookie_storage for why). Each log file starts with
a 32-byte file header, then records, each a 40-byte record header and a body. Little-endian
throughout (every machine we run on is, so packing costs no byte swaps).

File header:

    offset  size  field
    0       8     magic           b"QLBOOKIE"
    8       4     format version  u32
    12      4     reserved        u32 (0)
    16      8     file number     u64 (matches the name)
    24      4     reserved        u32 (0)
    28      4     header checksum u32 (CRC32C of bytes 0..27)

Record header (format version 2, 48 bytes):

    0       4     body checksum   u32 (CRC32C of the body)
    4       4     body length     u32
    8       1     kind            u8 (RecordKind)
    9       3     reserved        (0)
    12      4     count           u32 (entries, or ledgers of a checkpoint)
    16      8     ledger id       u64 (0 for a checkpoint)
    24      8     LAC             i64 (the LAC that rode on the add; -1 when none)
    32      8     length          i64 (the ledger's bytes through that LAC; -1: not known)
    40      4     reserved        u32 (0)
    44      4     header checksum u32 (CRC32C of bytes 0..43)

Format version 1 (40 bytes) had no length: bytes 32..35 were reserved and the header
checksum sat at 36. Its files are still read (every length in them is -1, "not known"),
so a bookie upgraded in place keeps its data; files it writes from then on are version 2,
and VERSION says 2 before the first of them exists, so a version-1 program refuses the
directory instead of misreading it. Each file header names the layout of its records.

Bodies by kind:

- ENTRIES: `count` entries, each a 16-byte entry header (entry id u64, data length u32,
  data checksum u32: CRC32C of the data) then the data. The index points at an entry's
  header, so a read fetches header and data with one pread and checks the data again.
- MASTER_KEY: the ledger's master key. FENCE, DROP: empty.
- CHECKPOINT: the first record of every file: the state of every ledger alive when the file
  was started, `count` items of (ledger id u64, LAC i64, length i64, flags u16, key length
  u16, key) (version 1: no length).
  Ledger state records (key, fence, drop) in older files are superseded by it, which is
  what lets whole files be deleted once the ledgers whose entries they hold are dropped.

Two checksums per record, so open can tell where damage is: a header that checks out says
how long the record is even when its body does not (a torn write), and a body checksum over
the whole body costs one C call for a batch of entries.
"""

from __future__ import annotations

import enum
import operator
import re
import struct
from collections.abc import Sequence
from itertools import accumulate, chain

import google_crc32c
import msgspec

FORMAT_VERSION = 2
FORMAT_VERSIONS_READ = frozenset({1, FORMAT_VERSION})
"""Version 1 is read (lengths unknown); only FORMAT_VERSION is written."""
MAGIC = b"QLBOOKIE"

VERSION_FILE_NAME = "VERSION"
_VERSION_LAYOUT = struct.Struct("<8sII")
"""Magic, format version, checksum of the first 12 bytes."""

FILE_HEADER = struct.Struct("<8sIIQII")
FILE_HEADER_BYTES = FILE_HEADER.size


class RecordLayout(msgspec.Struct, frozen=True):
    """The byte layout of records in a file of one format version."""

    version: int
    header: struct.Struct
    """The record header, its checksum last."""
    checkpoint_item: struct.Struct
    has_length: bool

    @property
    def header_bytes(self) -> int:
        return self.header.size


_LAYOUT_VERSION_1 = RecordLayout(
    1, struct.Struct("<IIB3xIQqII"), struct.Struct("<QqHH"), has_length=False
)
_LAYOUT_VERSION_2 = RecordLayout(
    2, struct.Struct("<IIB3xIQqqII"), struct.Struct("<QqqHH"), has_length=True
)
RECORD_LAYOUTS = {layout.version: layout for layout in (_LAYOUT_VERSION_1, _LAYOUT_VERSION_2)}
CURRENT_LAYOUT = RECORD_LAYOUTS[FORMAT_VERSION]

RECORD_HEADER = CURRENT_LAYOUT.header
RECORD_HEADER_BYTES = RECORD_HEADER.size
RECORD_HEADER_CHECKED_BYTES = RECORD_HEADER_BYTES - 4
_RECORD_HEADER_PREFIX = struct.Struct("<IIB3xIQqqI")

ENTRY_HEADER = struct.Struct("<QII")
ENTRY_HEADER_BYTES = ENTRY_HEADER.size

CHECKPOINT_ITEM = CURRENT_LAYOUT.checkpoint_item
CHECKPOINT_FLAG_FENCED = 1
LENGTH_UNKNOWN = -1

UNSIGNED_32 = struct.Struct("<I")
ID_MAX = 2**63 - 1
"""Ledger and entry ids are below 2**63 (signed 64-bit elsewhere in the protocol)."""

_crc32c = google_crc32c.value
_PAIRWISE_JOIN_BYTES_MAX = 256
"""Average entry size up to which an ENTRIES record joins header and data pairwise."""
_FILE_NAME = re.compile(r"entries_(\d{10})\.log")


class RecordKind(enum.IntEnum):
    ENTRIES = 1
    MASTER_KEY = 2
    FENCE = 3
    DROP = 4
    CHECKPOINT = 5


RECORD_KINDS = frozenset(int(kind) for kind in RecordKind)


class FormatError(ValueError):
    """Bytes that fail their own checks; the caller turns this into a typed storage error."""


class RecordHeader(msgspec.Struct, frozen=True):
    body_checksum: int
    body_length: int
    kind: int
    count: int
    ledger_id: int
    last_add_confirmed: int
    length: int = LENGTH_UNKNOWN
    """The ledger's bytes through `last_add_confirmed` (-1: not known, or a version-1 file)."""


class CheckpointItem(msgspec.Struct, frozen=True):
    ledger_id: int
    last_add_confirmed: int
    fenced: bool
    master_key: bytes
    length: int = LENGTH_UNKNOWN


# --- names and the version file -----------------------------------------------------------


def log_file_name(number: int) -> str:
    return f"entries_{number:010d}.log"


def parse_log_file_name(name: str) -> int | None:
    match = _FILE_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def encode_version_file(version: int = FORMAT_VERSION) -> bytes:
    prefix = _VERSION_LAYOUT.pack(MAGIC, version, 0)[:12]
    return prefix + UNSIGNED_32.pack(_crc32c(prefix))


def decode_version_file(data: bytes) -> int:
    """The format version a VERSION file names; FormatError if it is not one."""
    if len(data) != _VERSION_LAYOUT.size:
        raise FormatError(f"VERSION file has {len(data)} bytes, expected {_VERSION_LAYOUT.size}")
    magic, version, checksum = _VERSION_LAYOUT.unpack(data)
    if magic != MAGIC or _crc32c(data[:12]) != checksum:
        raise FormatError("VERSION file fails its magic or checksum")
    return int(version)


# --- file headers -----------------------------------------------------------------------


def encode_file_header(number: int, version: int = FORMAT_VERSION) -> bytes:
    prefix = FILE_HEADER.pack(MAGIC, version, 0, number, 0, 0)[: FILE_HEADER_BYTES - 4]
    return prefix + UNSIGNED_32.pack(_crc32c(prefix))


def decode_file_header(data: bytes) -> tuple[int, int]:
    """(format version, file number) of a file header; FormatError if it fails its checks."""
    if len(data) < FILE_HEADER_BYTES:
        raise FormatError("file header is incomplete")
    magic, version, _reserved, number, _reserved_2, checksum = FILE_HEADER.unpack_from(data)
    if magic != MAGIC or _crc32c(data[: FILE_HEADER_BYTES - 4]) != checksum:
        raise FormatError("file header fails its magic or checksum")
    return int(version), int(number)


# --- records ------------------------------------------------------------------------------


def encode_record(
    kind: RecordKind,
    ledger_id: int,
    last_add_confirmed: int,
    count: int,
    body: bytes,
    length: int = LENGTH_UNKNOWN,
) -> bytes:
    """One record in the current format version (the only one written)."""
    prefix = _RECORD_HEADER_PREFIX.pack(
        _crc32c(body), len(body), kind, count, ledger_id, last_add_confirmed, length, 0
    )
    return b"".join((prefix, UNSIGNED_32.pack(_crc32c(prefix)), body))


def encode_entries_record(
    ledger_id: int,
    last_add_confirmed: int,
    entry_ids: Sequence[int],
    datas: Sequence[bytes],
    length: int = LENGTH_UNKNOWN,
) -> tuple[bytes, list[int], list[int]]:
    """One ENTRIES record: (bytes, offset of each entry header in it, data length of each).

    Column by column with map() over C functions, so the per-entry work runs in C rather than
    in Python bytecode, as segment_format does for the Raft log.
    """
    if len(entry_ids) != len(datas):
        raise ValueError(f"{len(entry_ids)} entry ids for {len(datas)} entries")
    lengths = list(map(len, datas))
    entry_headers = map(ENTRY_HEADER.pack, entry_ids, lengths, map(_crc32c, datas))
    if sum(lengths) <= _PAIRWISE_JOIN_BYTES_MAX * len(datas):
        # Small entries: header and data joined pairwise first. Joining one sequence that
        # alternates 16-byte headers and 100-byte data cost three times as much per entry
        # (measured); for large entries the extra copy of each pair costs more instead.
        body = b"".join(map(operator.add, entry_headers, datas))
    else:
        body = b"".join(chain.from_iterable(zip(entry_headers, datas, strict=True)))
    record = encode_record(
        RecordKind.ENTRIES, ledger_id, last_add_confirmed, len(datas), body, length
    )
    offsets = list(
        accumulate((ENTRY_HEADER_BYTES + length for length in lengths), initial=RECORD_HEADER_BYTES)
    )
    offsets.pop()
    return record, offsets, lengths


def encode_checkpoint(items: Sequence[CheckpointItem]) -> bytes:
    parts: list[bytes] = []
    for item in items:
        flags = CHECKPOINT_FLAG_FENCED if item.fenced else 0
        parts.append(
            CHECKPOINT_ITEM.pack(
                item.ledger_id, item.last_add_confirmed, item.length, flags, len(item.master_key)
            )
        )
        parts.append(item.master_key)
    return encode_record(RecordKind.CHECKPOINT, 0, -1, len(items), b"".join(parts))


def decode_record_header(
    data: bytes, offset: int, layout: RecordLayout = CURRENT_LAYOUT
) -> RecordHeader:
    """The record header at `offset` of `data`, checked; FormatError if it fails a check
    (the caller has made sure `layout.header_bytes` are there)."""
    fields = layout.header.unpack_from(data, offset)
    header_checksum = fields[-1]
    if _crc32c(data[offset : offset + layout.header_bytes - 4]) != header_checksum:
        raise FormatError("record header checksum mismatch")
    body_checksum, body_length, kind, count, ledger_id, last_add_confirmed = fields[:6]
    length = fields[6] if layout.has_length else LENGTH_UNKNOWN
    if kind not in RECORD_KINDS:
        raise FormatError(f"unknown record kind {kind}")
    if length < LENGTH_UNKNOWN:
        raise FormatError(f"record length {length} is below -1")
    return RecordHeader(
        body_checksum, body_length, kind, count, ledger_id, last_add_confirmed, length
    )


def check_body(header: RecordHeader, body: bytes) -> None:
    if _crc32c(body) != header.body_checksum:
        raise FormatError("record body checksum mismatch")


def decode_entry_table(body: bytes, count: int) -> tuple[list[int], list[int], list[int]]:
    """(entry ids, offsets of entry headers within the body, data lengths) of an ENTRIES
    body whose checksum already checked out; FormatError if its layout is inconsistent."""
    entry_ids: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    unpack = ENTRY_HEADER.unpack_from
    position = 0
    body_length = len(body)
    for _ in range(count):
        if position + ENTRY_HEADER_BYTES > body_length:
            raise FormatError("entry table runs past the record body")
        entry_id, length, _checksum = unpack(body, position)
        entry_ids.append(entry_id)
        offsets.append(position)
        lengths.append(length)
        position += ENTRY_HEADER_BYTES + length
    if position != body_length:
        raise FormatError(f"entries end at {position} of a {body_length}-byte body")
    return entry_ids, offsets, lengths


def decode_checkpoint(
    body: bytes, count: int, layout: RecordLayout = CURRENT_LAYOUT
) -> list[CheckpointItem]:
    items: list[CheckpointItem] = []
    position = 0
    item_layout = layout.checkpoint_item
    for _ in range(count):
        if position + item_layout.size > len(body):
            raise FormatError("checkpoint runs past its body")
        fields = item_layout.unpack_from(body, position)
        ledger_id, last_add_confirmed = fields[:2]
        length = fields[2] if layout.has_length else LENGTH_UNKNOWN
        if length < LENGTH_UNKNOWN:
            raise FormatError(f"checkpoint length {length} is below -1")
        flags, key_length = fields[-2:]
        position += item_layout.size
        master_key = body[position : position + key_length]
        position += key_length
        fenced = bool(flags & CHECKPOINT_FLAG_FENCED)
        items.append(CheckpointItem(ledger_id, last_add_confirmed, fenced, master_key, length))
    if position != len(body):
        raise FormatError(f"checkpoint items end at {position} of a {len(body)}-byte body")
    return items


def decode_stored_entry(raw: bytes, entry_id: int) -> bytes:
    """The data of one entry read back (entry header and exactly its data), checked against
    its header: the id the index expected, the length and the data checksum."""
    if len(raw) < ENTRY_HEADER_BYTES:
        raise FormatError("a stored entry reads back shorter than its header")
    stored_id, length, checksum = ENTRY_HEADER.unpack_from(raw)
    if stored_id != entry_id:
        raise FormatError(f"index points at entry {stored_id}, not {entry_id}")
    if length != len(raw) - ENTRY_HEADER_BYTES:
        raise FormatError(f"entry header says {length} bytes, index says {len(raw) - 16}")
    data = raw[ENTRY_HEADER_BYTES:]
    if _crc32c(data) != checksum:
        raise FormatError("entry data checksum mismatch")
    return data
