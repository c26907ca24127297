"""The managed ledger record and entry formats (ledger/managed_format.py) and the
in-memory store's compare-and-set."""

from __future__ import annotations

import base64
from collections import OrderedDict

import msgspec
import pytest

from quorumlog.codec.wire import Record
from quorumlog.errors import LedgerMetadataFormatError, ManagedLedgerConflictError
from quorumlog.ledger.managed_format import (
    ManagedEntry,
    ManagedLedgerInfo,
    ManagedLedgerRecord,
    decode_entry,
    decode_producer_table,
    decode_record,
    encode_batch,
    encode_producer_table,
    encode_record,
)
from quorumlog.ledger.managed_store import InMemoryManagedLedgerStore
from quorumlog.ledger.metadata import InMemoryMetadataStore
from quorumlog.stream.partition import ProducerState
from quorumlog.testing.manual import ManualScheduler


def two_ledgers() -> ManagedLedgerRecord:
    return ManagedLedgerRecord(
        name="t/0",
        version=3,
        owner_epoch=2,
        owner="n1",
        start_offset=10,
        ledgers=[
            ManagedLedgerInfo(4, 10, closed=True, last_entry_id=9, data_bytes=100),
            ManagedLedgerInfo(7, 20),
        ],
    )


def test_a_record_round_trips_and_a_gap_or_newer_format_is_refused() -> None:
    record = two_ledgers()
    assert decode_record(encode_record(record)) == record
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
    data[4] = 2
    with pytest.raises(LedgerMetadataFormatError, match="format 2"):
        decode_record(base64.b64encode(bytes(data)).decode())
    with pytest.raises(LedgerMetadataFormatError):
        decode_record("not base64!")


def test_entries_name_their_batch_and_garbage_is_refused() -> None:
    records = [Record(b"a"), Record(b"b", key=b"k", timestamp_ms=5)]
    entries = [decode_entry(data) for data in encode_batch(records, "p", 7, 1000)]
    assert [(entry.base_sequence, entry.batch_index, entry.ends_batch) for entry in entries] == [
        (7, 0, False),
        (7, 1, True),
    ]
    assert [entry.record() for entry in entries] == [Record(b"a", None, 1000), records[1]]
    with pytest.raises(LedgerMetadataFormatError):
        decode_entry(b"\xff\x00garbage")


def test_entries_are_encoded_as_the_entry_struct_is() -> None:
    """encode_batch builds tuples, not ManagedEntry structs: the bytes must be the same."""
    records = [Record(b"a"), Record(b"b", key=b"k", timestamp_ms=5, headers=[("h", b"v")])]
    assert encode_batch(records, "p", 7, 1000) == [
        msgspec.msgpack.encode(ManagedEntry("p", 7, 0, 2, 1000, None, b"a")),
        msgspec.msgpack.encode(ManagedEntry("p", 7, 1, 2, 5, b"k", b"b", [("h", b"v")])),
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
