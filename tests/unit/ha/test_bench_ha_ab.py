"""`python -m quorumlog.bench.ha_ab`: trees alternated (the order flips every pair), one JSON
line a run, each tree's medians last. The runs themselves are stubbed here (a real one is
`bench ha` with its node processes, smoke-tested in tests/integration/test_bench_ha_smoke.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quorumlog.bench import ha_ab


def test_runs_alternate_and_the_medians_come_last(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rates = {"old": iter([100, 300, 200]), "new": iter([400, 600, 500])}

    def run_tree(source: Path, rounds: int, directory: str) -> dict[str, Any]:
        assert rounds == 2 and directory == ""
        rate = next(rates[source.name])
        return {
            "produce_records_per_s": rate,
            "raft_topic_produce_per_s": 100,
            "ledger_topic_produce_per_s": 100,
            "ratio_ha_to_raft_produce": rate / 100,
            "failover_seconds": 2.0,
        }

    monkeypatch.setattr(ha_ab, "run_tree", run_tree)
    ha_ab.main(["--old", "old", "--new", "new", "--pairs", "3", "--rounds", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line.get("tree"), line.get("pair")) for line in lines[:-1]] == [
        ("old", 1),
        ("new", 1),
        ("new", 2),
        ("old", 2),
        ("old", 3),
        ("new", 3),
    ]
    assert all(isinstance(line["load_average_before"], float) for line in lines[:-1])
    summary = lines[-1]
    assert summary["case"] == "ab-summary" and summary["pairs"] == 3
    assert summary["old_medians"]["produce_records_per_s"] == 200
    assert summary["new_medians"]["ratio_ha_to_raft_produce"] == 5.0
