"""The `quorumlog` command: one entry point, subcommands by area (etcdctl is the model).

Errors a user can cause print as one line on stderr and exit 1; tracebacks are for bugs.
"""

from __future__ import annotations

import sys

import click

from quorumlog import __version__
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


@cli.group()
def sim() -> None:
    """Deterministic simulations: seeded faults on virtual time."""


def main() -> None:
    try:
        cli(standalone_mode=True)
    except QuorumLogError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
