"""`quorumlog node --ledger-rollover-records` (records per ledger of a ledger topic), and
its old name `--ledger-rollover-entries`, kept hidden so scripts written for the previous
release still start their nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

import quorumlog.node.server as server
from quorumlog.cli.node_commands import node_command


def settings_given(
    arguments: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> server.NodeSettings:
    """Run `quorumlog node` with `arguments` up to the settings it would run with."""
    seen: list[server.NodeSettings] = []

    async def run_node(
        settings: server.NodeSettings, stop: asyncio.Event, started: object = None
    ) -> None:
        seen.append(settings)

    monkeypatch.setattr(server, "run_node", run_node)
    base = ["--id", "n1", "--listen", "127.0.0.1:1", "--data-dir", str(tmp_path / "n1")]
    result = CliRunner().invoke(node_command, [*base, *arguments])
    assert result.exit_code == 0, result.output
    return seen[0]


def rollover_records_given(
    arguments: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> int:
    return settings_given(arguments, tmp_path, monkeypatch).ledger_rollover_records


def test_rollover_counts_records_under_the_new_name_and_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rollover_records_given([], tmp_path, monkeypatch) == 50_000
    new_name = ["--ledger-rollover-records", "700"]
    assert rollover_records_given(new_name, tmp_path, monkeypatch) == 700
    old_name = ["--ledger-rollover-entries", "900"]
    assert rollover_records_given(old_name, tmp_path, monkeypatch) == 900
    help_text = CliRunner().invoke(node_command, ["--help"]).output
    assert "--ledger-rollover-records" in help_text
    assert "--ledger-rollover-entries" not in help_text


def test_the_garbage_collection_intervals_reach_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = settings_given([], tmp_path, monkeypatch)
    assert (default.bookie_garbage_interval_ms, default.ledger_sweep_interval_ms) == (
        300_000,
        300_000,
    )
    flags = ["--bookie-garbage-interval-ms", "1500", "--ledger-sweep-interval-ms", "2500"]
    given = settings_given(flags, tmp_path, monkeypatch)
    assert (given.bookie_garbage_interval_ms, given.ledger_sweep_interval_ms) == (1500, 2500)
