"""The managed ledger record and entry formats (ledger/managed_format.py): entry format 3
as written (with compressed batches), formats 2 and 1 as earlier releases left them
(tests/unit/ledger/managed_v1.py), and the in-memory store's compare-and-set."""

from __future__ import annotations

import base64
from collections import OrderedDict

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from quorumlog.codec.compression import compress
from quorumlog.codec.wire import Record
from quorumlog.errors import LedgerMetadataFormatError, ManagedLedgerConflictError
from quorumlog.ledger.managed_format import (
    ENTRY_FORMAT_V1,
    ENTRY_FORMAT_V2,
    ENTRY_FORMAT_V3,
    CompressedRecords,
    ManagedLedgerInfo,
    ManagedLedgerRecord,
    ManagedSlice,
    decode_producer_table,
    decode_record,
    decode_slice,
    encode_compressed_slice,
    encode_producer_table,
    encode_record,
    encode_slices,
    record_bytes,
)
from quorumlog.ledger.managed_store import InMemoryManagedLedgerStore
from quorumlog.ledger.metadata import InMemoryMetadataStore
from quorumlog.stream.partition import ProducerState
from quorumlog.testing.manual import ManualScheduler
from tests.unit.ledger.managed_v1 import (
    LedgerInfoV1,
    RecordV1,
    as_current,
    encode_batch_v1,
    encode_record_v1,
)


def two_ledgers() -> ManagedLedgerRecord:
    return ManagedLedgerRecord(
        name="t/0",
        version=3,
        owner_epoch=2,
        owner="n1",
        start_offset=10,
        ledgers=[
            ManagedLedgerInfo(4, 10, closed=True, last_entry_id=9, data_bytes=100),
            ManagedLedgerInfo(5, 20, closed=True, last_entry_id=2, entry_format=2, record_count=30),
            ManagedLedgerInfo(7, 50, entry_format=2),
        ],
    )


def test_a_record_round_trips_and_a_gap_or_newer_format_is_refused() -> None:
    record = two_ledgers()
    assert decode_record(encode_record(record)) == record
    assert [ledger.end_offset for ledger in record.ledgers] == [20, 50, 50]
    gap = ManagedLedgerRecord(
        name="t/0",
        start_offset=10,
        ledgers=[
            ManagedLedgerInfo(4, 10, closed=True, last_entry_id=9),
            ManagedLedgerInfo(7, 21),
        ],
    )
    with pytest.raises(LedgerMetadataFormatError, match="starts at 21"):
        decode_record(encode_record(gap))
    data = bytearray(base64.b64decode(encode_record(record)))
    assert data[4] == 2
    data[4] = 3
    with pytest.raises(LedgerMetadataFormatError, match=r"format 3 \(this version reads 1 and 2\)"):
        decode_record(base64.b64encode(bytes(data)).decode())
    with pytest.raises(LedgerMetadataFormatError):
        decode_record("not base64!")


def test_a_ledger_of_an_unknown_entry_format_or_fewer_records_than_entries_is_refused() -> None:
    unknown = ManagedLedgerRecord(name="t/0", ledgers=[ManagedLedgerInfo(4, 0, entry_format=9)])
    with pytest.raises(LedgerMetadataFormatError, match=r"entry format 9 \(this version reads"):
        decode_record(encode_record(unknown))
    short = ManagedLedgerRecord(
        name="t/0",
        ledgers=[
            ManagedLedgerInfo(4, 0, closed=True, last_entry_id=5, entry_format=2, record_count=3)
        ],
    )
    with pytest.raises(LedgerMetadataFormatError, match="fewer records than entries"):
        decode_record(encode_record(short))


def test_a_record_of_the_previous_release_reads_as_entry_format_1() -> None:
    old = RecordV1(
        name="t/0",
        version=4,
        owner_epoch=2,
        owner="n1",
        ledgers=[
            LedgerInfoV1(4, 0, closed=True, last_entry_id=9, data_bytes=100, closed_ms=7),
            LedgerInfoV1(6, 10),
        ],
    )
    record = decode_record(encode_record_v1(old))
    assert record == as_current(old)
    assert [ledger.entry_format for ledger in record.ledgers] == [ENTRY_FORMAT_V1] * 2
    assert record.ledgers[0].end_offset == 10


def test_a_batch_is_one_entry_naming_its_batch_and_offset() -> None:
    records = [Record(b"a"), Record(b"b", key=b"k", timestamp_ms=5, headers=[("h", b"v")])]
    datas, counts = encode_slices(records, "p", 7, 40, 1000)
    assert counts == [2]
    assert datas == [
        b"\x03" + msgspec.msgpack.encode(ManagedSlice("p", 7, 0, 2, 40, 1000, records))
    ]
    entry = decode_slice(datas[0], ENTRY_FORMAT_V3, -1)
    assert (entry.first_offset, entry.batch_base_offset, entry.end_offset) == (40, 40, 42)
    assert entry.ends_batch
    assert entry.stamped_records() == [Record(b"a", None, 1000), records[1]]
    assert entry.stamped_records(1) == [records[1]]


def test_garbage_an_unknown_entry_format_or_one_of_the_wrong_format_is_refused() -> None:
    data = encode_slices([Record(b"a")], "p", 0, 0, 1)[0][0]
    with pytest.raises(LedgerMetadataFormatError, match="not a managed ledger entry"):
        decode_slice(b"\x03\xff\x00garbage", ENTRY_FORMAT_V3, 0)
    with pytest.raises(LedgerMetadataFormatError, match="empty"):
        decode_slice(b"", ENTRY_FORMAT_V3, 0)
    with pytest.raises(
        LedgerMetadataFormatError, match=r"entry format 7 \(this version reads 1, 2 and 3\)"
    ):
        decode_slice(b"\x07" + data[1:], ENTRY_FORMAT_V3, 0)
    with pytest.raises(LedgerMetadataFormatError, match="format 3 in a ledger of format 1"):
        decode_slice(data, ENTRY_FORMAT_V1, 0)
    with pytest.raises(LedgerMetadataFormatError, match="format 3 in a ledger of format 2"):
        decode_slice(data, ENTRY_FORMAT_V2, 0)
    v1 = encode_batch_v1([Record(b"a")], "p", 0, 1)[0]
    with pytest.raises(LedgerMetadataFormatError, match="format 1 in a ledger of format 3"):
        decode_slice(v1, ENTRY_FORMAT_V3, 0)


def test_entries_of_format_2_still_read() -> None:
    """Entry format 2 as the release before compression wrote it: its own first byte, the
    slice's seven fields."""
    records = [Record(b"a"), Record(b"b", key=b"k", timestamp_ms=5)]
    data = b"\x02" + msgspec.msgpack.encode(("p", 7, 0, 2, 40, 1000, records))
    entry = decode_slice(data, ENTRY_FORMAT_V2, -1)
    assert entry == ManagedSlice("p", 7, 0, 2, 40, 1000, records)
    with pytest.raises(LedgerMetadataFormatError, match="format 2 in a ledger of format 3"):
        decode_slice(data, ENTRY_FORMAT_V3, -1)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_batch_is_one_entry_kept_as_sent_and_read_decompressed(codec: str) -> None:
    records = [Record(b"value-%d" % n, key=b"k", timestamp_ms=n % 2) for n in range(50)]
    payload = compress(codec, msgspec.msgpack.encode(records))
    data = encode_compressed_slice(CompressedRecords(codec, payload, 50), "p", 3, 100, 777)
    assert data[0] == ENTRY_FORMAT_V3
    assert payload in data, "the producer's compressed bytes, as they came"
    entry = decode_slice(data, ENTRY_FORMAT_V3, -1)
    assert (entry.first_offset, entry.batch_count, entry.end_offset) == (100, 50, 150)
    assert entry.ends_batch and entry.batch_base_offset == 100
    assert entry.records == records
    assert [record.timestamp_ms for record in entry.stamped_records(0, 3)] == [777, 1, 777]
    wrong_count = encode_compressed_slice(CompressedRecords(codec, payload, 49), "p", 3, 0, 1)
    with pytest.raises(LedgerMetadataFormatError, match="says 49 records and holds 50"):
        decode_slice(wrong_count, ENTRY_FORMAT_V3, -1)
    damaged = encode_compressed_slice(CompressedRecords(codec, b"not " + payload, 50), "p", 3, 0, 1)
    with pytest.raises(LedgerMetadataFormatError, match="does not decode"):
        decode_slice(damaged, ENTRY_FORMAT_V3, -1)


def test_entries_of_the_previous_release_read_as_one_record_slices() -> None:
    records = [Record(b"a"), Record(b"b", key=b"k", timestamp_ms=5, headers=[("h", b"v")])]
    entries = [
        decode_slice(data, ENTRY_FORMAT_V1, 30 + index)
        for index, data in enumerate(encode_batch_v1(records, "p", 7, 1000))
    ]
    assert [(entry.base_sequence, entry.batch_index, entry.ends_batch) for entry in entries] == [
        (7, 0, False),
        (7, 1, True),
    ]
    assert [entry.first_offset for entry in entries] == [30, 31]
    assert [entry.batch_base_offset for entry in entries] == [30, 30]
    assert [entry.stamped_records()[0] for entry in entries] == [
        Record(b"a", None, 1000),
        records[1],
    ]


record_strategy = st.builds(
    Record,
    st.binary(max_size=300),
    st.none() | st.binary(max_size=20),
    st.sampled_from([0, 5]),
    st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=8)), max_size=2),
)


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=40),
    records_max=st.integers(1, 8),
    bytes_max=st.integers(1, 2_000),
    first_offset=st.integers(0, 10**9),
)
def test_slices_cover_the_batch_in_order_within_their_bounds(
    records: list[Record], records_max: int, bytes_max: int, first_offset: int
) -> None:
    datas, counts = encode_slices(records, "p", 11, first_offset, 99, records_max, bytes_max)
    slices = [decode_slice(data, ENTRY_FORMAT_V3, -1) for data in datas]
    assert [len(entry.records) for entry in slices] == counts
    assert [record for entry in slices for record in entry.records] == records
    offset = first_offset
    for position, entry in enumerate(slices):
        assert (entry.producer_id, entry.base_sequence, entry.batch_count) == (
            "p",
            11,
            len(records),
        )
        assert entry.first_offset == offset
        assert entry.batch_base_offset == first_offset
        assert entry.ends_batch == (position == len(slices) - 1)
        assert 1 <= len(entry.records) <= records_max
        if len(entry.records) > 1:  # fits as encoded, or was cut by its records' sizes
            data = datas[position]
            assert len(data) <= bytes_max or sum(map(record_bytes, entry.records)) <= bytes_max
        offset = entry.end_offset
    # Within both bounds (with room for the entry's own header): never sliced; beyond the
    # count only, cut by count alone.
    if sum(map(record_bytes, records)) + 64 <= bytes_max:
        assert counts == [
            min(records_max, len(records) - start) for start in range(0, len(records), records_max)
        ]


def test_the_producer_table_copy_keeps_the_most_recently_active() -> None:
    table = OrderedDict(
        (f"p{number}", ProducerState(number, [(0, number, 0)])) for number in range(5)
    )
    copied = decode_producer_table(encode_producer_table(table, 2))
    assert list(copied) == ["p3", "p4"]
    assert copied["p4"].next_sequence == 4
    assert decode_producer_table(encode_producer_table(table, 0)) == OrderedDict()


def test_the_store_writes_a_record_only_over_the_version_it_expects() -> None:
    scheduler = ManualScheduler()
    store = InMemoryManagedLedgerStore(scheduler, InMemoryMetadataStore())
    record = two_ledgers()
    first = store.write_record(record, None)
    assert not first.done()  # answers come on a later turn, never inside the call
    scheduler.run_until_idle()
    assert first.result() == record
    again = store.write_record(record.updated(), None)
    stale = store.write_record(record.updated(), 2)
    fresh = store.write_record(record.updated(), 3)
    scheduler.run_until_idle()
    assert isinstance(again.exception(), ManagedLedgerConflictError)
    assert isinstance(stale.exception(), ManagedLedgerConflictError)
    assert fresh.result().version == 4
