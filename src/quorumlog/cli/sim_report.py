"""How every `quorumlog sim ...` command reports a run of seeds: each failed seed's report
(on stderr under --json, so stdout stays one JSON line), then the figures as one JSON line
or one human line, and exit status 1 if any seed failed."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from quorumlog.testing.sim.seed_runs import OutcomeT, SeedRunSummary


def failed_seeds(failures: list[int]) -> str:
    return ", ".join(str(seed) for seed in failures) or "none"


def report_seeds(
    failure_reports: list[str],
    figures: Mapping[str, object],
    as_json: bool,
    human_line: str,
) -> None:
    for report in failure_reports:
        click.echo(report, err=as_json)
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
    else:
        click.echo(human_line)
    if failure_reports:
        sys.exit(1)


def seed_run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every world's seed command takes: --seeds, --jobs, --json."""
    command = click.option(
        "--json", "as_json", is_flag=True, help="End with one JSON summary line."
    )(command)
    command = click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True)(
        command
    )
    return click.option(
        "--seeds", "seed_range", required=True, help='Seeds to run: "7" or "10-19".'
    )(command)


def run_world_seeds(
    seed_range: str,
    jobs: int,
    as_json: bool,
    run_seeds: Callable[[range, int], SeedRunSummary[OutcomeT]],
    format_failure: Callable[[OutcomeT], str],
    world_line: Callable[[Mapping[str, object]], str],
) -> None:
    """Parse --seeds, run them, report: the body of `quorumlog sim raft|ha|ledger|groups`.
    `world_line` says the world's own figures at the end of the human line."""
    from quorumlog.testing.sim.runner import parse_seed_range, silence_simulated_nodes

    try:
        seeds = parse_seed_range(seed_range)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--seeds") from error
    silence_simulated_nodes()
    summary = run_seeds(seeds, jobs)
    figures = summary.to_json_line()
    report_seeds(
        [format_failure(result) for result in summary.results if not result.ok],
        figures,
        as_json,
        f"{summary.seeds} seeds: failed {failed_seeds(summary.failures)}; "
        f"{figures['simulated_seconds']} simulated s in {figures['wall_seconds']} wall s "
        f"({figures['simulated_per_wall']}x), {summary.invariant_checks} invariant checks, "
        + world_line(figures),
    )
