"""Bookie adds per second through `Bookie.handle` with fsync on, no network.

    python -m quorumlog.bench.bookie [--quick] [--dir DIR]

What it answers: is the bookie's storage (validation, encoding, the write, the index, group
commit) fast enough that it is not what bounds ledger writes? The issue's target is 150,000
adds/s at 100 B with E=3, Qw=2, Qa=2 on 5 bookies, which asks each bookie for about
150,000 * 2 / 5 = 60,000 adds/s; on this 2-core machine a bookie shares its core with a node.

Cases, one JSON line each (figures, never pass or fail):

- `add-<bytes>-x<entries>`: AddEntries requests of `entries` entries of `bytes` bytes, spread
  over 8 ledgers, on an asyncio loop with the fsync on a worker thread (the node's setup:
  `ExecutorBackground`), up to 16,384 entries outstanding, 8 requests per loop turn.
  adds_per_s counts entries whose result came back OK (so each is durable);
  latency_ms_p50/p99 are per request, from `handle` to its result; adds_per_fsync shows
  the group commit at work.
- `codec-<bytes>-x<entries>`: microseconds per entry to decode those AddEntries frames
  from bytes and encode their results, which a bookie behind a socket pays on top.
- `recovery-read-100`: entries per second read back with ReadEntries of up to 1,000
  entries, as ledger recovery reads (the 1M-entry recovery target needs the bookies of a
  ledger to serve it within 5 s).
- `open-100`: seconds to reopen the storage the 100-byte run left (replay and index).

The last line is a summary object with the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from quorumlog.codec import wire
from quorumlog.ledger.bookie import Bookie, BookieResponse
from quorumlog.ledger.bookie_storage import BookieStorage
from quorumlog.runtime.group import ExecutorBackground

LEDGERS = 8
ENTRIES_OUTSTANDING_MAX = 16_384
"""The clients' window: entries sent and not yet acknowledged, over all ledgers."""
REQUESTS_PER_TURN = 8
"""Requests handled per turn of the event loop, as a socket read delivers a few frames:
the loop turns between them, so a sync starts while more requests keep coming."""
MASTER_KEY = b"bench-master-key"


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line, sort_keys=True), flush=True)


class AddDriver:
    """Keeps ENTRIES_OUTSTANDING_MAX entries in flight against one bookie."""

    def __init__(self, bookie: Bookie, entry_bytes: int, entries_per_request: int) -> None:
        self.bookie = bookie
        self.data = os.urandom(entry_bytes)
        self.entries_per_request = entries_per_request
        self.next_entry_ids = [0] * LEDGERS
        self.outstanding = 0
        self.adds_acknowledged = 0
        self.latencies_seconds: list[float] = []
        self.failures = 0
        self.room = asyncio.Event()
        self.request_id = 0

    def send(self) -> None:
        ledger = self.request_id % LEDGERS
        self.request_id += 1
        first = self.next_entry_ids[ledger]
        self.next_entry_ids[ledger] = first + self.entries_per_request
        data = self.data
        entries = [
            wire.LedgerEntryData(entry_id, data)
            for entry_id in range(first, first + self.entries_per_request)
        ]
        request = wire.AddEntries(self.request_id, ledger + 1, MASTER_KEY, first - 1, entries)
        started = time.perf_counter()
        self.outstanding += 1

        def done(response: BookieResponse) -> None:
            self.outstanding -= 1
            self.latencies_seconds.append(time.perf_counter() - started)
            if (
                isinstance(response, wire.AddEntriesResult)
                and response.status is wire.BookieStatus.OK
            ):
                self.adds_acknowledged += len(response.entry_ids)
            else:
                self.failures += 1
            self.room.set()

        self.bookie.handle(request, done)

    async def run(self, duration_seconds: float) -> float:
        started = time.perf_counter()
        deadline = started + duration_seconds
        window_requests = max(ENTRIES_OUTSTANDING_MAX // self.entries_per_request, 1)
        while time.perf_counter() < deadline:
            if self.outstanding >= window_requests:
                self.room.clear()
                await self.room.wait()
                continue
            for _ in range(min(REQUESTS_PER_TURN, window_requests - self.outstanding)):
                self.send()
            await asyncio.sleep(0)
        while self.outstanding:
            self.room.clear()
            await self.room.wait()
        return time.perf_counter() - started


async def add_case(
    directory: Path, entry_bytes: int, entries_per_request: int, duration_seconds: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    storage = BookieStorage.open(directory)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bookie-sync") as executor:
        bookie = Bookie(storage, ExecutorBackground(executor, loop), loop.call_soon)
        driver = AddDriver(bookie, entry_bytes, entries_per_request)
        elapsed_seconds = await driver.run(duration_seconds)
        syncs = bookie.syncs_completed
    storage.close()
    latencies = sorted(driver.latencies_seconds)
    adds = driver.adds_acknowledged
    return {
        "case": f"add-{entry_bytes}-x{entries_per_request}",
        "entry_bytes": entry_bytes,
        "entries_per_request": entries_per_request,
        "adds_per_s": round(adds / elapsed_seconds),
        "mb_per_s": round(adds * entry_bytes / elapsed_seconds / 1e6, 1),
        "fsyncs": syncs,
        "adds_per_fsync": round(adds / max(syncs, 1), 1),
        "latency_ms_p50": round(latencies[len(latencies) // 2] * 1e3, 2),
        "latency_ms_p99": round(latencies[int(len(latencies) * 0.99)] * 1e3, 2),
        "failures": driver.failures,
        "seconds": round(elapsed_seconds, 2),
    }


def codec_case(entry_bytes: int, entries_per_request: int, requests: int) -> dict[str, Any]:
    data = os.urandom(entry_bytes)
    entries = [wire.LedgerEntryData(i, data) for i in range(entries_per_request)]
    payload = wire.encode(wire.AddEntries(1, 1, MASTER_KEY, -1, entries))
    result = wire.AddEntriesResult(1, 1, wire.BookieStatus.OK, list(range(entries_per_request)))
    started = time.perf_counter()
    for _ in range(requests):
        wire.decode(payload)
        wire.encode(result)
    elapsed_seconds = time.perf_counter() - started
    return {
        "case": f"codec-{entry_bytes}-x{entries_per_request}",
        "microseconds_per_entry": round(
            elapsed_seconds / (requests * entries_per_request) * 1e6, 3
        ),
    }


def read_case(directory: Path, entries_per_read: int) -> dict[str, Any]:
    """Read every entry of the ledgers the 100-byte add case wrote."""
    storage = BookieStorage.open(directory)
    bookie = Bookie(storage, _NoBackground(), _run_now)
    entries_read = 0
    responses: list[BookieResponse] = []
    started = time.perf_counter()
    for ledger_id in storage.ledger_ids():
        state = storage.ledger(ledger_id)
        last = state.last_entry_id if state is not None else -1
        first = 0
        while first <= last:
            bookie.handle(
                wire.ReadEntries(0, ledger_id, first, min(first + entries_per_read - 1, last)),
                responses.append,
            )
            response = responses.pop()
            if not isinstance(response, wire.ReadEntriesResult):
                raise RuntimeError(f"read failed: {response}")
            entries_read += len(response.entries)
            first += max(len(response.entries), 1)
    elapsed_seconds = time.perf_counter() - started
    storage.close()
    return {
        "case": "recovery-read-100",
        "entries_per_read": entries_per_read,
        "entries_read": entries_read,
        "entries_per_s": round(entries_read / elapsed_seconds),
    }


def open_case(directory: Path) -> dict[str, Any]:
    started = time.perf_counter()
    storage = BookieStorage.open(directory)
    elapsed_seconds = time.perf_counter() - started
    result = {
        "case": "open-100",
        "entries": storage.recovery.entries_found,
        "log_bytes": storage.bytes_on_disk,
        "seconds": round(elapsed_seconds, 3),
    }
    storage.close()
    return result


class _NoBackground:
    def submit(self, job: Any, done: Any) -> None:
        job()
        done(None)


def _run_now(callback: Any) -> None:
    callback()


def run_bookie_benchmark(directory: str | None, quick: bool) -> None:
    duration_seconds = 1.0 if quick else 4.0
    batch_sizes = [16, 128] if quick else [1, 16, 128]
    summary: dict[str, Any] = {"case": "summary", "load_average": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="quorumlog-bench-bookie-", dir=directory) as root:
        for entry_bytes in (100, 4096):
            for entries_per_request in batch_sizes:
                work = Path(root) / f"add-{entry_bytes}-{entries_per_request}"
                line = asyncio.run(
                    add_case(work, entry_bytes, entries_per_request, duration_seconds)
                )
                emit(line)
                key = f"adds_per_s_{entry_bytes}_x{entries_per_request}"
                summary[key] = line["adds_per_s"]
                emit(codec_case(entry_bytes, entries_per_request, 200 if quick else 2000))
        last_100 = Path(root) / f"add-100-{batch_sizes[-1]}"
        read = read_case(last_100, 1000)
        emit(read)
        summary["recovery_read_entries_per_s"] = read["entries_per_s"]
        opened = open_case(last_100)
        emit(opened)
        summary["open_entries_per_s"] = round(opened["entries"] / max(opened["seconds"], 1e-9))
    summary["median_add_100"] = statistics.median(
        value for key, value in summary.items() if key.startswith("adds_per_s_100_")
    )
    emit(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    arguments = parser.parse_args()
    run_bookie_benchmark(arguments.dir, arguments.quick)


if __name__ == "__main__":
    main()
