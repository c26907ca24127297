"""The ledger driver (ledger/driver.py) over shipped bookies on a manual scheduler: batching
per loop turn, acknowledgements in order, ensemble change, fencing by a recovery, reads."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumlog.errors import LedgerEntryRangeError, LedgerError, LedgerFencedError
from quorumlog.ledger.bookie import Bookie, BookieRequest
from quorumlog.ledger.bookie_storage import BookieStorage
from quorumlog.ledger.driver import LedgerDriver
from quorumlog.ledger.metadata import (
    InMemoryMetadataStore,
    LedgerMetadata,
    LedgerState,
    master_key,
    new_ledger_metadata,
)
from quorumlog.ledger.protocol_actions import (
    LedgerProtocolConfig,
    MetadataOperation,
    MetadataResult,
    run_metadata_operation,
)
from quorumlog.testing.manual import InlineBackground, ManualScheduler
from quorumlog.testing.sim.filesystem import SimFileSystem

PASSWORD = b"secret"


class World:
    """Bookies answering through the scheduler (never inside a send), a metadata store."""

    def __init__(self, bookie_count: int = 5) -> None:
        self.scheduler = ManualScheduler()
        self.store = InMemoryMetadataStore()
        self.bookies: dict[str, Bookie] = {}
        self.down: set[str] = set()
        self.frames_sent: list[tuple[str, BookieRequest]] = []
        for number in range(bookie_count):
            bookie_id = f"b{number}"
            disk = SimFileSystem(random.Random(number))
            storage = BookieStorage.open(Path("/") / bookie_id, file_system=disk)
            background = InlineBackground(self.scheduler)
            self.bookies[bookie_id] = Bookie(storage, background, self.scheduler.call_soon)
            self.store.register_bookie(bookie_id)
        self.driver = LedgerDriver(
            self.scheduler,
            self,
            self,
            LedgerProtocolConfig(request_timeout_ticks=10),
            tick_seconds=0.01,
            random=random.Random(7),
        )

    def send(self, bookie_id: str, request: BookieRequest) -> None:
        self.frames_sent.append((bookie_id, request))
        if bookie_id in self.down:
            self.scheduler.call_soon(lambda: self.driver.bookie_unreachable(bookie_id))
            return
        bookie = self.bookies[bookie_id]

        def deliver() -> None:
            bookie.handle(request, lambda answer: self.driver.receive(bookie_id, answer))

        self.scheduler.call_soon(deliver)

    def submit(self, operation: MetadataOperation, done: Callable[[MetadataResult], None]) -> None:
        result = run_metadata_operation(self.store, operation)
        self.scheduler.call_soon(lambda: done(result))

    def create(self, ensemble: int = 3, write: int = 2, ack: int = 2) -> LedgerMetadata:
        bookies = [registration.bookie_id for registration in self.store.writable_bookies()]
        metadata = new_ledger_metadata(
            ensemble=bookies[:ensemble],
            write_quorum_size=write,
            ack_quorum_size=ack,
            password=PASSWORD,
        )
        return self.store.create_ledger(metadata)


class Acks:
    def __init__(self) -> None:
        self.last_add_confirmed = -1
        self.history: list[int] = []
        self.failures: list[LedgerError] = []

    def acknowledged(self, last_add_confirmed: int) -> None:
        assert last_add_confirmed > self.last_add_confirmed
        self.last_add_confirmed = last_add_confirmed
        self.history.append(last_add_confirmed)

    def failed(self, error: LedgerError) -> None:
        self.failures.append(error)


def test_entries_appended_in_one_turn_leave_in_one_frame_per_bookie() -> None:
    world = World()
    metadata = world.create()
    acks = Acks()
    writer = world.driver.start_writer(
        metadata, master_key(PASSWORD), acks.acknowledged, acks.failed
    )
    for number in range(100):
        assert writer.append(b"entry-%d" % number) == number
    world.scheduler.run_until_idle()
    assert acks.last_add_confirmed == 99
    adds = [frame for frame in world.frames_sent if type(frame[1]).__name__ == "AddEntries"]
    assert sorted(bookie for bookie, _ in adds) == ["b0", "b1", "b2"]
    closed = writer.close()
    world.scheduler.run_until_idle()
    assert closed.result().state is LedgerState.CLOSED
    assert closed.result().last_entry_id == 99
    assert world.driver.running == {}
    assert world.scheduler.timer_count == 0


def test_a_dead_bookie_is_replaced_and_the_change_recorded() -> None:
    world = World()
    metadata = world.create()
    acks = Acks()
    writer = world.driver.start_writer(
        metadata, master_key(PASSWORD), acks.acknowledged, acks.failed
    )
    for number in range(10):
        writer.append(b"a%d" % number)
    world.scheduler.run_until_idle()
    assert acks.last_add_confirmed == 9
    world.down.add("b1")
    for number in range(10):
        writer.append(b"b%d" % number)
    world.scheduler.advance(1.0)
    assert acks.last_add_confirmed == 19
    stored = world.store.read_ledger(metadata.ledger_id)
    assert sorted(stored.ensembles) == [0, 10]
    assert "b1" not in stored.ensembles[10]
    assert acks.failures == []


def test_recovery_fences_the_writer_and_reads_stop_at_the_lac() -> None:
    world = World()
    metadata = world.create()
    acks = Acks()
    key = master_key(PASSWORD)
    writer = world.driver.start_writer(metadata, key, acks.acknowledged, acks.failed)
    for number in range(25):
        writer.append(b"x%d" % number)
    world.scheduler.run_until_idle()
    recovered = world.driver.recover(world.store.read_ledger(metadata.ledger_id), key)
    world.scheduler.run_until_idle()
    closed = recovered.result()
    assert (closed.state, closed.last_entry_id) == (LedgerState.CLOSED, 24)
    writer.append(b"late")
    world.scheduler.advance(0.5)
    assert any(isinstance(failure, LedgerFencedError) for failure in acks.failures)
    assert acks.last_add_confirmed == 24
    read = world.driver.read(closed, 0, 24, closed.last_entry_id)
    world.scheduler.run_until_idle()
    assert [entry.data for entry in read.result()] == [b"x%d" % n for n in range(25)]
    beyond = world.driver.read(closed, 0, 25, closed.last_entry_id)
    with pytest.raises(LedgerEntryRangeError):
        beyond.result()


def test_last_add_confirmed_read_without_fencing() -> None:
    world = World()
    metadata = world.create(3, 3, 2)
    acks = Acks()
    key = master_key(PASSWORD)
    writer = world.driver.start_writer(metadata, key, acks.acknowledged, acks.failed)
    for number in range(5):
        writer.append(b"y%d" % number)
    world.scheduler.run_until_idle()
    for number in range(5):
        writer.append(b"z%d" % number)
    world.scheduler.run_until_idle()
    lac = world.driver.read_last_add_confirmed(world.store.read_ledger(metadata.ledger_id))
    world.scheduler.run_until_idle()
    # Bookies store the LAC that rode on the last add: what was confirmed before it.
    assert 4 <= lac.result() <= 9
    writer.append(b"still writable")
    world.scheduler.run_until_idle()
    assert acks.last_add_confirmed == 10
