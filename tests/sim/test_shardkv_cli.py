"""`quorumlog sim shardkv`: the same summary line as `sim raft`, exit 1 on a failure with
the seed, the scenario and the replay command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.shardkv.scenarios import SCENARIOS, ScenarioRun


def test_sim_shardkv_json_summary_has_the_sim_raft_keys() -> None:
    result = CliRunner().invoke(cli, ["sim", "shardkv", "--seeds", "0-8", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    raft = CliRunner().invoke(cli, ["sim", "raft", "--seeds", "1", "--seconds", "7", "--json"])
    assert set(summary) == set(json.loads(raft.output.strip().splitlines()[-1]))
    assert summary["seeds"] == 9
    assert summary["failures"] == []
    assert summary["invariant_checks"] > 10_000
    assert summary["simulated_seconds"] > 9


def test_sim_shardkv_reports_a_failing_seed_and_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    def planted(run: ScenarioRun) -> None:
        raise InvariantViolation("planted failure")

    monkeypatch.setitem(SCENARIOS, "snapshots", planted)
    result = CliRunner().invoke(
        cli, ["sim", "shardkv", "--seeds", "4-4", "--scenario", "snapshots", "--json"]
    )
    assert result.exit_code == 1
    assert "quorumlog sim shardkv --seeds 4-4 --scenario snapshots" in result.output
    assert "scenario snapshots" in result.output
    assert "planted failure" in result.output
    assert json.loads(result.output.strip().splitlines()[-1])["failures"] == [4]


def test_sim_shardkv_rejects_bad_arguments() -> None:
    assert CliRunner().invoke(cli, ["sim", "shardkv", "--seeds", "9-3"]).exit_code == 2
    unknown = CliRunner().invoke(cli, ["sim", "shardkv", "--seeds", "1", "--scenario", "nope"])
    assert unknown.exit_code == 2
    assert "unknown scenario" in unknown.output
