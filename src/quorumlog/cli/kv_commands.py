"""`quorumlog kv|status|member|leader`: the KV and cluster commands (etcdctl is the model).

Every command takes `--endpoints` (comma-separated host:port; else $QUORUMLOG_ENDPOINTS;
else the cluster `quorumlog dev up` started in this directory, else 127.0.0.1:2379),
`--cluster-id` (else $QUORUMLOG_CLUSTER_ID, else "quorumlog") and `--timeout` seconds.
`quorumlog dev up` prints the `export QUORUMLOG_ENDPOINTS=...` line for its cluster.

Errors from the cluster (`QuorumLogError`) reach `main()`, which prints one line and
exits 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec

from quorumlog.cli.credentials import USER_OPTIONS, user_and_password
from quorumlog.cli.defaults import default_endpoints
from quorumlog.cli.tls_options import CLIENT_TLS_OPTIONS, client_tls
from quorumlog.errors import QuorumLogError
from quorumlog.kv.client import KVClient
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT, Member, parse_endpoint, parse_endpoints
from quorumlog.tls.config import TLSConfig

TIMEOUT_SECONDS_DEFAULT = 5.0
STATUS_COLUMNS = [
    "endpoint",
    "id",
    "is leader",
    "term",
    "commit index",
    "applied index",
    "last index",
    "errors",
    "cluster level",
]

Command = TypeVar("Command", bound=Callable[..., Any])


class ClientSettings(msgspec.Struct, frozen=True):
    endpoints: list[str]
    cluster_id: str
    timeout_seconds: float
    user: str | None = None
    password: str | None = None
    tls: TLSConfig | None = None

    def client(self) -> KVClient:
        return KVClient(
            self.endpoints,
            timeout=self.timeout_seconds,
            cluster_id=self.cluster_id,
            user=self.user,
            password=self.password,
            tls=self.tls,
        )


def endpoints_callback(context: click.Context, parameter: click.Parameter, value: str) -> list[str]:
    try:
        return parse_endpoints(value)
    except ValueError as error:
        raise click.BadParameter(str(error), context, parameter) from error


def client_options(command: Command) -> Command:
    """Add --endpoints, --cluster-id and --timeout; the command receives `settings`."""

    def build(
        endpoints: list[str],
        cluster_id: str,
        timeout_seconds: float,
        tls_cacert: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        skip_hostname_check: bool,
        **arguments: Any,
    ) -> Any:
        user, password = user_and_password(arguments)
        tls = client_tls(tls_cacert, tls_cert, tls_key, skip_hostname_check)
        settings = ClientSettings(endpoints, cluster_id, timeout_seconds, user, password, tls)
        return command(settings=settings, **arguments)

    build.__name__ = command.__name__
    build.__doc__ = command.__doc__
    decorated: Any = build
    for option in (
        *USER_OPTIONS,
        click.option(
            "--timeout",
            "timeout_seconds",
            type=click.FloatRange(min=0.001),
            default=TIMEOUT_SECONDS_DEFAULT,
            show_default=True,
            help="Seconds to keep trying before giving up.",
        ),
        click.option(
            "--cluster-id",
            envvar="QUORUMLOG_CLUSTER_ID",
            default=CLUSTER_ID_DEFAULT,
            show_default=True,
            help="The cluster to talk to (nodes refuse other ids).  [env: QUORUMLOG_CLUSTER_ID]",
        ),
        click.option(
            "--endpoints",
            envvar="QUORUMLOG_ENDPOINTS",
            default=default_endpoints,
            show_default="the dev cluster started here, else 127.0.0.1:2379",
            callback=endpoints_callback,
            help="Comma-separated host:port of the nodes.  [env: QUORUMLOG_ENDPOINTS]",
        ),
        *CLIENT_TLS_OPTIONS,
    ):
        decorated = option(decorated)
    result: Command = decorated
    return result


def output_option(command: Command) -> Command:
    decorated: Command = click.option(
        "-w",
        "--write-out",
        "write_out",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Output format.",
    )(command)
    return decorated


# --- kv --------------------------------------------------------------------------------


@click.group("kv")
def kv_group() -> None:
    """Read and write keys (linearizable unless --stale)."""


@kv_group.command("put")
@click.argument("key")
@click.argument("value")
@client_options
def kv_put(settings: ClientSettings, key: str, value: str) -> None:
    """Set KEY to VALUE."""
    with settings.client() as client:
        client.put(key, value)
    click.echo("OK")


@kv_group.command("get")
@click.argument("key")
@click.argument("end", required=False)
@click.option("--stale", is_flag=True, help="Let any node answer from its state (may be old).")
@click.option("--prefix", is_flag=True, help="Every key starting with KEY.")
@click.option("--from-key", is_flag=True, help="Every key from KEY on.")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most this many keys.")
@click.option("--keys-only", is_flag=True, help="Keys without their values.")
@click.option("--rev", "revision", type=click.IntRange(min=0), default=0, help="At this revision.")
@click.option("-w", "--write-out", "write_out", type=click.Choice(["simple", "json"]), default=None)
@client_options
def kv_get(
    settings: ClientSettings,
    key: str,
    end: str | None,
    stale: bool,
    prefix: bool,
    from_key: bool,
    limit: int,
    keys_only: bool,
    revision: int,
    write_out: str | None,
) -> None:
    """Print the value of KEY (nothing if it is missing); with END or a range option, the
    keys in [KEY, END) as etcdctl prints them (key line, value line)."""
    if end is None and not (prefix or from_key or limit or keys_only or revision or write_out):
        with settings.client() as client:
            value = client.get(key, stale=stale)
        if value is not None:
            click.echo(value)
        return
    from quorumlog.cli.kv_v3_commands import get_range

    get_range(
        settings,
        key,
        end,
        prefix,
        from_key,
        limit,
        keys_only,
        revision,
        write_out or "simple",
        stale,
    )


@kv_group.command("append")
@click.argument("key")
@click.argument("value")
@client_options
def kv_append(settings: ClientSettings, key: str, value: str) -> None:
    """Append VALUE to KEY (creating it if missing)."""
    with settings.client() as client:
        client.append(key, value)
    click.echo("OK")


@kv_group.command("del")
@click.argument("key")
@click.argument("end", required=False)
@click.option("--prefix", is_flag=True, help="Every key starting with KEY.")
@click.option("--from-key", is_flag=True, help="Every key from KEY on.")
@client_options
def kv_delete(
    settings: ClientSettings, key: str, end: str | None, prefix: bool, from_key: bool
) -> None:
    """Delete KEY (or the keys in [KEY, END), or the prefix); print how many keys were
    deleted, as etcdctl does."""
    if end is not None or prefix or from_key:
        from quorumlog.cli.kv_v3_commands import delete_range

        delete_range(settings, key, end, prefix, from_key)
        return
    with settings.client() as client:
        result = client.write("delete", key, None, None)
    click.echo("1" if result.value is not None else "0")


# --- status ----------------------------------------------------------------------------


def status_rows(settings: ClientSettings) -> list[dict[str, Any]]:
    """One row per endpoint; an endpoint that does not answer is a row with its error."""
    rows: list[dict[str, Any]] = []
    with settings.client() as client:
        for endpoint in settings.endpoints:
            try:
                status = client.status(endpoint)
            except QuorumLogError as error:
                rows.append({"endpoint": endpoint, "errors": [str(error)]})
                continue
            row = msgspec.to_builtins(status)
            del row["request_id"], row["type"]
            rows.append({"endpoint": endpoint, **row})
    return rows


def status_cells(row: dict[str, Any]) -> list[str]:
    if "node_id" not in row:
        return [row["endpoint"], "", "", "", "", "", "", "; ".join(row["errors"]), ""]
    return [
        row["endpoint"],
        row["node_id"],
        "true" if row["is_leader"] else "false",
        str(row["term"]),
        str(row["commit_index"]),
        str(row["applied_index"]),
        str(row["last_index"]),
        "; ".join(row["errors"]),
        # The feature level the node knows its cluster committed (0: a node before it).
        str(row.get("cluster_level", 0)),
    ]


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*(column.upper() for column in columns), show_lines=False)
    for cells in rows:
        table.add_row(*cells)
    console = Console(highlight=False)
    if not console.is_terminal:
        # Piped or captured: do not squeeze the columns into 80 characters.
        console = Console(highlight=False, width=200)
    console.print(table)


@click.command("status")
@output_option
@client_options
def status_command(settings: ClientSettings, write_out: str) -> None:
    """Ask every endpoint for its view: id, leadership, term, log indexes and the cluster's
    feature level (an alias of `quorumlog endpoint status`).

    Exits 1 if any endpoint did not answer (after printing every row)."""
    report_status(settings, write_out)


def report_status(settings: ClientSettings, write_out: str) -> None:
    rows = status_rows(settings)
    if write_out == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        print_table(STATUS_COLUMNS, [status_cells(row) for row in rows])
    failed = sum(1 for row in rows if "node_id" not in row)
    if failed:
        raise QuorumLogError(f"{failed} of {len(rows)} endpoints did not answer")


# --- members ---------------------------------------------------------------------------


@click.group("member")
def member_group() -> None:
    """List and change the members of the group."""


@member_group.command("list")
@output_option
@client_options
def member_list(settings: ClientSettings, write_out: str) -> None:
    """The members as the leader sees them."""
    with settings.client() as client:
        members = client.member_list()
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(members), indent=2))
        return
    print_table(["id", "address", "role", "is leader"], [member_cells(m) for m in members])


def member_cells(member: Member) -> list[str]:
    return [
        member.node_id,
        member.address or "",
        member.role,
        "true" if member.is_leader else "false",
    ]


@member_group.command("add")
@click.argument("node_id", metavar="ID")
@click.argument("address")
@click.option("--learner", is_flag=True, help="Add as a learner (no vote) to promote later.")
@client_options
def member_add(settings: ClientSettings, node_id: str, address: str, learner: bool) -> None:
    """Add node ID, listening at ADDRESS (host:port)."""
    try:
        parse_endpoint(address)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="ADDRESS") from error
    with settings.client() as client:
        detail = client.member_add(node_id, address, learner=learner)
    click.echo(detail or f"added {node_id} as a {'learner' if learner else 'voter'}")


@member_group.command("remove")
@click.argument("node_id", metavar="ID")
@client_options
def member_remove(settings: ClientSettings, node_id: str) -> None:
    """Remove node ID from the group."""
    with settings.client() as client:
        detail = client.member_remove(node_id)
    click.echo(detail or f"removed {node_id}")


@member_group.command("promote")
@click.argument("node_id", metavar="ID")
@client_options
def member_promote(settings: ClientSettings, node_id: str) -> None:
    """Make learner ID a voter."""
    with settings.client() as client:
        detail = client.member_promote(node_id)
    click.echo(detail or f"promoted {node_id}")


# --- leader ----------------------------------------------------------------------------


@click.group("leader")
def leader_group() -> None:
    """Leadership of the group."""


@leader_group.command("transfer")
@click.argument("node_id", metavar="ID")
@client_options
def leader_transfer(settings: ClientSettings, node_id: str) -> None:
    """Hand leadership to node ID."""
    with settings.client() as client:
        detail = client.transfer_leader(node_id)
    click.echo(detail or f"transferring leadership to {node_id}")


COMMANDS = [kv_group, status_command, member_group, leader_group]
