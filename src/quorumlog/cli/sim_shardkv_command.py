"""`quorumlog sim shardkv`: run seeds of the sharded KV simulation, exit 1 on a failure.

The summary line has the same keys as `quorumlog sim raft --json`; each failure prints its
seed, its scenario and the command that replays it.
"""

from __future__ import annotations

import click

from quorumlog.cli.sim_report import failed_seeds, report_seeds


@click.command("shardkv")
@click.option("--seeds", "seed_range", required=True, help='Seeds to run: "7" or "10-19".')
@click.option(
    "--scenario",
    default=None,
    help="Run this scenario on every seed (default: each seed picks its own).",
)
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON summary line.")
def sim_shardkv_command(seed_range: str, scenario: str | None, jobs: int, as_json: bool) -> None:
    """Run the sharded KV (controller + shard groups) under seeded faults; exit 1 if any
    seed fails. Each failure prints its scenario and the command that replays it."""
    from quorumlog.testing.sim.runner import parse_seed_range, silence_simulated_nodes
    from quorumlog.testing.sim.shardkv.runner import format_failure, run_shardkv_seeds
    from quorumlog.testing.sim.shardkv.scenarios import SCENARIOS

    try:
        seeds = parse_seed_range(seed_range)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--seeds") from error
    if scenario is not None and scenario not in SCENARIOS:
        raise click.BadParameter(
            f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}",
            param_hint="--scenario",
        )
    silence_simulated_nodes()
    run = run_shardkv_seeds(seeds.start, seeds.stop - 1, scenario=scenario, jobs=jobs)
    summary = run.summary
    figures = run.to_json_line()
    report_seeds(
        [format_failure(outcome) for outcome in run.outcomes if not outcome.result.ok],
        figures,
        as_json,
        f"{summary.seeds} seeds: failed {failed_seeds(summary.failures)}; "
        f"{figures['simulated_seconds']} simulated s in {figures['wall_seconds']} wall s "
        f"({figures['simulated_per_wall']}x), {summary.invariant_checks} invariant checks",
    )
