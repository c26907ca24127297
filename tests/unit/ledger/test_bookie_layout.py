"""The entry index and the record layout, piece by piece."""

from __future__ import annotations

import random
import struct

import google_crc32c
import pytest

from quorumlog.ledger.bookie_format import (
    RECORD_HEADER_BYTES,
    RECORD_LAYOUTS,
    CheckpointItem,
    FormatError,
    RecordKind,
    check_body,
    decode_checkpoint,
    decode_entry_table,
    decode_file_header,
    decode_record_header,
    decode_stored_entry,
    decode_version_file,
    encode_checkpoint,
    encode_entries_record,
    encode_file_header,
    encode_record,
    encode_version_file,
    log_file_name,
    parse_log_file_name,
)
from quorumlog.ledger.bookie_index import CHUNK_ENTRIES, LedgerEntryIndex


def test_index_keeps_sparse_ids_and_scans_only_what_is_stored() -> None:
    index = LedgerEntryIndex()
    far = 10**15
    index.put_many([far], 3, 1000, [0], [7])
    index.put_many([0, 2, 5], 1, 100, [0, 30, 60], [10, 11, 12])
    index.put_many([CHUNK_ENTRIES + 1], 2, 0, [40], [13])  # a chunk between two others
    assert index.entry_count == 5
    assert index.last_entry_id == far
    stored = index.get(far)
    assert stored is not None
    assert (stored.file_number, stored.offset, stored.length) == (3, 1000, 7)
    assert index.get(1) is None and index.get(far - 1) is None
    assert [e.entry_id for e in index.scan(0, 2**62)] == [0, 2, 5, CHUNK_ENTRIES + 1, far]
    assert [e.entry_id for e in index.scan(1, 5)] == [2, 5]
    assert [e.entry_id for e in index.scan(6, CHUNK_ENTRIES)] == []
    assert index.chunk_numbers == sorted(index.chunks)


def test_index_overwrite_moves_the_entry_and_counts_it_once() -> None:
    index = LedgerEntryIndex()
    index.put_many([4], 1, 0, [100], [5])
    index.put_many([4], 2, 0, [200], [6])
    stored = index.get(4)
    assert stored is not None
    assert (stored.file_number, stored.offset, stored.length) == (2, 200, 6)
    assert index.entry_count == 1


def put_one_by_one(
    index: dict[int, tuple[int, int, int]],
    entry_ids: list[int],
    file_number: int,
    base_offset: int,
    offsets: list[int],
    lengths: list[int],
) -> None:
    """The index's meaning, spelled out: each id -> (file, offset, length), later wins."""
    for entry_id, offset, length in zip(entry_ids, offsets, lengths, strict=True):
        index[entry_id] = (file_number, base_offset + offset, length)


@pytest.mark.parametrize("seed", range(20))
def test_index_puts_of_frames_match_puts_one_by_one(seed: int) -> None:
    """Frames as bookies get them (striped shares of every E, Qw; whole frames; ids that
    cross chunks; re-writes of stored ids) and ids no frame has (gaps, out of order) give
    the index the same content as putting each entry on its own."""
    rng = random.Random(seed)
    index = LedgerEntryIndex()
    expected: dict[int, tuple[int, int, int]] = {}
    next_id = 0
    for frame in range(40):
        ensemble = rng.randint(1, 6)
        write_quorum = rng.randint(1, ensemble)
        position = rng.randrange(ensemble)
        first = next_id if rng.random() < 0.8 else rng.randrange(max(next_id, 1))
        span = rng.choice([1, 2, 7, 300, 1000])
        holds = {(position - k) % ensemble for k in range(write_quorum)}
        entry_ids = [i for i in range(first, first + span) if i % ensemble in holds]
        if rng.random() < 0.2:
            entry_ids = sorted(rng.sample(range(first, first + 3 * span), min(span, 50)))
        if rng.random() < 0.1:
            rng.shuffle(entry_ids)
        if not entry_ids:
            continue
        offsets = [rng.randrange(1, 1 << 31) for _ in entry_ids]
        lengths = [rng.randrange(0, 1 << 20) for _ in entry_ids]
        file_number = rng.randint(1, 9)
        index.put_many(entry_ids, file_number, frame * 7, offsets, lengths)
        put_one_by_one(expected, entry_ids, file_number, frame * 7, offsets, lengths)
        next_id = max(next_id, max(entry_ids) + 1)
    assert index.entry_count == len(expected)
    assert index.last_entry_id == max(expected)
    found = {
        stored.entry_id: (stored.file_number, stored.offset, stored.length)
        for stored in index.scan(0, 2**62)
    }
    assert found == expected


@pytest.mark.parametrize("entry_bytes", [0, 100, 256, 257, 4096])
def test_an_entries_record_body_is_each_header_then_its_data(entry_bytes: int) -> None:
    """Small and large entries are joined by different code: the bytes are the same."""
    entry_ids = [3, 4, 9, 10]
    datas = [bytes([entry_id]) * entry_bytes for entry_id in entry_ids]
    record, offsets, lengths = encode_entries_record(7, 2, entry_ids, datas)
    expected_body = b"".join(
        struct.pack("<QII", entry_id, len(data), google_crc32c.value(data)) + data
        for entry_id, data in zip(entry_ids, datas, strict=True)
    )
    assert record[RECORD_HEADER_BYTES:] == expected_body
    assert lengths == [entry_bytes] * 4
    assert offsets == [RECORD_HEADER_BYTES + k * (16 + entry_bytes) for k in range(4)]
    with pytest.raises(ValueError):
        encode_entries_record(7, 2, entry_ids[:3], datas)


def test_an_entries_record_round_trips() -> None:
    datas = [b"", b"a", b"bb" * 100]
    record, offsets, lengths = encode_entries_record(7, 41, [3, 4, 9], datas, 2**40 + 5)
    header = decode_record_header(record, 0)
    assert (header.kind, header.ledger_id, header.last_add_confirmed, header.count) == (
        RecordKind.ENTRIES,
        7,
        41,
        3,
    )
    assert header.length == 2**40 + 5
    body = record[RECORD_HEADER_BYTES:]
    check_body(header, body)
    entry_ids, body_offsets, body_lengths = decode_entry_table(body, 3)
    assert entry_ids == [3, 4, 9]
    assert [o + RECORD_HEADER_BYTES for o in body_offsets] == offsets
    assert body_lengths == lengths == [0, 1, 200]
    for entry_id, offset, data in zip(entry_ids, offsets, datas, strict=True):
        assert decode_stored_entry(record[offset : offset + 16 + len(data)], entry_id) == data


def test_every_flipped_byte_of_a_record_is_caught() -> None:
    record, _offsets, _lengths = encode_entries_record(7, 41, [3, 4], [b"xyz", b"uvw"])
    for position in range(len(record)):
        damaged = bytearray(record)
        damaged[position] ^= 0x01
        with pytest.raises(FormatError):
            header = decode_record_header(bytes(damaged), 0)
            check_body(header, bytes(damaged[RECORD_HEADER_BYTES:]))


def test_a_stored_entry_is_checked_on_the_way_back() -> None:
    record, offsets, _lengths = encode_entries_record(1, -1, [5], [b"hello"])
    raw = record[offsets[0] :]
    assert decode_stored_entry(raw, 5) == b"hello"
    with pytest.raises(FormatError, match="not 6"):
        decode_stored_entry(raw, 6)
    with pytest.raises(FormatError, match="checksum"):
        decode_stored_entry(raw[:-1] + b"?", 5)
    with pytest.raises(FormatError):
        decode_stored_entry(raw[:-1], 5)
    with pytest.raises(FormatError):
        decode_stored_entry(raw[:10], 5)


def test_a_checkpoint_round_trips() -> None:
    items = [
        CheckpointItem(1, -1, False, b""),
        CheckpointItem(2**62, 99, True, b"k" * 64, length=2**40 + 3),
        CheckpointItem(3, 7, False, b"k", length=-1),
    ]
    record = encode_checkpoint(items)
    header = decode_record_header(record, 0)
    assert header.kind == RecordKind.CHECKPOINT
    assert decode_checkpoint(record[RECORD_HEADER_BYTES:], header.count) == items
    with pytest.raises(FormatError):
        decode_checkpoint(record[RECORD_HEADER_BYTES:-1], header.count)


def test_file_headers_version_files_and_names() -> None:
    assert decode_file_header(encode_file_header(12)) == (2, 12)
    assert decode_file_header(encode_file_header(12, version=3)) == (3, 12)
    with pytest.raises(FormatError):
        decode_file_header(encode_file_header(12)[:-1] + b"\x00")
    assert decode_version_file(encode_version_file()) == 2
    with pytest.raises(FormatError):
        decode_version_file(b"QLBOOKIE" + bytes(8))
    assert parse_log_file_name(log_file_name(42)) == 42
    assert parse_log_file_name("entries_42.log") is None
    assert parse_log_file_name("VERSION") is None


def test_the_length_rides_in_the_record_header_and_below_minus_one_is_refused() -> None:
    """Version 2 keeps the ledger length beside the LAC; a length of -1 means not known."""
    record, _offsets, _lengths = encode_entries_record(1, 0, [0], [b"x"])
    assert decode_record_header(record, 0).length == -1
    assert RECORD_HEADER_BYTES == 48
    with pytest.raises(FormatError, match="below -1"):
        decode_record_header(encode_record(RecordKind.ENTRIES, 1, 0, 0, b"", length=-2), 0)
    with pytest.raises(FormatError, match="below -1"):
        decode_checkpoint(encode_checkpoint([CheckpointItem(1, 0, False, b"", -5)])[48:], 1)


def test_version_1_records_read_with_the_length_unknown() -> None:
    """The 40-byte version-1 header, packed here by hand from its documented layout."""
    layout = RECORD_LAYOUTS[1]
    body = b"key"
    prefix = struct.Struct("<IIB3xIQqI").pack(
        google_crc32c.value(body), len(body), RecordKind.MASTER_KEY, 0, 9, 17, 0
    )
    record = prefix + struct.pack("<I", google_crc32c.value(prefix)) + body
    header = decode_record_header(record, 0, layout)
    assert (header.kind, header.ledger_id, header.last_add_confirmed, header.length) == (
        RecordKind.MASTER_KEY,
        9,
        17,
        -1,
    )
    item = struct.Struct("<QqHH").pack(4, 12, 1, 2) + b"kk"
    assert decode_checkpoint(item, 1, layout) == [CheckpointItem(4, 12, True, b"kk", -1)]
