"""A deterministic in-memory world for the ledger protocol cores.

Fake bookies follow the wire contract of codec/wire.py (store on add, fence durably, answer
NO_SUCH_ENTRY for a missing first entry); the metadata store is the shipped in-memory one.
Every bookie request, answer, metadata operation and metadata result waits in one queue
until the test delivers it, so a test (or hypothesis) chooses the order, drops messages,
pauses and crashes bookies. The cores run exactly as a driver must run them: after every
event, `take_actions()`, and everything in it goes into the queue.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorumlog.codec.wire import (
    AddEntries,
    AddEntriesResult,
    BookieStatus,
    ErrorCode,
    ErrorResponse,
    LastAddConfirmedResult,
    LedgerEntryData,
    ReadEntries,
    ReadEntriesResult,
    ReadLastAddConfirmed,
)
from quorumlog.errors import LedgerError
from quorumlog.ledger.metadata import (
    InMemoryMetadataStore,
    LedgerMetadata,
    check_password,
    new_ledger_metadata,
)
from quorumlog.ledger.placement import choose_ensemble
from quorumlog.ledger.protocol_actions import (
    BookieAnswer,
    BookieRequest,
    LedgerActions,
    LedgerCore,
    LedgerProtocolConfig,
    MetadataOperation,
    MetadataResult,
    MetadataUnavailable,
    request_id_counter,
    run_metadata_operation,
)
from quorumlog.ledger.protocol_read import EntryRangeRead, LastAddConfirmedRead
from quorumlog.ledger.protocol_recovery import LedgerRecovery
from quorumlog.ledger.protocol_write import LedgerWriter

TEST_CONFIG = LedgerProtocolConfig(
    request_timeout_ticks=20,
    retry_delay_ticks=2,
    batch_entries_max=8,
    read_entries_max=8,
)
"""Small batches and windows, so a few dozen entries already exercise several frames."""


@dataclass
class FakeLedger:
    master_key: bytes
    entries: dict[int, bytes] = field(default_factory=dict)
    last_add_confirmed: int = -1
    length: int = -1
    fenced: bool = False


class FakeBookie:
    """A bookie as the wire contract describes it; everything it stores is durable."""

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.ledgers: dict[int, FakeLedger] = {}
        self.read_only = False
        self.sick = False
        """True: answer every request with ErrorResponse INTERNAL (its storage failed)."""
        self.keeps_length = True
        """False: behave as a bookie that does not store the length with the LAC (-1)."""
        self.adds_taken = 0

    def handle(self, request: BookieRequest) -> BookieAnswer:
        if self.sick:
            return ErrorResponse(request.request_id, ErrorCode.INTERNAL, "storage failed")
        if isinstance(request, AddEntries):
            return self.add(request)
        if isinstance(request, ReadEntries):
            return self.read(request)
        return self.last_add_confirmed(request)

    def add(self, request: AddEntries) -> AddEntriesResult:
        def answer(status: BookieStatus, entry_ids: list[int] | None = None) -> AddEntriesResult:
            return AddEntriesResult(request.request_id, request.ledger_id, status, entry_ids or [])

        if self.read_only:
            return answer(BookieStatus.READ_ONLY)
        ledger = self.ledgers.setdefault(request.ledger_id, FakeLedger(request.master_key))
        if ledger.master_key != request.master_key:
            return answer(BookieStatus.UNAUTHORIZED)
        if ledger.fenced and not request.recovery:
            return answer(BookieStatus.FENCED)
        for entry in request.entries:
            previous = ledger.entries.setdefault(entry.entry_id, entry.data)
            assert previous == entry.data, "an entry id was written with two values"
        if request.last_add_confirmed > ledger.last_add_confirmed:
            ledger.last_add_confirmed = request.last_add_confirmed
            ledger.length = request.length if self.keeps_length else -1
        self.adds_taken += len(request.entries)
        return answer(BookieStatus.OK, [entry.entry_id for entry in request.entries])

    def read(self, request: ReadEntries) -> ReadEntriesResult:
        ledger = self.ledgers.get(request.ledger_id)
        if ledger is None:
            return ReadEntriesResult(
                request.request_id, request.ledger_id, BookieStatus.NO_SUCH_LEDGER
            )
        if request.first_entry_id not in ledger.entries:
            return ReadEntriesResult(
                request.request_id,
                request.ledger_id,
                BookieStatus.NO_SUCH_ENTRY,
                last_add_confirmed=ledger.last_add_confirmed,
            )
        entries: list[LedgerEntryData] = []
        size = 0
        for entry_id in range(request.first_entry_id, request.last_entry_id + 1):
            data = ledger.entries.get(entry_id)
            if data is None:
                continue
            if entries and size + len(data) > request.bytes_max:
                break
            entries.append(LedgerEntryData(entry_id, data))
            size += len(data)
        return ReadEntriesResult(
            request.request_id,
            request.ledger_id,
            BookieStatus.OK,
            entries,
            last_add_confirmed=ledger.last_add_confirmed,
        )

    def last_add_confirmed(self, request: ReadLastAddConfirmed) -> LastAddConfirmedResult:
        ledger = self.ledgers.get(request.ledger_id)
        if request.fence:
            # Fencing a ledger this bookie never saw creates it fenced (as BookKeeper's
            # bookies do): otherwise the old writer could still add here afterwards.
            ledger = self.ledgers.setdefault(request.ledger_id, FakeLedger(request.master_key))
            if ledger.master_key != request.master_key:
                return LastAddConfirmedResult(
                    request.request_id, request.ledger_id, BookieStatus.UNAUTHORIZED
                )
            ledger.fenced = True
        if ledger is None:
            return LastAddConfirmedResult(
                request.request_id, request.ledger_id, BookieStatus.NO_SUCH_LEDGER
            )
        return LastAddConfirmedResult(
            request.request_id,
            request.ledger_id,
            BookieStatus.OK,
            last_add_confirmed=ledger.last_add_confirmed,
            last_entry_id=max(ledger.entries, default=-1),
            length=ledger.length,
        )


class RecordingMetadataStore(InMemoryMetadataStore):
    """The in-memory store, remembering every version it stored per ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, list[LedgerMetadata]] = {}

    def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        stored = super().create_ledger(metadata)
        self.history[stored.ledger_id] = [stored]
        return stored

    def update_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        stored = super().update_ledger(metadata, expected_version)
        self.history[stored.ledger_id].append(stored)
        return stored


@dataclass(eq=False)
class Message:
    client: str
    bookie_id: str | None
    payload: BookieRequest | BookieAnswer | MetadataOperation | MetadataResult
    to_bookie: bool = False
    to_store: bool = False


def requests_to(bookie_id: str, client: str | None = None) -> Callable[[Message], bool]:
    return lambda message: (
        message.to_bookie
        and message.bookie_id == bookie_id
        and (client is None or message.client == client)
    )


def answers_from(bookie_id: str, client: str | None = None) -> Callable[[Message], bool]:
    return lambda message: (
        not message.to_bookie
        and message.bookie_id == bookie_id
        and (client is None or message.client == client)
    )


def of_client(client: str) -> Callable[[Message], bool]:
    return lambda message: message.client == client


def metadata_of(client: str) -> Callable[[Message], bool]:
    return lambda message: message.client == client and message.bookie_id is None


@dataclass
class ClientRecord:
    core: LedgerCore
    last_add_confirmed: int = -1
    acknowledged_history: list[int] = field(default_factory=list)
    failure: LedgerError | None = None
    closed: LedgerMetadata | None = None
    entries: list[LedgerEntryData] | None = None


class BookieDouble(Protocol):
    """What the world needs of a bookie: FakeBookie, or an adapter around the real one."""

    sick: bool
    keeps_length: bool

    def handle(self, request: BookieRequest) -> BookieAnswer: ...


class LedgerWorld:
    def __init__(
        self,
        bookie_count: int = 5,
        seed: int = 0,
        config: LedgerProtocolConfig = TEST_CONFIG,
        bookie_factory: Callable[[str], BookieDouble] | None = None,
    ) -> None:
        self.config = config
        self.random = random_module.Random(seed)
        self.store = RecordingMetadataStore()
        make = bookie_factory or FakeBookie
        self.bookies: dict[str, Any] = {
            f"b{index}": make(f"b{index}") for index in range(bookie_count)
        }
        """FakeBookies unless a factory says otherwise (scripted tests look inside them)."""
        for bookie_id in self.bookies:
            self.store.register_bookie(bookie_id)
        self.clients: dict[str, ClientRecord] = {}
        self.queue: list[Message] = []
        self.request_ids = request_id_counter()
        self.down: set[str] = set()
        """Crashed bookies: requests to them vanish (the client learns by timeout)."""
        self.unreachable: set[str] = set()
        """Bookies whose connection refuses: the client is told at once."""
        self.paused: set[str] = set()
        """Requests to these wait in the queue (a SIGSTOPped bookie)."""
        self.held_clients: set[str] = set()
        """Every message of these clients waits (a paused process)."""
        self.store_unavailable = False
        self.entries_written: dict[int, dict[int, bytes]] = {}
        """Every entry an application appended, per ledger (what acked ids must read as)."""

    # --- set-up ------------------------------------------------------------------------

    def create_ledger(
        self, ensemble_size: int = 3, write_quorum_size: int = 2, ack_quorum_size: int = 2
    ) -> LedgerMetadata:
        writable = [bookie.bookie_id for bookie in self.store.writable_bookies()]
        ensemble = choose_ensemble(writable, ensemble_size, self.random)
        metadata = new_ledger_metadata(
            ensemble=ensemble,
            write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size,
            password=b"secret",
        )
        return self.store.create_ledger(metadata)

    def writer(self, name: str, metadata: LedgerMetadata) -> LedgerWriter:
        writer = LedgerWriter(
            metadata,
            check_password(metadata, b"secret"),
            self.config,
            request_ids=self.request_ids,
            random=random_module.Random(self.random.random()),
        )
        self.entries_written.setdefault(metadata.ledger_id, {})
        self.add_client(name, writer)
        return writer

    def append(self, name: str, data: bytes) -> int:
        writer = self.clients[name].core
        assert isinstance(writer, LedgerWriter)
        entry_id = writer.append(data)
        self.entries_written[writer.metadata.ledger_id][entry_id] = data
        self.collect(name)
        return entry_id

    def recovery(self, name: str, ledger_id: int, password: bytes = b"secret") -> LedgerRecovery:
        metadata = self.store.read_ledger(ledger_id)
        recovery = LedgerRecovery(
            metadata,
            check_password(metadata, password),
            self.config,
            request_ids=self.request_ids,
            random=random_module.Random(self.random.random()),
        )
        self.add_client(name, recovery)
        return recovery

    def range_read(self, name: str, ledger_id: int, first: int, last: int) -> EntryRangeRead:
        metadata = self.store.read_ledger(ledger_id)
        read = EntryRangeRead(
            metadata,
            first,
            last,
            metadata.known_last_add_confirmed,
            self.config,
            request_ids=self.request_ids,
        )
        self.add_client(name, read)
        return read

    def last_add_confirmed_read(self, name: str, ledger_id: int) -> LastAddConfirmedRead:
        metadata = self.store.read_ledger(ledger_id)
        read = LastAddConfirmedRead(metadata, self.config, request_ids=self.request_ids)
        self.add_client(name, read)
        return read

    def add_client(self, name: str, core: LedgerCore) -> None:
        self.clients[name] = ClientRecord(core)
        self.collect(name)

    # --- the driver --------------------------------------------------------------------

    def collect(self, name: str) -> None:
        record = self.clients[name]
        actions: LedgerActions = record.core.take_actions()
        for send in actions.sends:
            self.queue.append(Message(name, send.bookie_id, send.request, to_bookie=True))
        for operation in actions.metadata_operations:
            self.queue.append(Message(name, None, operation, to_store=True))
        if actions.last_add_confirmed is not None:
            if isinstance(record.core, LedgerWriter):
                assert actions.last_add_confirmed > record.last_add_confirmed, "LAC went back"
            record.last_add_confirmed = actions.last_add_confirmed
            record.acknowledged_history.append(actions.last_add_confirmed)
        if actions.failure is not None:
            record.failure = actions.failure
        if actions.closed is not None:
            record.closed = actions.closed
        if actions.entries is not None:
            record.entries = actions.entries

    def deliverable(self, index: int) -> bool:
        message = self.queue[index]
        if message.client in self.held_clients:
            return False
        return not (message.to_bookie and message.bookie_id in self.paused)

    def deliver(self, index: int) -> None:
        message = self.queue.pop(index)
        record = self.clients.get(message.client)
        if record is None:
            return
        payload = message.payload
        if message.to_bookie:
            self.deliver_to_bookie(message)
        elif message.to_store:
            if self.store_unavailable:
                result: MetadataResult = MetadataUnavailable(payload.operation_id)
            else:
                result = run_metadata_operation(self.store, payload)  # type: ignore[arg-type]
            self.queue.append(Message(message.client, None, result))
        elif message.bookie_id is not None:
            record.core.receive(message.bookie_id, payload)  # type: ignore[arg-type]
            self.collect(message.client)
        else:
            record.core.metadata_result(payload)  # type: ignore[arg-type]
            self.collect(message.client)

    def deliver_to_bookie(self, message: Message) -> None:
        bookie_id = message.bookie_id
        assert bookie_id is not None
        if bookie_id in self.unreachable:
            self.clients[message.client].core.bookie_unreachable(bookie_id)
            self.collect(message.client)
            return
        if bookie_id in self.down:
            return
        answer = self.bookies[bookie_id].handle(message.payload)  # type: ignore[arg-type]
        self.queue.append(Message(message.client, bookie_id, answer))

    def drop(self, index: int) -> None:
        """Lose a message. A lost metadata operation or result reaches the core as
        MetadataUnavailable, as a driver reports a store that did not answer in time (the
        operation may or may not have happened)."""
        message = self.queue.pop(index)
        if message.bookie_id is None:
            operation_id = message.payload.operation_id  # type: ignore[union-attr]
            self.queue.append(Message(message.client, None, MetadataUnavailable(operation_id)))

    def tick(self) -> None:
        for name, record in list(self.clients.items()):
            record.core.tick()
            self.collect(name)

    def step(self) -> bool:
        """Deliver the oldest deliverable message; False when there is none."""
        for index in range(len(self.queue)):
            if self.deliverable(index):
                self.deliver(index)
                return True
        return False

    def deliver_all(self) -> None:
        """Deliver until nothing is deliverable, without letting time pass (no timeouts)."""
        while self.step():
            pass

    def deliver_matching(self, predicate: Callable[[Message], bool]) -> int:
        """Deliver, oldest first, every message queued now that matches (not the ones this
        produces); returns how many."""
        chosen = [message for message in self.queue if predicate(message)]
        for message in chosen:
            self.deliver(self.queue.index(message))
        return len(chosen)

    def drop_matching(self, predicate: Callable[[Message], bool]) -> int:
        chosen = [message for message in self.queue if predicate(message)]
        for message in chosen:
            self.drop(self.queue.index(message))
        return len(chosen)

    def run(self, until: Callable[[], bool] | None = None, ticks_max: int = 2000) -> None:
        """Deliver in order, ticking whenever nothing is deliverable, until `until()` holds
        or, without one, until nothing happens for a few request timeouts (every timer a
        core set has run out). Fails after `ticks_max` ticks."""
        ticks = 0
        quiet_ticks = 0
        while True:
            if until is not None and until():
                return
            if self.step():
                quiet_ticks = 0
                continue
            if until is None and quiet_ticks > 3 * self.config.request_timeout_ticks:
                return
            ticks += 1
            quiet_ticks += 1
            assert ticks <= ticks_max, "the world did not settle"
            self.tick()

    # --- looking -----------------------------------------------------------------------

    def writer_of(self, name: str) -> LedgerWriter:
        core = self.clients[name].core
        assert isinstance(core, LedgerWriter)
        return core

    def read_all(self, ledger_id: int, name: str = "reader") -> list[LedgerEntryData]:
        """Every entry of a closed ledger, read through the read core."""
        metadata = self.store.read_ledger(ledger_id)
        if metadata.last_entry_id < 0:
            return []
        self.range_read(name, ledger_id, 0, metadata.last_entry_id)
        record = self.clients[name]
        self.run(until=lambda: record.entries is not None or record.failure is not None)
        assert record.failure is None, record.failure
        assert record.entries is not None
        return record.entries
