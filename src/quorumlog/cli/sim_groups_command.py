"""`quorumlog sim groups`: run seeds of the consumer-group coordinator simulation, exit 1 on
a failure.

The summary line has the keys of `quorumlog sim raft --json` (failures, seeds,
simulated_seconds, wall_seconds, simulated_per_wall, invariant_checks) and the group
counts (commits acknowledged and refused, fenced commits checked, partitions taken from
removed members, the mean wait for a heartbeat answer in virtual ms); each
failure prints its seed, the command that replays it and its trace tail.
"""

from __future__ import annotations

import click

from quorumlog.cli.sim_report import failed_seeds, report_seeds


@click.command("groups")
@click.option("--seeds", "seed_range", required=True, help='Seeds to run: "7" or "10-19".')
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON summary line.")
def sim_groups_command(seed_range: str, jobs: int, as_json: bool) -> None:
    """Run the consumer-group coordinator (Raft group, service, consumers) under seeded
    crashes, pauses, partitions, lossy frames, leaving and silent consumers; exit 1 if any
    seed fails. Each failure prints the command that replays it."""
    from quorumlog.testing.sim.groups.runner import format_failure, run_seeds
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
        f"{figures['commits_acknowledged']} commits acknowledged",
    )
