"""What a managed ledger stores: its record in the metadata group, its entries, and the
producer table it hands from one ledger to the next.

- The record (`ManagedLedgerRecord`, key `__managed/<topic>/<partition>`) is the partition's
  ledger list: for each ledger its id, the offset of its entry 0, its entry format, and
  once it is closed its last entry, record count and data bytes. With it the start offset
  (retention moved it), the owner's epoch and a version that every change raises by one:
  every change is a compare-and-set. Record format 2 added the entry format and the record
  count to each ledger; a format-1 record still reads (its ledgers are all entry format 1).
- Entry format 2 (`ManagedSlice`, the release before compression): one ledger entry holds one
  producer batch, or a slice of at most `SLICE_RECORDS_MAX` records / about
  `SLICE_BYTES_MAX` bytes of a larger one, so a batch costs one bookie add, not one per
  record. The entry names its batch (producer id, base sequence, the slice's position and
  the batch's count) and its first offset, so a new owner rebuilds the producer table from
  the entries it recovers, can tell a batch that recovery found only part of (its writer
  was cut off before all its slices were acknowledged) from a whole one, and a reader maps
  an offset to its entry (managed_index.py). The bytes start with the format number.
- Entry format 3 (what this version writes): format 2's layout with two trailing fields,
  the codec and the compressed bytes of a batch a producer compressed (`codec.compression`).
  A compressed batch is one entry holding the producer's bytes as they came (the owner
  does not re-encode them): its `records` are empty, `batch_count` says how many it holds,
  and a reader decompresses. It may hold more than `SLICE_RECORDS_MAX` records (a read of
  one of them decompresses them all). A compressed batch larger than a slice
  (`SLICE_BYTES_MAX`) is decompressed by the owner and written as plain slices, so an
  entry stays within the bound. An uncompressed batch is encoded exactly as in format 2
  (the trailing fields left out) but for its first byte. A ledger's format is in the
  record: a ledger of format 2 holds only format-2 entries, one of format 3 only format 3.
- Entry format 1 (`ManagedEntry`, the previous release): one record per entry, so offset =
  first_offset + entry_id. Ledgers written so still read; nothing writes them any more.
  Ledgers of entry format 2 (the release before compression) still read likewise.
- The producer table as it stood when a ledger was created rides in that ledger's metadata
  (property `PRODUCERS_PROPERTY`): a new owner starts from the last ledger's copy and
  replays only that ledger's entries, so the work of a takeover is bounded by one ledger.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict

import msgspec

from quorumlog.codec.compression import NONE, CompressionError, decompress
from quorumlog.codec.wire import Record
from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.stream.partition import ProducerState

MANAGED_PREFIX = "__managed/"
RECORD_FORMAT_VERSION = 2
"""The record format this version writes."""
RECORD_FORMATS_READ = (1, 2)
ENTRY_FORMAT_V1 = 1
"""One record per ledger entry (`ManagedEntry`): read, never written."""
ENTRY_FORMAT_V2 = 2
"""One producer batch (or a slice of one) per ledger entry (`ManagedSlice`): read, never
written any more."""
ENTRY_FORMAT_V3 = 3
"""Format 2, and a compressed batch as one entry (`CompressedSlice`): written."""
ENTRY_FORMAT_WRITTEN = ENTRY_FORMAT_V3
ENTRY_FORMATS_READ = (ENTRY_FORMAT_V1, ENTRY_FORMAT_V2, ENTRY_FORMAT_V3)
SLICE_RECORDS_MAX = 4096
"""Records one entry of a plain batch holds at most (a larger batch is sliced; a compressed
batch within `SLICE_BYTES_MAX` is kept whole, whatever its count)."""
SLICE_BYTES_MAX = 1024 * 1024
"""Bytes one entry holds at most, about: a piece of a batch whose encoding is larger is cut
again by its records' sizes (`record_bytes`); a single record is never cut (the writer
takes entries up to its `entry_bytes_max`, 4 MiB)."""
_RECORD_MAGIC = b"QLML"
PRODUCERS_PROPERTY = "managed.producers"
"""Ledger metadata property: the producer table before the ledger's first entry."""
TOPIC_PROPERTY = "managed.name"
"""Ledger metadata property: the managed ledger a ledger belongs to (finds orphans)."""
EPOCH_PROPERTY = "managed.epoch"
"""Ledger metadata property: the owner epoch of the record that its creator's
compare-and-set would store with it (decimal). Once the record holds a higher epoch that
write can never succeed, so a ledger the record does not list is an orphan for good."""


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
    entry_format: int = ENTRY_FORMAT_V1
    """How the ledger's entries hold records (a record of format 1 has no field: 1)."""
    record_count: int = 0
    """Records in entries 0..last_entry_id (closed ledgers of entry format 2)."""

    @property
    def entry_count(self) -> int:
        return self.last_entry_id + 1 if self.closed else 0

    @property
    def end_offset(self) -> int:
        """One past the ledger's last offset (closed ledgers)."""
        if self.entry_format == ENTRY_FORMAT_V1:
            return self.first_offset + self.entry_count
        return self.first_offset + (self.record_count if self.closed else 0)


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
        if ledger.entry_format not in ENTRY_FORMATS_READ:
            return f"ledger {ledger.ledger_id}: {entry_format_refusal(ledger.entry_format)}"
        if ledger.entry_format == ENTRY_FORMAT_V2 and ledger.closed:
            # Every entry holds at least one record.
            if ledger.record_count < ledger.entry_count:
                return f"ledger {ledger.ledger_id} has fewer records than entries"
            if ledger.entry_count == 0 and ledger.record_count != 0:
                return f"ledger {ledger.ledger_id} has records but no entries"
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
    if data[len(_RECORD_MAGIC)] not in RECORD_FORMATS_READ:
        raise LedgerMetadataFormatError(
            f"managed ledger record format {data[len(_RECORD_MAGIC)]} (this version reads "
            f"{' and '.join(map(str, RECORD_FORMATS_READ))})"
        )
    try:
        record: ManagedLedgerRecord = _record_decoder.decode(data[header_size:])
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"bad managed ledger record: {error}") from error
    check_record(record)
    return record


# --- entries -------------------------------------------------------------------------------


class ManagedEntry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Entry format 1: one record as a ledger entry holds it (the previous release's)."""

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


class ManagedSlice(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Entry format 2: a producer batch, or a slice of one, as a ledger entry holds it."""

    producer_id: str
    base_sequence: int
    """The base sequence of the whole batch."""
    batch_index: int
    """The position in its batch of the slice's first record."""
    batch_count: int
    """Records in the whole batch."""
    first_offset: int
    """The offset of the slice's first record."""
    timestamp_ms: int
    """The owner's clock when it appended the batch: the time of records sent without one."""
    records: list[Record]

    @property
    def ends_batch(self) -> bool:
        return self.batch_index + len(self.records) == self.batch_count

    @property
    def batch_base_offset(self) -> int:
        return self.first_offset - self.batch_index

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.records)

    def stamped_records(self, begin: int = 0, stop: int | None = None) -> list[Record]:
        """Records begin..stop - 1, those sent without a timestamp given the owner's."""
        timestamp_ms = self.timestamp_ms
        return [
            record
            if record.timestamp_ms
            else Record(record.value, record.key, timestamp_ms, record.headers)
            for record in self.records[begin:stop]
        ]


class CompressedSlice(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Entry format 3: `ManagedSlice`'s fields, then a compressed batch's codec and bytes
    (absent for an uncompressed slice, which then reads as format 2's)."""

    producer_id: str
    base_sequence: int
    batch_index: int
    batch_count: int
    first_offset: int
    timestamp_ms: int
    records: list[Record]
    compression: str = NONE
    compressed: bytes = b""


class CompressedRecords(msgspec.Struct, frozen=True):
    """A producer's compressed batch as the owner appends it: the codec, its bytes (the
    msgpack list of the records, compressed) and how many records they hold (checked by
    the node when the batch came in, `node.compressed_batches`)."""

    codec: str
    data: bytes
    count: int


_WRITTEN_PREFIX = bytes([ENTRY_FORMAT_WRITTEN])
_entry_encoder = msgspec.msgpack.Encoder()
_v1_entry_decoder = msgspec.msgpack.Decoder(ManagedEntry)
_slice_decoder = msgspec.msgpack.Decoder(ManagedSlice)
_v3_slice_decoder = msgspec.msgpack.Decoder(CompressedSlice)
_records_decoder = msgspec.msgpack.Decoder(list[Record])
_RECORD_OVERHEAD_BYTES = 16
"""What `record_bytes` adds for a record's framing (array header, timestamp, lengths)."""


def record_bytes(record: Record) -> int:
    """About what `record` takes in an entry (what slicing counts against its bound)."""
    size = len(record.value or b"") + _RECORD_OVERHEAD_BYTES
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers:
        size += len(name) + len(value)
    return size


def slices_by_bytes(
    records: list[Record], start: int, stop: int, bytes_max: int
) -> list[tuple[int, int]]:
    """records[start:stop] cut into runs of at most `bytes_max` bytes (`record_bytes`),
    a record alone in a run if it is larger."""
    runs: list[tuple[int, int]] = []
    run_start = start
    size = 0
    for index in range(start, stop):
        record_size = record_bytes(records[index])
        if index > run_start and size + record_size > bytes_max:
            runs.append((run_start, index))
            run_start, size = index, 0
        size += record_size
    runs.append((run_start, stop))
    return runs


def encode_slices(
    records: list[Record],
    producer_id: str,
    base_sequence: int,
    first_offset: int,
    timestamp_ms: int,
    records_max: int = SLICE_RECORDS_MAX,
    bytes_max: int = SLICE_BYTES_MAX,
) -> tuple[list[bytes], list[int]]:
    """A batch as entries of the format written (3): their bytes and the records each holds.

    The batch is cut by count (`records_max`) and each piece encoded at once; only a piece
    whose bytes exceed `bytes_max` is cut again by its records' sizes. Batches as producers
    send them (up to 16,384 records and 1 MiB) so cost no work per record here. Each entry
    is encoded from a plain tuple in `ManagedSlice`'s field order (an array-like struct and
    a tuple encode to the same msgpack array, and the tuple costs less to build)."""
    batch_count = len(records)
    encode = _entry_encoder.encode

    def encoded(start: int, stop: int) -> bytes:
        piece = records if start == 0 and stop == batch_count else records[start:stop]
        return _WRITTEN_PREFIX + encode(
            (
                producer_id,
                base_sequence,
                start,
                batch_count,
                first_offset + start,
                timestamp_ms,
                piece,
            )
        )

    datas: list[bytes] = []
    counts: list[int] = []
    for start in range(0, batch_count, records_max):
        stop = min(start + records_max, batch_count)
        data = encoded(start, stop)
        if len(data) <= bytes_max or stop - start == 1:
            datas.append(data)
            counts.append(stop - start)
            continue
        for run_start, run_stop in slices_by_bytes(records, start, stop, bytes_max):
            datas.append(encoded(run_start, run_stop))
            counts.append(run_stop - run_start)
    return datas, counts


def encode_compressed_slice(
    compressed: CompressedRecords,
    producer_id: str,
    base_sequence: int,
    first_offset: int,
    timestamp_ms: int,
) -> bytes:
    """A compressed batch as one format-3 entry, its bytes as the producer sent them."""
    return _WRITTEN_PREFIX + _entry_encoder.encode(
        (
            producer_id,
            base_sequence,
            0,
            compressed.count,
            first_offset,
            timestamp_ms,
            (),
            compressed.codec,
            compressed.data,
        )
    )


def decompressed_records(compressed: CompressedRecords) -> list[Record]:
    """The records of a compressed batch; LedgerMetadataFormatError if its bytes do not
    decompress into `count` records."""
    try:
        records = _records_decoder.decode(decompress(compressed.codec, compressed.data))
    except (CompressionError, msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"a compressed batch does not decode: {error}") from error
    if len(records) != compressed.count:
        raise LedgerMetadataFormatError(
            f"a compressed batch says {compressed.count} records and holds {len(records)}"
        )
    return records


def entry_format_refusal(entry_format: int) -> str:
    *earlier, last = map(str, ENTRY_FORMATS_READ)
    readable = f"{', '.join(earlier)} and {last}"
    return f"managed ledger entry format {entry_format} (this version reads {readable})"


def decode_slice(data: bytes, entry_format: int, v1_offset: int) -> ManagedSlice:
    """A ledger entry as a slice of its batch, in either format. `entry_format` is the
    ledger's (from the record); the entry's own first byte must agree. A format-1 entry
    holds no offset: it is `v1_offset` (the ledger's first offset + the entry id).
    LedgerMetadataFormatError for bytes that are not a managed entry of that format."""
    if not data:
        raise LedgerMetadataFormatError("an empty managed ledger entry")
    found = ENTRY_FORMAT_V1 if 0x90 <= data[0] <= 0x9F else data[0]  # v1: a msgpack array
    if found not in ENTRY_FORMATS_READ:
        raise LedgerMetadataFormatError(entry_format_refusal(found))
    if found != entry_format:
        raise LedgerMetadataFormatError(
            f"a managed ledger entry of format {found} in a ledger of format {entry_format}"
        )
    try:
        if found == ENTRY_FORMAT_V3:
            return slice_of_v3(_v3_slice_decoder.decode(memoryview(data)[1:]))
        if found == ENTRY_FORMAT_V2:
            decoded: ManagedSlice = _slice_decoder.decode(memoryview(data)[1:])
            return decoded
        entry: ManagedEntry = _v1_entry_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"not a managed ledger entry: {error}") from error
    record = Record(entry.value, entry.key, entry.timestamp_ms, entry.headers)
    return ManagedSlice(
        entry.producer_id,
        entry.base_sequence,
        entry.batch_index,
        entry.batch_count,
        v1_offset,
        entry.timestamp_ms,
        [record],
    )


def slice_of_v3(entry: CompressedSlice) -> ManagedSlice:
    """A format-3 entry as the slice it holds, its records decompressed."""
    records = entry.records
    if entry.compression != NONE:
        if records or entry.batch_index != 0:
            raise LedgerMetadataFormatError(
                "a compressed managed ledger entry holds plain records or a part of a batch"
            )
        whole = CompressedRecords(entry.compression, entry.compressed, entry.batch_count)
        records = decompressed_records(whole)
    return ManagedSlice(
        entry.producer_id,
        entry.base_sequence,
        entry.batch_index,
        entry.batch_count,
        entry.first_offset,
        entry.timestamp_ms,
        records,
    )


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
