"""The blocking LedgerClient against real bookies over TCP: acknowledgements in entry order,
striping, an ensemble change when a bookie goes away, fencing by a second client's
recovery, reads at the LAC without recovery, passwords, delete/list/metadata.

Most tests keep the metadata in an InMemoryMetadataStore (the metadata group is not their
point); test_metadata_kv.py and the CLI test run it on a real node."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from quorumlog import LedgerClient
from quorumlog.errors import (
    BadPasswordError,
    LedgerClosedError,
    LedgerEntryRangeError,
    LedgerFencedError,
    LedgerNotFoundError,
    NotEnoughBookiesError,
)
from quorumlog.ledger.client import LedgerEntry
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from tests.unit.ledger.live_bookies import LiveBookies

PASSWORD = b"pw"
FAST = LedgerProtocolConfig(request_timeout_ticks=50, retry_delay_ticks=2)
"""Ticks are 20 ms: a bookie that went away is given up on after one second."""


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[LiveBookies]:
    live = LiveBookies(tmp_path, 5, metadata_node=False)
    try:
        yield live
    finally:
        live.close()


def client_of(bookies: LiveBookies) -> LedgerClient:
    return LedgerClient([], timeout=10, metadata_store=bookies.store, config=FAST)


def payload(entry_id: int) -> bytes:
    return b"entry-%06d-" % entry_id + bytes([entry_id % 251]) * (entry_id % 37)


def test_acknowledgements_come_in_entry_order_and_entries_are_striped(
    bookies: LiveBookies,
) -> None:
    with client_of(bookies) as client:
        handle = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        completed: list[int] = []
        futures: list[Future[int]] = []
        for entry_id in range(500):
            future = handle.append_async(payload(entry_id))
            future.add_done_callback(lambda done: completed.append(done.result()))
            futures.append(future)
        assert [future.result(timeout=10) for future in futures] == list(range(500))
        assert completed == list(range(500))
        assert handle.last_add_confirmed == 499
        assert handle.append(b"last") == 500
        handle.close()
        with pytest.raises(LedgerClosedError):
            handle.append(b"after close")

        info = client.ledger_metadata(handle.ledger_id)
        assert (info.state, info.last_entry_id) == ("CLOSED", 500)
        assert info.length == sum(len(payload(i)) for i in range(500)) + len(b"last")
        ensemble = info.ensembles[0]
        for position, bookie_id in enumerate(ensemble):
            # Entry i goes to the Qw = 2 bookies starting at position i mod E.
            expected = [i for i in range(501) if position in (i % 3, (i + 1) % 3)]
            assert bookies.stored_entry_ids(bookie_id, handle.ledger_id) == expected
        for bookie_id in set(bookies.servers) - set(ensemble):
            assert bookies.stored_entry_ids(bookie_id, handle.ledger_id) == []

        reader = client.open_ledger(handle.ledger_id, PASSWORD)
        assert reader.last_add_confirmed == 500
        entries = reader.read(0, 499)
        assert entries == [LedgerEntry(i, payload(i)) for i in range(500)]


def test_a_bookie_that_goes_away_is_replaced_and_the_change_recorded(
    bookies: LiveBookies,
) -> None:
    with client_of(bookies) as client:
        # Qa = Qw: no entry after the stop can be acknowledged without a replacement (with
        # Qa < Qw the remaining two may acknowledge everything before the writer notices,
        # and a close then needs no change: right, but not what this test is about).
        handle = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=PASSWORD)
        for entry_id in range(50):
            handle.append_async(payload(entry_id))
        assert handle.append(payload(50)) == 50
        first_ensemble = client.ledger_metadata(handle.ledger_id).ensembles[0]
        gone = first_ensemble[1]
        bookies.stop_bookie(gone)
        futures = [handle.append_async(payload(entry_id)) for entry_id in range(51, 120)]
        assert [future.result(timeout=10) for future in futures] == list(range(51, 120))
        handle.close()

        info = client.ledger_metadata(handle.ledger_id)
        assert len(info.ensembles) == 2
        second_first_entry = max(info.ensembles)
        assert 0 < second_first_entry <= 51
        assert gone not in info.ensembles[second_first_entry]
        assert info.last_entry_id == 119
        entries = client.open_ledger(handle.ledger_id, PASSWORD).read(0, 119)
        assert [entry.data for entry in entries] == [payload(i) for i in range(120)]


def test_a_second_clients_recovery_fences_the_first_and_both_agree(
    bookies: LiveBookies,
) -> None:
    with client_of(bookies) as writer_client, client_of(bookies) as recovering_client:
        handle = writer_client.create_ledger(password=PASSWORD)
        for entry_id in range(30):
            handle.append_async(payload(entry_id))
        acknowledged = handle.append(payload(30))
        assert acknowledged == 30

        recovered = recovering_client.open_ledger(handle.ledger_id, PASSWORD, recovery=True)
        assert recovered.last_add_confirmed >= acknowledged
        with pytest.raises(LedgerFencedError):
            handle.append(b"after the fence")
        with pytest.raises(LedgerFencedError):
            handle.close()

        info = writer_client.ledger_metadata(handle.ledger_id)
        assert (info.state, info.last_entry_id) == ("CLOSED", recovered.last_add_confirmed)
        again = writer_client.open_ledger(handle.ledger_id, PASSWORD)
        assert again.last_add_confirmed == recovered.last_add_confirmed
        last = recovered.last_add_confirmed
        assert [entry.data for entry in recovered.read(0, last)] == [
            payload(i) for i in range(last + 1)
        ]
        assert again.read(0, last) == recovered.read(0, last)


def test_open_without_recovery_reads_at_the_lac_and_does_not_fence(
    bookies: LiveBookies,
) -> None:
    with client_of(bookies) as writer_client, client_of(bookies) as reader_client:
        handle = writer_client.create_ledger(password=PASSWORD)
        for entry_id in range(10):
            handle.append_async(payload(entry_id))
        assert handle.append(payload(10)) == 10
        # The LAC rides on adds: entry 11 carries LAC 10 to its bookies.
        assert handle.append(payload(11)) == 11

        reader = reader_client.open_ledger(handle.ledger_id, PASSWORD, recovery=False)
        assert reader.last_add_confirmed == 10
        assert [entry.entry_id for entry in reader.read(0, 10)] == list(range(11))
        with pytest.raises(LedgerEntryRangeError):
            reader.read(0, 11)
        assert reader_client.ledger_metadata(handle.ledger_id).state == "OPEN"
        assert handle.append(payload(12)) == 12
        handle.close()


def test_passwords_unknown_ledgers_and_too_few_bookies_are_typed_errors(
    bookies: LiveBookies,
) -> None:
    with client_of(bookies) as client:
        handle = client.create_ledger(password=PASSWORD)
        handle.append(b"x")
        with pytest.raises(BadPasswordError):
            client.open_ledger(handle.ledger_id, b"wrong")
        with pytest.raises(LedgerNotFoundError):
            client.open_ledger(handle.ledger_id + 1000, PASSWORD)
        with pytest.raises(NotEnoughBookiesError):
            client.create_ledger(ensemble=6, write_quorum=2, ack_quorum=2)
        assert client.ledger_metadata(handle.ledger_id).state == "OPEN"
        handle.close()


def test_delete_list_and_metadata(bookies: LiveBookies) -> None:
    with client_of(bookies) as client:
        kept = client.create_ledger(ensemble=2, write_quorum=2, ack_quorum=1)
        deleted = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
        for handle in (kept, deleted):
            handle.append(b"one")
            handle.close()
        assert client.list_ledgers() == [kept.ledger_id, deleted.ledger_id]
        info = client.ledger_metadata(kept.ledger_id)
        assert (info.ensemble_size, info.write_quorum_size, info.ack_quorum_size) == (2, 2, 1)
        assert (info.state, info.last_entry_id, info.length) == ("CLOSED", 0, 3)
        holders = client.ledger_metadata(deleted.ledger_id).ensembles[0]
        assert any(bookies.stored_entry_ids(bookie, deleted.ledger_id) for bookie in holders)

        client.delete_ledger(deleted.ledger_id)
        assert client.list_ledgers() == [kept.ledger_id]
        with pytest.raises(LedgerNotFoundError):
            client.ledger_metadata(deleted.ledger_id)
        with pytest.raises(LedgerNotFoundError):
            client.delete_ledger(deleted.ledger_id)
        for bookie in holders:
            assert bookies.stored_entry_ids(bookie, deleted.ledger_id) == []
        assert client.open_ledger(kept.ledger_id).read(0, 0) == [LedgerEntry(0, b"one")]


def test_batches_and_single_appends_interleave_in_entry_order(bookies: LiveBookies) -> None:
    with client_of(bookies) as client:
        handle = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        futures: list[Future[int]] = []
        expected_results: list[int] = []
        next_id = 0
        for round_number in range(20):
            size = 1 + round_number * 7 % 23
            futures.append(handle.append_many_async([payload(next_id + k) for k in range(size)]))
            expected_results.append(next_id)  # a batch completes with its first id
            next_id += size
            futures.append(handle.append_async(payload(next_id)))
            expected_results.append(next_id)
            next_id += 1
        assert [future.result(timeout=10) for future in futures] == expected_results
        assert handle.append_many([payload(next_id), payload(next_id + 1)]) == next_id
        assert handle.last_add_confirmed == next_id + 1
        handle.close()
        with pytest.raises(LedgerClosedError):
            handle.append_many_async([b"after close"]).result(timeout=10)
        with pytest.raises(ValueError):
            handle.append_many_async([])

        entries = client.open_ledger(handle.ledger_id, PASSWORD).read(0, next_id + 1)
        assert [entry.data for entry in entries] == [payload(i) for i in range(next_id + 2)]


def test_a_batch_larger_than_the_writer_holds_is_handed_over_in_parts(
    bookies: LiveBookies,
) -> None:
    """The writer takes at most 64 unacknowledged entries: a batch of 300 waits for acks
    between parts, keeps its first id, and completes once its last entry is acknowledged."""
    small = LedgerProtocolConfig(
        request_timeout_ticks=50,
        retry_delay_ticks=2,
        pending_entries_max=64,
        batch_entries_max=16,
        entry_bytes_max=1024,
        pending_bytes_max=64 * 1024,
    )
    with LedgerClient([], timeout=10, metadata_store=bookies.store, config=small) as client:
        handle = client.create_ledger(password=PASSWORD)
        before = handle.append_async(payload(0))
        batch = handle.append_many_async([payload(1 + k) for k in range(300)])
        after = handle.append_async(payload(301))
        assert before.result(timeout=10) == 0
        assert batch.result(timeout=10) == 1
        assert after.result(timeout=10) == 301
        handle.close()
        entries = client.open_ledger(handle.ledger_id, PASSWORD).read(0, 301)
        assert [entry.data for entry in entries] == [payload(i) for i in range(302)]


def test_a_fenced_writer_fails_its_batches(bookies: LiveBookies) -> None:
    with client_of(bookies) as writer_client, client_of(bookies) as recovering_client:
        handle = writer_client.create_ledger(password=PASSWORD)
        assert handle.append_many([payload(0), payload(1)]) == 0
        recovering_client.open_ledger(handle.ledger_id, PASSWORD, recovery=True)
        # The writer learns of the fence from the bookies' answer to its next add.
        with pytest.raises(LedgerFencedError):
            handle.append_many_async([payload(2), payload(3)]).result(timeout=10)
        with pytest.raises(LedgerFencedError):
            handle.append_many_async([payload(4)]).result(timeout=10)
        with pytest.raises(LedgerFencedError):
            handle.close()
