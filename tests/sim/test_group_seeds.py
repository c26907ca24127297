"""The consumer-group coordinator simulator: a bounded block of seeds, the seeds that found
stale heartbeat answers, determinism, and the CLI with replay of one seed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.groups import runner
from quorumlog.testing.sim.groups.runner import run_seed
from quorumlog.testing.sim.trace import TraceRecorder

SEEDS = range(0, 6)
"""About half a second of CI time a seed (13 simulated seconds each)."""
STALE_HEARTBEAT_SEEDS = (78, 206, 399)
"""Seeds where a heartbeat answered from the leader's memory gave a member an older
generation than it had (a new leader that had not applied its predecessor's last commit):
tests/sim/test_group_checks_can_fail.py runs one with the old answer path."""


@pytest.mark.parametrize("seed", [*SEEDS, *STALE_HEARTBEAT_SEEDS])
def test_seed_keeps_every_invariant(seed: int) -> None:
    result = run_seed(seed, capture_trace=False)
    assert result.ok, f"{result.replay_command}\n{result.failure}"
    assert result.commits_ok > 0
    assert result.generations_taken > 3


def test_the_seed_block_exercises_the_fences() -> None:
    results = [run_seed(seed, capture_trace=False) for seed in (0, 1)]
    assert sum(result.fenced_commits for result in results) > 0
    assert sum(result.commits_refused for result in results) > 0


def test_a_seed_replays_exactly() -> None:
    first, second = TraceRecorder(), TraceRecorder()
    one = run_seed(3, trace=first, capture_trace=False)
    two = run_seed(3, trace=second, capture_trace=False)
    assert one.trace_digest == two.trace_digest
    assert (one.simulated_ms, one.operations, one.commits_ok) == (
        two.simulated_ms,
        two.operations,
        two.commits_ok,
    )


def test_cli_reports_json_with_the_sim_raft_keys() -> None:
    outcome = CliRunner().invoke(cli, ["sim", "groups", "--seeds", "2-2", "--json"])
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads(outcome.output.strip().splitlines()[-1])
    assert summary["failures"] == []
    assert summary["seeds"] == 1
    assert summary["commits_acknowledged"] > 0
    for key in ("simulated_seconds", "wall_seconds", "simulated_per_wall", "invariant_checks"):
        assert key in summary


def test_cli_prints_the_replay_command_of_a_failing_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def planted(self: runner.GroupSeed) -> None:
        raise InvariantViolation("planted failure")

    monkeypatch.setattr(runner.GroupSeed, "final_checks", planted)
    outcome = CliRunner().invoke(cli, ["sim", "groups", "--seeds", "4", "--json"])
    assert outcome.exit_code == 1
    assert "quorumlog sim groups --seeds 4-4" in outcome.output
    assert "planted failure" in outcome.output
    assert json.loads(outcome.output.strip().splitlines()[-1])["failures"] == [4]


def test_cli_rejects_an_empty_seed_range() -> None:
    assert CliRunner().invoke(cli, ["sim", "groups", "--seeds", "9-3"]).exit_code == 2
