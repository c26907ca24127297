"""`quorumlog bookie` (a bookie-only process) and `quorumlog bookie list` (the registrations).

    quorumlog bookie --id b1 --listen 127.0.0.1:3181 --data-dir ./b1 --metadata 127.0.0.1:2379
    quorumlog bookie list -w json

Every `quorumlog node` hosts a bookie already (unless `--no-bookie`); a bookie-only process
adds storage without adding members to the metadata group, as BookKeeper deployments do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from quorumlog.cli.config_file import ConfiguredGroup
from quorumlog.cli.kv_commands import ClientSettings, client_options, output_option, print_table
from quorumlog.cli.tls_options import node_tls_options
from quorumlog.errors import QuorumLogError
from quorumlog.kv.connection import parse_endpoints
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.registry import (
    BOOKIE_HEARTBEAT_SECONDS,
    BOOKIE_PREFIX,
    BookieRecord,
    decode_bookie_record,
    is_live,
)
from quorumlog.tls.config import NodeTLS

if TYPE_CHECKING:
    from quorumlog.node.bookie_process import BookieProcessSettings

BOOKIE_COLUMNS = ["id", "address", "writable", "ledgers", "journal size", "heartbeat age"]
EXIT_FAILED = 70
"""A bookie stopped by an unexpected error (as `quorumlog node`)."""
EXIT_CANNOT_RUN = 2
"""A bookie that cannot start: its data directory is locked or unreadable."""


@click.group("bookie", cls=ConfiguredGroup, invoke_without_command=True)
@click.option("--id", "bookie_id", help="This bookie's id (unique among bookies and nodes).")
@click.option("--listen", help="HOST:PORT to serve the bookie protocol on.")
@click.option("--data-dir", type=click.Path(file_okay=False))
@click.option("--metadata", help="The metadata group's nodes: HOST:PORT,HOST:PORT,...")
@click.option("--cluster-id", default="quorumlog", envvar="QUORUMLOG_CLUSTER_ID", show_default=True)
@click.option(
    "--advertise", default="", help="HOST:PORT clients should use, if not --listen (NAT)."
)
@click.option(
    "--heartbeat-ms",
    default=int(BOOKIE_HEARTBEAT_SECONDS * 1000),
    show_default=True,
    type=click.IntRange(10, 60_000),
    help="How often the bookie rewrites its registration.",
)
@click.option(
    "--garbage-interval-ms",
    default=300_000,
    show_default=True,
    type=click.IntRange(1),
    help="How often the bookie drops the ledgers it stores whose metadata is gone.",
)
@click.pass_context
@node_tls_options
def bookie_group(
    context: click.Context,
    bookie_id: str | None,
    listen: str | None,
    data_dir: str | None,
    metadata: str | None,
    cluster_id: str,
    advertise: str,
    heartbeat_ms: int,
    garbage_interval_ms: int,
    node_tls: NodeTLS,
) -> None:
    """Run a bookie-only process in the foreground (SIGTERM stops it cleanly), or list the
    registered bookies (`quorumlog bookie list`)."""
    if context.invoked_subcommand is not None:
        return
    if not (bookie_id and listen and data_dir and metadata):
        given = {"--id": bookie_id, "--listen": listen, "--data-dir": data_dir}
        missing = [name for name, value in {**given, "--metadata": metadata}.items() if not value]
        raise click.UsageError(
            f"running a bookie needs {', '.join(missing)} (or: quorumlog bookie list)", context
        )
    try:
        endpoints = parse_endpoints(metadata)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--metadata") from error
    from quorumlog.node.bookie_process import BookieProcessSettings

    settings = BookieProcessSettings(
        bookie_id=bookie_id,
        listen=listen,
        data_dir=data_dir,
        metadata=endpoints,
        cluster_id=cluster_id,
        advertise=advertise,
        heartbeat_ms=heartbeat_ms,
        garbage_interval_ms=garbage_interval_ms,
        tls=node_tls,
    )
    run_bookie_process(settings)


def run_bookie_process(settings: BookieProcessSettings) -> None:
    """Run until SIGTERM/SIGINT; exit 0 after closing, 2 if it cannot start, 70 on a bug."""
    from quorumlog.node.bookie_process import run_bookie
    from quorumlog.node.server import NodeFailedError

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {settings.bookie_id} %(name)s %(levelname)s %(message)s",
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signal_number, stop.set)
        await run_bookie(settings, stop)

    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency; for odd platforms
            asyncio.run(main())
        else:
            uvloop.run(main())
    except NodeFailedError as error:
        click.echo(f"error: bookie {settings.bookie_id} stopped: {error}", err=True)
        sys.exit(EXIT_FAILED)
    except (QuorumLogError, OSError) as error:
        # A locked, unreadable or non-directory data dir, or a listen address in use.
        click.echo(f"error: bookie {settings.bookie_id} cannot run: {error}", err=True)
        sys.exit(EXIT_CANNOT_RUN)


# --- list ------------------------------------------------------------------------------


def bookie_rows(settings: ClientSettings, now_ms: int) -> list[dict[str, Any]]:
    """One row per registration, in id order; a registration that does not decode (written
    by a newer release, say) is a row with only its id and `error`."""
    with settings.client() as client:
        items = InternalKeys(client).scan_prefix(BOOKIE_PREFIX)
    rows: list[dict[str, Any]] = []
    for key, value in items:
        record = decode_bookie_record(value)
        if record is None:
            rows.append({"id": key.removeprefix(BOOKIE_PREFIX), "error": "unreadable record"})
            continue
        rows.append(bookie_row(record, now_ms))
    return rows


def bookie_row(record: BookieRecord, now_ms: int) -> dict[str, Any]:
    live = is_live(record, now_ms)
    return {
        "id": record.bookie_id,
        "address": record.address,
        "writable": record.writable and live,
        "live": live,
        "ledgers": record.ledgers,
        "journal_bytes": record.journal_bytes,
        "heartbeat_age_seconds": round((now_ms - record.heartbeat_ms) / 1000, 3),
    }


def bookie_cells(row: dict[str, Any]) -> list[str]:
    if "error" in row:
        return [row["id"], "", "", "", "", row["error"]]
    writable = "true" if row["writable"] else ("false" if row["live"] else "false (expired)")
    return [
        row["id"],
        row["address"],
        writable,
        str(row["ledgers"]),
        byte_size(row["journal_bytes"]),
        f"{row['heartbeat_age_seconds']:.1f}s",
    ]


def byte_size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop returns at GiB


@bookie_group.command("list")
@output_option
@client_options
def bookie_list(settings: ClientSettings, write_out: str) -> None:
    """The registered bookies: id, address, writable (live and taking writes), ledgers,
    journal size and the age of the last heartbeat (by this machine's clock)."""
    rows = bookie_rows(settings, int(time.time() * 1000))
    if write_out == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    print_table(BOOKIE_COLUMNS, [bookie_cells(row) for row in rows])
