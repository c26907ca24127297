"""`quorumlog ledger list|metadata|read|recover|delete`: ledgers on bookies, as the
BookKeeper shell shows them (listledgers, ledgermetadata, readledger, recover, deleteledger).

The endpoints are the metadata group's nodes (`--endpoints`, as for the KV commands);
bookie addresses come from their registrations there. `read` opens the ledger without
recovery (it never fences a live writer) and reads up to the LAC the bookies report;
`recover` fences and closes it, as a new owner would.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import click
import msgspec

from quorumlog.cli.credentials import without_password_option
from quorumlog.cli.kv_commands import ClientSettings, client_options, output_option, print_table
from quorumlog.errors import LedgerNotFoundError
from quorumlog.ledger.client import LedgerClient, LedgerEntry, LedgerInfo

PREVIEW_CHARACTERS = 60
"""Characters of an entry's data a table shows."""


def ledger_client(settings: ClientSettings) -> LedgerClient:
    return LedgerClient(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
    )


def password_option(command: Any) -> Any:
    return click.option(
        "--password",
        default="",
        envvar="QUORUMLOG_LEDGER_PASSWORD",
        help="The ledger's password (UTF-8).  [env: QUORUMLOG_LEDGER_PASSWORD]",
    )(without_password_option(command))


def info_cells(info: LedgerInfo) -> list[str]:
    fragments = "; ".join(
        f"{first}: {','.join(bookies)}" for first, bookies in sorted(info.ensembles.items())
    )
    return [
        str(info.ledger_id),
        info.state,
        f"{info.ensemble_size}/{info.write_quorum_size}/{info.ack_quorum_size}",
        str(info.last_entry_id) if info.state == "CLOSED" else "-",
        str(info.length) if info.state == "CLOSED" else "-",
        str(info.version),
        fragments,
    ]


INFO_COLUMNS = ["id", "state", "E/Qw/Qa", "last entry", "length", "version", "ensembles"]


def print_infos(infos: list[LedgerInfo], write_out: str) -> None:
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(infos), indent=2))
    else:
        print_table(INFO_COLUMNS, [info_cells(info) for info in infos])


def entry_json(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "entry_id": entry.entry_id,
        "size": len(entry.data),
        "data": entry.data.decode("utf-8", errors="backslashreplace"),
        "data_base64": base64.b64encode(entry.data).decode("ascii"),
    }


@click.group("ledger")
def ledger_group() -> None:
    """List, inspect, read, recover and delete ledgers."""


@ledger_group.command("list")
@output_option
@client_options
def ledger_list(settings: ClientSettings, write_out: str) -> None:
    """Every ledger with its state, quorum sizes and ensembles."""
    with ledger_client(settings) as client:
        infos = []
        for ledger_id in client.list_ledgers():
            try:
                infos.append(client.ledger_metadata(ledger_id))
            except LedgerNotFoundError:
                continue  # deleted since the listing: not a ledger any more
    print_infos(infos, write_out)


@ledger_group.command("metadata")
@click.argument("ledger_id", type=click.IntRange(min=0))
@output_option
@client_options
def ledger_metadata(settings: ClientSettings, ledger_id: int, write_out: str) -> None:
    """One ledger's metadata."""
    with ledger_client(settings) as client:
        info = client.ledger_metadata(ledger_id)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(info), indent=2))
    else:
        print_infos([info], write_out)


@ledger_group.command("read")
@click.argument("ledger_id", type=click.IntRange(min=0))
@click.option("--first", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--last", type=click.IntRange(min=0), default=None, help="Default: the LAC.")
@password_option
@output_option
@client_options
def ledger_read(
    settings: ClientSettings,
    ledger_id: int,
    first: int,
    last: int | None,
    password: str,
    write_out: str,
) -> None:
    """Entries FIRST..LAST of a ledger, without recovering it."""
    with ledger_client(settings) as client:
        handle = client.open_ledger(ledger_id, password.encode(), recovery=False)
        end = handle.last_add_confirmed if last is None else last
        entries = handle.read(first, end) if end >= first else []
    if write_out == "json":
        click.echo(json.dumps([entry_json(entry) for entry in entries], indent=2))
        return
    rows = [
        [
            str(entry.entry_id),
            str(len(entry.data)),
            repr(entry.data[:PREVIEW_CHARACTERS])[2:-1],
        ]
        for entry in entries
    ]
    print_table(["entry", "size", "data"], rows)


@ledger_group.command("recover")
@click.argument("ledger_id", type=click.IntRange(min=0))
@password_option
@output_option
@client_options
def ledger_recover(settings: ClientSettings, ledger_id: int, password: str, write_out: str) -> None:
    """Fence, recover and close a ledger (its writer can add nothing more)."""
    with ledger_client(settings) as client:
        client.open_ledger(ledger_id, password.encode(), recovery=True)
        info = client.ledger_metadata(ledger_id)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(info), indent=2))
    else:
        click.echo(f"ledger {ledger_id} closed at entry {info.last_entry_id}")


@ledger_group.command("delete")
@click.argument("ledger_id", type=click.IntRange(min=0))
@client_options
def ledger_delete(settings: ClientSettings, ledger_id: int) -> None:
    """Delete a ledger: its metadata, then its entries on the bookies."""
    with ledger_client(settings) as client:
        client.delete_ledger(ledger_id)
    click.echo(f"deleted ledger {ledger_id}")


COMMANDS = [ledger_group]
