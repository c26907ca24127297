"""`quorumlog bench shard`: the sharded KV on 3 node processes — throughput, and moving a
large shard while the other shards keep serving.

Every node hosts the shard controller group and every shard group (`--groups`, 3 by
default), fsync on; one Join gives the groups the shards. Phases, each printed as one JSON
object with a "phase" name:

- `cluster`: the nodes start, the groups join; seconds until every replica serves.
- `throughput`: `--clients` load processes (`shard_load`), each with one pipelined
  `AsyncKVClient` per group, put 100-byte values to keys of every shard for `--seconds`:
  committed puts/s across the groups, latency percentiles.
- `fill`: one shard is loaded with `--shard-megabytes` of 64 KiB values.
- `migration-closed-loop`: a load process puts to every other shard (the unaffected ones)
  with `migration_concurrency` puts in flight (saturating) for `--seconds`, then the shard
  moves to another group (a `Move` through the controller) while that load goes on.
  `migration_seconds` runs from the move's commit (the controller's answer) until the new
  owner serves the shard: its leader reports every shard SERVING at the new configuration
  and a read of a moved key returns its value. `unaffected_ops_ratio` is the load's puts/s
  during the migration ÷ its puts/s in the `--seconds` before the move.
  `garbage_collected_seconds`: until no replica of the old owner holds the shard.
- `migration-paced`: the shard moves back, the same way, under a paced (open loop) load on
  the other shards at half the puts/s they took at saturation. At saturation the figure
  says how the nodes' CPU is shared between serving and migrating; paced, it says whether
  the move stalls the other shards when the cluster has headroom.
- `nodes`: the peak RSS of each node process (VmHWM from /proc).

The last line sums it up: ops_per_s, p50_ms, p99_ms (throughput); migration_seconds,
garbage_collected_seconds, unaffected_ops_ratio and the puts/s before and during
(closed loop); migration_seconds_paced, unaffected_ops_ratio_paced and the paced rate;
shard_bytes, shard_count, groups, node_rss_mb_max, load_average_at_start (the machine's
other load shows up in every figure). Each migration phase also prints the unaffected
shards' puts/s per quarter second around the move.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from quorumlog.bench.kv import emit, load_figures
from quorumlog.bench.kv_processes import (
    FINISH_SLACK_SECONDS,
    POLL_INTERVAL_SECONDS,
    READY_TIMEOUT_SECONDS,
    BenchError,
    LoadProcesses,
    last_json_line,
    peak_rss_megabytes,
    run_load_processes,
)
from quorumlog.bench.shard_load import ShardLoadResult, format_route, keys_for_shard
from quorumlog.bench.shard_processes import (
    REQUEST_TIMEOUT_SECONDS,
    ControllerAdmin,
    ShardNodeCluster,
    group_settled,
    request_once,
    shard_statuses,
    wait_settled,
)
from quorumlog.codec.wire import KVRead, KVReadResult, shard_group_name
from quorumlog.kv.async_client import AsyncKVClient
from quorumlog.node.shard_migration import MIGRATION_BYTES_PER_SECOND_DEFAULT
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.controller_commands import Join, Move

CLUSTER_ID = "bench-shard"
WARM_UP_SECONDS_MAX = 1.0
"""Between the start signal and the window: pipelines fill, nothing counts (half the
window when that is shorter, so a smoke run stays short)."""
VALUE_BYTES = 100
FILL_VALUE_BYTES = 64 * 1024
FILL_PUTS_IN_FLIGHT = 16
"""Puts of the fill in flight at once: about 1 MiB, enough to batch several per entry."""
SETTLE_TIMEOUT_SECONDS = 60.0
MIGRATION_TIMEOUT_SECONDS = 600.0
MOVED_SHARD = 0
PACED_FRACTION_OF_SATURATED = 0.5
TIMELINE_STEP_SECONDS = 0.25
"""The migration phases print the unaffected shards' puts/s in steps of this, from
TIMELINE_MARGIN_SECONDS before the move until as long after the new owner serves: a stall
shows as a run of zeros."""
TIMELINE_MARGIN_SECONDS = 1.0


class ShardBenchSettings:
    def __init__(
        self,
        seconds: float = 8.0,
        clients: int = 2,
        concurrency: int = 1000,
        migration_concurrency: int = 500,
        shard_megabytes: float = 100.0,
        groups: int = 3,
        shard_count: int = 16,
        directory: str | None = None,
        migration_mib_per_second: float | None = None,
    ) -> None:
        if groups < 2:
            raise ValueError("a shard moves between two groups: --groups must be at least 2")
        self.seconds = seconds
        self.clients = clients
        self.concurrency = concurrency
        """Puts in flight per load process in the throughput phase."""
        self.migration_concurrency = migration_concurrency
        """Puts in flight on the unaffected shards before and during the migration."""
        self.shard_bytes = int(shard_megabytes * 1e6)
        self.groups = groups
        self.shard_count = shard_count
        self.directory = directory
        self.migration_mib_per_second = migration_mib_per_second
        """The nodes' migration throttle; None: the node's default."""
        self.warm_up_seconds = min(WARM_UP_SECONDS_MAX, seconds / 2)


def run_shard_benchmark(settings: ShardBenchSettings, as_json: bool) -> dict[str, Any]:
    """Run every phase, printing each; returns (and prints last) the summary."""
    load_average = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="quorumlog-bench-shard-", dir=settings.directory))
    base_cluster = base / "nodes"
    base_cluster.mkdir()
    node_arguments = (
        []
        if settings.migration_mib_per_second is None
        else ["--shard-migration-mib-per-second", str(settings.migration_mib_per_second)]
    )
    cluster = ShardNodeCluster(
        base_cluster, CLUSTER_ID, settings.groups, settings.shard_count, node_arguments
    )
    try:
        cluster_phase, admin, configuration = start_cluster(cluster, settings)
        emit(cluster_phase, as_json)
        throughput = throughput_phase(cluster, configuration, settings)
        emit(throughput, as_json)
        fill = fill_phase(cluster, configuration, settings)
        emit(fill, as_json)
        source = configuration.shards[MOVED_SHARD]
        target = next(gid for gid in cluster.gids if gid != source)
        migration = migration_phase(cluster, admin, configuration, target, fill, settings)
        emit(migration, as_json)
        # Back again under a paced load at a fraction of what the unaffected shards took
        # at saturation: the headroom a cluster runs with, so the figure shows whether
        # the move stalls the other shards rather than how two cores are shared.
        rate = PACED_FRACTION_OF_SATURATED * migration["ops_per_s_before"]
        paced = migration_phase(cluster, admin, admin.latest(), source, fill, settings, rate=rate)
        emit(paced, as_json)
        rss = {node_id: round(peak_rss_megabytes(pid), 1) for node_id, pid in cluster.pids.items()}
        emit({"phase": "nodes", "rss_mb": rss}, as_json)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        "ops_per_s": throughput["ops_per_s"],
        "p50_ms": throughput["p50_ms"],
        "p99_ms": throughput["p99_ms"],
        "migration_seconds": migration["migration_seconds"],
        "garbage_collected_seconds": migration["garbage_collected_seconds"],
        "unaffected_ops_ratio": migration["unaffected_ops_ratio"],
        "unaffected_ops_per_s_before": migration["ops_per_s_before"],
        "unaffected_ops_per_s_during": migration["ops_per_s_during"],
        "migration_seconds_paced": paced["migration_seconds"],
        "unaffected_ops_ratio_paced": paced["unaffected_ops_ratio"],
        "unaffected_paced_ops_per_s": paced["offered_ops_per_s"],
        "shard_bytes": fill["shard_bytes"],
        "shard_count": settings.shard_count,
        "groups": settings.groups,
        "migration_mib_per_second": (
            MIGRATION_BYTES_PER_SECOND_DEFAULT / (1024 * 1024)
            if settings.migration_mib_per_second is None
            else settings.migration_mib_per_second
        ),
        "node_rss_mb_max": max(rss.values()),
        "load_average_at_start": round(load_average, 2),
    }
    emit(summary, as_json)
    return summary


# --- phases ------------------------------------------------------------------------------


def start_cluster(
    cluster: ShardNodeCluster, settings: ShardBenchSettings
) -> tuple[dict[str, Any], ControllerAdmin, ShardConfiguration]:
    started = time.monotonic()
    cluster.start()
    admin = ControllerAdmin(cluster.endpoints, CLUSTER_ID, "bench-shard-admin")
    servers = cluster.endpoints
    result = admin.run(Join(admin.next_sequence(), {gid: servers for gid in cluster.gids}))
    number = result.configuration_number
    if number is None:
        raise BenchError("the join returned no configuration number")
    wait_settled(cluster.endpoints, CLUSTER_ID, cluster.gids, number, SETTLE_TIMEOUT_SECONDS)
    configuration = admin.latest()
    owned = {gid: len(configuration.shards_of_group(gid)) for gid in cluster.gids}
    phase = {
        "phase": "cluster",
        "nodes": len(cluster.endpoints),
        "groups": settings.groups,
        "shard_count": settings.shard_count,
        "shards_per_group": owned,
        "fsync": True,
        "serving_after_seconds": round(time.monotonic() - started, 2),
    }
    return phase, admin, configuration


def load_command(
    cluster: ShardNodeCluster,
    route: dict[int, int],
    seconds: float,
    client_number: int,
    concurrency: int,
    until_stdin_closes: bool = False,
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "quorumlog.bench.shard_load",
        "--endpoints",
        ",".join(cluster.endpoints),
        "--cluster-id",
        CLUSTER_ID,
        "--route",
        format_route(route),
        "--shard-count",
        str(cluster.shard_count),
        "--seconds",
        repr(seconds),
        "--concurrency",
        str(concurrency),
        "--value-bytes",
        str(VALUE_BYTES),
        "--client-number",
        str(client_number),
    ]
    if until_stdin_closes:
        command.append("--until-stdin-closes")
    return command


def throughput_phase(
    cluster: ShardNodeCluster, configuration: ShardConfiguration, settings: ShardBenchSettings
) -> dict[str, Any]:
    route = dict(enumerate(configuration.shards))
    commands = [
        load_command(cluster, route, settings.seconds, number, settings.concurrency)
        for number in range(settings.clients)
    ]
    load_average = os.getloadavg()[0]
    _, outputs = run_load_processes(commands, settings.seconds, settings.warm_up_seconds)
    results = [last_json_line(output, ShardLoadResult) for output in outputs]
    return {
        "phase": "throughput",
        "clients": settings.clients,
        "concurrency_per_client": settings.concurrency,
        "value_bytes": VALUE_BYTES,
        **load_figures(results, settings.seconds),
        "load_average_at_start": round(load_average, 2),
    }


def fill_phase(
    cluster: ShardNodeCluster, configuration: ShardConfiguration, settings: ShardBenchSettings
) -> dict[str, Any]:
    owner = configuration.shards[MOVED_SHARD]
    count = max(1, settings.shard_bytes // FILL_VALUE_BYTES)
    keys = keys_for_shard(MOVED_SHARD, settings.shard_count, count, prefix="large")
    started = time.monotonic()
    asyncio.run(fill(cluster.endpoints, owner, keys))
    seconds = time.monotonic() - started
    shard_bytes = count * FILL_VALUE_BYTES
    return {
        "phase": "fill",
        "shard": MOVED_SHARD,
        "owner": owner,
        "keys": count,
        "value_bytes": FILL_VALUE_BYTES,
        "shard_bytes": shard_bytes,
        "seconds": round(seconds, 2),
        "megabytes_per_s": round(shard_bytes / 1e6 / seconds, 1),
        "moved_key": keys[-1],
    }


def fill_value(key: str) -> str:
    """A FILL_VALUE_BYTES value that names its key, so a read proves it is the right one."""
    return (key + ":" + "x" * FILL_VALUE_BYTES)[:FILL_VALUE_BYTES]


async def fill(endpoints: list[str], gid: int, keys: list[str]) -> None:
    async with AsyncKVClient(
        endpoints,
        timeout=60.0,
        cluster_id=CLUSTER_ID,
        client_id=f"bench-shard-fill-{time.time_ns()}",
        group=shard_group_name(gid),
    ) as client:
        queue = list(reversed(keys))

        async def worker() -> None:
            while queue:
                key = queue.pop()
                await client.put(key, fill_value(key))

        await asyncio.gather(*(worker() for _ in range(FILL_PUTS_IN_FLIGHT)))


def migration_phase(
    cluster: ShardNodeCluster,
    admin: ControllerAdmin,
    configuration: ShardConfiguration,
    target: int,
    fill: dict[str, Any],
    settings: ShardBenchSettings,
    rate: float = 0.0,
) -> dict[str, Any]:
    """Move MOVED_SHARD to `target` under a load on every other shard: closed loop
    (saturating) when `rate` is 0, else `rate` puts/s started whatever the answers do."""
    source = configuration.shards[MOVED_SHARD]
    unaffected = {
        shard: gid for shard, gid in enumerate(configuration.shards) if shard != MOVED_SHARD
    }
    # The window's length is only a bound: closing stdin ends the load once the migration
    # is over, however long it took.
    command = load_command(
        cluster,
        unaffected,
        settings.seconds + MIGRATION_TIMEOUT_SECONDS,
        0,
        settings.migration_concurrency,
        until_stdin_closes=True,
    )
    if rate > 0:
        command += ["--rate", repr(rate)]
    load_average = os.getloadavg()[0]
    load = LoadProcesses([command])
    try:
        load.wait_ready(READY_TIMEOUT_SECONDS)
        start_at = time.monotonic() + settings.warm_up_seconds
        load.start(start_at)
        # A timer, not a wait for a condition: the baseline is `seconds` of steady load.
        time.sleep(max(start_at + settings.seconds - time.monotonic(), 0))
        move_sent = time.monotonic()
        result = admin.run(Move(admin.next_sequence(), MOVED_SHARD, target))
        move_committed = time.monotonic()
        number = result.configuration_number
        if number is None:
            raise BenchError("the move returned no configuration number")
        served = wait_served(cluster, target, number, fill["moved_key"])
        garbage_collected = wait_garbage_collected(cluster, source, number)
        # A timer: the load runs on for the end of the printed timeline.
        time.sleep(max(served + TIMELINE_MARGIN_SECONDS - time.monotonic(), 0))
        [output] = load.finish(FINISH_SLACK_SECONDS)
    finally:
        load.kill()
    load_result = last_json_line(output, ShardLoadResult)
    assert isinstance(load_result, ShardLoadResult)
    before = ops_per_second(load_result, start_at, move_sent - settings.seconds, move_sent)
    during = ops_per_second(load_result, start_at, move_committed, served)
    load_description: dict[str, Any] = (
        {"load": "paced", "offered_ops_per_s": round(rate, 1)}
        if rate > 0
        else {"load": "closed-loop", "concurrency": settings.migration_concurrency}
    )
    return {
        "phase": f"migration-{load_description['load']}",
        "shard": MOVED_SHARD,
        "from_group": source,
        "to_group": target,
        "shard_bytes": fill["shard_bytes"],
        "move_commit_seconds": round(move_committed - move_sent, 3),
        "migration_seconds": round(served - move_committed, 3),
        "garbage_collected_seconds": round(garbage_collected - move_committed, 3),
        "unaffected_shards": len(unaffected),
        **load_description,
        "ops_per_s_before": round(before, 1),
        "ops_per_s_during": round(during, 1),
        "unaffected_ops_ratio": round(during / before, 3) if before else None,
        "ops_per_s_by_quarter_second": [
            round(ops_per_second(load_result, start_at, at, at + TIMELINE_STEP_SECONDS))
            for at in stepped(
                move_sent - TIMELINE_MARGIN_SECONDS,
                served + TIMELINE_MARGIN_SECONDS,
                TIMELINE_STEP_SECONDS,
            )
        ],
        "errors": load_result.errors,
        "load_average_at_start": round(load_average, 2),
    }


def wait_served(cluster: ShardNodeCluster, gid: int, number: int, moved_key: str) -> float:
    """When the group's leader serves every shard at `number` and reads `moved_key` back."""
    deadline = time.monotonic() + MIGRATION_TIMEOUT_SECONDS
    group = shard_group_name(gid)
    while time.monotonic() < deadline:
        leader = next(
            (
                status
                for status in shard_statuses(cluster.endpoints, CLUSTER_ID, gid)
                if status is not None and status.is_leader
            ),
            None,
        )
        if leader is not None and leader.leader is not None and group_settled(leader, number):
            answer = request_once(
                leader.leader,
                CLUSTER_ID,
                KVRead(request_id=1, keys=[moved_key], group=group),
                REQUEST_TIMEOUT_SECONDS,
            )
            if isinstance(answer, KVReadResult):
                if answer.values != [fill_value(moved_key)]:
                    raise BenchError(f"{moved_key} read back wrong after the move")
                return time.monotonic()
        time.sleep(POLL_INTERVAL_SECONDS)
    raise BenchError(f"group {gid} did not serve the moved shard in {MIGRATION_TIMEOUT_SECONDS}s")


def wait_garbage_collected(cluster: ShardNodeCluster, gid: int, number: int) -> float:
    """When no replica of the old owner holds the moved shard any more."""
    deadline = time.monotonic() + MIGRATION_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        statuses = shard_statuses(cluster.endpoints, CLUSTER_ID, gid)
        if all(
            status is not None
            and status.configuration_number >= number
            and MOVED_SHARD not in status.shard_states
            for status in statuses
        ):
            return time.monotonic()
        time.sleep(POLL_INTERVAL_SECONDS)
    raise BenchError(f"group {gid} kept the moved shard for {MIGRATION_TIMEOUT_SECONDS}s")


def stepped(start: float, end: float, step: float) -> list[float]:
    """start, start + step, ... up to (not including) end."""
    return [start + number * step for number in range(max(0, int((end - start) / step)))]


def ops_per_second(result: ShardLoadResult, window_start: float, start: float, end: float) -> float:
    """Puts/s the load answered in [start, end), from its timeline (a bucket partly inside
    counts in proportion)."""
    if end <= start:
        return 0.0
    bucket_seconds = result.bucket_seconds
    ops = 0.0
    for number, count in enumerate(result.timeline):
        bucket_start = window_start + number * bucket_seconds
        overlap = min(end, bucket_start + bucket_seconds) - max(start, bucket_start)
        if overlap > 0:
            ops += count * overlap / bucket_seconds
    return ops / (end - start)
