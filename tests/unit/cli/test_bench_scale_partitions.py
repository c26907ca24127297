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


def test_produce_records_sets_the_records_per_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[ScaleSettings] = []
    monkeypatch.setattr(scale, "run_scale_benchmark", ran.append)
    result = CliRunner().invoke(cli, ["bench", "scale", "--produce-records", "100000"])
    assert result.exit_code == 0, result.output
    assert [settings.produce_records for settings in ran] == [100_000]
    assert ScaleSettings().produce_records != 100_000  # the option changed it, not the default


def test_the_summary_gives_the_ratio_of_the_largest_topic_to_three_partitions() -> None:
    phases = [
        {
            "partitions": 3,
            "produce_records_per_s": 200_000,
            "rss_mb_per_node": 40.0,
            "idle_cores": 0.03,
            "seconds_to_create": 0.1,
            "produce_records": 1000,
        },
        {
            "partitions": 1000,
            "produce_records_per_s": 50_000,
            "rss_mb_per_node": 60.0,
            "idle_cores": 0.04,
            "seconds_to_create": 12.0,
            "produce_records": 1000,
        },
    ]
    summary = scale.summarize(phases, groups_per_node=1004)
    assert summary["produce_ratio_1000_to_3_partitions"] == 0.25
    assert summary["produce_records_per_s_1000_partitions"] == 50_000
    assert summary["produce_records"] == 1000
