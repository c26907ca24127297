"""`quorumlog shard join|leave|move|query|status|put|get|watch`: the sharded KV from the shell.

`--endpoints` names nodes of the shard controller group (else $QUORUMLOG_ENDPOINTS, else
the cluster `quorumlog dev up` started in this directory); the groups' own addresses come
from the controller's configuration. Errors print as one line (see `cli.main`).
"""

from __future__ import annotations

import json
from typing import Any

import click
import msgspec

from quorumlog.cli.kv_commands import ClientSettings, client_options, output_option, print_table
from quorumlog.cli.kv_v3_commands import print_event
from quorumlog.errors import QuorumLogError
from quorumlog.kv.connection import parse_endpoint
from quorumlog.shard.admin import ShardAdmin, ShardClusterStatus
from quorumlog.shard.client import ShardedKVClient
from quorumlog.shard.config import ShardConfiguration

STATUS_COLUMNS = ["shard", "group", "state", "leader"]


def admin_for(settings: ClientSettings) -> ShardAdmin:
    return ShardAdmin(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
    )


def client_for(settings: ClientSettings) -> ShardedKVClient:
    return ShardedKVClient(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
    )


def parse_servers(text: str) -> list[str]:
    """Comma-separated servers, each a node id or "host:port"; ValueError if malformed."""
    servers = [part.strip() for part in text.split(",") if part.strip()]
    if not servers:
        raise ValueError("no servers given")
    for server in servers:
        if ":" in server:
            parse_endpoint(server)
    return servers


def parse_group(text: str) -> tuple[int, list[str]]:
    """GID=SERVER,SERVER → (gid, servers), each server a node id (which the cluster keeps
    resolving to where that node listens now) or HOST:PORT; click.BadParameter if
    malformed."""
    gid_text, separator, servers_text = text.partition("=")
    if not separator or not gid_text.strip().isdigit() or int(gid_text) <= 0:
        raise click.BadParameter(f"{text!r} is not GID=ID|HOST:PORT,...", param_hint="GROUP")
    try:
        servers = parse_servers(servers_text)
    except ValueError as error:
        raise click.BadParameter(f"{text!r}: {error}", param_hint="GROUP") from error
    return int(gid_text), servers


def parse_groups(values: tuple[str, ...]) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for value in values:
        gid, servers = parse_group(value)
        if gid in groups:
            raise click.BadParameter(f"group {gid} given twice", param_hint="GROUP")
        groups[gid] = servers
    return groups


def configuration_json(configuration: ShardConfiguration) -> dict[str, Any]:
    """JSON keys are strings: groups as {"1": [...]}, shards as a list indexed by shard."""
    return {
        "number": configuration.number,
        "shards": list(configuration.shards),
        "groups": {str(gid): servers for gid, servers in configuration.groups.items()},
    }


def status_json(status: ShardClusterStatus) -> dict[str, Any]:
    return {
        "configuration": configuration_json(status.configuration),
        "shards": msgspec.to_builtins(status.rows()),
        "groups": msgspec.to_builtins(status.groups, str_keys=True),
    }


@click.group("shard")
def shard_group() -> None:
    """The sharded KV: groups joining and leaving, shard moves, configurations, status."""


@shard_group.command("join")
@click.argument("groups", nargs=-1, required=True, metavar="GID=ID|HOST:PORT,... ...")
@client_options
def shard_join(settings: ClientSettings, groups: tuple[str, ...]) -> None:
    """Add shard groups (each with its servers); shards are rebalanced onto them.

    Name servers by node id (1=n1,n2,n3) where you can: an id follows its node to a new
    address, a HOST:PORT does not."""
    parsed = parse_groups(groups)
    with admin_for(settings) as admin:
        number = admin.join(parsed)
    click.echo(f"joined groups {', '.join(map(str, sorted(parsed)))}: configuration {number}")


@shard_group.command("leave")
@click.argument("gids", nargs=-1, required=True, type=click.IntRange(min=1), metavar="GID...")
@client_options
def shard_leave(settings: ClientSettings, gids: tuple[int, ...]) -> None:
    """Remove shard groups; their shards go to the groups that stay."""
    with admin_for(settings) as admin:
        number = admin.leave(list(gids))
    click.echo(f"groups {', '.join(map(str, gids))} left: configuration {number}")


@shard_group.command("move")
@click.argument("shard", type=click.IntRange(min=0))
@click.argument("gid", type=click.IntRange(min=1))
@client_options
def shard_move(settings: ClientSettings, shard: int, gid: int) -> None:
    """Give SHARD to group GID (until the next join or leave rebalances)."""
    with admin_for(settings) as admin:
        number = admin.move(shard, gid)
    click.echo(f"shard {shard} moves to group {gid}: configuration {number}")


@shard_group.command("query")
@click.argument("number", type=click.IntRange(min=-1), default=-1)
@output_option
@client_options
def shard_query(settings: ClientSettings, number: int, write_out: str) -> None:
    """Print configuration NUMBER (default: the latest): shard owners and group servers."""
    with admin_for(settings) as admin:
        configuration = admin.query(number)
    if write_out == "json":
        click.echo(json.dumps(configuration_json(configuration), indent=2))
        return
    click.echo(f"configuration {configuration.number}")
    print_table(
        ["shard", "group"],
        [[str(shard), str(gid)] for shard, gid in enumerate(configuration.shards)],
    )
    print_table(
        ["group", "servers"],
        [[str(gid), ",".join(servers)] for gid, servers in configuration.groups.items()],
    )


@shard_group.command("status")
@output_option
@client_options
def shard_status(settings: ClientSettings, write_out: str) -> None:
    """Every shard: the group holding it, its state there and that group's leader.

    A shard on its way between groups has a row for each of them. Exits 1 if a group had
    no replica answering (after printing everything)."""
    with admin_for(settings) as admin:
        status = admin.status()
    if write_out == "json":
        click.echo(json.dumps(status_json(status), indent=2))
    else:
        click.echo(f"configuration {status.configuration.number}")
        rows = [
            [str(row.shard), str(row.gid), row.state, row.leader or ""] for row in status.rows()
        ]
        print_table(STATUS_COLUMNS, rows)
        for group in status.groups:
            for error in group.errors:
                click.echo(f"group {group.gid}: {error}", err=True)
    silent = [group.gid for group in status.groups if group.configuration_number is None]
    if silent:
        raise QuorumLogError(f"no replica of groups {silent} answered")


@shard_group.command("put")
@click.argument("key")
@click.argument("value")
@client_options
def shard_put(settings: ClientSettings, key: str, value: str) -> None:
    """Set KEY to VALUE in the group owning KEY's shard."""
    with client_for(settings) as client:
        client.put(key, value)
    click.echo("OK")


@shard_group.command("get")
@click.argument("key")
@click.option("--stale", is_flag=True, help="Let any replica answer from its state (may be old).")
@client_options
def shard_get(settings: ClientSettings, key: str, stale: bool) -> None:
    """Print the value of KEY (nothing if it is missing)."""
    with client_for(settings) as client:
        value = client.get(key, stale=stale)
    if value is not None:
        click.echo(value)


@shard_group.command("watch")
@click.argument("key")
@click.option("--prefix", is_flag=True, help="Watch the keys starting with KEY (needs --shard).")
@click.option(
    "--shard",
    type=click.IntRange(min=0),
    default=None,
    help="The shard to watch (revisions are per shard); default: KEY's shard.",
)
@click.option(
    "--rev",
    "revision",
    type=click.IntRange(min=0),
    default=0,
    help="From this revision of the shard.",
)
@click.option(
    "--max-events",
    type=click.IntRange(min=0),
    default=0,
    help="Stop after this many events (0: watch until interrupted).",
)
@client_options
def shard_watch(
    settings: ClientSettings,
    key: str,
    prefix: bool,
    shard: int | None,
    revision: int,
    max_events: int,
) -> None:
    """Print changes of KEY (or the prefix, in one shard) as they happen: type, key, value."""
    with client_for(settings) as client:
        try:
            watch = client.watch(key, prefix=prefix, start_revision=revision, shard=shard)
        except ValueError as error:  # a prefix without --shard, or a shard out of range
            raise click.UsageError(str(error)) from error
        with watch:
            for count, event in enumerate(watch, start=1):
                print_event(event)
                if count == max_events:
                    return


COMMANDS = [shard_group]
