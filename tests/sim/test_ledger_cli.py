"""`quorumlog sim ledger`: the summary line of `sim raft` plus the ledger counts; exit 1
with the seed and the replay command when a seed fails."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.ledger.protocol_recovery import LedgerRecovery

RAFT_KEYS = {
    "failures",
    "seeds",
    "simulated_seconds",
    "wall_seconds",
    "simulated_per_wall",
    "invariant_checks",
}


def test_sim_ledger_json_summary() -> None:
    result = CliRunner().invoke(cli, ["sim", "ledger", "--seeds", "1-4", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert set(summary) >= RAFT_KEYS
    assert summary["seeds"] == 4
    assert summary["failures"] == []
    assert summary["invariant_checks"] > 1000
    assert summary["recoveries"] >= 4


def test_sim_ledger_reports_a_failing_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    def never_recovers(self: LedgerRecovery) -> None:
        raise RuntimeError("planted failure")

    monkeypatch.setattr(LedgerRecovery, "begin_recovering", never_recovers)
    result = CliRunner().invoke(cli, ["sim", "ledger", "--seeds", "3-3", "--json"])
    assert result.exit_code == 1
    assert "seed 3 FAILED" in result.output
    assert "quorumlog sim ledger --seeds 3-3" in result.output
    assert "planted failure" in result.output
    assert "trace tail" in result.output
    assert json.loads(result.output.strip().splitlines()[-1])["failures"] == [3]
