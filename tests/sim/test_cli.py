"""`quorumlog sim raft`: runs seeds, ends with one JSON line, exits 1 on a failure."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.testing.sim import runner
from quorumlog.testing.sim.checks import InvariantViolation


def test_sim_raft_json_summary() -> None:
    result = CliRunner().invoke(
        cli, ["sim", "raft", "--seeds", "3-4", "--nodes", "3", "--seconds", "10", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["seeds"] == 2
    assert summary["failures"] == []
    assert summary["simulated_seconds"] >= 12
    assert summary["invariant_checks"] > 1000
    assert summary["wall_seconds"] > 0


def test_sim_raft_reports_a_failing_seed_with_its_replay_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_timeline(*arguments: object) -> None:
        raise InvariantViolation("planted failure")

    monkeypatch.setattr(runner, "_run_timeline", broken_timeline)
    result = CliRunner().invoke(cli, ["sim", "raft", "--seeds", "7", "--nodes", "5", "--json"])
    assert result.exit_code == 1
    assert "quorumlog sim raft --seeds 7-7 --nodes 5" in result.output
    assert "planted failure" in result.output
    assert json.loads(result.output.strip().splitlines()[-1])["failures"] == [7]


def test_sim_raft_rejects_a_bad_seed_range() -> None:
    result = CliRunner().invoke(cli, ["sim", "raft", "--seeds", "9-3"])
    assert result.exit_code == 2
    assert "empty" in result.output


def test_parse_seed_range() -> None:
    assert runner.parse_seed_range("5") == range(5, 6)
    assert runner.parse_seed_range("10-19") == range(10, 20)


def test_a_run_too_short_to_check_liveness_is_refused() -> None:
    result = CliRunner().invoke(cli, ["sim", "raft", "--seeds", "0", "--seconds", "5"])
    assert result.exit_code == 2
    assert "7" in result.output
    with pytest.raises(ValueError, match="liveness"):
        runner.run_seed(0, 3, 5.0, capture_trace=False)


def test_a_short_run_heals_early_enough_to_check_liveness() -> None:
    """At 7.5 s the final heal used to come at 40% of the run, 1.5 s before the liveness
    deadline: these seeds, still electing a leader by then, "failed" liveness."""
    results = [runner.run_seed(seed, 3, 7.5, capture_trace=False) for seed in (24, 41, 163)]
    assert [(result.seed, result.failure) for result in results if not result.ok] == []
