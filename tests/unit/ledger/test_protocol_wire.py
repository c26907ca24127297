"""The bookie frames the protocol relies on, including the length that rides with the LAC."""

from __future__ import annotations

import msgspec

from quorumlog.codec.wire import (
    AddEntries,
    BookieStatus,
    LastAddConfirmedResult,
    LedgerEntryData,
    decode,
    encode,
)


def test_the_length_rides_with_the_lac_and_round_trips() -> None:
    add = AddEntries(7, 3, b"key", 41, [LedgerEntryData(42, b"x")], length=4096)
    assert decode(encode(add)) == add
    answer = LastAddConfirmedResult(7, 3, BookieStatus.OK, 41, 42, length=4096)
    assert decode(encode(answer)) == answer


def test_a_frame_without_the_length_decodes_as_not_known() -> None:
    """A bookie (or client) built before the field existed sends no length: -1."""
    without = {
        "type": "LastAddConfirmedResult",
        "request_id": 1,
        "ledger_id": 2,
        "status": "ok",
        "last_add_confirmed": 5,
        "last_entry_id": 6,
    }
    decoded = decode(msgspec.msgpack.encode(without))
    assert isinstance(decoded, LastAddConfirmedResult)
    assert (decoded.last_add_confirmed, decoded.length) == (5, -1)
