"""One PySyncObj peer of `quorumlog bench kv`: the comparison cluster, same workload.

    python -m quorumlog.bench.kv_pysyncobj --self 127.0.0.1:5001 \
        --partners 127.0.0.1:5002,127.0.0.1:5003 --seconds 5 --concurrency 500 --leader-only

PySyncObj has no client protocol: a program calls `@replicated` methods on its own
`SyncObj`, and a follower forwards the call to the leader. So the load runs inside the peer
processes: each keeps `--concurrency` puts of `--value-bytes` values in flight (a new one
from each completion callback), and counts those committed and applied inside the window,
exactly as `kv_load` does for quorumlog (same `LoadResult` line on stdout). Its log lives
in memory (no journal file): that is PySyncObj's design, so it pays no fsync.

Start: as `kv_load`, once a leader is known the peer prints a ready line and reads the
window's start from stdin (ticking meanwhile, so the cluster stays up).

The peer ticks PySyncObj itself on the main thread (autoTick off), so no second thread
fights over the GIL.
"""

from __future__ import annotations

import argparse
import select
import sys
import time
from typing import Any

import msgspec
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated  # type: ignore[import-untyped]

from quorumlog.bench.kv_load import (
    KEY_SPACE_DEFAULT,
    VALUE_BYTES_DEFAULT,
    LatencyHistogram,
    LoadResult,
    announce_ready,
    read_start_at,
)

TICK_WAIT_SECONDS = 0.002
"""How long one tick may wait for socket events: short, so new puts go out promptly."""
SETTLE_SECONDS = 0.5
"""Ticking goes on this long after the window so the other peers' last puts can finish."""
READY_TIMEOUT_SECONDS = 20.0


class BenchStore(SyncObj):  # type: ignore[misc]
    """A replicated dict with one write: put."""

    def __init__(self, self_address: str, partners: list[str], configuration: Any) -> None:
        super().__init__(self_address, partners, configuration)
        self.data: dict[str, str] = {}

    @replicated  # type: ignore[untyped-decorator]
    def put(self, key: str, value: str) -> None:
        self.data[key] = value


class PeerLoad:
    """Keeps puts in flight and counts the completions inside the window."""

    def __init__(
        self, store: BenchStore, window_start: float, window_end: float, value: str
    ) -> None:
        self.store = store
        self.window_start = window_start
        self.window_end = window_end
        self.value = value
        self.in_flight = 0
        self.number = 0
        self.ops = 0
        self.errors = 0
        self.histogram = LatencyHistogram()

    def submit(self, key_space: int) -> None:
        started = time.monotonic()
        key = f"key-{self.number % key_space}"
        self.number += 1
        self.in_flight += 1

        def done(result: Any, error: Any) -> None:
            self.in_flight -= 1
            finished = time.monotonic()
            if not self.window_start <= finished < self.window_end:
                return
            if error != FAIL_REASON.SUCCESS:
                self.errors += 1
                return
            self.ops += 1
            if started >= self.window_start:
                self.histogram.record(finished - started)

        self.store.put(key, self.value, callback=done)


def wait_for_start(store: BenchStore, start_at: float | None) -> float:
    """--start-at if given; else announce readiness and tick until the start line comes."""
    if start_at is not None:
        return start_at
    announce_ready()
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sys.stdin], [], [], 0)
        if readable:
            return read_start_at(sys.stdin.buffer.readline())
        store.doTick(TICK_WAIT_SECONDS)
    raise SystemExit("pysyncobj peer: no start signal in time")


def run_peer(arguments: argparse.Namespace) -> LoadResult:
    partners = [address for address in arguments.partners.split(",") if address]
    configuration = SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=True,
        commandsWaitLeader=True,
        dynamicMembershipChange=False,
        # Peers start at about the same time; the default 5 s between attempts to reach a
        # peer that was not listening yet would only delay the start (not the figures).
        connectionRetryTime=0.2,
    )
    store = BenchStore(arguments.self_address, partners, configuration)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while store._getLeader() is None:
            if time.monotonic() > deadline:
                raise SystemExit("pysyncobj peer: no leader elected in time")
            store.doTick(TICK_WAIT_SECONDS)
        window_start = wait_for_start(store, arguments.start_at)
        window_end = window_start + arguments.seconds
        load = PeerLoad(store, window_start, window_end, "v" * arguments.value_bytes)
        drives = not arguments.leader_only or store._isLeader()
        while True:
            now = time.monotonic()
            if now >= window_end + SETTLE_SECONDS:
                break
            if drives and now < window_end:
                while load.in_flight < arguments.concurrency:
                    load.submit(arguments.key_space)
            store.doTick(TICK_WAIT_SECONDS)
    finally:
        store.destroy()
    return LoadResult(
        ops=load.ops,
        errors=load.errors,
        seconds=arguments.seconds,
        histogram=load.histogram.counts,
    )


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="One PySyncObj peer of quorumlog bench kv.")
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--partners", required=True)
    parser.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="time.monotonic() value; default: print a ready line, read the start on stdin",
    )
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=500, help="0: serve, drive nothing")
    parser.add_argument(
        "--leader-only", action="store_true", help="only the peer leading at the start drives"
    )
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES_DEFAULT)
    parser.add_argument("--key-space", type=int, default=KEY_SPACE_DEFAULT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    result = run_peer(parse_arguments(sys.argv[1:] if argv is None else argv))
    sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
