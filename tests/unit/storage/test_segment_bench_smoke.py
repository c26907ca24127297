"""Smoke run of `quorumlog bench storage --json --quick`: every line is a JSON case result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quorumlog.bench.storage import run_storage_benchmark
from quorumlog.cli.main import cli


@pytest.mark.timeout(60)
def test_quick_benchmark_prints_one_json_case_per_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_storage_benchmark(as_json=True, directory=str(tmp_path), quick=True)
    lines = capsys.readouterr().out.splitlines()
    results = [json.loads(line) for line in lines]
    assert all(isinstance(result["case"], str) for result in results)
    by_case = {result["case"]: result for result in results}
    for case in (
        "segment-append-4096",
        "segment-append-100",
        "segment-append-encoded-100",
        "segment-open-1gib",
        "segment-read-random",
        "segment-index-memory",
    ):
        assert "error" not in by_case[case], by_case[case]
    assert by_case["segment-append-100"]["entries_per_s"] > 0
    assert by_case["segment-index-memory"]["bytes_per_entry"] > 0
    # The mmap store is reported too, with figures or with an error line per case.
    assert any(case.startswith("mmap-") for case in by_case)
    side_by_side = by_case["mmap-vs-segment-append-100"]
    assert side_by_side["mmap_entries_per_s"] > 0 and side_by_side["segment_entries_per_s"] > 0
    for store in ("mmap", "segment"):
        # Where the time went: append and sync per batch add up to the rate reported.
        per_batch_us = side_by_side[f"{store}_append_us"] + side_by_side[f"{store}_sync_us_mean"]
        entries_per_s = side_by_side["batch_entries"] / per_batch_us * 1e6
        assert entries_per_s == pytest.approx(side_by_side[f"{store}_entries_per_s"], rel=0.01)
        assert side_by_side[f"{store}_sync_us_median"] > 0
        assert 0 <= side_by_side[f"{store}_sync_slow_share"] < 1
    assert list(tmp_path.iterdir()) == []  # the benchmark cleaned up after itself


@pytest.mark.timeout(60)
def test_cli_runs_the_quick_benchmark(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "storage", "--json", "--quick", "--dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert all("case" in json.loads(line) for line in result.output.splitlines())
