"""Smoke run of `python -m quorumlog.bench.storage_ab`: one JSON line per run, trees alternated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import quorumlog
from quorumlog.bench import storage_ab


@pytest.mark.timeout(60)
def test_runs_alternate_between_trees_and_report_both_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = Path(quorumlog.__file__).resolve().parent.parent
    arguments = ["--old", str(source), "--new", str(source), "--pairs", "2"]
    storage_ab.main([*arguments, "--entries", "512", "--repeats", "1", "--dir", str(tmp_path)])
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(result["tree"], result["pair"]) for result in results] == [
        ("old", 1),
        ("new", 1),
        ("new", 2),
        ("old", 2),
    ]
    for result in results:
        assert result["case"] == "mmap-vs-segment-append-100"
        assert result["mmap_entries_per_s"] > 0 and result["segment_entries_per_s"] > 0
        assert isinstance(result["load_average_1m"], float)
    assert list(tmp_path.iterdir()) == []
