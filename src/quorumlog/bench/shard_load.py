"""One load process of `quorumlog bench shard`: puts to chosen shards of the sharded KV.

    python -m quorumlog.bench.shard_load --endpoints 127.0.0.1:4001,... \
        --route 0=1,1=2,2=3 --shard-count 16 --seconds 5 --concurrency 1000

`--route` lists the shards to load and the group owning each (SHARD=GID,...); the
configuration does not change while this process runs on those shards, so routing is a
table look-up. The process opens one `AsyncKVClient` per group (group "shard-<gid>"), so
each group's puts are batched and pipelined to its own leader, and walks a fixed set of
keys per shard, chosen by their hash (`keys_for_shard`).

Closed loop by default (`--concurrency` puts in flight); `--rate N` starts N puts/s
whatever the answers do (open loop).

Start and window are those of `kv_load` (ready line, then `{"start_at": T}` on stdin).
With `--until-stdin-closes` the window also ends early when stdin closes, so the driver
can run the load for as long as something else (a migration) takes. Besides the totals
the result carries a timeline: puts answered per `--bucket-seconds` since the window's
start, so the driver can cut out the throughput of any stretch of it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import msgspec

from quorumlog.bench.kv_load import (
    LatencyHistogram,
    Window,
    read_start_signal,
    run_and_print,
)
from quorumlog.codec.wire import shard_group_name
from quorumlog.errors import ClientError
from quorumlog.kv.async_client import AsyncKVClient
from quorumlog.shard.config import shard_for_key

KEYS_PER_SHARD_DEFAULT = 64
BUCKET_SECONDS_DEFAULT = 0.05
CLIENT_TIMEOUT_SECONDS = 10.0
PACED_TICK_SECONDS = 0.002
"""Paced load: puts due are started in bursts this far apart (cheaper than a timer each)."""


def keys_for_shard(shard: int, shard_count: int, count: int, prefix: str = "key") -> list[str]:
    """The first `count` keys "<prefix>-<n>" that hash to `shard` (n = 0, 1, ...)."""
    keys: list[str] = []
    number = 0
    while len(keys) < count:
        key = f"{prefix}-{number}"
        if shard_for_key(key, shard_count) == shard:
            keys.append(key)
        number += 1
    return keys


def parse_route(text: str) -> dict[int, int]:
    """ "SHARD=GID,SHARD=GID" → shard → gid."""
    route: dict[int, int] = {}
    for item in text.split(","):
        shard, _, gid = item.partition("=")
        route[int(shard)] = int(gid)
    return route


def format_route(route: dict[int, int]) -> str:
    return ",".join(f"{shard}={gid}" for shard, gid in sorted(route.items()))


class ShardLoadResult(msgspec.Struct):
    ops: int
    """Puts answered inside the window."""
    errors: int
    seconds: float
    """The window's length (shorter than asked when stdin closed first)."""
    histogram: dict[int, int]
    """Latency bucket -> count (see `LatencyHistogram`)."""
    timeline: list[int]
    """Puts answered in each `bucket_seconds` from the window's start."""
    bucket_seconds: float


class Counters:
    def __init__(self, window: Window, bucket_seconds: float) -> None:
        self.window = window
        self.bucket_seconds = bucket_seconds
        self.ops = 0
        self.errors = 0
        self.histogram = LatencyHistogram()
        self.timeline: list[int] = []

    def finished(self, started: float, error: bool) -> None:
        finished = time.monotonic()
        window = self.window
        if not window.start <= finished < window.end:
            return
        if error:
            self.errors += 1
            return
        self.ops += 1
        bucket = int((finished - window.start) / self.bucket_seconds)
        if bucket >= len(self.timeline):
            self.timeline.extend([0] * (bucket + 1 - len(self.timeline)))
        self.timeline[bucket] += 1
        if started >= window.start:
            self.histogram.record(finished - started)


async def closed_loop(
    clients: dict[str, AsyncKVClient],
    keys: list[tuple[str, str]],
    worker: int,
    value: str,
    counters: Counters,
) -> None:
    """Put, wait for the answer, put the next key; `keys` holds (group, key) pairs."""
    number = worker
    window = counters.window
    while True:
        started = time.monotonic()
        if started >= window.end:
            return
        group, key = keys[number % len(keys)]
        number += 7919  # a prime stride: workers walk the keys without colliding
        try:
            await clients[group].put(key, value)
        except ClientError:
            counters.finished(started, error=True)
            continue
        counters.finished(started, error=False)


async def one_paced_put(
    client: AsyncKVClient, key: str, value: str, counters: Counters, started: float
) -> None:
    try:
        await client.put(key, value)
    except ClientError:
        counters.finished(started, error=True)
        return
    counters.finished(started, error=False)


async def paced(
    clients: dict[str, AsyncKVClient],
    keys: list[tuple[str, str]],
    rate: float,
    value: str,
    counters: Counters,
) -> None:
    """Start puts at `rate` per second from now until the window ends, whatever the answers
    do (open loop): a stall on the nodes shows as fewer answers, not as less offered load."""
    window = counters.window
    begun = time.monotonic()
    started_count = 0
    running: set[asyncio.Task[None]] = set()
    while (now := time.monotonic()) < window.end:
        due = int((now - begun) * rate)
        while started_count < due:
            group, key = keys[started_count % len(keys)]
            task = asyncio.create_task(one_paced_put(clients[group], key, value, counters, now))
            running.add(task)
            task.add_done_callback(running.discard)
            started_count += 1
        await asyncio.sleep(PACED_TICK_SECONDS)  # the pacing clock, not a wait for a condition
    if running:
        await asyncio.wait(running)


async def end_window_when_stdin_closes(window: Window) -> None:
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.buffer.readline):
        pass
    window.end = min(window.end, time.monotonic())


async def run_load(arguments: argparse.Namespace) -> ShardLoadResult:
    route = parse_route(arguments.route)
    value = "v" * arguments.value_bytes
    keys = [
        (shard_group_name(gid), key)
        for shard, gid in sorted(route.items())
        for key in keys_for_shard(shard, arguments.shard_count, arguments.keys_per_shard)
    ]
    clients = {
        shard_group_name(gid): AsyncKVClient(
            arguments.endpoints.split(","),
            timeout=CLIENT_TIMEOUT_SECONDS,
            cluster_id=arguments.cluster_id,
            client_id=f"bench-shard-{arguments.client_number}-{gid}-{time.time_ns()}",
            group=shard_group_name(gid),
        )
        for gid in sorted(set(route.values()))
    }
    try:
        # One put per group first: connects, finds each leader, fails fast if one is down.
        first_key = {group: key for group, key in reversed(keys)}  # each group's first key
        await asyncio.gather(*(clients[group].put(key, value) for group, key in first_key.items()))
        window = Window(await read_start_signal(), arguments.seconds)
        counters = Counters(window, arguments.bucket_seconds)
        watcher = (
            asyncio.create_task(end_window_when_stdin_closes(window))
            if arguments.until_stdin_closes
            else None
        )
        if arguments.rate > 0:
            await paced(clients, keys, arguments.rate, value, counters)
        else:
            await asyncio.gather(
                *(
                    closed_loop(clients, keys, worker, value, counters)
                    for worker in range(arguments.concurrency)
                )
            )
        if watcher is not None:
            watcher.cancel()
    finally:
        for client in clients.values():
            await client.close()
    return ShardLoadResult(
        ops=counters.ops,
        errors=counters.errors,
        seconds=max(window.end - window.start, 0.0),
        histogram=counters.histogram.counts,
        timeline=counters.timeline,
        bucket_seconds=arguments.bucket_seconds,
    )


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--cluster-id", default="quorumlog")
    parser.add_argument("--route", required=True, help="SHARD=GID,...: the shards to load")
    parser.add_argument("--shard-count", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True, help="the longest window")
    parser.add_argument("--until-stdin-closes", action="store_true")
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.0, help="puts/s; 0: closed loop")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--keys-per-shard", type=int, default=KEYS_PER_SHARD_DEFAULT)
    parser.add_argument("--bucket-seconds", type=float, default=BUCKET_SECONDS_DEFAULT)
    parser.add_argument("--client-number", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    run_and_print(lambda: run_load(arguments))


if __name__ == "__main__":
    main()
