"""`quorumlog bookie` as a real process beside a one-node metadata cluster: it registers,
serves adds and reads over TCP, is listed by `quorumlog bookie list`, stops being writable
once its heartbeats stop (SIGKILL) or at once on a clean stop (SIGTERM, exit 0), replays
its journal on restart, and refuses a locked or unusable data directory with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.codec import wire
from quorumlog.kv.client import BlockingConnection, KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.metadata import master_key
from quorumlog.ledger.registry import (
    BOOKIE_PREFIX,
    BookieRecord,
    bookie_key,
    decode_bookie_record,
    registration,
)

from .bookie_processes import BookieProcess
from .process_cluster import ProcessCluster, wait_until

CLUSTER_ID = "bookie-process"
HEARTBEAT_MS = 100
LIVENESS_SECONDS = 1.0
"""The window a reader gives a registration here, shrunk from the default so the test
waits one second, not six, for a killed bookie to expire."""
TIMEOUT_SECONDS = 20.0
KEY = master_key(b"pw")
LEDGER_ID = 11


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    base: Path = tmp_path_factory.mktemp("bookie-process")
    with ProcessCluster(
        base, node_count=1, cluster_id=CLUSTER_ID, extra_arguments=["--no-bookie"]
    ) as running:
        running.wait_for_leader()
        yield running


@pytest.fixture
def bookies(cluster: ProcessCluster, tmp_path: Path) -> Iterator[list[BookieProcess]]:
    started: list[BookieProcess] = []
    yield started
    for bookie in started:
        if bookie.process.poll() is None:
            bookie.process.kill()
        bookie.process.wait()


def start(
    bookies: list[BookieProcess], cluster: ProcessCluster, bookie_id: str, data_dir: Path
) -> BookieProcess:
    log = cluster.base_directory / f"{bookie_id}-{len(bookies)}.log"
    bookie = BookieProcess(
        bookie_id, data_dir, cluster.endpoints, log, CLUSTER_ID, heartbeat_ms=HEARTBEAT_MS
    )
    bookies.append(bookie)
    return bookie


def record_of(cluster: ProcessCluster, bookie_id: str) -> BookieRecord | None:
    with KVClient(cluster.endpoints, timeout=TIMEOUT_SECONDS, cluster_id=CLUSTER_ID) as client:
        items = dict(InternalKeys(client).scan_prefix(BOOKIE_PREFIX))
    value = items.get(bookie_key(bookie_id))
    return decode_bookie_record(value) if value is not None else None


def writable_now(record: BookieRecord | None) -> bool:
    if record is None:
        return False
    return registration(record, int(time.time() * 1000), LIVENESS_SECONDS).writable


def wait_registered(cluster: ProcessCluster, bookie: BookieProcess) -> BookieRecord:
    def registered() -> BookieRecord | None:
        assert bookie.process.poll() is None, f"the bookie exited:\n{bookie.log_text()}"
        record = record_of(cluster, bookie.bookie_id)
        return record if writable_now(record) else None

    return wait_until(registered, TIMEOUT_SECONDS, f"{bookie.bookie_id} to register writable")


def call(address: str, request: wire.ClientRequest) -> wire.Frame:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    connection = BlockingConnection.open(address, CLUSTER_ID, "test", deadline)
    try:
        connection.send(request)
        return connection.receive(request.request_id, deadline)
    finally:
        connection.close()


def add(address: str, entry_id: int) -> None:
    answer = call(
        address,
        wire.AddEntries(
            request_id=1,
            ledger_id=LEDGER_ID,
            master_key=KEY,
            last_add_confirmed=entry_id - 1,
            entries=[wire.LedgerEntryData(entry_id, b"entry-%d" % entry_id)],
        ),
    )
    assert isinstance(answer, wire.AddEntriesResult), answer
    assert (answer.status, answer.entry_ids) == (wire.BookieStatus.OK, [entry_id])


def read_all(address: str, last: int) -> list[bytes]:
    answer = call(
        address,
        wire.ReadEntries(request_id=2, ledger_id=LEDGER_ID, first_entry_id=0, last_entry_id=last),
    )
    assert isinstance(answer, wire.ReadEntriesResult), answer
    assert answer.status is wire.BookieStatus.OK, answer
    return [entry.data for entry in answer.entries]


def quorumlog(*arguments: str, endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "QUORUMLOG_CLUSTER_ID": CLUSTER_ID,
        "QUORUMLOG_ENDPOINTS": ",".join(endpoints),
    }
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *arguments],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        env=environment,
        check=False,
    )


def test_a_bookie_process_registers_serves_is_listed_and_expires_after_sigkill(
    cluster: ProcessCluster, bookies: list[BookieProcess], tmp_path: Path
) -> None:
    bookie = start(bookies, cluster, "b1", tmp_path / "b1")
    record = wait_registered(cluster, bookie)
    add(record.address, 0)
    add(record.address, 1)
    assert read_all(record.address, 1) == [b"entry-0", b"entry-1"]

    def listed() -> dict[str, object] | None:
        shown = quorumlog("bookie", "list", "-w", "json", endpoints=cluster.endpoints)
        assert shown.returncode == 0, shown.stderr
        rows = {row["id"]: row for row in json.loads(shown.stdout)}
        row = rows.get("b1")
        return row if row is not None and row["ledgers"] == 1 else None

    row = wait_until(listed, TIMEOUT_SECONDS, "bookie list to show b1 holding a ledger")
    assert row["address"] == record.address and row["writable"] is True
    assert isinstance(row["journal_bytes"], int) and row["journal_bytes"] > 0
    table = quorumlog("bookie", "list", endpoints=cluster.endpoints)
    assert table.returncode == 0, table.stderr
    assert "b1" in table.stdout and record.address in table.stdout

    assert bookie.stop(signal.SIGKILL) == -signal.SIGKILL
    expired = wait_until(
        lambda: (found := record_of(cluster, "b1")) is not None and not writable_now(found),
        TIMEOUT_SECONDS,
        "b1's registration to expire",
    )
    assert expired
    last = record_of(cluster, "b1")
    # It expired: the record still says writable, as a killed bookie says nothing more.
    assert last is not None and last.writable


def test_a_bookie_process_stops_cleanly_restarts_from_its_journal_and_refuses_bad_dirs(
    cluster: ProcessCluster, bookies: list[BookieProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "b2"
    bookie = start(bookies, cluster, "b2", data_dir)
    record = wait_registered(cluster, bookie)
    add(record.address, 0)

    second = start(bookies, cluster, "b2-twin", data_dir)
    assert second.process.wait(timeout=TIMEOUT_SECONDS) == 2
    refusal = [line for line in second.log_text().splitlines() if line.startswith("error:")]
    assert len(refusal) == 1 and "cannot run" in refusal[0], second.log_text()

    a_file = tmp_path / "not-a-directory"
    a_file.write_text("x")
    # Under a file: no directory can be made there (click's own check sees only the path).
    unusable = start(bookies, cluster, "b2-file", a_file / "bookie")
    assert unusable.process.wait(timeout=TIMEOUT_SECONDS) == 2
    assert "cannot run" in unusable.log_text()

    assert bookie.stop(signal.SIGTERM) == 0
    stopped = record_of(cluster, "b2")
    assert stopped is not None and not stopped.writable  # said at once, not aged out

    restarted = start(bookies, cluster, "b2", data_dir)
    record = wait_registered(cluster, restarted)
    assert read_all(record.address, 0) == [b"entry-0"]
    assert restarted.stop(signal.SIGTERM) == 0
