"""The etcd v3-style KV commands (etcdctl is the model): ranges for `kv get` and `kv del`,
`kv txn`, `kv watch`, `kv compact` and `lease grant|revoke|timetolive|keep-alive`.

Output follows etcdctl's simple format (a key line, then a value line) or, with
`-w json`, one JSON object with the revision (`header.revision`), the keys with their
revisions, `count` and `more`. Values print as UTF-8 text (bytes that are not UTF-8 as
backslash escapes). Lease ids print and parse in decimal (etcdctl uses hexadecimal).
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any, TextIO

import click

from quorumlog.cli.kv_commands import ClientSettings, client_options, kv_group
from quorumlog.codec.kv_v3 import RANGE_END_ALL, KeyValue, WatchEvent
from quorumlog.kv.v3_client import CompareTuple, OperationTuple, RangeResult, TxnResult

COMPARE_LINE = re.compile(r'^(value|version|create|mod)\("(.*)"\)\s*(=|==|!=|<|>)\s*"(.*)"$')


def value_text(value: bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace")


def kv_json(kv: KeyValue) -> dict[str, Any]:
    # KeyValue is an array on the wire: name the fields here.
    return {
        "key": kv.key,
        "value": value_text(kv.value),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
    }


def print_kvs(kvs: list[KeyValue], keys_only: bool) -> None:
    for kv in kvs:
        click.echo(kv.key)
        if not keys_only:
            click.echo(value_text(kv.value))


def range_json(result: RangeResult) -> str:
    return json.dumps(
        {
            "header": {"revision": result.revision},
            "kvs": [kv_json(kv) for kv in result.kvs],
            "count": result.count,
            "more": result.more,
        },
        indent=2,
    )


def get_range(
    settings: ClientSettings,
    key: str,
    end: str | None,
    prefix: bool,
    from_key: bool,
    limit: int,
    keys_only: bool,
    revision: int,
    write_out: str,
    stale: bool,
) -> None:
    """`kv get` with any range option: the keys in range, etcdctl's way."""
    if from_key:
        end = RANGE_END_ALL
    with settings.client() as client:
        result = client.range(
            key,
            end,
            prefix=prefix,
            limit=limit,
            keys_only=keys_only,
            revision=revision,
            stale=stale,
        )
    if write_out == "json":
        click.echo(range_json(result))
    else:
        print_kvs(result.kvs, keys_only)


def delete_range(
    settings: ClientSettings, key: str, end: str | None, prefix: bool, from_key: bool
) -> None:
    with settings.client() as client:
        deleted = client.delete_range(key, RANGE_END_ALL if from_key else end, prefix=prefix)
    click.echo(str(deleted))


# --- kv txn ------------------------------------------------------------------------------


def parse_compare(line: str) -> CompareTuple:
    match = COMPARE_LINE.match(line.strip())
    if match is None:
        raise click.UsageError(f'bad compare {line!r}; e.g. value("key") = "v", mod("k") > "4"')
    target, key, operator, operand = match.groups()
    operator = "==" if operator in ("=", "==") else operator
    if target == "value":
        return (target, key, operator, operand)
    try:
        return (target, key, operator, int(operand))
    except ValueError as error:
        raise click.UsageError(f"{target} compares with a number, got {operand!r}") from error


def parse_operation(line: str) -> OperationTuple:
    words = line.split()
    if len(words) >= 3 and words[0] == "put":
        return ("put", words[1], line.split(None, 2)[2])
    if len(words) in (2, 3) and words[0] in ("get", "del"):
        kind = "get" if words[0] == "get" else "delete"
        return (kind, words[1], *words[2:])
    raise click.UsageError(f"bad request {line!r}; e.g. put k v, get k [end], del k [end]")


def read_section(stream: TextIO, prompt: str | None) -> list[str]:
    """Lines up to a blank line or the end of input."""
    if prompt is not None:
        click.echo(prompt, err=True)
    lines: list[str] = []
    for line in stream:
        if not line.strip():
            break
        lines.append(line.rstrip("\n"))
    return lines


def print_txn(result: TxnResult) -> None:
    click.echo("SUCCESS" if result.succeeded else "FAILURE")
    for response in result.responses:
        click.echo("")
        if isinstance(response, RangeResult):
            print_kvs(response.kvs, keys_only=False)
        elif isinstance(response, int):
            click.echo(str(response))
        else:
            click.echo("OK")


@kv_group.command("txn")
@click.option("-i", "--interactive", is_flag=True, help="Prompt for each section.")
@client_options
def kv_txn(settings: ClientSettings, interactive: bool) -> None:
    """Run a transaction read from stdin, in etcdctl's format: compares (one per line,
    e.g. `mod("key") > "4"`), a blank line, the requests on success (`put k v`, `get k
    [end]`, `del k [end]`), a blank line, the requests on failure."""
    stream = sys.stdin
    compares = [
        parse_compare(line) for line in read_section(stream, "compares:" if interactive else None)
    ]
    success = [
        parse_operation(line)
        for line in read_section(
            stream, "success requests (get, put, del):" if interactive else None
        )
    ]
    failure = [
        parse_operation(line)
        for line in read_section(
            stream, "failure requests (get, put, del):" if interactive else None
        )
    ]
    with settings.client() as client:
        print_txn(client.txn(compares, success, failure))


# --- kv watch, kv compact ---------------------------------------------------------------------


def print_event(event: WatchEvent) -> None:
    click.echo(event.type)
    click.echo(event.kv.key)
    if event.type == "PUT":
        click.echo(value_text(event.kv.value))


@kv_group.command("watch")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Watch every key starting with KEY.")
@click.option(
    "--rev", "revision", type=click.IntRange(min=0), default=0, help="From this revision."
)
@click.option(
    "--max-events",
    type=click.IntRange(min=0),
    default=0,
    help="Stop after this many events (0: watch until interrupted).",
)
@client_options
def kv_watch(
    settings: ClientSettings, key: str, prefix: bool, revision: int, max_events: int
) -> None:
    """Print changes of KEY (or the prefix) as they happen: type, key, value."""
    with (
        settings.client() as client,
        client.watch(key, prefix=prefix, start_revision=revision) as watch,
    ):
        for count, event in enumerate(watch, start=1):
            print_event(event)
            if count == max_events:
                return


@kv_group.command("compact")
@click.argument("revision", type=click.IntRange(min=1))
@client_options
def kv_compact(settings: ClientSettings, revision: int) -> None:
    """Free the history up to REVISION (reads and watches before it then fail)."""
    with settings.client() as client:
        client.compact(revision)
    click.echo(f"compacted revision {revision}")


# --- lease ---------------------------------------------------------------------------------


@click.group("lease")
def lease_group() -> None:
    """Leases: keys put with one vanish when it expires."""


@lease_group.command("grant")
@click.argument("ttl_seconds", metavar="TTL", type=click.IntRange(min=1))
@client_options
def lease_grant(settings: ClientSettings, ttl_seconds: int) -> None:
    """Grant a lease of TTL seconds."""
    with settings.client() as client:
        lease_id = client.lease_grant(ttl_seconds)
    click.echo(f"lease {lease_id} granted with TTL({ttl_seconds}s)")


@lease_group.command("revoke")
@click.argument("lease_id", metavar="ID", type=int)
@client_options
def lease_revoke(settings: ClientSettings, lease_id: int) -> None:
    """Revoke lease ID (its keys are deleted)."""
    with settings.client() as client:
        client.lease_revoke(lease_id)
    click.echo(f"lease {lease_id} revoked")


@lease_group.command("timetolive")
@click.argument("lease_id", metavar="ID", type=int)
@click.option("--keys", is_flag=True, help="Also list the keys attached.")
@client_options
def lease_timetolive(settings: ClientSettings, lease_id: int, keys: bool) -> None:
    """How long lease ID has left."""
    with settings.client() as client:
        answer = client.lease_time_to_live(lease_id, keys=keys)
    if answer.ttl_seconds < 0:
        click.echo(f"lease {lease_id} already expired")
        return
    line = (
        f"lease {lease_id} granted with TTL({answer.granted_ttl_seconds}s), "
        f"remaining({answer.ttl_seconds}s)"
    )
    if keys:
        line += f", attached keys([{' '.join(answer.keys)}])"
    click.echo(line)


@lease_group.command("keep-alive")
@click.argument("lease_id", metavar="ID", type=int)
@click.option("--once", is_flag=True, help="Renew once and exit.")
@client_options
def lease_keep_alive(settings: ClientSettings, lease_id: int, once: bool) -> None:
    """Keep lease ID alive (renewing at a third of its TTL) until interrupted."""
    with settings.client() as client:
        while True:
            ttl_seconds = client.lease_keepalive(lease_id)
            click.echo(f"lease {lease_id} keepalived with TTL({ttl_seconds})")
            if once:
                return
            time.sleep(max(ttl_seconds / 3, 0.5))  # the renewal period


COMMANDS = [lease_group]
"""Registered at the top level; the `kv` subcommands join `kv_group` on import."""

__all__ = ["COMMANDS", "delete_range", "get_range"]
