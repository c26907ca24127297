"""`quorumlog bench scale --partitions 3,1000` runs only those phases (the A/B figures of
issue 13 need only 3 and 1,000 partitions)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from quorumlog.bench import scale
from quorumlog.bench.scale import ScaleSettings
from quorumlog.cli.main import cli


def test_partitions_choose_the_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[ScaleSettings] = []
    monkeypatch.setattr(scale, "run_scale_benchmark", ran.append)
    result = CliRunner().invoke(cli, ["bench", "scale", "--json", "--partitions", "3,1000"])
    assert result.exit_code == 0, result.output
    assert [settings.partition_counts for settings in ran] == [(3, 1000)]


def test_partitions_must_be_positive_numbers() -> None:
    for wrong in ("3,x", "0", ""):
        result = CliRunner().invoke(cli, ["bench", "scale", "--partitions", wrong])
        assert result.exit_code != 0
        assert "partition" in result.output or "numbers" in result.output
