"""Record batches read as columns straight from their bytes (spark/record_scan.py): whatever
the scanner accepts must decode to exactly what msgspec decodes, and whatever breaks the
one-layout rule must be refused (and still read right, record by record)."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.codec.compression import compress
from quorumlog.codec.wire import Record, RecordBatch, encode_record_batch
from quorumlog.spark.arrow import (
    ARROW_SCHEMA,
    RecordColumns,
    decode_entry,
    decode_stored_batch,
    entry_record_count,
)
from quorumlog.spark.record_scan import SCAN_RECORDS_MIN, RecordBlock, scan_entry

VALUE_LENGTHS = [0, 1, 100, 255, 256, 70_000]
"""Across the bin8 / bin16 / bin32 boundaries."""
TIMES_MS = [0, 5, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 1_700_000_000_123]
"""Across the fixint / u8 / u16 / u32 / u64 boundaries."""
COUNTS = [SCAN_RECORDS_MIN, 300]
"""Fewer than SCAN_RECORDS_MIN records are decoded record by record, never scanned."""


def uniform_batch(chooser: random.Random, count: int) -> RecordBatch:
    """Records of one layout: one value length, one key length (or none), one time width."""
    value_length = chooser.choice(VALUE_LENGTHS)
    key_length = chooser.choice([None, 0, 3])
    time_ms = chooser.choice(TIMES_MS)
    records = []
    for _ in range(count):
        key = None if key_length is None else chooser.randbytes(key_length)
        # Same width, different values: the low byte varies unless the time is a fixint.
        own_time = time_ms if time_ms < 128 else time_ms - chooser.randrange(min(time_ms, 100))
        if own_time.bit_length() != time_ms.bit_length():
            own_time = time_ms
        records.append(Record(chooser.randbytes(value_length), key, own_time))
    return RecordBatch("producer", chooser.randrange(2**40), 1_700_000_000_000, records)


def block_records(block: RecordBlock, append_time_ms: int) -> list[tuple[object, ...]]:
    keys = [None] * len(block) if block.keys is None else [bytes(row) for row in block.keys]
    times = [0] * len(block) if block.own_times_ms is None else block.own_times_ms.tolist()
    assert block.append_time_ms == append_time_ms
    return [
        (bytes(value), key, time_ms)
        for value, key, time_ms in zip(block.values, keys, times, strict=True)
    ]


@pytest.mark.parametrize("seed", range(12))
def test_a_scanned_batch_holds_what_msgspec_decodes(seed: int) -> None:
    chooser = random.Random(seed)
    for count in COUNTS:
        batch = uniform_batch(chooser, count)
        data = encode_record_batch(batch)
        block = scan_entry(data)
        assert block is not None, f"seed {seed}: a one-layout batch of {count} was refused"
        decoded = decode_stored_batch(data)
        expected = [(record.value, record.key, record.timestamp_ms) for record in decoded.records]
        assert block_records(block, decoded.timestamp_ms) == expected


def test_an_entry_of_more_than_65535_records_is_scanned_and_a_small_one_is_not() -> None:
    """The array32 header; and below SCAN_RECORDS_MIN the decode is cheaper than a scan."""
    records = [Record(bytes([number % 256]), None, 1_700_000_000_000) for number in range(70_000)]
    block = scan_entry(encode_record_batch(RecordBatch("p", 0, 7, records)))
    assert block is not None
    assert block_records(block, 7) == [(r.value, r.key, r.timestamp_ms) for r in records]
    small = encode_record_batch(RecordBatch("p", 0, 7, records[: SCAN_RECORDS_MIN - 1]))
    assert scan_entry(small) is None


def test_a_compressed_one_layout_batch_is_scanned_after_decompressing() -> None:
    records = [
        Record(bytes([number]) * 10, b"k", 1_700_000_000_000 + number) for number in range(50)
    ]
    payload = compress("zstd", msgspec.msgpack.encode(records))
    data = encode_record_batch(RecordBatch("p", 0, 7, [], "zstd", payload, len(records)))
    block = scan_entry(data)
    assert block is not None
    assert block_records(block, 7) == [(r.value, r.key, r.timestamp_ms) for r in records]


@pytest.mark.parametrize(
    "pattern",
    [
        [Record(b"aa"), Record(b"bbb")],  # value lengths differ
        [Record(b"aa"), Record(b"bb", b"k")],  # a key on some records only
        [Record(b"aa"), Record(b"bb", timestamp_ms=1_700_000_000_000)],  # a time on some
        [Record(b"aa", timestamp_ms=200), Record(b"bb", timestamp_ms=70_000)],  # widths differ
        [Record(b"aa", timestamp_ms=-5), Record(b"bb", timestamp_ms=-5)],  # negative times
        [Record(None), Record(None)],  # tombstones
        [Record(b"aa", headers=[("h", b"v")]), Record(b"bb", headers=[("h", b"v")])],
        # Same total size, different layouts: value 3 + key 1 against value 1 + key 3.
        [Record(b"vvv", b"k"), Record(b"v", b"kkk")],
    ],
)
def test_batches_of_mixed_layouts_are_refused_and_still_read_right(
    pattern: list[Record],
) -> None:
    records = pattern * (SCAN_RECORDS_MIN // len(pattern))  # enough to be worth a scan
    data = encode_record_batch(RecordBatch("p", 0, 1_700_000_000_000, records))
    assert scan_entry(data) is None
    entry = decode_entry(data)
    assert entry_record_count(entry) == len(records)
    columns = RecordColumns("t", 0)
    assert columns.add_batch(0, entry, 0, len(records), len(data)) == len(records)
    rows = columns.take().to_pylist()
    assert [(row["value"], row["key"]) for row in rows] == [(r.value, r.key) for r in records]


def test_scanned_and_decoded_entries_mix_in_one_arrow_batch_in_offset_order() -> None:
    """Runs of both kinds, sliced at the range's ends, with a retention gap: the columns
    must equal the record-by-record reference built from msgspec's decoding."""
    chooser = random.Random(99)
    scanned_columns = RecordColumns("t", 3)
    reference_columns = RecordColumns("t", 3)
    base_offset, start, end = 10, 17, 900
    kinds = []
    while base_offset < end:
        if chooser.random() < 0.5:
            batch = uniform_batch(chooser, chooser.choice(COUNTS))
        else:
            batch = RecordBatch("p", 0, 9, [Record(b"x" * chooser.randrange(5)) for _ in range(7)])
        data = encode_record_batch(batch)
        entry = decode_entry(data)
        kinds.append(isinstance(entry, RecordBlock))
        added = scanned_columns.add_batch(base_offset, entry, start, end, len(data))
        assert added == reference_columns.add_batch(
            base_offset, decode_stored_batch(data), start, end, len(data)
        )
        base_offset += len(batch.records) + chooser.choice([0, 0, 2])
    assert any(kinds) and not all(kinds)
    scanned = scanned_columns.take()
    assert scanned.schema.equals(ARROW_SCHEMA)
    assert scanned.to_pylist() == reference_columns.take().to_pylist()


def test_an_entry_of_another_layout_with_records_of_the_same_size_is_read_right() -> None:
    """The scanner keeps the layout of the entry it read last (`record_scan.last_layout`):
    the next entry's records of the same size but other fields (a key now, a shorter
    value) must not be read with it, whether its first record or only a later one
    differs."""
    no_key = [Record(b"v" * 100, None, 0) for _ in range(SCAN_RECORDS_MIN)]
    keyed = [Record(b"w" * 98, b"k", 0) for _ in range(SCAN_RECORDS_MIN)]
    late_keyed = [*no_key[:-1], Record(b"w" * 98, b"k", 0)]
    assert len(msgspec.msgpack.encode(no_key[0])) == len(msgspec.msgpack.encode(keyed[0]))
    for records in (no_key, keyed, no_key, late_keyed, no_key):
        data = encode_record_batch(RecordBatch("producer", 0, 1_700_000_000_000, records))
        decoded = decode_entry(data)
        assert (isinstance(decoded, RecordBlock)) == (records is not late_keyed)
        stored = decode_stored_batch(data)
        if isinstance(decoded, RecordBlock):
            expected = [(record.value, record.key, record.timestamp_ms) for record in records]
            assert block_records(decoded, stored.timestamp_ms) == expected
