"""The `quorumlog` command: one entry point, subcommands by area (etcdctl is the model).

Errors a user can cause print as one line on stderr and exit 1; tracebacks are for bugs.
"""

from __future__ import annotations

import sys

import click

from quorumlog import __version__
from quorumlog.cli.extras_check import require_extra_for_command
from quorumlog.cli.sim_report import run_world_seeds
from quorumlog.errors import QuorumLogError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="quorumlog")
def cli() -> None:
    """quorumlog: replicated logs, Raft groups, a replicated KV, streams and a Spark pipeline."""


@cli.group()
def bench() -> None:
    """Benchmarks that print figures as JSON lines (they never pass or fail)."""


@bench.command("storage")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the benchmark files (default: a temporary directory).",
)
@click.option("--quick", is_flag=True, help="Smaller sizes, for a smoke run.")
def bench_storage(as_json: bool, directory: str | None, quick: bool) -> None:
    """Append, open, random-read and index-memory figures for each file store."""
    from quorumlog.bench.storage import run_storage_benchmark

    run_storage_benchmark(as_json=as_json, directory=directory, quick=quick)


@bench.command("bookie")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (the only output form).")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the bookie's files (default: a temporary directory).",
)
@click.option("--quick", is_flag=True, help="Short runs, for a smoke run.")
def bench_bookie(as_json: bool, directory: str | None, quick: bool) -> None:
    """Adds/s through one bookie's request handler with fsync on (no network): 100 B and
    4 KiB entries at several batch sizes, recovery-style reads, reopen time."""
    from quorumlog.bench.bookie import run_bookie_benchmark

    run_bookie_benchmark(directory, quick)


@bench.command("ledger")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option("--quick", is_flag=True, help="Short runs and small ledgers, for a smoke run.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
def bench_ledger(as_json: bool, quick: bool, directory: str | None) -> None:
    """Ledger adds/s and latency (100 B and 4 KiB, E=3 Qw=2|3 Qa=2), recovery time and
    ledger- vs Raft-topic produce, on 3 metadata nodes and 5 bookie processes (fsync on)."""
    from quorumlog.bench.ledger import run_ledger_benchmark

    run_ledger_benchmark(as_json, quick, directory)


@bench.command("ha")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option("--quick", is_flag=True, help="Short runs, for a smoke run.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Produce rounds.")
def bench_ha(as_json: bool, quick: bool, directory: str | None, rounds: int | None) -> None:
    """Produce records/s and p50/p99 to an HA topic, a Raft topic and a ledger topic on 3
    nodes (fsync on), and failover seconds from the HA master's SIGKILL."""
    from quorumlog.bench.ha import run_ha_benchmark

    run_ha_benchmark(as_json, quick, directory, rounds)


@bench.command("kv")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option("--seconds", type=click.FloatRange(0.5, 600), default=8.0, show_default=True)
@click.option("--clients", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 100_000), default=2000, show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
@click.option("--tls", is_flag=True, help="Also measure a cluster that requires TLS (same run).")
def bench_kv(
    as_json: bool, seconds: float, clients: int, concurrency: int, directory: str | None, tls: bool
) -> None:
    """Committed puts/s and latency on 3 node processes (fsync on), against PySyncObj;
    with --tls, puts/s with and without TLS in one run."""
    require_extra_for_command("bench", "quorumlog bench kv")
    from quorumlog.bench.kv import KVBenchSettings, run_kv_benchmark

    settings = KVBenchSettings(
        seconds=seconds, clients=clients, concurrency=concurrency, directory=directory, tls=tls
    )
    run_kv_benchmark(settings, as_json=as_json)


@bench.command("stream")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option("--records", type=click.IntRange(1000, 10**8), default=1_000_000, show_default=True)
@click.option(
    "--spark-records", type=click.IntRange(1000, 10**8), default=1_000_000, show_default=True
)
@click.option("--skip-spark", is_flag=True, help="Leave out the Spark read (no JVM).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
def bench_stream(
    as_json: bool, records: int, spark_records: int, skip_spark: bool, directory: str | None
) -> None:
    """Produce, consume and Spark batch-read rates on 3 node processes (fsync on)."""
    if not skip_spark:
        require_extra_for_command("spark", "quorumlog bench stream (or --skip-spark)")
    from quorumlog.bench.stream import run_stream_benchmark

    run_stream_benchmark(as_json, records, spark_records, directory, skip_spark)


@bench.command("scale")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (the only output form).")
@click.option("--quick", is_flag=True, help="Few partitions and short windows, for a smoke run.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
@click.option(
    "--quiesce-idle-ticks",
    type=click.IntRange(0),
    default=None,
    help="The nodes' --quiesce-idle-ticks (default: the node's; 0: groups never go quiet).",
)
@click.option(
    "--partitions",
    "partition_counts",
    default=None,
    help="Comma-separated partition counts, one topic each (default: 1,3,100,1000).",
)
@click.option(
    "--produce-records",
    type=click.IntRange(1),
    default=None,
    help="Records produced per topic (default: 1,000,000; 5,000 with --quick).",
)
def bench_scale(
    as_json: bool,
    quick: bool,
    directory: str | None,
    quiesce_idle_ticks: int | None,
    partition_counts: str | None,
    produce_records: int | None,
) -> None:
    """Idle CPU, memory, create time and produce rate with 1, 3, 100 and 1000 partitions
    on 3 node processes (fsync on)."""
    import msgspec

    from quorumlog.bench.scale import QUICK_SETTINGS, ScaleSettings, run_scale_benchmark

    settings = QUICK_SETTINGS if quick else ScaleSettings()
    settings = msgspec.structs.replace(
        settings, directory=directory, quiesce_idle_ticks=quiesce_idle_ticks
    )
    if partition_counts is not None:
        try:
            counts = tuple(int(count) for count in partition_counts.split(","))
        except ValueError as error:
            raise click.BadParameter(f"not a list of numbers: {partition_counts}") from error
        if not counts or min(counts) < 1:
            raise click.BadParameter("every partition count must be at least 1")
        settings = msgspec.structs.replace(settings, partition_counts=counts)
    if produce_records is not None:
        settings = msgspec.structs.replace(settings, produce_records=produce_records)
    run_scale_benchmark(settings)


@bench.command("shard")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@click.option("--seconds", type=click.FloatRange(0.5, 600), default=8.0, show_default=True)
@click.option(
    "--shard-megabytes", type=click.FloatRange(0.1, 10_000), default=100.0, show_default=True
)
@click.option("--groups", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None)
@click.option(
    "--migration-mib-per-second",
    type=click.FloatRange(0),
    default=None,
    help="The nodes' migration throttle (default: the node's; 0: unthrottled).",
)
def bench_shard(
    as_json: bool,
    seconds: float,
    shard_megabytes: float,
    groups: int,
    directory: str | None,
    migration_mib_per_second: float | None,
) -> None:
    """Sharded KV on 3 node processes: puts/s across groups, moving a large shard, and the
    other shards' throughput during the move."""
    from quorumlog.bench.shard import ShardBenchSettings, run_shard_benchmark

    settings = ShardBenchSettings(
        seconds=seconds,
        shard_megabytes=shard_megabytes,
        groups=groups,
        directory=directory,
        migration_mib_per_second=migration_mib_per_second,
    )
    run_shard_benchmark(settings, as_json=as_json)


@cli.group()
def sim() -> None:
    """Deterministic simulations: seeded faults on virtual time."""


from quorumlog.cli.sim_shardkv_command import sim_shardkv_command  # noqa: E402 - joins sim

sim.add_command(sim_shardkv_command)
from quorumlog.cli.sim_ledger_command import sim_ledger_command  # noqa: E402 - joins sim

sim.add_command(sim_ledger_command)

from quorumlog.cli.sim_ha_command import sim_ha_command  # noqa: E402 - joins sim

sim.add_command(sim_ha_command)

from quorumlog.cli.sim_groups_command import sim_groups_command  # noqa: E402 - joins sim

sim.add_command(sim_groups_command)


@sim.command("raft")
@click.option("--seeds", "seed_range", required=True, help='Seeds to run: "7" or "10-19".')
@click.option("--nodes", "node_count", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--seconds",
    "simulated_seconds",
    type=click.FloatRange(min=7.0),
    default=30.0,
    show_default=True,
    help="Simulated seconds a seed runs (at least 7: the liveness check after the "
    "final heal and the drain need the time).",
)
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON summary line.")
@click.option(
    "--quiet-groups",
    "quiet",
    is_flag=True,
    default=None,
    help="Every seed with quiet groups (idle groups quiesce; clients fall silent now and "
    "then); default: a quarter of the seeds.",
)
def sim_raft(
    seed_range: str,
    node_count: int,
    simulated_seconds: float,
    jobs: int,
    as_json: bool,
    quiet: bool | None,
) -> None:
    """Run Raft clusters under a seeded nemesis; exit 1 if any seed fails.

    Each failure prints the command that replays it and the tail of its trace."""

    from quorumlog.testing.sim.runner import format_failure, run_seeds

    run_world_seeds(
        seed_range,
        jobs,
        as_json,
        lambda seeds, jobs: run_seeds(seeds, node_count, simulated_seconds, jobs, quiet or None),
        format_failure,
        lambda figures: f"{node_count} nodes",
    )


def register_node_commands() -> None:
    from quorumlog.cli.bookie_commands import bookie_group
    from quorumlog.cli.node_commands import dev_group, node_command

    cli.add_command(node_command)
    cli.add_command(bookie_group)
    cli.add_command(dev_group)


register_node_commands()


def register_stream_commands() -> None:
    from quorumlog.cli.stream_commands import consume_command, produce_command, topic_group

    cli.add_command(topic_group)
    cli.add_command(produce_command)
    cli.add_command(consume_command)
    from quorumlog.cli.group_commands import group_group

    cli.add_command(group_group)


register_stream_commands()


def register_kv_commands() -> None:
    from quorumlog.cli.kv_commands import COMMANDS
    from quorumlog.cli.kv_v3_commands import COMMANDS as KV_V3_COMMANDS
    from quorumlog.cli.shard_commands import COMMANDS as SHARD_COMMANDS

    for command in [*COMMANDS, *SHARD_COMMANDS, *KV_V3_COMMANDS]:
        cli.add_command(command)


register_kv_commands()


def register_ledger_commands() -> None:
    from quorumlog.cli.ledger_commands import COMMANDS as LEDGER_COMMANDS

    for command in LEDGER_COMMANDS:
        cli.add_command(command)


register_ledger_commands()


def register_ha_commands() -> None:
    from quorumlog.cli.ha_commands import COMMANDS as HA_COMMANDS

    for command in HA_COMMANDS:
        cli.add_command(command)


register_ha_commands()


def register_auth_commands() -> None:
    from quorumlog.cli.auth_commands import COMMANDS as AUTH_COMMANDS

    for command in AUTH_COMMANDS:
        cli.add_command(command)


register_auth_commands()

from quorumlog.demo.command import demo_command  # noqa: E402 - after the group it joins

cli.add_command(demo_command)

from quorumlog.cli.endpoint_commands import endpoint_group  # noqa: E402 - joins cli

cli.add_command(endpoint_group)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except QuorumLogError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
