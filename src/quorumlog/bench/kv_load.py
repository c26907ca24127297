"""One load process of `quorumlog bench kv`: puts through `AsyncKVClient` in a timed window.

    python -m quorumlog.bench.kv_load --endpoints 127.0.0.1:4001,... --seconds 5 \
        --concurrency 1000

Closed loop (the default): `--concurrency` coroutines each put, wait for the answer, put
again; the client batches what they issue in one loop turn into one `KVWrite` and pipelines
those on one connection. Paced (`--rate N`): one put is started every 1/N s whatever the
answers do (open loop), so a slow answer cannot slow the offered load down.

Start: once connected (one put answered) the process prints `{"ready":true}` and reads one
line `{"start_at": T}` from stdin, so the driver starts every load process together however
slowly each came up. The window is [T, T + seconds) on the system-wide monotonic clock,
which every process on the machine shares; the load begins on reading the line, so the
time until T fills the pipelines. A put counts if it is answered inside the window; its
latency is recorded if it also started there. The process prints one JSON line (see
`LoadResult`) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from quorumlog.errors import ClientError
from quorumlog.kv.async_client import AsyncKVClient
from quorumlog.tls.config import TLSConfig

HISTOGRAM_BUCKETS_PER_E = 200
"""Buckets per factor of e in latency: neighbouring bounds differ by 0.5 %."""
KEY_SPACE_DEFAULT = 10_000
VALUE_BYTES_DEFAULT = 100


class LatencyHistogram:
    """Counts of latencies in logarithmic buckets: cheap to fill, exact to merge."""

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    def record(self, seconds: float) -> None:
        microseconds = max(seconds * 1e6, 1.0)
        bucket = int(math.log(microseconds) * HISTOGRAM_BUCKETS_PER_E)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1

    def merge(self, other: LatencyHistogram) -> None:
        for bucket, count in other.counts.items():
            self.counts[bucket] = self.counts.get(bucket, 0) + count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile_ms(self, fraction: float) -> float | None:
        """The latency below which `fraction` of the recorded ones fall (bucket top)."""
        total = self.total
        if total == 0:
            return None
        rank = max(1, math.ceil(fraction * total))
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return round(math.exp((bucket + 1) / HISTOGRAM_BUCKETS_PER_E) / 1000, 3)
        raise AssertionError("rank beyond the total")  # unreachable: rank <= total


class LoadResult(msgspec.Struct):
    ops: int
    """Puts answered inside the window."""
    errors: int
    seconds: float
    histogram: dict[int, int]
    """Latency bucket -> count (see `LatencyHistogram`)."""
    started: int = 0
    """Paced runs: puts started inside the window."""


class Window:
    def __init__(self, start: float, seconds: float) -> None:
        self.start = start
        self.end = start + seconds


class LoadCounters:
    def __init__(self) -> None:
        self.ops = 0
        self.errors = 0
        self.started = 0
        self.histogram = LatencyHistogram()

    def finished(self, window: Window, started: float, error: bool) -> None:
        finished = time.monotonic()
        if not window.start <= finished < window.end:
            return
        if error:
            self.errors += 1
            return
        self.ops += 1
        if started >= window.start:
            self.histogram.record(finished - started)


async def closed_loop(
    client: AsyncKVClient,
    worker: int,
    value: str,
    key_space: int,
    window: Window,
    counters: LoadCounters,
) -> None:
    number = worker
    while True:
        started = time.monotonic()
        if started >= window.end:
            return
        key = f"key-{number % key_space}"
        number += 7919  # a prime stride: workers walk the key space without colliding
        try:
            await client.put(key, value)
        except ClientError:
            counters.finished(window, started, error=True)
            continue
        counters.finished(window, started, error=False)


async def one_paced_put(
    client: AsyncKVClient, key: str, value: str, window: Window, counters: LoadCounters
) -> None:
    started = time.monotonic()
    try:
        await client.put(key, value)
    except ClientError:
        counters.finished(window, started, error=True)
        return
    counters.finished(window, started, error=False)


async def paced(
    client: AsyncKVClient,
    rate: float,
    value: str,
    key_space: int,
    window: Window,
    counters: LoadCounters,
    warm_up_start: float,
) -> None:
    interval = 1.0 / rate
    next_at = warm_up_start
    number = 0
    running: set[asyncio.Task[None]] = set()
    while next_at < window.end:
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if window.start <= next_at:
            counters.started += 1
        task = asyncio.create_task(
            one_paced_put(client, f"key-{number % key_space}", value, window, counters)
        )
        running.add(task)
        task.add_done_callback(running.discard)
        number += 1
        next_at += interval
    if running:
        await asyncio.wait(running)


READY_LINE = b'{"ready":true}\n'
"""Printed once the process can start its load at once (connected, leader found)."""


class StartSignal(msgspec.Struct):
    start_at: float
    """Where the window starts on time.monotonic(); the load begins as soon as it is read."""


def announce_ready() -> None:
    sys.stdout.buffer.write(READY_LINE)
    sys.stdout.flush()


def read_start_at(line: bytes) -> float:
    if not line:
        raise SystemExit("no start signal: stdin closed")
    return msgspec.json.decode(line, type=StartSignal).start_at


async def read_start_signal() -> float:
    """Announce readiness, then read the window's start from stdin."""
    announce_ready()
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.readline)
    return read_start_at(line)


async def wait_for_start(arguments: argparse.Namespace) -> float:
    """The window's start: --start-at if given, else announce readiness and read it."""
    if arguments.start_at is not None:
        return float(arguments.start_at)
    return await read_start_signal()


async def run_load(arguments: argparse.Namespace) -> LoadResult:
    endpoints = arguments.endpoints.split(",")
    value = "v" * arguments.value_bytes
    counters = LoadCounters()
    async with AsyncKVClient(
        endpoints,
        timeout=10.0,
        cluster_id=arguments.cluster_id,
        client_id=f"bench-{arguments.client_number}-{time.time_ns()}",
        tls=load_tls(arguments),
    ) as client:
        # One put first: connects, finds the leader, and fails fast if the cluster is down.
        await client.put("warm-up", value)
        window = Window(await wait_for_start(arguments), arguments.seconds)
        if arguments.rate > 0:
            warm_up_start = min(time.monotonic(), window.start)
            await paced(
                client, arguments.rate, value, arguments.key_space, window, counters, warm_up_start
            )
        else:
            workers = [
                closed_loop(client, worker, value, arguments.key_space, window, counters)
                for worker in range(arguments.concurrency)
            ]
            await asyncio.gather(*workers)
    return LoadResult(
        ops=counters.ops,
        errors=counters.errors,
        seconds=arguments.seconds,
        histogram=counters.histogram.counts,
        started=counters.started,
    )


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--cluster-id", default="quorumlog")
    parser.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="time.monotonic() value; default: print a ready line, read the start on stdin",
    )
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.0, help="puts/s; 0: closed loop")
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES_DEFAULT)
    parser.add_argument("--key-space", type=int, default=KEY_SPACE_DEFAULT)
    parser.add_argument("--client-number", type=int, default=0)
    parser.add_argument("--cacert", default=None, help="talk TLS, trusting this CA")
    parser.add_argument("--cert", default=None, help="with --cacert: the client certificate")
    parser.add_argument("--key", default=None, help="with --cacert: its key")
    return parser.parse_args(argv)


def load_tls(arguments: argparse.Namespace) -> TLSConfig | None:
    if arguments.cacert is None:
        return None
    return TLSConfig(ca_file=arguments.cacert, cert_file=arguments.cert, key_file=arguments.key)


def run_and_print(load: Callable[[], Coroutine[Any, Any, msgspec.Struct]]) -> None:
    """Run `load()` on uvloop (asyncio where uvloop is missing) and print its result as
    one JSON line: the last line a load process writes."""
    try:
        import uvloop

        result = uvloop.run(load())
    except ImportError:  # pragma: no cover - uvloop is a dependency; for odd platforms
        result = asyncio.run(load())
    sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    run_and_print(lambda: run_load(arguments))


if __name__ == "__main__":
    main()
