"""The `quorumlog demo` command (kept light: Spark and the clients load only when it runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from quorumlog.cli.extras_check import require_extra_for_command
from quorumlog.demo.flights import FLIGHT_COUNT

DEFAULT_DEMO_DIR = ".quorumlog-demo"


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    default=DEFAULT_DEMO_DIR,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the cluster keeps its data and logs (reset at each run).",
)
@click.option(
    "--records",
    default=FLIGHT_COUNT,
    show_default=True,
    type=click.IntRange(1, FLIGHT_COUNT),
    help="How many flights to stream (the first N rows of the table).",
)
@click.option("--keep-cluster", is_flag=True, help="Leave the cluster running at the end.")
@click.option(
    "--spark-master",
    default=None,
    metavar="URL",
    help="Run the Spark job on this cluster (spark://host:port of a standalone master) "
    "instead of in this process (local[2]).",
)
def demo_command(
    directory: Path, records: int, keep_cluster: bool, spark_master: str | None
) -> None:
    """The main job, end to end: a local 3-node cluster, the NYC flights of 2013 streamed
    into a topic while a partition leader is killed, a Spark Structured Streaming job that
    aggregates them into the KV and a topic, and a check that each record counted once.

    Exits 1 if a check fails."""
    require_extra_for_command("demo", "quorumlog demo")
    from quorumlog.demo.main import DemoSettings, run_demo

    settings = DemoSettings(
        directory=directory,
        records=records,
        keep_cluster=keep_cluster,
        spark_master=spark_master,
    )
    if not run_demo(settings):
        sys.exit(1)
