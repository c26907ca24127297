"""The segment store's on-disk codec: entry headers, file names, the meta file."""

from __future__ import annotations

import struct

import google_crc32c
import pytest

from quorumlog.storage import EntryType, LogEntry
from quorumlog.storage.segment_format import (
    ENTRY_HEADER_BYTES,
    HeaderError,
    closed_segment_name,
    decode_entry,
    decode_header,
    decode_meta,
    encode_entries,
    encode_entry,
    encode_meta,
    open_segment_name,
    parse_segment_name,
)


def test_header_layout_is_the_documented_24_bytes() -> None:
    entry = LogEntry(index=7, term=0x0102030405060708, data=b"hello", type=EntryType.NO_OP)
    raw = encode_entry(entry)
    assert len(raw) == ENTRY_HEADER_BYTES + 5
    term, kind, checksum_type, reserved, length, data_crc, header_crc = struct.unpack_from(
        "<QBBHIII", raw
    )
    assert term == 0x0102030405060708
    assert kind == EntryType.NO_OP
    assert checksum_type == 1
    assert reserved == 0
    assert length == 5
    assert data_crc == google_crc32c.value(b"hello")
    assert header_crc == google_crc32c.value(raw[:20])
    assert raw[24:] == b"hello"


def test_encode_then_decode_round_trips_every_type() -> None:
    entries = [
        LogEntry(index=i, term=i * 3, data=bytes(range(i % 256)) * 3, type=kind)
        for i, kind in zip(range(1, 40), list(EntryType) * 13, strict=False)
    ]
    encoded, offsets, terms = encode_entries(entries)
    assert terms == [entry.term for entry in entries]
    ends = [*offsets[1:], len(encoded)]
    decoded = [
        decode_entry(entry.index, encoded[start:end])
        for entry, start, end in zip(entries, offsets, ends, strict=True)
    ]
    assert decoded == entries
    assert decode_header(encoded[:24]) == (entries[0].term, entries[0].type, len(entries[0].data))


def test_empty_batch_encodes_to_nothing() -> None:
    assert encode_entries([]) == (b"", [], [])


@pytest.mark.parametrize("bit", [0, 7, 64, 72, 80, 96, 128, 160, 191])
def test_any_header_bit_flip_is_detected(bit: int) -> None:
    raw = bytearray(encode_entry(LogEntry(index=1, term=5, data=b"payload")))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(HeaderError):
        decode_entry(1, bytes(raw))


def test_data_bit_flip_is_detected() -> None:
    raw = bytearray(encode_entry(LogEntry(index=1, term=5, data=b"payload")))
    raw[-1] ^= 0x10
    with pytest.raises(HeaderError, match="data checksum"):
        decode_entry(1, bytes(raw))


def test_length_mismatch_is_detected() -> None:
    raw = encode_entry(LogEntry(index=1, term=5, data=b"payload"))
    with pytest.raises(HeaderError):
        decode_entry(1, raw[:-1])
    with pytest.raises(HeaderError):
        decode_entry(1, raw[:10])


def test_segment_names_sort_in_index_order_and_parse_back() -> None:
    names = [closed_segment_name(9, 10), closed_segment_name(11, 200), open_segment_name(201)]
    assert [parse_segment_name(name) for name in names] == [(9, 10), (11, 200), (201, None)]
    assert sorted([closed_segment_name(100, 200), closed_segment_name(99, 99)])[0].startswith(
        "log_00000000000000000099"
    )
    assert len(open_segment_name(1)) == len("log_inprogress_") + 20
    assert parse_segment_name("log_meta") is None
    assert parse_segment_name("notes.txt") is None
    with pytest.raises(HeaderError):
        parse_segment_name("log_12-13")


def test_meta_round_trips_and_rejects_damage() -> None:
    raw = encode_meta(1234, reset_in_progress=False)
    assert decode_meta(raw) == (1234, False)
    assert decode_meta(encode_meta(5, reset_in_progress=True)) == (5, True)
    damaged = bytearray(raw)
    damaged[17] ^= 1
    with pytest.raises(HeaderError):
        decode_meta(bytes(damaged))
    with pytest.raises(HeaderError):
        decode_meta(raw[:-1])
