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

from quorumlog.cli.sim_report import run_world_seeds, seed_run_options


@click.command("groups")
@seed_run_options
def sim_groups_command(seed_range: str, jobs: int, as_json: bool) -> None:
    """Run the consumer-group coordinator (Raft group, service, consumers) under seeded
    crashes, pauses, partitions, lossy frames, leaving and silent consumers; exit 1 if any
    seed fails. Each failure prints the command that replays it."""
    from quorumlog.testing.sim.groups.runner import format_failure, run_seeds

    run_world_seeds(
        seed_range,
        jobs,
        as_json,
        run_seeds,
        format_failure,
        lambda figures: f"{figures['commits_acknowledged']} commits acknowledged",
    )
