"""The mmap store's on-disk codecs: data entries, index slots, the meta checkpoint."""

from __future__ import annotations

import struct
from pathlib import Path

import google_crc32c
import pytest

from quorumlog.storage import EntryType, LogEntry, MmapLogStore
from quorumlog.storage.mmap_encode import (
    SLOT_STRUCT_ENTRIES_MAX,
    TABLE_LENGTH_MAX,
    EntryColumns,
    encode,
)
from quorumlog.storage.mmap_format import (
    BLANK_MAGIC,
    ENTRY_HEADER_BYTES,
    ENTRY_MAGIC,
    INDEX_MAGIC,
    INDEX_SLOT_BYTES,
    EntryHeader,
    Meta,
    body_matches,
    decode_header,
    decode_index_slot,
    decode_meta,
    encode_entry,
    encode_index_slot,
    encode_meta,
    entry_size,
)


def test_entry_size_is_header_plus_body_rounded_to_eight() -> None:
    assert entry_size(0) == 48
    assert entry_size(1) == 56
    assert entry_size(8) == 56
    assert entry_size(9) == 64
    assert all(entry_size(n) % 8 == 0 for n in range(100))


def test_entry_round_trip_keeps_every_field() -> None:
    entry = LogEntry(index=7, term=3, data=b"hello world", type=EntryType.CONFIGURATION)
    encoded = encode_entry(entry, position=4096)
    assert len(encoded) == entry_size(len(entry.data))
    header = decode_header(encoded[:ENTRY_HEADER_BYTES])
    assert isinstance(header, EntryHeader)
    assert (header.size, header.index, header.term, header.position) == (len(encoded), 7, 3, 4096)
    assert (header.entry_type, header.body_bytes) == (EntryType.CONFIGURATION, 11)
    body = encoded[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + header.body_bytes]
    assert body == b"hello world"
    assert body_matches(header, body)
    assert encoded[ENTRY_HEADER_BYTES + 11 :] == bytes(len(encoded) - ENTRY_HEADER_BYTES - 11)


def test_layout_matches_the_documented_offsets() -> None:
    encoded = encode_entry(LogEntry(index=0x0102, term=0x0304, data=b"ab"), position=0x0506)
    magic, size, index, term, position, channel = struct.unpack_from("<IIQQQI", encoded, 0)
    assert (magic, size, index, term, position) == (ENTRY_MAGIC, 56, 0x0102, 0x0304, 0x0506)
    assert channel == EntryType.DATA
    body_crc, body_bytes = struct.unpack_from("<II", encoded, 40)
    assert (body_crc, body_bytes) == (google_crc32c.value(b"ab"), 2)
    assert encoded[48:50] == b"ab"


@pytest.mark.parametrize("byte", range(ENTRY_HEADER_BYTES))
def test_a_flipped_header_bit_never_decodes_as_the_same_entry(byte: int) -> None:
    entry = LogEntry(index=5, term=2, data=b"payload!")
    encoded = bytearray(encode_entry(entry, position=800))
    encoded[byte] ^= 1 << (byte % 8)
    header = decode_header(bytes(encoded[:ENTRY_HEADER_BYTES]))
    body = bytes(encoded[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + len(entry.data)])
    # Either the header itself is rejected, or (body crc / body size flipped) the body check is.
    assert isinstance(header, str) or not body_matches(header, body)


def test_decode_header_rejects_short_zero_and_unknown_type() -> None:
    assert "cut short" in str(decode_header(b"\x01" * 10))
    assert "magic" in str(decode_header(bytes(ENTRY_HEADER_BYTES)))
    encoded = bytearray(encode_entry(LogEntry(index=1, term=1, data=b""), position=0))
    struct.pack_into("<I", encoded, 32, 99)  # channel
    # Recompute the chain crc so only the type is wrong.
    struct.pack_into("<I", encoded, 36, google_crc32c.value(bytes(encoded[:36])))
    assert "unknown entry type" in str(decode_header(bytes(encoded[:ENTRY_HEADER_BYTES])))


def test_index_slot_round_trip() -> None:
    encoded = encode_index_slot(position=123456, size=88, index=42, term=9)
    assert len(encoded) == INDEX_SLOT_BYTES
    slot = decode_index_slot(encoded)
    assert (slot.magic, slot.position, slot.size, slot.index, slot.term) == (
        INDEX_MAGIC,
        123456,
        88,
        42,
        9,
    )
    assert decode_index_slot(b"\0" * 40 + encoded, 40) == slot


def test_meta_round_trip_and_checksum() -> None:
    meta = Meta(
        data_file_bytes=4096,
        index_file_bytes=512,
        first_index=10,
        slot_base_index=-5,
        first_data_position=8192,
        first_entry_present=True,
        cut_pending=True,
        cut_last_kept=12,
        cut_data_position=9000,
    )
    encoded = encode_meta(meta)
    assert decode_meta(encoded) == meta
    for byte in range(len(encoded)):
        damaged = bytearray(encoded)
        damaged[byte] ^= 0x10
        assert isinstance(decode_meta(bytes(damaged)), str)
    assert isinstance(decode_meta(encoded[:-1]), str)


def test_the_store_writes_exactly_what_the_codec_encodes(tmp_path: Path) -> None:
    path = tmp_path / "log"
    store = MmapLogStore.open(
        path, data_file_bytes=4096, index_file_bytes=1024, entry_bytes_max=1024
    )
    entries = [LogEntry(index=i, term=2, data=bytes([i]) * (i * 3)) for i in range(1, 20)]
    store.append(entries)
    store.sync()
    store.close()
    data = (path / "data" / f"{0:020d}").read_bytes()
    index = (path / "index" / f"{0:020d}").read_bytes()
    position = 0
    for number, entry in enumerate(entries):
        expected = encode_entry(entry, position)
        assert data[position : position + len(expected)] == expected
        slot = index[number * INDEX_SLOT_BYTES : (number + 1) * INDEX_SLOT_BYTES]
        assert slot == encode_index_slot(position, len(expected), entry.index, entry.term)
        position += len(expected)
    assert data[position:] == bytes(len(data) - position)


@pytest.mark.parametrize("file_bytes", [4096, 8192])
def test_batches_across_rollovers_match_the_reference_codec(
    tmp_path: Path, file_bytes: int
) -> None:
    """The store's flat encoding loop writes what `encode_entry` says, blanks included."""
    # 4048 bytes of data fill a 4096-byte file exactly: the next entry rolls over blankless.
    sizes = [0, 1, 7, 8, 9, 100, 1000, 1024, 3000, 4000, 13, 2048, 4048, 4048, 0, 555]
    entries = [
        LogEntry(
            index=i + 1, term=1 + i // 5, data=bytes([1 + i]) * size, type=EntryType(1 + i % 3)
        )
        for i, size in enumerate(sizes * 4)
    ]
    path = tmp_path / "log"
    store = MmapLogStore.open(
        path, data_file_bytes=file_bytes, index_file_bytes=512, entry_bytes_max=4048
    )
    for start in range(0, len(entries), 6):
        store.append(entries[start : start + 6])
    store.close()
    data = b"".join(file.read_bytes() for file in sorted((path / "data").iterdir()))
    index = b"".join(file.read_bytes() for file in sorted((path / "index").iterdir()))
    position = 0
    blanks = 0
    for number, entry in enumerate(entries):
        size = entry_size(len(entry.data))
        file_end = position - position % file_bytes + file_bytes
        if position + size > file_end:
            if position < file_end:
                blanks += 1
                blank = struct.pack("<II", BLANK_MAGIC, file_end - position)
                assert data[position:file_end] == blank + bytes(file_end - position - 8)
            position = file_end
        assert data[position : position + size] == encode_entry(entry, position)
        slot = index[number * INDEX_SLOT_BYTES : (number + 1) * INDEX_SLOT_BYTES]
        assert slot == encode_index_slot(position, size, entry.index, entry.term)
        position += size
    assert data[position:] == bytes(len(data) - position)
    assert blanks > 3


@pytest.mark.parametrize(
    "lengths",
    [
        [0, 1, 7, 8, 9, 100, 4095],  # every size and padding from the tables
        [100, TABLE_LENGTH_MAX, 3],  # a length past the tables: sizes computed
        [5] * (SLOT_STRUCT_ENTRIES_MAX + 1),  # slots packed one by one
        [33] * 300,  # slots from one Struct for the batch
        [100] * 256,  # one length: sizes and positions from one size
        [100] * 255 + [101],  # all but one alike
        [4095],
    ],
)
def test_the_batch_encoder_matches_the_reference_codec(lengths: list[int]) -> None:
    entries = [
        LogEntry(
            index=50 + i, term=3 + i % 2, data=bytes([i % 251]) * length, type=EntryType(1 + i % 3)
        )
        for i, length in enumerate(lengths)
    ]
    start = 4096 + 8
    batch = encode(EntryColumns(entries), start, 1 << 40)
    [(position, [data])] = batch.pieces
    assert position == start
    expected_data = b""
    expected_slots = b""
    for entry in entries:
        encoded = encode_entry(entry, start + len(expected_data))
        expected_slots += encode_index_slot(
            start + len(expected_data), len(encoded), entry.index, entry.term
        )
        expected_data += encoded
    assert bytes(data) == expected_data
    assert bytes(batch.index_buffer) == expected_slots
    assert batch.data_end == start + len(expected_data)


def test_entry_columns_follow_only_a_contiguous_batch_within_bounds() -> None:
    entries = [LogEntry(index=i, term=1, data=b"x" * i) for i in range(5, 9)]
    assert EntryColumns(entries).follow(4, 8)
    assert not EntryColumns(entries).follow(3, 8)  # starts past the end
    assert not EntryColumns(entries).follow(4, 7)  # the last entry is too large
    assert not EntryColumns([*entries[:2], entries[3]]).follow(4, 8)  # a gap
    assert not EntryColumns([LogEntry(index=5, term=-1)]).follow(4, 8)


def test_entry_columns_follow_checks_batches_of_one_length_and_one_term_alike() -> None:
    """The one-length and one-term shortcuts decide as the general checks do."""
    alike = [LogEntry(index=i, term=2, data=b"x" * 8) for i in range(5, 9)]
    assert EntryColumns(alike).uniform
    assert EntryColumns(alike).follow(4, 8)
    assert not EntryColumns(alike).follow(4, 7)  # every entry is too large
    assert not EntryColumns([LogEntry(index=i, term=-1) for i in range(5, 9)]).follow(4, 8)
    mixed_terms = [LogEntry(index=5 + i, term=term) for i, term in enumerate([1, -1, 1])]
    assert not EntryColumns(mixed_terms).follow(4, 8)
    mixed_lengths = [LogEntry(index=i, term=1, data=b"x" * (i - 4)) for i in range(5, 9)]
    assert not EntryColumns(mixed_lengths).uniform
    assert EntryColumns(mixed_lengths).length_max == 4
    empty = EntryColumns([])
    assert (empty.uniform, empty.length_max, empty.follow(4, 8)) == (False, 0, True)
