"""The previous release's managed-ledger writer, kept here (and only here) to make what it
left behind: format-1 records (ledger infos without an entry format or a record count)
and format-1 entries (one record each). The code is that release's `encode_batch` and
`encode_record`, so a test of the current reader reads the bytes users have on disk."""

from __future__ import annotations

import base64

import msgspec

from quorumlog.codec.wire import Record
from quorumlog.ledger.managed_format import ManagedLedgerRecord

_entry_encoder = msgspec.msgpack.Encoder()


class LedgerInfoV1(msgspec.Struct, frozen=True, array_like=True):
    """`ManagedLedgerInfo` as format 1 had it."""

    ledger_id: int
    first_offset: int
    closed: bool = False
    last_entry_id: int = -1
    data_bytes: int = 0
    closed_ms: int = 0


class RecordV1(msgspec.Struct, frozen=True, kw_only=True):
    """`ManagedLedgerRecord` as format 1 had it."""

    name: str
    version: int = 0
    owner_epoch: int = 0
    owner: str = ""
    start_offset: int = 0
    ledgers: list[LedgerInfoV1] = []


def encode_batch_v1(
    records: list[Record], producer_id: str, base_sequence: int, timestamp_ms: int
) -> list[bytes]:
    """One entry per record; records without a timestamp get `timestamp_ms`."""
    batch_count = len(records)
    encode = _entry_encoder.encode
    return [
        encode(
            (
                producer_id,
                base_sequence,
                index,
                batch_count,
                record.timestamp_ms or timestamp_ms,
                record.key,
                record.value,
                record.headers,
            )
        )
        for index, record in enumerate(records)
    ]


def encode_record_v1(record: RecordV1) -> str:
    data = b"QLML" + bytes([1]) + msgspec.msgpack.encode(record)
    return base64.b64encode(data).decode("ascii")


def as_current(record: RecordV1) -> ManagedLedgerRecord:
    """What the current reader should make of `record`."""
    return msgspec.convert(msgspec.to_builtins(record), ManagedLedgerRecord)
