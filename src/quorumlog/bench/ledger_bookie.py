"""A bookie-only process for `quorumlog bench ledger`, for trees without `quorumlog bookie`.

    python -m quorumlog.bench.ledger_bookie --id b1 --listen 127.0.0.1:3181 \
        --data-dir DIR --metadata 127.0.0.1:2379 --cluster-id bench-ledger

It takes the flags of `quorumlog bookie` and does what the benchmark needs of one: a
`BookieServer` (journal fsync on) on its own listener, and its registration rewritten in the
metadata group every BOOKIE_HEARTBEAT_SECONDS from a daemon thread, so it stays writable for
as long as the benchmark runs. SIGTERM stops it. The benchmark prefers `quorumlog bookie`
wherever the command exists (bench/ledger_processes.py decides).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
import time

from quorumlog.errors import QuorumLogError
from quorumlog.kv.client import KVClient
from quorumlog.kv.connection import parse_endpoint, parse_endpoints
from quorumlog.ledger.bookie_server import BookieServer
from quorumlog.ledger.registry import (
    BOOKIE_HEARTBEAT_SECONDS,
    BookieRecord,
    bookie_key,
    encode_bookie_record,
)

log = logging.getLogger("quorumlog.bench.ledger_bookie")


def heartbeat(
    server: BookieServer, address: str, endpoints: list[str], cluster_id: str, stop: threading.Event
) -> None:
    """Rewrite the registration until `stop` is set (a failed write is tried next beat)."""
    with KVClient(endpoints, timeout=5.0, cluster_id=cluster_id) as kv:
        while not stop.is_set():
            record = BookieRecord(
                bookie_id=server.bookie_id,
                address=address,
                writable=server.writable,
                heartbeat_ms=int(time.time() * 1000),
            )
            try:
                kv.put(bookie_key(server.bookie_id), encode_bookie_record(record))
            except QuorumLogError as error:
                log.info("registration not written: %s", error)
            stop.wait(BOOKIE_HEARTBEAT_SECONDS)


async def serve(arguments: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stopping.set)
    host, port = parse_endpoint(arguments.listen)
    server = BookieServer(arguments.id, arguments.data_dir, loop)
    bound = await server.listen(host, port, arguments.cluster_id)
    stop = threading.Event()
    beat = threading.Thread(
        target=heartbeat,
        args=(
            server,
            f"{host}:{bound}",
            parse_endpoints(arguments.metadata),
            arguments.cluster_id,
            stop,
        ),
        name="bookie-heartbeat",
        daemon=True,
    )
    beat.start()
    try:
        await stopping.wait()
    finally:
        stop.set()
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--cluster-id", default="quorumlog")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; for odd platforms
        asyncio.run(serve(arguments))
    else:
        uvloop.run(serve(arguments))


if __name__ == "__main__":
    main()
