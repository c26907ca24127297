"""`quorumlog node` (one node in the foreground) and `quorumlog dev` (a local cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from quorumlog.cli.config_file import ConfiguredCommand
from quorumlog.cli.defaults import DEV_DIRECTORY_DEFAULT as DEFAULT_DEV_DIR
from quorumlog.cli.defaults import DEV_STATE_FILE
from quorumlog.cli.tls_options import node_tls_options
from quorumlog.errors import QuorumLogError
from quorumlog.obs.log_format import LOG_FORMATS, LOG_LEVELS, configure_logging
from quorumlog.tls.config import NodeTLS
from quorumlog.tls.dev import dev_tls, state_tls, tls_exports

STARTED_HERE: dict[int, subprocess.Popen[bytes]] = {}
"""Node processes this process started (kept, not dropped to the garbage collector, which
would warn that they still run; `stop_dev_cluster` reaps them)."""


def parse_peers(text: str) -> dict[str, str]:
    peers: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node_id, separator, address = item.partition("=")
        if not separator or not node_id or ":" not in address:
            raise click.BadParameter(f"{item!r} is not ID=HOST:PORT", param_hint="--peers")
        peers[node_id] = address
    return peers


def parse_shard_groups(values: tuple[str, ...]) -> dict[int, list[str]]:
    """GID=ID,ID,... per --shard-group option → gid → member node ids."""
    groups: dict[int, list[str]] = {}
    for value in values:
        gid_text, separator, members_text = value.partition("=")
        members = [member.strip() for member in members_text.split(",") if member.strip()]
        if not separator or not gid_text.strip().isdigit() or int(gid_text) <= 0 or not members:
            raise click.BadParameter(f"{value!r} is not GID=ID,ID,...", param_hint="--shard-group")
        if int(gid_text) in groups:
            raise click.BadParameter(f"group {gid_text} given twice", param_hint="--shard-group")
        groups[int(gid_text)] = members
    return groups


@click.command("node", cls=ConfiguredCommand)
@click.option("--id", "node_id", required=True, help="This node's id (unique in the cluster).")
@click.option("--listen", required=True, help="HOST:PORT to listen on for peers and clients.")
@click.option("--peers", default="", help="The other members: ID=HOST:PORT,ID=HOST:PORT,...")
@click.option(
    "--advertise",
    default="",
    help="HOST:PORT others should use to reach this node, if not --listen (NAT, proxies).",
)
@click.option("--data-dir", required=True, type=click.Path(file_okay=False))
@click.option("--cluster-id", default="quorumlog", envvar="QUORUMLOG_CLUSTER_ID", show_default=True)
@click.option("--join", is_flag=True, help="Start empty and wait to be added as a member.")
@click.option("--tick-ms", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--quiesce-idle-ticks",
    default=4,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="An idle Raft group goes quiet (no heartbeats, no ticks) after this many ticks; 0: never.",
)
@click.option("--no-fsync", is_flag=True, help="Do not fsync (tests only: loses data on crash).")
@click.option(
    "--snapshot-entries", default=20_000, show_default=True, type=click.IntRange(10, 10**9)
)
@click.option(
    "--controller",
    default="",
    help="Node ids of the shard controller group's members: ID,ID,... (sharded KV).",
)
@click.option(
    "--shard-group",
    "shard_groups",
    multiple=True,
    help="A shard group and its members' node ids: GID=ID,ID,... (repeat per group).",
)
@click.option("--shard-count", default=16, show_default=True, type=click.IntRange(1, 4096))
@click.option(
    "--shard-migration-mib-per-second",
    default=16.0,
    show_default=True,
    type=click.FloatRange(0),
    help="How fast this node pulls moving shards, all groups together (0: unthrottled).",
)
@click.option(
    "--shard-pull-kib",
    default=1024,
    show_default=True,
    type=click.IntRange(1, 16 * 1024),
    help="Shard data per pull chunk (one frame and one log entry).",
)
@click.option("--no-bookie", is_flag=True, help="Host no bookie (ledger storage) on this node.")
@click.option(
    "--ledger-owner-renew-ms",
    default=1_000,
    show_default=True,
    type=click.IntRange(10),
    help="Ledger topics: how often a partition owner renews its lease.",
)
@click.option(
    "--ledger-owner-stale-ms",
    default=3_000,
    show_default=True,
    type=click.IntRange(20),
    help="Ledger topics: an unrenewed lease is taken over after this long.",
)
@click.option(
    "--ledger-rollover-records",
    default=50_000,
    show_default=True,
    type=click.IntRange(1),
    help="Ledger topics: records per ledger before rolling over to a new one.",
)
@click.option(
    "--http-listen",
    default="",
    help="HOST:PORT for /metrics, /health, /readyz, /livez and the dashboard (default: off).",
)
@click.option("--log-format", default="text", show_default=True, type=click.Choice(LOG_FORMATS))
@click.option("--log-level", default="info", show_default=True, type=click.Choice(LOG_LEVELS))
@click.option(
    "--slow-fsync-warn-ms",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="Log a slow_fsync event when a log sync takes longer than this.",
)
@click.option(
    "--ledger-rollover-entries",
    default=None,
    type=click.IntRange(1),
    hidden=True,
    help="The old name of --ledger-rollover-records (it counted records then too).",
)
@click.option(
    "--auth-token-ttl-ms",
    default=300_000,
    show_default=True,
    type=click.IntRange(1),
    help="Auth: a client token unused this long is forgotten (the client authenticates again).",
)
@click.option(
    "--election-timeout-ms",
    type=click.IntRange(1),
    default=None,
    help="Time without a leader's word before a follower stands for election: a whole "
    "number of ticks, at least 5 heartbeat intervals (default: 10 ticks).",
)
@click.option(
    "--heartbeat-interval-ms",
    type=click.IntRange(1),
    default=None,
    help="How often a leader heartbeats: a whole number of ticks (default: one tick).",
)
@click.option(
    "--bookie-garbage-interval-ms",
    default=300_000,
    show_default=True,
    type=click.IntRange(1),
    help="Bookie: how often it drops the ledgers it stores whose metadata is gone.",
)
@click.option(
    "--ledger-sweep-interval-ms",
    default=300_000,
    show_default=True,
    type=click.IntRange(1),
    help="Ledger topics: how often the metadata leader sweeps deleted topics' ledgers, "
    "lists and leases, and live topics' orphan ledgers.",
)
@node_tls_options
def node_command(
    node_id: str,
    listen: str,
    peers: str,
    advertise: str,
    data_dir: str,
    cluster_id: str,
    join: bool,
    tick_ms: int,
    quiesce_idle_ticks: int,
    no_fsync: bool,
    snapshot_entries: int,
    controller: str,
    shard_groups: tuple[str, ...],
    shard_count: int,
    shard_migration_mib_per_second: float,
    shard_pull_kib: int,
    no_bookie: bool,
    ledger_owner_renew_ms: int,
    ledger_owner_stale_ms: int,
    ledger_rollover_records: int,
    ledger_rollover_entries: int | None,
    http_listen: str,
    log_format: str,
    log_level: str,
    slow_fsync_warn_ms: int,
    auth_token_ttl_ms: int,
    node_tls: NodeTLS,
    election_timeout_ms: int | None,
    heartbeat_interval_ms: int | None,
    bookie_garbage_interval_ms: int,
    ledger_sweep_interval_ms: int,
) -> None:
    """Run one node in the foreground; logs to stderr; SIGTERM stops it cleanly."""
    from quorumlog.node.gc_policy import apply_node_collector_policy
    from quorumlog.node.raft_timing import raft_timing
    from quorumlog.node.server import NodeFailedError, NodeSettings, run_node

    try:
        timing = raft_timing(tick_ms, election_timeout_ms, heartbeat_interval_ms)
    except ValueError as error:
        raise click.UsageError(str(error)) from error

    configure_logging(node_id, log_format, log_level)
    settings = NodeSettings(
        node_id=node_id,
        listen=listen,
        data_dir=data_dir,
        peers=parse_peers(peers),
        advertise=advertise,
        cluster_id=cluster_id,
        join=join,
        tick_ms=tick_ms,
        quiesce_idle_ticks=quiesce_idle_ticks,
        fsync=not no_fsync,
        snapshot_entries=snapshot_entries,
        snapshot_trailing_entries=min(5_000, snapshot_entries // 2),
        controller=[member.strip() for member in controller.split(",") if member.strip()],
        shard_groups=parse_shard_groups(shard_groups),
        shard_count=shard_count,
        shard_migration_bytes_per_second=int(shard_migration_mib_per_second * 1024 * 1024),
        shard_pull_bytes_max=shard_pull_kib * 1024,
        bookie=not no_bookie,
        ledger_owner_renew_ms=ledger_owner_renew_ms,
        ledger_owner_stale_ms=ledger_owner_stale_ms,
        ledger_rollover_records=ledger_rollover_entries or ledger_rollover_records,
        http_listen=http_listen,
        slow_fsync_warn_ms=slow_fsync_warn_ms,
        auth_token_ttl_ms=auth_token_ttl_ms,
        tls=node_tls,
        election_ticks=timing.election_ticks,
        heartbeat_ticks=timing.heartbeat_ticks,
        bookie_garbage_interval_ms=bookie_garbage_interval_ms,
        ledger_sweep_interval_ms=ledger_sweep_interval_ms,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signal_number, stop.set)
        await run_node(settings, stop, started=lambda node: apply_node_collector_policy())

    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency; for odd platforms
            asyncio.run(main())
        else:
            uvloop.run(main())
    except NodeFailedError as error:
        # Fail-stop: a violated invariant or a bug stopped the node; say why in one line.
        click.echo(f"error: node {node_id} stopped: {error}", err=True)
        sys.exit(70)
    except QuorumLogError as error:
        # A node that cannot start (its data directory is in use by another node, a log
        # is corrupt) says why in one line and exits non-zero.
        click.echo(f"error: node {node_id} cannot run: {error}", err=True)
        sys.exit(2)


# --- dev: a local cluster of background processes ---------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports the OS hands out now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            held = socket.socket()
            held.bind(("127.0.0.1", 0))
            sockets.append(held)
        return [held.getsockname()[1] for held in sockets]
    finally:
        for held in sockets:
            held.close()


def dev_state_path(directory: str) -> Path:
    return Path(directory) / DEV_STATE_FILE


def load_dev_state(directory: str) -> dict[str, object] | None:
    path = dev_state_path(directory)
    if not path.exists():
        return None
    state: dict[str, object] = json.loads(path.read_text())
    return state


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sharded_kv_arguments(node_ids: list[str], group_count: int) -> list[str]:
    """`quorumlog node` flags for a controller group and shard groups 1..G on every node."""
    if group_count == 0:
        return []
    members = ",".join(node_ids)
    arguments = ["--controller", members]
    for gid in range(1, group_count + 1):
        arguments += ["--shard-group", f"{gid}={members}"]
    return arguments


def start_dev_cluster(
    directory: str,
    nodes: int,
    cluster_id: str,
    extra_arguments: list[str] | None = None,
    group_count: int = 0,
    bookie_count: int = 0,
    tls: bool = False,
) -> dict[str, object]:
    """Start `nodes` node processes (each hosting a bookie) and `bookie_count` bookie-only
    processes ("bookie-1", ...) under `directory`; returns the state written there.

    Each start picks free ports anew, so a cluster brought down and up again listens on
    new addresses: every node gets all current addresses (`--peers`), which beat the old
    ones its logs still hold, and nodes announce their own on connecting.

    With `group_count`, every node hosts the shard controller and shard groups 1..G (not
    yet joined: see `join_dev_groups`); the state records the groups' servers by node id,
    which the cluster resolves to wherever the node listens now.

    With `tls`, a fresh CA and certificates go to `directory/tls` (tls/dev.py) and every
    process requires TLS of peers and clients; the state records the client's files."""
    base = Path(directory).resolve()
    base.mkdir(parents=True, exist_ok=True)
    existing = load_dev_state(str(base))
    running: dict[str, int] = existing["pids"] if existing else {}  # type: ignore[assignment]
    if any(process_alive(int(pid)) for pid in running.values()):
        raise QuorumLogError(
            f"a dev cluster is already running under {base}; `quorumlog dev down` first"
        )
    ports = free_ports(nodes + bookie_count + nodes)
    http_ports = ports[nodes + bookie_count :]
    ids = [f"n{i}" for i in range(1, nodes + 1)]
    addresses = {node_id: f"127.0.0.1:{port}" for node_id, port in zip(ids, ports, strict=False)}
    bookie_ids = [f"bookie-{i}" for i in range(1, bookie_count + 1)]
    bookies = {
        bookie_id: f"127.0.0.1:{port}"
        for bookie_id, port in zip(bookie_ids, ports[nodes : nodes + bookie_count], strict=True)
    }
    endpoints = ",".join(addresses.values())
    dashboards = {
        node_id: f"http://127.0.0.1:{port}/" for node_id, port in zip(ids, http_ports, strict=True)
    }
    secured = dev_tls(base) if tls else None
    tls_arguments = secured.node_arguments if secured is not None else []
    pids: dict[str, int] = {}
    for node_id in ids:
        peers = ",".join(f"{p}={a}" for p, a in addresses.items() if p != node_id)
        pids[node_id] = launch_dev_process(
            base,
            node_id,
            [
                "node",
                "--id",
                node_id,
                "--listen",
                addresses[node_id],
                "--peers",
                peers,
                "--data-dir",
                str(base / node_id),
                "--cluster-id",
                cluster_id,
                *sharded_kv_arguments(ids, group_count),
                *(extra_arguments or []),
                "--http-listen",
                dashboards[node_id].removeprefix("http://").rstrip("/"),
                *tls_arguments,
            ],
        )
    for bookie_id, address in bookies.items():
        pids[bookie_id] = launch_dev_process(
            base,
            bookie_id,
            [
                "bookie",
                "--id",
                bookie_id,
                "--listen",
                address,
                "--data-dir",
                str(base / bookie_id),
                "--metadata",
                endpoints,
                "--cluster-id",
                cluster_id,
                *tls_arguments,
            ],
        )
    state: dict[str, object] = {
        "directory": str(base),
        "cluster_id": cluster_id,
        "addresses": addresses,
        "bookies": bookies,
        "pids": pids,
        "endpoints": endpoints,
        "groups": {str(gid): list(ids) for gid in range(1, group_count + 1)},
        "dashboards": dashboards,
        "tls": secured.client_files if secured is not None else None,
    }
    dev_state_path(str(base)).write_text(json.dumps(state, indent=2))
    return state


def launch_dev_process(base: Path, name: str, arguments: list[str]) -> int:
    """Start `quorumlog ARGUMENTS` in the background, logging to `base/NAME.log`; its pid."""
    log_file = open(base / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", *arguments],
        stdout=log_file,
        stderr=log_file,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log_file.close()
    STARTED_HERE[process.pid] = process
    return process.pid


JOIN_TIMEOUT_SECONDS = 30.0
"""Long enough for fresh node processes to start and elect a controller leader."""


def join_dev_groups(state: dict[str, object]) -> tuple[int, bool]:
    """Join the dev cluster's shard groups through its controller: (the configuration
    number, whether anything joined). Groups that joined before (the cluster was brought
    down and up again over the same data) are left as they are: their servers are node
    ids, still right wherever the nodes listen now. The controller deduplicates the join,
    so a retry inside the client is safe."""
    from quorumlog.shard.admin import ShardAdmin

    groups: dict[str, list[str]] = state["groups"]  # type: ignore[assignment]
    endpoints = str(state["endpoints"]).split(",")
    with ShardAdmin(
        endpoints,
        timeout=JOIN_TIMEOUT_SECONDS,
        cluster_id=str(state["cluster_id"]),
        tls=state_tls(state),
    ) as admin:
        latest = admin.query()
        missing = {
            int(gid): servers for gid, servers in groups.items() if int(gid) not in latest.groups
        }
        if not missing:
            return latest.number, False
        return admin.join(missing), True


def stop_dev_cluster(directory: str, timeout_seconds: float = 10.0) -> list[str]:
    state = load_dev_state(directory)
    if state is None:
        return []
    try:
        return stop_processes(directory, state, timeout_seconds)
    finally:
        # Reap the children this process started, so none lingers as a zombie.
        pids_started: dict[str, int] = state["pids"]  # type: ignore[assignment]
        for pid in pids_started.values():
            child = STARTED_HERE.pop(pid, None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=timeout_seconds)


def stop_processes(directory: str, state: dict[str, object], timeout_seconds: float) -> list[str]:
    pids: dict[str, int] = state["pids"]  # type: ignore[assignment]
    for pid in pids.values():
        if process_alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_seconds
    for node_id, pid in pids.items():
        while process_alive(pid) and time.monotonic() < deadline:
            try:
                finished, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                finished = 0
                if not process_alive(pid):
                    break
            if finished:
                break
            time.sleep(0.05)
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)
            click.echo(f"{node_id} did not stop in {timeout_seconds}s; killed", err=True)
    dev_state_path(directory).unlink(missing_ok=True)
    return list(pids)


@click.group("dev")
def dev_group() -> None:
    """A local cluster of node processes under one data directory (the embedded default)."""


def wait_for_dev_bookies(state: dict[str, object], count: int) -> None:
    """Return once `count` bookies are registered and writable, so a ledger can be created
    the moment `dev up` returns (their first heartbeat needs an elected metadata group)."""
    from quorumlog.kv.client import KVClient
    from quorumlog.ledger.metadata_kv import KVMetadataStore

    endpoints = str(state["endpoints"]).split(",")
    deadline = time.monotonic() + JOIN_TIMEOUT_SECONDS
    with KVClient(
        endpoints,
        timeout=JOIN_TIMEOUT_SECONDS,
        cluster_id=str(state["cluster_id"]),
        tls=state_tls(state),
    ) as client:
        store = KVMetadataStore(client)
        while len(store.writable_bookies()) < count:
            if time.monotonic() >= deadline:
                raise QuorumLogError(
                    f"{len(store.writable_bookies())} of {count} bookies writable after "
                    f"{JOIN_TIMEOUT_SECONDS:.0f}s"
                )
            time.sleep(0.05)  # polling a registry that changes once per heartbeat


@dev_group.command("up")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 9))
@click.option(
    "--groups",
    "group_count",
    default=0,
    show_default=True,
    type=click.IntRange(0, 64),
    help="Shard groups 1..G (sharded KV), each on every node, with the controller group.",
)
@click.option(
    "--bookies",
    "bookie_count",
    default=0,
    show_default=True,
    type=click.IntRange(0, 16),
    help="Bookie-only processes (bookie-1..N) besides the bookie every node hosts.",
)
@click.option(
    "--dir", "directory", default=DEFAULT_DEV_DIR, show_default=True, envvar="QUORUMLOG_DEV_DIR"
)
@click.option("--cluster-id", default="quorumlog", envvar="QUORUMLOG_CLUSTER_ID")
@click.option(
    "--tls",
    is_flag=True,
    help="Make a throwaway CA and certificates under the directory; peers and clients "
    "must use TLS with a certificate (prints the exports that point the command at them).",
)
def dev_up(
    nodes: int, group_count: int, bookie_count: int, directory: str, cluster_id: str, tls: bool
) -> None:
    """Start the cluster in the background and print the endpoints.

    Every node hosts a bookie; --bookies N adds N bookie-only processes. With --groups G,
    every node also hosts the shard controller and shard groups 1..G, and the groups are
    joined through the controller, so `quorumlog shard put` works at once."""
    state = start_dev_cluster(
        directory,
        nodes,
        cluster_id,
        group_count=group_count,
        bookie_count=bookie_count,
        tls=tls,
    )
    bookies_started = f" and {bookie_count} bookies" if bookie_count else ""
    click.echo(f"started {nodes} nodes{bookies_started}; data and logs under {state['directory']}")
    try:
        wait_for_dev_bookies(state, nodes + bookie_count)
    except QuorumLogError as error:
        raise QuorumLogError(
            f"the nodes run but their bookies did not register ({error}); "
            f"`quorumlog dev down` stops them"
        ) from error
    if group_count:
        try:
            number, joined = join_dev_groups(state)
        except QuorumLogError as error:
            raise QuorumLogError(
                f"the nodes run but joining the shard groups failed ({error}); "
                f"`quorumlog dev down` stops them"
            ) from error
        done = "joined" if joined else "already joined:"
        click.echo(f"{done} shard groups 1..{group_count}: configuration {number}")
    echo_dashboards(state)
    click.echo(f"export QUORUMLOG_ENDPOINTS={state['endpoints']}")
    for line in tls_exports(state):
        click.echo(line)


@dev_group.command("down")
@click.option(
    "--dir", "directory", default=DEFAULT_DEV_DIR, show_default=True, envvar="QUORUMLOG_DEV_DIR"
)
def dev_down(directory: str) -> None:
    """Stop the cluster (SIGTERM, then SIGKILL after a timeout). Data stays."""
    stopped = stop_dev_cluster(directory)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "no dev cluster running")


@dev_group.command("status")
@click.option(
    "--dir", "directory", default=DEFAULT_DEV_DIR, show_default=True, envvar="QUORUMLOG_DEV_DIR"
)
def dev_status(directory: str) -> None:
    """Which node processes are up, and where."""
    state = load_dev_state(directory)
    if state is None:
        click.echo("no dev cluster running")
        return
    addresses: dict[str, str] = state["addresses"]  # type: ignore[assignment]
    pids: dict[str, int] = state["pids"]  # type: ignore[assignment]
    for node_id, address in addresses.items():
        alive = "up" if process_alive(pids[node_id]) else "down"
        click.echo(f"{node_id}  {address}  pid {pids[node_id]}  {alive}")
    bookies: dict[str, str] = state.get("bookies") or {}  # type: ignore[assignment]
    for bookie_id, address in bookies.items():
        alive = "up" if process_alive(pids[bookie_id]) else "down"
        click.echo(f"{bookie_id}  {address}  pid {pids[bookie_id]}  {alive}  (bookie only)")
    groups: dict[str, list[str]] = state.get("groups") or {}  # type: ignore[assignment]
    for gid, servers in groups.items():
        click.echo(f"shard group {gid}  {','.join(servers)}")
    echo_dashboards(state)
    click.echo(f"export QUORUMLOG_ENDPOINTS={state['endpoints']}")


def echo_dashboards(state: dict[str, object]) -> None:
    """Each node's dashboard (also /metrics and /health there), one line each."""
    dashboards: dict[str, str] = state.get("dashboards") or {}  # type: ignore[assignment]
    for node_id, url in dashboards.items():
        click.echo(f"{node_id} dashboard: {url}  (metrics: {url}metrics, health: {url}health)")
    for line in tls_exports(state):
        click.echo(line)
