"""A managed ledger: one stream partition stored as a list of ledgers (Pulsar's managed
ledger over reference 001's ledgers).

One node owns the partition and drives this object on its scheduler; nothing here does
I/O or reads a clock except through the scheduler, the `LedgerDriver` and the
`ManagedLedgerStore`, so the simulator runs it as shipped.

Open (taking ownership). Read the record (managed_format.py). If its last ledger is not
CLOSED, recover it: that fences the previous owner, whose next append fails. Read the last
ledger's entries back to rebuild the producer table (from the copy the ledger's metadata
holds, plus its own batches) and to find its last whole batch: the tail of a batch that
recovery found only part of was never acknowledged, and is left out of the list so a retry
writes it whole. Create a new ledger on writable bookies and store the new list with one
compare-and-set that also raises the owner epoch. A conflict means someone else changed
the list first: the open fails with NotPartitionOwnerError (the host asks the ownership
service again and retries if it still owns the partition).

Appends. A batch is decided against the producer table (`admit_batch`, shared with Raft
partitions: a duplicate gets its original offsets, a gap OutOfOrderSequenceError), then
becomes one entry of the current ledger (entry format 3; a batch beyond the slice bounds
becomes several; a compressed batch is one entry, as it came, unless it is larger than a
slice), and the open ledger's `EntryIndex` (managed_index.py) records where
each entry starts. Batches complete in order once every entry of theirs is acknowledged;
`end_offset` moves a whole batch at a time and is as far as reads go. Ledgers written by
the previous release (entry format 1, a record per entry) are read, and a takeover
replays one as it replays its own; so are those of format 2; new ledgers are always
format 3.

While a new ledger is being opened (at open, at a rollover) appends wait in a queue,
undecided, and are decided in arrival order once it is ready: the producer table copied
into a ledger's metadata then holds exactly the batches of the ledgers before it.

Reads map an offset to its entry through the ledger's index (whole for the ledgers this
owner wrote or replayed, learned by probing for older ones) and return records from the
offset asked, not from the start of its batch, as Raft partitions do.

Rollover by records, bytes or age: close the current ledger (once its appends are all
acknowledged), create the next one, store the list. Retention (`trim`) drops whole closed
ledgers from the front, stores the list, then deletes them. Every change of the record
goes through one queue, one compare-and-set at a time, each built from the record the
previous one stored. Losing the ledger (fenced) or the record (a conflict) stops the
managed ledger for good with NotPartitionOwnerError.
"""

from __future__ import annotations

import enum
import random as random_module
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from quorumlog.codec.wire import LedgerEntryData, Record
from quorumlog.errors import (
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    LedgerMetadataFormatError,
    LedgerPendingFullError,
    ManagedLedgerConflictError,
    NotPartitionOwnerError,
    QuorumLogError,
)
from quorumlog.ledger.driver import DriverWriter, LedgerDriver
from quorumlog.ledger.managed_format import (
    ENTRY_FORMAT_WRITTEN,
    EPOCH_PROPERTY,
    PRODUCERS_PROPERTY,
    SLICE_BYTES_MAX,
    SLICE_RECORDS_MAX,
    TOPIC_PROPERTY,
    CompressedRecords,
    ManagedLedgerInfo,
    ManagedLedgerRecord,
    ManagedSlice,
    ProducerTable,
    decode_producer_table,
    decode_slice,
    decompressed_records,
    encode_compressed_slice,
    encode_producer_table,
    encode_slices,
    replay_batch,
)
from quorumlog.ledger.managed_index import ClosedIndexes, EntryIndex
from quorumlog.ledger.managed_store import ManagedLedgerStore
from quorumlog.ledger.metadata import (
    LedgerMetadata,
    LedgerState,
    check_password,
    master_key,
    new_ledger_metadata,
)
from quorumlog.ledger.placement import choose_ensemble
from quorumlog.raft.invariants import InvariantViolation, require
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Timer
from quorumlog.stream.partition import (
    PRODUCER_COUNT_MAX_DEFAULT,
    RECENT_BATCHES_PER_PRODUCER,
    OffsetOutOfRangeError,
    ProduceOutcome,
    admit_batch,
)

ValueType = TypeVar("ValueType")

PROBES_MAX = 64
"""Probes one read makes at most to find an offset's entry (a ledger of 2**31 entries
needs 62 by midpoints): more means the entries contradict the record."""


class ManagedLedgerConfig(msgspec.Struct, frozen=True, kw_only=True):
    ensemble_size: int = 3
    write_quorum_size: int = 2
    ack_quorum_size: int = 2
    password: bytes = b""
    rollover_records_max: int = 50_000
    """A ledger with this many records is closed and the next one opened. It also bounds
    what a new owner reads back at a takeover (the last ledger, whole)."""
    rollover_bytes_max: int = 256 * 1024 * 1024
    rollover_age_seconds: float = 4 * 3600.0
    """A ledger with entries that has been open this long is rolled over."""
    retention_bytes: int = -1
    """Keep at least this many bytes of closed ledgers; -1: unbounded."""
    retention_ms: int = -1
    """Drop closed ledgers closed longer ago than this; -1: unbounded."""
    pending_entries_max: int = 100_000
    """Records appended (queued or in flight) and not yet acknowledged before appends fail
    with LedgerPendingFullError. Must stay within the writer's own pending bound, so a
    batch the table admitted is never refused by the writer."""
    read_records_max: int = 10_000
    """Records one read returns at most."""
    producer_count_max: int = PRODUCER_COUNT_MAX_DEFAULT
    snapshot_producers_max: int = 10_000
    """Producers (most recently active first) copied into a new ledger's metadata."""
    slice_records_max: int = SLICE_RECORDS_MAX
    """Records one entry holds at most: a larger batch is written as several entries."""
    slice_bytes_max: int = SLICE_BYTES_MAX
    """Record bytes one entry holds at most (unless it holds one record)."""

    def validate(self) -> None:
        if not 1 <= self.ack_quorum_size <= self.write_quorum_size <= self.ensemble_size:
            raise ValueError("sizes must satisfy 1 <= ack quorum <= write quorum <= ensemble")
        for name in (
            "rollover_records_max",
            "rollover_bytes_max",
            "pending_entries_max",
            "read_records_max",
            "producer_count_max",
            "slice_records_max",
            "slice_bytes_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.rollover_age_seconds <= 0:
            raise ValueError("rollover_age_seconds must be > 0")
        if self.retention_bytes < -1 or self.retention_ms < -1:
            raise ValueError("retention_bytes and retention_ms must be >= -1")
        if self.snapshot_producers_max < 0:
            raise ValueError("snapshot_producers_max must be >= 0")


class ManagedState(enum.Enum):
    NEW = "new"
    OPENING = "opening"
    WRITABLE = "writable"
    ROLLING = "rolling"
    """Closing the current ledger and opening the next; appends wait."""
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(slots=True)
class QueuedAppend:
    records: list[Record]
    producer_id: str
    base_sequence: int
    completion: Completion[ProduceOutcome]
    compressed: CompressedRecords | None = None
    """Set (and `records` empty) for a batch that came compressed."""
    timestamp_ms: int | None = None
    """The owner's stamp given at append; None: its clock when the batch is written."""

    @property
    def count(self) -> int:
        return len(self.records) if self.compressed is None else self.compressed.count


@dataclass(slots=True)
class InflightBatch:
    last_entry_id: int
    outcome: ProduceOutcome
    completion: Completion[ProduceOutcome]


RecordChange = Callable[[ManagedLedgerRecord], ManagedLedgerRecord]


def chain(
    completion: Completion[ValueType],
    on_value: Callable[[ValueType], None],
    on_error: Callable[[BaseException], None],
) -> None:
    """Continue with `on_value(result)`, or `on_error(error)` if `completion` failed or
    `on_value` refused what it got with a typed error (a wrong password, bytes that are
    not a managed entry): those end the step, never the scheduler's loop."""

    def done(finished: Completion[ValueType]) -> None:
        error = finished.exception()
        if error is not None:
            on_error(error)
            return
        try:
            on_value(finished.result())
        except QuorumLogError as refused:
            on_error(refused)

    completion.add_done_callback(done)


class ManagedLedger:
    def __init__(
        self,
        name: str,
        owner: str,
        driver: LedgerDriver,
        store: ManagedLedgerStore,
        config: ManagedLedgerConfig | None = None,
        *,
        random: random_module.Random | None = None,
    ) -> None:
        self.name = name
        self.owner = owner
        self.driver = driver
        self.scheduler = driver.scheduler
        self.store = store
        self.config = config or ManagedLedgerConfig()
        self.config.validate()
        if self.config.pending_entries_max > driver.config.pending_entries_max:
            raise ValueError("pending_entries_max must not exceed the writer's")
        self.random = random or driver.random
        self.master_key = master_key(self.config.password)
        self.state = ManagedState.NEW
        self.failure: LedgerError | None = None
        self.record: ManagedLedgerRecord | None = None
        """The record as this owner last stored (or read) it."""
        self.producers: ProducerTable = ProducerTable()
        self.writer: DriverWriter | None = None
        self.ledger_first_offset = 0
        """The offset of the current ledger's entry 0."""
        self.ledger_data_bytes = 0
        self.next_offset = 0
        """Where the next admitted batch goes."""
        self.acknowledged_offset = 0
        """One past the last record of the last acknowledged batch (`end_offset`)."""
        self.queued: deque[QueuedAppend] = deque()
        self.inflight: deque[InflightBatch] = deque()
        self.waiting_duplicates: list[tuple[int, ProduceOutcome, Completion[ProduceOutcome]]] = []
        """Retries of batches still in flight: answered once the original is acknowledged."""
        self.pending_records = 0
        self.changes: deque[tuple[RecordChange, Completion[ManagedLedgerRecord]]] = deque()
        self.change_running = False
        self.age_timer: Timer | None = None
        self.open_completion: Completion[None] = Completion(self.scheduler)
        self.close_completion: Completion[None] | None = None
        self.metadata_cache: dict[int, LedgerMetadata] = {}
        """Closed ledgers' metadata, for reads."""
        self.ledger_index = EntryIndex(0)
        """Where each entry of the open ledger starts (every one: the owner wrote them)."""
        self.closed_indexes = ClosedIndexes()
        self.entry_kept: tuple[int, int, ManagedSlice] | None = None
        """(ledger id, entry id, its records): the last entry a read took only the start
        of. A consumer reading fewer records than an entry holds asks for the rest next:
        served from here, each entry is read from the bookies and decoded once."""

    # --- views ---------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return 0 if self.record is None else self.record.start_offset

    @property
    def end_offset(self) -> int:
        """One past the last acknowledged record: as far as reads go."""
        return self.acknowledged_offset

    @property
    def ledger_ids(self) -> list[int]:
        return [] if self.record is None else [ledger.ledger_id for ledger in self.record.ledgers]

    # --- open ----------------------------------------------------------------------------

    def open(self) -> Completion[None]:
        """Take the partition over (see the module docstring); completes once appends are
        written, or fails (NotPartitionOwnerError when another owner changed the list)."""
        if self.state is ManagedState.NEW:
            self.state = ManagedState.OPENING
            chain(self.store.read_record(self.name), self.record_read, self.fail)
        return self.open_completion

    def record_read(self, record: ManagedLedgerRecord | None) -> None:
        if self.state is not ManagedState.OPENING:
            return
        self.record = record
        if record is None or not record.ledgers:
            start = 0 if record is None else record.start_offset
            self.next_offset = self.acknowledged_offset = start
            self.start_next_ledger(take_over=True)
            return
        last = record.ledgers[-1]
        chain(self.store.read_ledger(last.ledger_id), self.last_ledger_read, self.fail)

    def last_ledger_read(self, metadata: LedgerMetadata) -> None:
        if self.state is not ManagedState.OPENING:
            return
        key = check_password(metadata, self.config.password)
        if metadata.state is LedgerState.CLOSED:
            self.last_ledger_closed(metadata)
        else:
            chain(self.driver.recover(metadata, key), self.last_ledger_closed, self.fail)

    def last_ledger_closed(self, metadata: LedgerMetadata) -> None:
        """The last ledger is closed (by us now, or before): read it back."""
        if self.state is not ManagedState.OPENING:
            return
        self.metadata_cache[metadata.ledger_id] = metadata
        self.producers = producer_table_of(metadata)
        if metadata.last_entry_id < 0:
            self.last_ledger_replayed(metadata, [])
            return
        read = self.driver.read(metadata, 0, metadata.last_entry_id, metadata.last_entry_id)
        chain(read, lambda entries: self.last_ledger_replayed(metadata, entries), self.fail)

    def last_ledger_replayed(
        self, metadata: LedgerMetadata, entries: list[LedgerEntryData]
    ) -> None:
        if self.state is not ManagedState.OPENING:
            return
        record = present(self.record, "replayed without a ledger list")
        require(bool(record.ledgers), "replayed an empty ledger list")
        last = record.ledgers[-1]
        known_last = last.last_entry_id if last.closed else None
        index = self.replay(last, entries, known_last)
        closed = ManagedLedgerInfo(
            last.ledger_id,
            last.first_offset,
            closed=True,
            last_entry_id=index.entry_count - 1,
            data_bytes=metadata.length,
            closed_ms=last.closed_ms if last.closed else self.scheduler.wall_time_ms(),
            entry_format=last.entry_format,
            record_count=index.end_offset - last.first_offset,
        )
        if last.closed and last.end_offset != index.end_offset:
            raise LedgerMetadataFormatError(
                f"ledger {last.ledger_id} ends at offset {index.end_offset}, "
                f"its record says {last.end_offset}"
            )
        self.closed_indexes.remember(last.ledger_id, index)
        self.next_offset = self.acknowledged_offset = closed.end_offset
        self.start_next_ledger(take_over=True, closed=closed)

    def replay(
        self, ledger: ManagedLedgerInfo, entries: list[LedgerEntryData], known_last: int | None
    ) -> EntryIndex:
        """Rebuild the producer table from a ledger's entries (either format); its index up
        to the last entry of its last whole batch (or to `known_last`, when the list already
        says where it ends). LedgerMetadataFormatError if an entry is not where the offsets
        before it put it."""
        config = self.config
        index = EntryIndex(ledger.first_offset)
        whole_entries = 0
        for entry in entries:
            if known_last is not None and entry.entry_id > known_last:
                break
            require(entry.entry_id == index.entry_count, "replayed entries out of order")
            managed = decode_slice(entry.data, ledger.entry_format, index.end_offset)
            if managed.first_offset != index.end_offset or not managed.records:
                raise LedgerMetadataFormatError(
                    f"ledger {ledger.ledger_id} entry {entry.entry_id} starts at offset "
                    f"{managed.first_offset}, not {index.end_offset}"
                )
            index.append((len(managed.records),))
            if managed.ends_batch:
                replay_batch(
                    self.producers,
                    managed.producer_id,
                    managed.base_sequence,
                    managed.batch_count,
                    managed.batch_base_offset,
                    config.producer_count_max,
                    RECENT_BATCHES_PER_PRODUCER,
                )
                whole_entries = index.entry_count
        if known_last is None:
            index.truncate(whole_entries)  # the tail of a batch found only in part
        else:
            require(index.entry_count == known_last + 1, "a closed ledger read back short")
        return index

    # --- the next ledger -----------------------------------------------------------------

    def start_next_ledger(
        self, *, take_over: bool = False, closed: ManagedLedgerInfo | None = None
    ) -> None:
        """Create the next ledger and store the list with it (and `closed` in place of the
        previous last ledger); then write to it."""
        chain(
            self.store.writable_bookies(),
            lambda bookies: self.create_ledger(bookies, take_over, closed),
            self.fail,
        )

    def create_ledger(
        self, bookies: list[str], take_over: bool, closed: ManagedLedgerInfo | None
    ) -> None:
        if self.state not in (ManagedState.OPENING, ManagedState.ROLLING):
            return
        config = self.config
        try:
            ensemble = choose_ensemble(bookies, config.ensemble_size, self.random)
        except LedgerError as error:
            self.fail(error)
            return
        properties = {
            TOPIC_PROPERTY: self.name,
            EPOCH_PROPERTY: str(self.epoch_written(take_over)),
            PRODUCERS_PROPERTY: encode_producer_table(
                self.producers, config.snapshot_producers_max
            ),
        }
        metadata = new_ledger_metadata(
            ensemble=ensemble,
            write_quorum_size=config.write_quorum_size,
            ack_quorum_size=config.ack_quorum_size,
            password=config.password,
            properties=properties,
        )
        chain(
            self.store.create_ledger(metadata),
            lambda created: self.add_ledger(created, take_over, closed),
            self.fail,
        )

    def epoch_written(self, take_over: bool) -> int:
        """The owner epoch the record will hold if the change adding the next ledger is
        stored (as `add_ledger` computes it: this owner's changes never move the epoch
        but the take-over's own)."""
        epoch = 0 if self.record is None else self.record.owner_epoch
        return epoch + 1 if take_over else epoch

    def add_ledger(
        self, created: LedgerMetadata, take_over: bool, closed: ManagedLedgerInfo | None
    ) -> None:
        first_offset = self.next_offset
        owner = self.owner

        def change(record: ManagedLedgerRecord) -> ManagedLedgerRecord:
            ledgers = list(record.ledgers)
            if closed is not None:
                require(ledgers[-1].ledger_id == closed.ledger_id, "closed a ledger not last")
                ledgers[-1] = closed
                if closed.entry_count == 0:
                    ledgers.pop()  # an empty ledger holds no offsets: keep the list short
            ledgers.append(
                ManagedLedgerInfo(
                    created.ledger_id, first_offset, entry_format=ENTRY_FORMAT_WRITTEN
                )
            )
            epoch = record.owner_epoch + 1 if take_over else record.owner_epoch
            # The sweep trusts the ledger's epoch property (managed_format.EPOCH_PROPERTY).
            stamped = created.properties.get(EPOCH_PROPERTY)
            require(stamped == str(epoch), "a ledger stamped with another owner epoch")
            return record.updated(ledgers=ledgers, owner_epoch=epoch, owner=owner)

        def stored(record: ManagedLedgerRecord) -> None:
            if closed is not None and closed.entry_count == 0:
                self.store.delete_ledger(closed.ledger_id)
            self.begin_writing(created, first_offset)

        def refused(error: BaseException) -> None:
            if isinstance(error, NotPartitionOwnerError):
                # The record changed under us: certainly not listed, never used.
                self.store.delete_ledger(created.ledger_id)
            # Otherwise the record may yet list it (an unknown outcome): the next owner finds
            # it there, or the sweep collects it as an orphan of an earlier owner epoch.
            self.fail(error)

        chain(self.change_record(change), stored, refused)

    def begin_writing(self, metadata: LedgerMetadata, first_offset: int) -> None:
        if self.state not in (ManagedState.OPENING, ManagedState.ROLLING):
            return
        self.ledger_first_offset = first_offset
        self.ledger_data_bytes = 0
        self.ledger_index = EntryIndex(first_offset)
        writer: DriverWriter | None = None

        def acknowledged(last_add_confirmed: int) -> None:
            if writer is self.writer:
                self.acknowledge(last_add_confirmed)

        def failed(error: LedgerError) -> None:
            if writer is self.writer:
                self.writer_failed(error)

        writer = self.driver.start_writer(metadata, self.master_key, acknowledged, failed)
        self.writer = writer
        self.arm_age_timer()
        opening = self.state is ManagedState.OPENING
        self.state = ManagedState.WRITABLE
        if opening:
            self.open_completion.set_result(None)
        self.drain_queue()
        if self.close_completion is not None:
            self.begin_close()

    def drain_queue(self) -> None:
        while self.queued and self.state is ManagedState.WRITABLE:
            self.write(self.queued.popleft())

    # --- appends -------------------------------------------------------------------------

    def append(
        self,
        records: list[Record],
        producer_id: str,
        base_sequence: int,
        compressed: CompressedRecords | None = None,
        timestamp_ms: int | None = None,
    ) -> Completion[ProduceOutcome]:
        """Append one producer batch (`records`, or with `records` empty the `compressed`
        batch); completes with its offsets once it is acknowledged (a duplicate with the
        original's), in order. `timestamp_ms`: the stamp its records sent without one get
        (default: the scheduler's wall clock when the batch is written). Fails with
        OutOfOrderSequenceError, LedgerPendingFullError, NotPartitionOwnerError,
        LedgerClosedError; LedgerMetadataFormatError for a compressed batch that does not
        decompress (the node checks every batch before, so only a bug gets it)."""
        if compressed is not None and len(compressed.data) > self.config.slice_bytes_max:
            # Kept whole it would pass the entry bound: written as plain slices instead.
            try:
                records = decompressed_records(compressed)
            except LedgerMetadataFormatError as problem:
                return Completion.failed(self.scheduler, problem)
            compressed = None
        queued = QueuedAppend(
            records,
            producer_id,
            base_sequence,
            Completion(self.scheduler),
            compressed,
            timestamp_ms,
        )
        count = queued.count
        if count < 1 or (compressed is not None and records):
            raise ValueError("a batch needs at least one record, plain or compressed")
        if self.failure is not None:
            return Completion.failed(self.scheduler, self.failure)
        if self.close_completion is not None or self.state is ManagedState.CLOSED:
            return Completion.failed(self.scheduler, LedgerClosedError(f"{self.name} is closed"))
        if self.pending_records + count > self.config.pending_entries_max:
            error = LedgerPendingFullError(f"{self.name}: {self.pending_records} records pending")
            return Completion.failed(self.scheduler, error)
        self.pending_records += count
        if self.state is ManagedState.WRITABLE:
            self.write(queued)
        else:
            self.queued.append(queued)
        return queued.completion

    def write(self, queued: QueuedAppend) -> None:
        count = queued.count
        outcome = admit_batch(
            self.producers,
            queued.producer_id,
            queued.base_sequence,
            count,
            self.next_offset,
            self.config.producer_count_max,
        )
        if isinstance(outcome, QuorumLogError):
            self.pending_records -= count
            queued.completion.set_exception(outcome)
            return
        if outcome.duplicate:
            self.answer_duplicate(outcome, queued.completion)
            return
        writer = present(self.writer, "writing without a writer")
        require(outcome.base_offset == self.next_offset, "a batch admitted elsewhere")
        datas, counts = self.entries_of(queued, outcome.base_offset)
        try:
            first_entry_id = writer.append_many(datas)
        except LedgerError as error:
            # The table already counts this batch: only a new owner's rebuild is right now.
            self.fail(error)
            queued.completion.set_exception(self.failure or error)
            return
        index = self.ledger_index
        require(first_entry_id == index.entry_count, "the writer's entry ids left the index")
        index.append(counts)
        self.next_offset += count
        require(index.end_offset == self.next_offset, "the index lost a record")
        self.ledger_data_bytes += sum(map(len, datas))
        last_entry_id = first_entry_id + len(datas) - 1
        self.inflight.append(InflightBatch(last_entry_id, outcome, queued.completion))
        config = self.config
        if (
            self.next_offset - self.ledger_first_offset >= config.rollover_records_max
            or self.ledger_data_bytes >= config.rollover_bytes_max
        ):
            self.roll_over()

    def entries_of(self, queued: QueuedAppend, base_offset: int) -> tuple[list[bytes], list[int]]:
        """The batch's entries and the records each holds: a compressed batch as one entry
        (`append` made one too large for that plain), a plain batch as slices."""
        config = self.config
        timestamp_ms = queued.timestamp_ms
        if timestamp_ms is None:
            timestamp_ms = self.scheduler.wall_time_ms()
        compressed = queued.compressed
        if compressed is not None:
            data = encode_compressed_slice(
                compressed, queued.producer_id, queued.base_sequence, base_offset, timestamp_ms
            )
            return [data], [compressed.count]
        return encode_slices(
            queued.records,
            queued.producer_id,
            queued.base_sequence,
            base_offset,
            timestamp_ms,
            config.slice_records_max,
            config.slice_bytes_max,
        )

    def answer_duplicate(
        self, outcome: ProduceOutcome, completion: Completion[ProduceOutcome]
    ) -> None:
        self.pending_records -= outcome.count
        end = outcome.base_offset + outcome.count
        if outcome.base_offset < 0 or end <= self.acknowledged_offset:
            completion.set_result(outcome)
        else:
            self.waiting_duplicates.append((end, outcome, completion))

    def acknowledge(self, last_add_confirmed: int) -> None:
        inflight = self.inflight
        while inflight and inflight[0].last_entry_id <= last_add_confirmed:
            batch = inflight.popleft()
            outcome = batch.outcome
            require(outcome.base_offset == self.acknowledged_offset, "acknowledged out of order")
            self.acknowledged_offset = outcome.base_offset + outcome.count
            self.pending_records -= outcome.count
            batch.completion.set_result(outcome)
        if self.waiting_duplicates:
            waiting = self.waiting_duplicates
            self.waiting_duplicates = []
            for end, outcome, completion in waiting:
                if end <= self.acknowledged_offset:
                    completion.set_result(outcome)
                else:
                    self.waiting_duplicates.append((end, outcome, completion))

    def writer_failed(self, error: LedgerError) -> None:
        if isinstance(error, LedgerFencedError):
            self.fail(NotPartitionOwnerError(f"{self.name}: ledger fenced by a new owner"))
        else:
            self.fail(error)

    # --- rollover ------------------------------------------------------------------------

    def arm_age_timer(self) -> None:
        if self.age_timer is not None:
            self.age_timer.cancel()
        self.age_timer = self.scheduler.call_later(self.config.rollover_age_seconds, self.aged)

    def aged(self) -> None:
        self.age_timer = None
        if self.state is not ManagedState.WRITABLE:
            return
        if self.next_offset > self.ledger_first_offset:
            self.roll_over()
        else:
            self.arm_age_timer()  # an empty ledger is not worth replacing

    def roll_over(self) -> None:
        """Close the current ledger and open the next (appends wait meanwhile)."""
        writer = present(self.writer, "rolling over without a writer")
        self.state = ManagedState.ROLLING
        if self.age_timer is not None:
            self.age_timer.cancel()
            self.age_timer = None
        chain(writer.close(), self.rolled_ledger_closed, self.fail_from_writer)

    def rolled_ledger_closed(self, metadata: LedgerMetadata) -> None:
        if self.state is not ManagedState.ROLLING:
            return
        closed = self.closed_info(metadata)
        self.metadata_cache[metadata.ledger_id] = metadata
        self.start_next_ledger(closed=closed)

    def closed_info(self, metadata: LedgerMetadata) -> ManagedLedgerInfo:
        """The ledger just closed, as the list records it; its index joins the closed
        ones (whole: this owner wrote every entry)."""
        index = self.ledger_index
        require(
            metadata.last_entry_id + 1 == index.entry_count
            and index.end_offset == self.acknowledged_offset,
            "a ledger closed short of its acknowledged batches",
        )
        self.closed_indexes.remember(metadata.ledger_id, index)
        return ManagedLedgerInfo(
            metadata.ledger_id,
            self.ledger_first_offset,
            closed=True,
            last_entry_id=metadata.last_entry_id,
            data_bytes=metadata.length,
            closed_ms=self.scheduler.wall_time_ms(),
            entry_format=ENTRY_FORMAT_WRITTEN,
            record_count=self.acknowledged_offset - self.ledger_first_offset,
        )

    def fail_from_writer(self, error: BaseException) -> None:
        if isinstance(error, LedgerFencedError):
            self.writer_failed(error)
        else:
            self.fail(error)

    # --- the record ----------------------------------------------------------------------

    def change_record(self, change: RecordChange) -> Completion[ManagedLedgerRecord]:
        """Store `change(current record)` once the changes queued before it are stored."""
        completion: Completion[ManagedLedgerRecord] = Completion(self.scheduler)
        self.changes.append((change, completion))
        self.next_change()
        return completion

    def next_change(self) -> None:
        if self.change_running or not self.changes:
            return
        change, completion = self.changes.popleft()
        current = self.record or ManagedLedgerRecord(name=self.name)
        expected = None if self.record is None else self.record.version
        try:
            wanted = change(current)
        except QuorumLogError as error:
            completion.set_exception(error)
            self.next_change()
            return
        if wanted is current:
            completion.set_result(current)
            self.next_change()
            return
        self.change_running = True

        def stored(record: ManagedLedgerRecord) -> None:
            self.change_running = False
            require(self.record is None or record.version > self.record.version, "record went back")
            self.record = record
            completion.set_result(record)
            self.next_change()

        def refused(error: BaseException) -> None:
            self.change_running = False
            if isinstance(error, ManagedLedgerConflictError):
                error = NotPartitionOwnerError(f"{self.name}: the ledger list changed: {error}")
            completion.set_exception(error)
            self.next_change()

        chain(self.store.write_record(wanted, expected), stored, refused)

    # --- retention -----------------------------------------------------------------------

    def trim(self) -> Completion[list[int]]:
        """Drop whole closed ledgers from the front as retention allows; completes with
        the ids dropped (their deletion follows, best effort)."""
        if self.failure is not None:
            return Completion.failed(self.scheduler, self.failure)
        if self.record is None:
            return Completion.failed(
                self.scheduler, NotPartitionOwnerError(f"{self.name}: not open")
            )
        dropped: list[int] = []
        now_ms = self.scheduler.wall_time_ms()
        config = self.config

        def change(record: ManagedLedgerRecord) -> ManagedLedgerRecord:
            keep = retained_ledgers(record.ledgers, self.ledger_data_bytes, now_ms, config)
            dropped.extend(
                ledger.ledger_id for ledger in record.ledgers[: len(record.ledgers) - len(keep)]
            )
            if not dropped:
                return record  # the same record: nothing is stored
            return record.updated(ledgers=keep, start_offset=keep[0].first_offset)

        result: Completion[list[int]] = Completion(self.scheduler)

        def stored(record: ManagedLedgerRecord) -> None:
            for ledger_id in dropped:
                self.metadata_cache.pop(ledger_id, None)
                self.closed_indexes.drop(ledger_id)
                if self.entry_kept is not None and self.entry_kept[0] == ledger_id:
                    self.entry_kept = None
                self.store.delete_ledger(ledger_id)
            result.set_result(list(dropped))

        def refused(error: BaseException) -> None:
            self.fail(error)
            result.set_exception(self.failure or error)

        chain(self.change_record(change), stored, refused)
        return result

    # --- reads ---------------------------------------------------------------------------

    def read(self, offset: int, records_max: int) -> Completion[list[tuple[int, Record]]]:
        """Records from `offset` (at most `records_max`, and `read_records_max`), across
        ledger boundaries; OffsetOutOfRangeError outside [start_offset, end_offset]."""
        if self.failure is not None:
            return Completion.failed(self.scheduler, self.failure)
        start, end = self.start_offset, self.end_offset
        if self.record is None or not start <= offset <= end:
            error = OffsetOutOfRangeError(
                f"offset {offset} is outside [{start}, {end}]", start, end
            )
            return Completion.failed(self.scheduler, error)
        last_offset = min(end, offset + min(records_max, self.config.read_records_max)) - 1
        result: Completion[list[tuple[int, Record]]] = Completion(self.scheduler)
        self.read_from(offset, last_offset, [], result)
        return result

    def read_from(
        self,
        offset: int,
        last_offset: int,
        found: list[tuple[int, Record]],
        result: Completion[list[tuple[int, Record]]],
        probes: int = 0,
    ) -> None:
        """Read offset..last_offset one run of entries at a time, adding to `found`: the
        entries from the one holding `offset` to the one the index says (or guesses) holds
        the last offset wanted; a run that falls short goes on from where it stopped. An
        entry the index cannot place yet is probed first (`probes` so far)."""
        if offset > last_offset:
            result.set_result(found)
            return
        located = self.locate(offset)
        if located is None:
            result.set_exception(
                OffsetOutOfRangeError(
                    f"offset {offset} is no longer retained", self.start_offset, self.end_offset
                )
            )
            return
        ledger, index, readable_end = located
        last = min(last_offset, readable_end - 1)
        first_entry = index.entry_of(offset)
        if first_entry is None:
            if probes >= PROBES_MAX:
                result.set_exception(
                    LedgerMetadataFormatError(
                        f"ledger {ledger.ledger_id}: offset {offset} not found in {probes} probes"
                    )
                )
                return
            probe = index.probe(offset, by_midpoint=probes % 2 == 1)

            def probed(entries: list[LedgerEntryData]) -> None:
                learn_run(ledger, index, entries)
                self.read_from(offset, last_offset, found, result, probes + 1)

            self.read_entries(ledger, probe, probe, readable_end, probed, result)
            return
        kept = self.entry_kept
        if kept is not None and kept[:2] == (ledger.ledger_id, first_entry):
            take_records(kept[2], offset, last, found)
            self.read_from(min(kept[2].end_offset, last + 1), last_offset, found, result)
            return
        last_entry = max(first_entry, index.last_entry_for(last))

        def entries_read(entries: list[LedgerEntryData]) -> None:
            slices = learn_run(ledger, index, entries)
            for managed in slices:
                take_records(managed, offset, last, found)
            if slices[-1].end_offset > last + 1:
                self.entry_kept = (ledger.ledger_id, entries[-1].entry_id, slices[-1])
            next_offset = min(slices[-1].end_offset, last + 1)
            self.read_from(next_offset, last_offset, found, result)

        self.read_entries(ledger, first_entry, last_entry, readable_end, entries_read, result)

    def read_entries(
        self,
        ledger: ManagedLedgerInfo,
        first_entry: int,
        last_entry: int,
        readable_end: int,
        on_entries: Callable[[list[LedgerEntryData]], None],
        result: Completion[list[tuple[int, Record]]],
    ) -> None:
        """Read entries first_entry..last_entry of `ledger` from its bookies."""

        def metadata_known(metadata: LedgerMetadata, lac: int) -> None:
            read = self.driver.read(metadata, first_entry, min(last_entry, lac), lac)
            chain(read, on_entries, result.set_exception)

        writer = self.writer
        if writer is not None and writer.ledger_id == ledger.ledger_id:
            acknowledged_entry = present(
                self.ledger_index.entry_of(readable_end - 1), "the open ledger's index has a gap"
            )
            metadata_known(writer.metadata, acknowledged_entry)
        elif ledger.ledger_id in self.metadata_cache:
            metadata_known(self.metadata_cache[ledger.ledger_id], ledger.last_entry_id)
        else:

            def remember(metadata: LedgerMetadata) -> None:
                self.metadata_cache[metadata.ledger_id] = metadata
                metadata_known(metadata, ledger.last_entry_id)

            chain(self.store.read_ledger(ledger.ledger_id), remember, result.set_exception)

    def locate(self, offset: int) -> tuple[ManagedLedgerInfo, EntryIndex, int] | None:
        """The ledger holding `offset`, its entry index and one past its last readable
        offset."""
        record = self.record
        if record is None:
            return None
        for ledger in record.ledgers:
            if ledger.closed:
                if ledger.first_offset <= offset < ledger.end_offset:
                    return ledger, self.closed_indexes.of(ledger), ledger.end_offset
            elif ledger.first_offset <= offset < self.acknowledged_offset:
                require(self.ledger_first_offset == ledger.first_offset, "not the open ledger")
                return ledger, self.ledger_index, self.acknowledged_offset
        return None

    # --- close and failure ---------------------------------------------------------------

    def close(self) -> Completion[None]:
        """Close the current ledger once its appends are acknowledged and record it
        closed; a later owner then needs no recovery."""
        if self.close_completion is None:
            self.close_completion = Completion(self.scheduler)
            if self.failure is not None:
                self.close_completion.set_exception(self.failure)
            elif self.state is ManagedState.NEW:
                self.state = ManagedState.CLOSED
                self.close_completion.set_result(None)
            elif self.state is ManagedState.WRITABLE:
                self.begin_close()
            # OPENING or ROLLING: `begin_writing` closes once the next ledger is ready.
        return self.close_completion

    def begin_close(self) -> None:
        writer = present(self.writer, "closing without a writer")
        self.state = ManagedState.CLOSING
        if self.age_timer is not None:
            self.age_timer.cancel()
            self.age_timer = None
        for queued in self.queued:
            queued.completion.set_exception(LedgerClosedError(f"{self.name} is closed"))
        self.queued.clear()
        chain(writer.close(), self.final_ledger_closed, self.fail_from_writer)

    def final_ledger_closed(self, metadata: LedgerMetadata) -> None:
        closed = self.closed_info(metadata)
        self.metadata_cache[metadata.ledger_id] = metadata

        def change(record: ManagedLedgerRecord) -> ManagedLedgerRecord:
            ledgers = list(record.ledgers)
            require(ledgers[-1].ledger_id == closed.ledger_id, "closed a ledger not last")
            ledgers[-1] = closed
            return record.updated(ledgers=ledgers)

        def stored(record: ManagedLedgerRecord) -> None:
            self.state = ManagedState.CLOSED
            self.writer = None
            if self.close_completion is not None:
                self.close_completion.set_result(None)

        chain(self.change_record(change), stored, self.fail)

    def fail(self, error: BaseException) -> None:
        """Stop for good: every waiting append and the open or close fail with `error`."""
        if self.failure is not None:
            return
        if not isinstance(error, LedgerError):
            if not isinstance(error, QuorumLogError):
                raise error  # an invariant or a bug: never turned into a retry
            error = wrap_error(error)
        self.failure = error
        self.state = ManagedState.FAILED
        if self.age_timer is not None:
            self.age_timer.cancel()
            self.age_timer = None
        waiting = [batch.completion for batch in self.inflight]
        waiting += [queued.completion for queued in self.queued]
        waiting += [completion for _, _, completion in self.waiting_duplicates]
        self.inflight.clear()
        self.queued.clear()
        self.waiting_duplicates.clear()
        for completion in waiting:
            completion.set_exception(error)
        self.open_completion.set_exception(error)
        if self.close_completion is not None:
            self.close_completion.set_exception(error)


def take_records(
    managed: ManagedSlice, offset: int, last: int, found: list[tuple[int, Record]]
) -> None:
    """Add the records of `managed` within offset..last to `found`, with their offsets."""
    first = managed.first_offset
    begin = max(offset - first, 0)
    stop = min(last + 1 - first, len(managed.records))
    records = managed.stamped_records(begin, stop)
    found.extend(zip(range(first + begin, first + stop), records, strict=True))


def learn_run(
    ledger: ManagedLedgerInfo, index: EntryIndex, entries: list[LedgerEntryData]
) -> list[ManagedSlice]:
    """Decode a run of consecutive entries; teach `index` where the run starts and ends
    (only those two points: a read adds two at most, so what a reader learns stays small).
    LedgerMetadataFormatError if an entry is not where the one before it ends."""
    require(bool(entries), "a read returned no entries")
    slices: list[ManagedSlice] = []
    v1_offset = ledger.first_offset + entries[0].entry_id  # entry format 1: a record each
    for entry in entries:
        managed = decode_slice(entry.data, ledger.entry_format, v1_offset)
        if (slices and managed.first_offset != slices[-1].end_offset) or not managed.records:
            raise LedgerMetadataFormatError(
                f"ledger {ledger.ledger_id} entry {entry.entry_id} starts at offset "
                f"{managed.first_offset}, not where the entry before it ends"
            )
        slices.append(managed)
        v1_offset += 1
    first, last = slices[0], slices[-1]
    index.learn_point(entries[0].entry_id, first.first_offset)
    index.learn_point(entries[-1].entry_id + 1, last.end_offset)
    return slices


def present(value: ValueType | None, message: str) -> ValueType:
    """`value`, which must be there (InvariantViolation if it is None)."""
    if value is None:
        raise InvariantViolation(message)
    return value


def wrap_error(error: QuorumLogError) -> LedgerError:
    wrapped = LedgerError(str(error))
    wrapped.__cause__ = error
    return wrapped


def producer_table_of(metadata: LedgerMetadata) -> ProducerTable:
    """The producer table copied into a ledger's metadata when it was created."""
    value = metadata.properties.get(PRODUCERS_PROPERTY)
    return ProducerTable() if value is None else decode_producer_table(value)


def retained_ledgers(
    ledgers: list[ManagedLedgerInfo],
    open_data_bytes: int,
    now_ms: int,
    config: ManagedLedgerConfig,
) -> list[ManagedLedgerInfo]:
    """`ledgers` without the closed ones at the front that retention lets go: by bytes,
    while what stays still holds `retention_bytes`; by age, those closed longer ago than
    `retention_ms`. The open ledger (and the last one) always stays."""
    retained_bytes = open_data_bytes + sum(ledger.data_bytes for ledger in ledgers)
    drop = 0
    while drop < len(ledgers) - 1 and ledgers[drop].closed:
        ledger = ledgers[drop]
        by_bytes = (
            config.retention_bytes >= 0
            and retained_bytes - ledger.data_bytes >= config.retention_bytes
        )
        by_age = config.retention_ms >= 0 and ledger.closed_ms < now_ms - config.retention_ms
        if not (by_bytes or by_age):
            break
        retained_bytes -= ledger.data_bytes
        drop += 1
    return ledgers[drop:]
