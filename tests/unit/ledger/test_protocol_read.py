"""The read cores: ranges within the LAC with failover across write sets, and the LAC of a
ledger opened without recovery. Reference 001, "消费"."""

from __future__ import annotations

import pytest

from quorumlog.codec.wire import ReadEntries
from quorumlog.errors import LedgerEntryRangeError
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from quorumlog.ledger.protocol_read import EntryRangeRead
from tests.unit.ledger.harness import TEST_CONFIG, LedgerWorld


def closed_ledger(world: LedgerWorld, shape: tuple[int, int, int], count: int) -> int:
    metadata = world.create_ledger(*shape)
    writer = world.writer("w", metadata)
    for entry_id in range(count):
        world.append("w", b"entry-%d" % entry_id)
    writer.close()
    world.collect("w")
    world.run()
    assert world.clients["w"].closed is not None
    return metadata.ledger_id


@pytest.mark.parametrize("shape", [(3, 3, 2), (3, 2, 2), (5, 2, 1), (4, 3, 2)])
def test_a_read_returns_every_entry_in_order(shape: tuple[int, int, int]) -> None:
    world = LedgerWorld()
    ledger_id = closed_ledger(world, shape, 30)
    entries = world.read_all(ledger_id)
    assert [(e.entry_id, e.data) for e in entries] == [(i, b"entry-%d" % i) for i in range(30)]


def test_reading_beyond_the_last_add_confirmed_is_an_error() -> None:
    world = LedgerWorld()
    ledger_id = closed_ledger(world, (3, 2, 2), 5)
    metadata = world.store.read_ledger(ledger_id)
    for first, last in [(5, 5), (0, 5), (-1, 2), (3, 2)]:
        with pytest.raises(LedgerEntryRangeError):
            EntryRangeRead(metadata, first, last, 4, TEST_CONFIG, request_ids=world.request_ids)


def test_a_long_read_asks_in_ranges_not_entry_by_entry() -> None:
    world = LedgerWorld(config=LedgerProtocolConfig(read_entries_max=100))
    ledger_id = closed_ledger(world, (3, 3, 2), 250)
    world.range_read("reader", ledger_id, 0, 249)
    reads = [m.payload for m in world.queue if isinstance(m.payload, ReadEntries)]
    assert [(read.first_entry_id, read.last_entry_id) for read in reads] == [
        (0, 99),
        (100, 199),
        (200, 249),
    ]
    assert len({m.bookie_id for m in world.queue}) == 3  # chunks spread over the ensemble


def test_a_read_fails_over_to_the_next_bookie_of_the_write_set() -> None:
    world = LedgerWorld()
    ledger_id = closed_ledger(world, (3, 3, 2), 20)
    metadata = world.store.read_ledger(ledger_id)
    world.unreachable.add(metadata.ensembles[0][0])
    world.down.add(metadata.ensembles[0][1])  # silent: found out by timeout
    entries = world.read_all(ledger_id)
    assert len(entries) == 20
    world.unreachable.clear()
    world.down.clear()
    world.bookies[metadata.ensembles[0][0]].sick = True  # answers ErrorResponse
    world.bookies[metadata.ensembles[0][2]].sick = True
    world.range_read("second reader", ledger_id, 0, 19)
    # Errors move the read on without waiting for the request timeout.
    for _ in range(TEST_CONFIG.request_timeout_ticks - 1):
        world.deliver_all()
        world.tick()
    entries = world.clients["second reader"].entries
    assert entries is not None and len(entries) == 20


def test_a_read_spans_fragments() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    for entry_id in range(10):
        world.append("w", b"entry-%d" % entry_id)
        if entry_id in (3, 6):
            world.run()
            world.unreachable.add(writer.ensemble[entry_id % 3])
    writer.close()
    world.collect("w")
    world.run()
    world.unreachable.clear()
    stored = world.store.read_ledger(metadata.ledger_id)
    assert len(stored.ensembles) == 3
    entries = world.read_all(metadata.ledger_id)
    assert [e.data for e in entries] == [b"entry-%d" % i for i in range(10)]


def test_an_entry_no_bookie_returns_fails_the_read_after_the_rounds() -> None:
    world = LedgerWorld()
    ledger_id = closed_ledger(world, (3, 2, 2), 6)
    for bookie in world.bookies.values():
        if ledger_id in bookie.ledgers:
            bookie.ledgers[ledger_id].entries.pop(4, None)
    world.range_read("reader", ledger_id, 0, 5)
    record = world.clients["reader"]
    world.run(until=lambda: record.failure is not None or record.entries is not None)
    assert record.entries is None
    assert "entry 4" in str(record.failure)


def test_the_lac_of_an_open_ledger_is_read_without_fencing() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    for entry_id in range(5):
        world.append("w", b"entry-%d" % entry_id)
        world.run()
    world.last_add_confirmed_read("lac", metadata.ledger_id)
    world.run()
    assert world.clients["lac"].last_add_confirmed == 3  # the bookies lag the writer by one
    world.append("w", b"entry-5")  # the writer goes on: nobody fenced it
    world.run()
    assert world.clients["w"].failure is None
    assert world.clients["w"].last_add_confirmed == 5


def test_the_lac_of_a_closed_ledger_comes_from_the_metadata() -> None:
    world = LedgerWorld()
    ledger_id = closed_ledger(world, (3, 2, 2), 7)
    world.last_add_confirmed_read("lac", ledger_id)
    assert world.clients["lac"].last_add_confirmed == 6
    assert not any(m.client == "lac" for m in world.queue)
