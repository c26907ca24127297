"""`quorumlog sim ledger`: run seeds of the ledger simulation, exit 1 on a failure.

The summary line has the keys of `quorumlog sim raft --json` (failures, seeds,
simulated_seconds, wall_seconds, simulated_per_wall, invariant_checks) and the ledger
counts (entries acknowledged and read, recoveries, ensemble changes, fenced writers); each
failure prints its seed, the command that replays it and its trace tail.
"""

from __future__ import annotations

import click

from quorumlog.cli.sim_report import run_world_seeds, seed_run_options


@click.command("ledger")
@seed_run_options
def sim_ledger_command(seed_range: str, jobs: int, as_json: bool) -> None:
    """Run ledger writers, recoveries and readers on bookies under seeded faults; exit 1 if
    any seed fails. Each failure prints the command that replays it."""
    from quorumlog.testing.sim.ledger.runner import format_failure, run_seeds

    run_world_seeds(
        seed_range,
        jobs,
        as_json,
        run_seeds,
        format_failure,
        lambda figures: (
            f"{figures['recoveries']} recoveries, {figures['ensemble_changes']} ensemble changes"
        ),
    )
