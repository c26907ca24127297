"""`quorumlog sim ha`: run seeds of the controller-mode simulation, exit 1 on a failure.

The summary line has the keys of `quorumlog sim raft --json` (failures, seeds,
simulated_seconds, wall_seconds, simulated_per_wall, invariant_checks) and the
controller-mode counts (messages acknowledged, elections, handshakes, broker crashes);
each failure prints its seed, the command that replays it and its trace tail.
"""

from __future__ import annotations

import click

from quorumlog.cli.sim_report import run_world_seeds, seed_run_options


@click.command("ha")
@seed_run_options
def sim_ha_command(seed_range: str, jobs: int, as_json: bool) -> None:
    """Run a Raft HA controller and a broker group under seeded crashes, pauses, partitions
    and disk halts; exit 1 if any seed fails. Each failure prints the command that replays
    it."""
    from quorumlog.testing.sim.ha.runner import format_failure, run_seeds

    run_world_seeds(
        seed_range,
        jobs,
        as_json,
        run_seeds,
        format_failure,
        lambda figures: f"{figures['elections']} elections, {figures['handshakes']} handshakes",
    )
