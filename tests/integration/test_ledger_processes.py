"""Ledgers on real processes: a one-node metadata group and five `quorumlog bookie` processes.

- A writer streams while one bookie of its ensemble is SIGKILLed and another is paused
  (SIGSTOP): both are replaced, the ensemble changes are in the metadata, and every
  acknowledged entry reads back with its bytes after the close.
- A second client recovers the ledger while the first is still writing: the first is fenced
  (its later appends fail LedgerFencedError) and the recovered end covers every entry the
  first saw acknowledged.
- A bookie SIGKILLed after a write and restarted on its data directory serves what it
  acknowledged, from its journal.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from quorumlog import LedgerClient
from quorumlog.codec import wire
from quorumlog.errors import LedgerError, LedgerFencedError
from quorumlog.kv.client import BlockingConnection, KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.registry import BOOKIE_PREFIX, decode_bookie_record, registration

from .bookie_processes import BookieProcess
from .process_cluster import ProcessCluster, wait_until

CLUSTER_ID = "ledger-processes"
HEARTBEAT_MS = 100
BOOKIE_COUNT = 5
TIMEOUT_SECONDS = 30.0
PASSWORD = b"ledger-processes"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    base: Path = tmp_path_factory.mktemp("ledger-processes")
    with ProcessCluster(
        base, node_count=1, cluster_id=CLUSTER_ID, extra_arguments=["--no-bookie"]
    ) as running:
        running.wait_for_leader()
        yield running


class Bookies:
    def __init__(self, cluster: ProcessCluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self.processes: dict[str, BookieProcess] = {}
        self.restarted: list[BookieProcess] = []
        """Processes replaced by a restart (reaped already)."""

    def start(self, bookie_id: str) -> BookieProcess:
        log = self.directory / f"{bookie_id}-{time.monotonic_ns()}.log"
        process = BookieProcess(
            bookie_id,
            self.directory / bookie_id,
            self.cluster.endpoints,
            log,
            CLUSTER_ID,
            heartbeat_ms=HEARTBEAT_MS,
        )
        self.processes[bookie_id] = process
        return process

    def writable(self) -> dict[str, str]:
        """Writable bookie id -> address, as the metadata group lists them now."""
        with KVClient(
            self.cluster.endpoints, timeout=TIMEOUT_SECONDS, cluster_id=CLUSTER_ID
        ) as client:
            items = InternalKeys(client).scan_prefix(BOOKIE_PREFIX)
        now_ms = int(time.time() * 1000)
        found: dict[str, str] = {}
        for _, value in items:
            record = decode_bookie_record(value)
            if record is not None and registration(record, now_ms).writable:
                found[record.bookie_id] = record.address
        return found

    def wait_writable(self, bookie_ids: set[str]) -> dict[str, str]:
        def all_writable() -> dict[str, str] | None:
            listed = self.writable()
            return listed if bookie_ids <= set(listed) else None

        return wait_until(
            all_writable,
            TIMEOUT_SECONDS,
            f"bookies {sorted(bookie_ids)} registered and writable",
        )

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGCONT)
                process.process.kill()
            process.process.wait()


@pytest.fixture
def bookies(cluster: ProcessCluster, tmp_path: Path) -> Iterator[Bookies]:
    running = Bookies(cluster, tmp_path)
    for number in range(BOOKIE_COUNT):
        running.start(f"{tmp_path.name[-12:]}-b{number}")
    running.wait_writable(set(running.processes))
    yield running
    running.stop_all()


def client(cluster: ProcessCluster) -> LedgerClient:
    return LedgerClient(cluster.endpoints, timeout=TIMEOUT_SECONDS, cluster_id=CLUSTER_ID)


class Streamer:
    """Appends numbered entries from a thread, pipelined, until told to stop; remembers
    which were acknowledged."""

    def __init__(self, handle: object, window: int = 200) -> None:
        self.handle = handle
        self.window = window
        self.acknowledged: dict[int, bytes] = {}
        self.failure: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        pending: list[tuple[bytes, Future[int]]] = []
        number = 0
        try:
            while not self.stopping.is_set():
                data = b"entry-%08d" % number
                number += 1
                pending.append((data, self.handle.append_async(data)))  # type: ignore[attr-defined]
                if len(pending) >= self.window:
                    self.settle(pending[: self.window // 2])
                    del pending[: self.window // 2]
            self.settle(pending)
        except BaseException as error:
            self.failure = error

    def settle(self, pending: list[tuple[bytes, Future[int]]]) -> None:
        for data, future in pending:
            entry_id = future.result(timeout=TIMEOUT_SECONDS)
            self.acknowledged[entry_id] = data

    def wait_for(self, count: int) -> None:
        wait_until(
            lambda: len(self.acknowledged) >= count or self.failure is not None,
            TIMEOUT_SECONDS,
            f"{count} acknowledged entries",
        )
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(TIMEOUT_SECONDS)


def test_a_writer_streams_through_a_killed_and_a_paused_bookie(
    cluster: ProcessCluster, bookies: Bookies
) -> None:
    with client(cluster) as writer_client:
        handle = writer_client.create_ledger(3, 2, 2, password=PASSWORD)
        ledger_id = handle.ledger_id
        first_ensemble = writer_client.ledger_metadata(ledger_id).ensembles[0]
        streamer = Streamer(handle)
        streamer.wait_for(2000)
        killed, paused = first_ensemble[0], first_ensemble[1]
        bookies.processes[killed].process.kill()
        streamer.wait_for(len(streamer.acknowledged) + 2000)
        bookies.processes[paused].process.send_signal(signal.SIGSTOP)
        streamer.wait_for(len(streamer.acknowledged) + 2000)

        def replaced_both() -> bool:
            ensembles = writer_client.ledger_metadata(ledger_id).ensembles
            last = ensembles[max(ensembles)]
            return killed not in last and paused not in last

        wait_until(replaced_both, TIMEOUT_SECONDS, "both bad bookies replaced")
        streamer.stop()
        assert streamer.failure is None, streamer.failure
        bookies.processes[paused].process.send_signal(signal.SIGCONT)
        handle.close()
        info = writer_client.ledger_metadata(ledger_id)
        assert info.state == "CLOSED"
        assert len(info.ensembles) >= 3  # the first fragment and one change per bad bookie
        assert info.last_entry_id == max(streamer.acknowledged)

    with client(cluster) as reader_client:
        reader = reader_client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        entries = reader.read(0, reader.last_add_confirmed)
    assert {entry.entry_id: entry.data for entry in entries} == streamer.acknowledged


def test_a_second_client_recovers_mid_write_and_fences_the_first(
    cluster: ProcessCluster, bookies: Bookies
) -> None:
    with client(cluster) as writer_client, client(cluster) as recovering_client:
        handle = writer_client.create_ledger(3, 3, 2, password=PASSWORD)
        streamer = Streamer(handle)
        streamer.wait_for(3000)
        recovered = recovering_client.open_ledger(handle.ledger_id, password=PASSWORD)
        streamer.stop()
        assert isinstance(streamer.failure, LedgerError), streamer.failure
        with pytest.raises(LedgerFencedError):
            handle.append(b"after the fence")
        last = recovered.last_add_confirmed
        assert last >= max(streamer.acknowledged)
        entries = recovered.read(0, last)
        for entry in entries:
            if entry.entry_id in streamer.acknowledged:
                assert entry.data == streamer.acknowledged[entry.entry_id]
        assert set(streamer.acknowledged) <= {entry.entry_id for entry in entries}
        info = recovering_client.ledger_metadata(handle.ledger_id)
        assert (info.state, info.last_entry_id) == ("CLOSED", last)


def read_directly(address: str, ledger_id: int, last: int) -> list[bytes]:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    connection = BlockingConnection.open(address, CLUSTER_ID, "direct-read", deadline)
    try:
        request = wire.ReadEntries(
            request_id=1, ledger_id=ledger_id, first_entry_id=0, last_entry_id=last
        )
        connection.send(request)
        answer = connection.receive(1, deadline)
    finally:
        connection.close()
    assert isinstance(answer, wire.ReadEntriesResult), answer
    return [entry.data for entry in answer.entries]


def test_a_killed_bookie_restarts_from_its_journal(
    cluster: ProcessCluster, bookies: Bookies
) -> None:
    with client(cluster) as writer_client:
        handle = writer_client.create_ledger(3, 3, 3, password=PASSWORD)
        written = [b"journal-%d" % number for number in range(500)]
        futures = [handle.append_async(data) for data in written]
        assert [future.result(TIMEOUT_SECONDS) for future in futures] == list(range(500))
        ensemble = writer_client.ledger_metadata(handle.ledger_id).ensembles[0]
        victim = ensemble[0]
        old_address = bookies.wait_writable({victim})[victim]
        bookies.processes[victim].process.kill()
        bookies.processes[victim].process.wait()
        bookies.restarted.append(bookies.processes[victim])
        bookies.start(victim)
        # The restarted process listens on a new port and says so in its registration.
        address = wait_until(
            lambda: (found := bookies.writable().get(victim)) != old_address and found,
            TIMEOUT_SECONDS,
            "the restarted bookie's new registration",
        )
        # Every entry was acknowledged by all three (Qa = 3), so the victim synced them all
        # before it answered: the restarted process must have them from its journal.
        assert read_directly(address, handle.ledger_id, 499) == written
