"""What a managed ledger stores: its record in the metadata group, its entries, and the
producer table it hands from one ledger to the next.

- The record (`ManagedLedgerRecord`, key `__managed/<topic>/<partition>`) is the partition's
  ledger list: for each ledger its id, the offset of its entry 0, and once it is closed its
  last entry and data bytes. With it the start offset (retention moved it), the owner's
  epoch and a version that every change raises by one: every change is a compare-and-set.
- One ledger entry holds one record (`ManagedEntry`), so offset = first_offset + entry_id
  and a fetch needs no index. The entry names its producer batch (producer id, base
  sequence, position and count), so a new owner can rebuild the producer table from the
  entries it recovers, and can tell a batch that recovery found only part of (its writer
  was cut off before the batch was acknowledged) from a whole one.
- The producer table as it stood when a ledger was created rides in that ledger's metadata
  (property `PRODUCERS_PROPERTY`): a new owner starts from the last ledger's copy and
  replays only that ledger's entries, so the work of a takeover is bounded by one ledger.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict

import msgspec

from quorumlog.codec.wire import Record
from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.stream.partition import ProducerState

MANAGED_PREFIX = "__managed/"
RECORD_FORMAT_VERSION = 1
_RECORD_MAGIC = b"QLML"
PRODUCERS_PROPERTY = "managed.producers"
"""Ledger metadata property: the producer table before the ledger's first entry."""
TOPIC_PROPERTY = "managed.name"
"""Ledger metadata property: the managed ledger a ledger belongs to (finds orphans)."""


def managed_ledger_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def managed_ledger_key(name: str) -> str:
    """The metadata-group key of a managed ledger's record."""
    return MANAGED_PREFIX + name


class ManagedLedgerInfo(msgspec.Struct, frozen=True, array_like=True):
    """One ledger of a managed ledger's list."""

    ledger_id: int
    first_offset: int
    """The offset of the ledger's entry 0."""
    closed: bool = False
    last_entry_id: int = -1
    """The last entry that belongs to the managed ledger (closed ledgers only). It may be
    below the ledger's own last entry: the tail of a batch recovery found only part of is
    left out."""
    data_bytes: int = 0
    """Bytes of the ledger's entries (closed ledgers only; retention by bytes counts it)."""
    closed_ms: int = 0
    """Wall clock of the owner that closed the ledger (retention by age counts from it)."""

    @property
    def entry_count(self) -> int:
        return self.last_entry_id + 1 if self.closed else 0

    @property
    def end_offset(self) -> int:
        """One past the ledger's last offset (closed ledgers)."""
        return self.first_offset + self.entry_count


class ManagedLedgerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A managed ledger's list of ledgers, as the metadata group keeps it."""

    name: str
    version: int = 0
    """Raised by one at every change; a change is stored only over the version it read."""
    owner_epoch: int = 0
    """Raised by each owner that takes the managed ledger over."""
    owner: str = ""
    start_offset: int = 0
    """The first offset still retained (retention drops whole ledgers)."""
    ledgers: list[ManagedLedgerInfo] = []

    def updated(self, **changes: object) -> ManagedLedgerRecord:
        return msgspec.structs.replace(self, version=self.version + 1, **changes)


def check_record(record: ManagedLedgerRecord) -> None:
    """LedgerMetadataFormatError unless the ledger list is contiguous and well formed."""
    problem = record_problem(record)
    if problem is not None:
        raise LedgerMetadataFormatError(f"managed ledger {record.name}: {problem}")


def record_problem(record: ManagedLedgerRecord) -> str | None:
    if record.version < 0 or record.owner_epoch < 0:
        return "negative version or epoch"
    offset = record.ledgers[0].first_offset if record.ledgers else record.start_offset
    if record.ledgers and offset != record.start_offset:
        return "the first ledger does not start at the start offset"
    for position, ledger in enumerate(record.ledgers):
        if ledger.first_offset != offset:
            return f"ledger {ledger.ledger_id} starts at {ledger.first_offset}, not {offset}"
        if not ledger.closed and position != len(record.ledgers) - 1:
            return f"ledger {ledger.ledger_id} is open but not last"
        if ledger.closed and (ledger.last_entry_id < -1 or ledger.data_bytes < 0):
            return f"ledger {ledger.ledger_id} has a negative size"
        offset = ledger.end_offset
    return None


_record_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(ManagedLedgerRecord)


def encode_record(record: ManagedLedgerRecord) -> str:
    """Text for the metadata group's KV (base64 of magic, format version, msgpack)."""
    data = _RECORD_MAGIC + bytes([RECORD_FORMAT_VERSION]) + _record_encoder.encode(record)
    return base64.b64encode(data).decode("ascii")


def decode_record(value: str) -> ManagedLedgerRecord:
    """LedgerMetadataFormatError for anything this version cannot read (a newer format is
    refused, never misread)."""
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise LedgerMetadataFormatError(f"managed ledger record is not base64: {error}") from error
    header_size = len(_RECORD_MAGIC) + 1
    if len(data) < header_size or data[: len(_RECORD_MAGIC)] != _RECORD_MAGIC:
        raise LedgerMetadataFormatError("not a managed ledger record (bad magic)")
    if data[len(_RECORD_MAGIC)] != RECORD_FORMAT_VERSION:
        raise LedgerMetadataFormatError(
            f"managed ledger record format {data[len(_RECORD_MAGIC)]} (this version reads "
            f"{RECORD_FORMAT_VERSION})"
        )
    try:
        record: ManagedLedgerRecord = _record_decoder.decode(data[header_size:])
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"bad managed ledger record: {error}") from error
    check_record(record)
    return record


# --- entries -------------------------------------------------------------------------------


class ManagedEntry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One record as a ledger entry holds it."""

    producer_id: str
    base_sequence: int
    """The base sequence of the batch the record came in."""
    batch_index: int
    """The record's position in its batch (its sequence is base_sequence + batch_index)."""
    batch_count: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = []

    @property
    def ends_batch(self) -> bool:
        return self.batch_index == self.batch_count - 1

    def record(self) -> Record:
        return Record(self.value, self.key, self.timestamp_ms, self.headers)


_entry_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(ManagedEntry)


def encode_batch(
    records: list[Record], producer_id: str, base_sequence: int, timestamp_ms: int
) -> list[bytes]:
    """One entry per record; records without a timestamp get `timestamp_ms`.

    Each entry is encoded from a plain tuple in `ManagedEntry`'s field order: an array-like
    struct and a tuple encode to the same msgpack array, and building the tuple costs less
    than building the struct (this runs once per record produced)."""
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


def decode_entry(data: bytes) -> ManagedEntry:
    """LedgerMetadataFormatError for bytes that are not a managed entry."""
    try:
        return _entry_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"not a managed ledger entry: {error}") from error


# --- the producer table --------------------------------------------------------------------

ProducerTable = OrderedDict[str, ProducerState]
"""Producer id -> its next sequence and last batches, least recently active first (the
table `stream.partition.admit_batch` decides against)."""

_table_encoder = msgspec.msgpack.Encoder()
_table_decoder = msgspec.msgpack.Decoder(list[tuple[str, ProducerState]])


def encode_producer_table(table: ProducerTable, producers_max: int) -> str:
    """The `producers_max` most recently active producers, as text for a ledger property."""
    newest = list(table.items())[-producers_max:] if producers_max > 0 else []
    return base64.b64encode(_table_encoder.encode(newest)).decode("ascii")


def decode_producer_table(value: str) -> ProducerTable:
    try:
        items = _table_decoder.decode(base64.b64decode(value.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeEncodeError, msgspec.DecodeError, msgspec.ValidationError):
        raise LedgerMetadataFormatError("bad producer table in ledger metadata") from None
    return OrderedDict(items)


def replay_batch(
    table: ProducerTable,
    producer_id: str,
    base_sequence: int,
    count: int,
    base_offset: int,
    producers_max: int,
    recent_max: int,
) -> None:
    """Record a batch found in the log, as its admission did when it was written."""
    state = table.get(producer_id)
    if state is None:
        state = ProducerState()
        table[producer_id] = state
        while len(table) > producers_max:
            table.popitem(last=False)
    else:
        table.move_to_end(producer_id)
    state.next_sequence = base_sequence + count
    state.recent.append((base_sequence, count, base_offset))
    del state.recent[:-recent_max]
