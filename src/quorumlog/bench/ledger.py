"""`quorumlog bench ledger`: ledger adds, latency, recovery and ledger-topic produce on a
real cluster (issue 11, "Benchmark").

    quorumlog bench ledger --json [--quick] [--dir DIR]

Setup: 3 `quorumlog node --no-bookie` processes run the metadata group and 5 `quorumlog
bookie` processes store the entries, all with fsync on, on loopback. The client is a
`LedgerClient` in this process: with the batch API it spends well under a microsecond of
CPU per 100-byte entry (reported below), so it is not what bounds the figures; the
bookies' CPU per entry is reported beside it.

Cases, one JSON object each:

- `adds-<bytes>-e<E>-w<Qw>-a<Qa>`: saturated throughput. `append_many_async` batches of
  BATCH_ENTRIES entries, as many as the handle takes (it blocks appends while it holds
  twice `pending_entries_max`: what its writer may have unacknowledged, and as many again
  queued behind it); adds_per_s counts entries
  acknowledged (Qa bookies fsynced them), from the first append to the last ack. For 100 B
  the same with one `append_async` per entry (`single_adds_per_s`): a future per entry is
  what that API costs.
- `latency-<bytes>-e<E>-w<Qw>-a<Qa>`: one `append_async` per entry at PACED_ADDS_PER_SECOND,
  whatever the answers do (open loop); p50/p99 of each append, call to ack.
- `recovery`: a ledger of RECOVERY_ENTRIES 100-byte entries (E=3, Qw=2, Qa=2) written and
  left open, as by a writer that died; a second client's `open_ledger(recovery=True)`
  (fence, read forward from the bookies' LAC, re-write, close) is timed alone. The line
  says where recovery started (the LAC the bookies had) and how many entries it read
  forward: recovery reads from the LAC on, so its time follows the unconfirmed tail (here
  the writer's whole pipeline), not the ledger's length.
- `produce`: records/s of one `Producer` to a one-partition topic stored in ledgers and to
  one stored in Raft (the `bench stream` produce path), on the same nodes. Until nodes
  serve ledger topics the ledger figure is null with a note saying so.

The last line sums it up (see SUMMARY in the smoke test). Figures, never pass or fail; the
machine's load average is in every line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from quorumlog.bench.kv_processes import cpu_seconds
from quorumlog.bench.ledger_processes import BookieProcesses, MetadataNodes
from quorumlog.kv.client import KVClient
from quorumlog.ledger.client import LedgerClient, WriteHandle
from quorumlog.ledger.metadata_kv import KVMetadataStore

CLUSTER_ID = "bench-ledger"
BOOKIE_COUNT = 5
PASSWORD = b"bench"
CONFIGURATIONS = [(3, 2, 2), (3, 3, 2)]
"""(ensemble, write quorum, ack quorum), as the issue asks."""
ENTRY_SIZES = [100, 4096]
BATCH_ENTRIES = 1000
"""Entries per `append_many_async` in the throughput cases."""
PACED_ADDS_PER_SECOND = 5000.0
PACE_TICK_SECONDS = 0.002
RECOVERY_ENTRIES = 1_000_000
RECOVERY_ENTRIES_QUICK = 20_000
PRODUCE_RECORDS = 300_000
PRODUCE_RECORDS_QUICK = 5_000


class Settings:
    def __init__(self, quick: bool, directory: str | None, as_json: bool) -> None:
        self.quick = quick
        self.directory = directory
        self.as_json = as_json
        self.seconds = 0.5 if quick else 5.0
        """Length of each throughput run."""
        self.single_seconds = 0.5 if quick else 3.0
        self.paced_seconds = 0.5 if quick else 3.0
        self.recovery_entries = RECOVERY_ENTRIES_QUICK if quick else RECOVERY_ENTRIES
        self.produce_records = PRODUCE_RECORDS_QUICK if quick else PRODUCE_RECORDS


def emit(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(line, sort_keys=True), flush=True)
    else:
        print("  ".join(f"{key}={value}" for key, value in line.items()), flush=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def percentile_ms(sorted_seconds: list[float], fraction: float) -> float | None:
    if not sorted_seconds:
        return None
    index = min(int(len(sorted_seconds) * fraction), len(sorted_seconds) - 1)
    return round(sorted_seconds[index] * 1e3, 2)


class CpuMeter:
    """CPU seconds used by this process (the client), the bookies and the metadata nodes
    while `measure` runs its work."""

    def __init__(self, bookie_pids: list[int], node_pids: list[int]) -> None:
        self.bookie_pids = bookie_pids
        self.node_pids = node_pids
        self.client_seconds = 0.0
        self.bookie_seconds = 0.0
        self.node_seconds = 0.0

    def read(self) -> tuple[float, float, float]:
        return (
            time.process_time(),
            sum(cpu_seconds(pid) for pid in self.bookie_pids),
            sum(cpu_seconds(pid) for pid in self.node_pids),
        )

    def measure(self, work: Callable[[], None]) -> None:
        client_before, bookies_before, nodes_before = self.read()
        work()
        client_after, bookies_after, nodes_after = self.read()
        self.client_seconds = client_after - client_before
        self.bookie_seconds = bookies_after - bookies_before
        self.node_seconds = nodes_after - nodes_before


# --- throughput -------------------------------------------------------------------------


def window_entries(handle: WriteHandle, entry_bytes: int) -> int:
    """Entries the loops keep unacknowledged: the writer's limit and a queue as deep behind
    it, so the writer always has the next entries at hand (a smaller window leaves the
    bookies idle while a round trip is out: in alternating runs at load 5, a window of
    100,000 gave 266-314k adds/s at 100 B, this one 353-360k). Large entries stop at the
    writer's byte limit instead, or the tail would take seconds to drain. The futures are
    the loops' only memory: every entry is the same bytes object."""
    config = handle.client.driver.config
    return min(2 * config.pending_entries_max, config.pending_bytes_max // entry_bytes)


def stream_batches(handle: WriteHandle, data: bytes, seconds: float) -> tuple[int, float]:
    """Append batches for `seconds` within the window; (entries acknowledged, elapsed)."""
    batch = [data] * BATCH_ENTRIES
    window_batches = max(window_entries(handle, len(data)) // BATCH_ENTRIES, 1)
    outstanding: deque[Future[int]] = deque()
    sent = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        if len(outstanding) >= window_batches:
            outstanding.popleft().result(timeout=60)
        outstanding.append(handle.append_many_async(batch))
        sent += BATCH_ENTRIES
    for future in outstanding:
        future.result(timeout=60)
    return sent, time.perf_counter() - started


def stream_singles(handle: WriteHandle, data: bytes, seconds: float) -> tuple[int, float]:
    """As stream_batches with one `append_async` (one future) per entry."""
    window = window_entries(handle, len(data))
    outstanding: deque[Future[int]] = deque()
    sent = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(BATCH_ENTRIES):
            if len(outstanding) >= window:
                outstanding.popleft().result(timeout=60)
            outstanding.append(handle.append_async(data))
        sent += BATCH_ENTRIES
    for future in outstanding:
        future.result(timeout=60)
    return sent, time.perf_counter() - started


def throughput_case(
    client: LedgerClient,
    pids: tuple[list[int], list[int]],
    entry_bytes: int,
    configuration: tuple[int, int, int],
    settings: Settings,
) -> dict[str, Any]:
    ensemble, write_quorum, ack_quorum = configuration
    data = os.urandom(entry_bytes)
    load = load_average()
    handle = client.create_ledger(ensemble, write_quorum, ack_quorum, PASSWORD)
    handle.append(data)  # connections open, the writer runs
    meter = CpuMeter(*pids)
    figures: dict[str, float] = {}

    def run() -> None:
        figures["adds"], figures["seconds"] = stream_batches(handle, data, settings.seconds)

    meter.measure(run)
    adds, seconds = int(figures["adds"]), figures["seconds"]
    line: dict[str, Any] = {
        "case": f"adds-{entry_bytes}-e{ensemble}-w{write_quorum}-a{ack_quorum}",
        "entry_bytes": entry_bytes,
        "ensemble": ensemble,
        "write_quorum": write_quorum,
        "ack_quorum": ack_quorum,
        "batch_entries": BATCH_ENTRIES,
        "adds": adds,
        "seconds": round(seconds, 3),
        "adds_per_s": round(adds / seconds),
        "mb_per_s": round(adds * entry_bytes / seconds / 1e6, 1),
        "client_cpu_us_per_add": round(meter.client_seconds / adds * 1e6, 2),
        "bookie_cpu_us_per_add": round(meter.bookie_seconds / adds * 1e6, 2),
        "metadata_node_cpu_us_per_add": round(meter.node_seconds / adds * 1e6, 2),
        "cores_used": round(
            (meter.client_seconds + meter.bookie_seconds + meter.node_seconds) / seconds, 2
        ),
        "load_average_at_start": load,
    }
    if entry_bytes == min(ENTRY_SIZES):
        singles, single_seconds = stream_singles(handle, data, settings.single_seconds)
        line["single_adds_per_s"] = round(singles / single_seconds)
    handle.close()
    client.delete_ledger(handle.ledger_id)
    return line


# --- latency ------------------------------------------------------------------------------


def paced_appends(handle: WriteHandle, data: bytes, seconds: float) -> list[float]:
    """One append_async per entry at PACED_ADDS_PER_SECOND for `seconds` (open loop: the
    schedule does not wait for answers); each append's seconds from call to ack, sorted."""
    latencies: list[float] = []
    futures: list[Future[int]] = []
    started = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) < started + seconds:
        due = int((now - started) * PACED_ADDS_PER_SECOND) + 1
        for _ in range(due - sent):
            futures.append(timed_append(handle, data, latencies))
        sent = due
        time.sleep(PACE_TICK_SECONDS)  # pacing the schedule, not waiting for an outcome
    for future in futures:
        future.result(timeout=60)
    return sorted(latencies)


def timed_append(handle: WriteHandle, data: bytes, latencies: list[float]) -> Future[int]:
    sent_at = time.perf_counter()
    future = handle.append_async(data)
    # Runs on the client's loop thread; list.append is atomic.
    future.add_done_callback(lambda _: latencies.append(time.perf_counter() - sent_at))
    return future


def latency_case(
    client: LedgerClient,
    entry_bytes: int,
    configuration: tuple[int, int, int],
    settings: Settings,
) -> dict[str, Any]:
    ensemble, write_quorum, ack_quorum = configuration
    load = load_average()
    with client.create_ledger(ensemble, write_quorum, ack_quorum, PASSWORD) as handle:
        handle.append(b"warm")
        latencies = paced_appends(handle, os.urandom(entry_bytes), settings.paced_seconds)
    client.delete_ledger(handle.ledger_id)
    return {
        "case": f"latency-{entry_bytes}-e{ensemble}-w{write_quorum}-a{ack_quorum}",
        "entry_bytes": entry_bytes,
        "adds_per_s_offered": PACED_ADDS_PER_SECOND,
        "adds": len(latencies),
        "p50_ms": percentile_ms(latencies, 0.50),
        "p99_ms": percentile_ms(latencies, 0.99),
        "max_ms": percentile_ms(latencies, 1.0),
        "load_average_at_start": load,
    }


# --- recovery -----------------------------------------------------------------------------


def recovery_case(endpoints: list[str], settings: Settings) -> dict[str, Any]:
    """Write a ledger and leave it open; time a second client's recovery of it."""
    entries = settings.recovery_entries
    data = os.urandom(100)
    with LedgerClient(endpoints, cluster_id=CLUSTER_ID) as writer_client:
        handle = writer_client.create_ledger(3, 2, 2, PASSWORD)
        batch = [data] * BATCH_ENTRIES
        futures = [handle.append_many_async(batch) for _ in range(entries // BATCH_ENTRIES)]
        for future in futures:
            future.result(timeout=120)
        written = handle.last_add_confirmed + 1
        ledger_id = handle.ledger_id
        # The writer now "dies": it never closes, so the ledger stays OPEN.
        with LedgerClient(endpoints, cluster_id=CLUSTER_ID) as recovering_client:
            lac_before = recovering_client.open_ledger(
                ledger_id, PASSWORD, recovery=False
            ).last_add_confirmed
            load = load_average()
            started = time.perf_counter()
            recovered = recovering_client.open_ledger(ledger_id, PASSWORD, recovery=True)
            seconds = time.perf_counter() - started
            recovering_client.delete_ledger(ledger_id)
    return {
        "case": "recovery",
        "entries_written": written,
        "entries_after_recovery": recovered.last_add_confirmed + 1,
        "bookie_lac_before": lac_before,
        "entries_read_forward": recovered.last_add_confirmed - lac_before,
        "recovery_seconds": round(seconds, 3),
        "load_average_at_start": load,
    }


# --- produce --------------------------------------------------------------------------------


def produce_case(endpoints: list[str], settings: Settings) -> dict[str, Any]:
    from quorumlog.bench.stream import create_topic, produce

    records = settings.produce_records
    load = load_average()
    create_topic(endpoints, "bench-raft-topic", 1, CLUSTER_ID)
    raft_rate = round(records / produce(endpoints, "bench-raft-topic", records, 1, CLUSTER_ID))
    ledger_rate = ledger_topic_produce_per_s(endpoints, records)
    line: dict[str, Any] = {
        "case": "produce",
        "records": records,
        "value_bytes": 100,
        "raft_topic_produce_per_s": raft_rate,
        "ledger_topic_produce_per_s": ledger_rate,
        "ratio_ledger_to_raft_produce": round(ledger_rate / raft_rate, 3),
        "load_average_at_start": load,
    }
    return line


def ledger_topic_produce_per_s(endpoints: list[str], records: int) -> int:
    """Records/s to a one-partition ledger topic (E=3, Qw=2, Qa=2) written by its owner node
    to the bench's bookies."""
    from quorumlog import Admin
    from quorumlog.bench.stream import produce

    admin = Admin(endpoints, cluster_id=CLUSTER_ID)
    try:
        admin.create_topic(
            "bench-ledger-topic",
            partitions=1,
            replication=3,
            storage="ledger",
            ensemble=3,
            write_quorum=2,
            ack_quorum=2,
        )
    finally:
        admin.close()
    return round(records / produce(endpoints, "bench-ledger-topic", records, 1, CLUSTER_ID))


# --- the run --------------------------------------------------------------------------------


def run_cases(
    endpoints: list[str], pids: tuple[list[int], list[int]], settings: Settings
) -> dict[str, Any]:
    """Every case in order; the summary. `pids`: the bookies' and the metadata nodes'."""
    summary: dict[str, Any] = {"case": "summary", "load_average": load_average()}
    with LedgerClient(endpoints, cluster_id=CLUSTER_ID) as client:
        for configuration in CONFIGURATIONS:
            suffix = "_".join(map(str, configuration))
            for entry_bytes in ENTRY_SIZES:
                line = throughput_case(client, pids, entry_bytes, configuration, settings)
                emit(line, settings.as_json)
                summary[f"adds_per_s_{entry_bytes}_{suffix}"] = line["adds_per_s"]
                if "single_adds_per_s" in line:
                    summary[f"single_adds_per_s_{entry_bytes}_{suffix}"] = line["single_adds_per_s"]
                paced = latency_case(client, entry_bytes, configuration, settings)
                emit(paced, settings.as_json)
                summary[f"p50_ms_{entry_bytes}_{suffix}"] = paced["p50_ms"]
                summary[f"p99_ms_{entry_bytes}_{suffix}"] = paced["p99_ms"]
    recovery = recovery_case(endpoints, settings)
    emit(recovery, settings.as_json)
    summary["recovery_entries"] = recovery["entries_written"]
    summary["recovery_seconds"] = recovery["recovery_seconds"]
    produced = produce_case(endpoints, settings)
    emit(produced, settings.as_json)
    for key in ("raft_topic_produce_per_s", "ledger_topic_produce_per_s"):
        summary[key] = produced[key]
    summary["ratio_ledger_to_raft_produce"] = produced["ratio_ledger_to_raft_produce"]
    return summary


def run_ledger_benchmark(as_json: bool, quick: bool, directory: str | None) -> None:
    settings = Settings(quick, directory, as_json)
    base = Path(tempfile.mkdtemp(prefix="quorumlog-bench-ledger-", dir=directory))
    nodes = MetadataNodes(base, 3, CLUSTER_ID)
    bookies = BookieProcesses(base, BOOKIE_COUNT, CLUSTER_ID, [])
    try:
        nodes.start()
        bookies.metadata_endpoints = nodes.endpoints
        with KVClient(nodes.endpoints, timeout=10.0, cluster_id=CLUSTER_ID) as kv:
            bookies.start(KVMetadataStore(kv))
        pids = (list(bookies.pids.values()), list(nodes.pids.values()))
        summary = run_cases(nodes.endpoints, pids, settings)
    finally:
        bookies.stop()
        nodes.stop()
        shutil.rmtree(base, ignore_errors=True)
    emit(summary, as_json)
