"""`quorumlog bench ledger --json --quick` runs end to end and prints its figures.

The figures themselves are never judged here (benchmarks do not pass or fail); this checks
that every case runs on real processes (3 metadata nodes, 5 bookie processes), that the
summary line has the keys the issue names, and that nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CASES = [
    "adds-100-e3-w2-a2",
    "latency-100-e3-w2-a2",
    "adds-4096-e3-w2-a2",
    "latency-4096-e3-w2-a2",
    "adds-100-e3-w3-a2",
    "latency-100-e3-w3-a2",
    "adds-4096-e3-w3-a2",
    "latency-4096-e3-w3-a2",
    "recovery",
    "produce",
]
SUMMARY_KEYS = {
    "adds_per_s_100_3_2_2",
    "adds_per_s_4096_3_2_2",
    "adds_per_s_100_3_3_2",
    "adds_per_s_4096_3_3_2",
    "p50_ms_100_3_2_2",
    "p99_ms_100_3_2_2",
    "recovery_seconds",
    "recovery_entries",
    "ledger_topic_produce_per_s",
    "raft_topic_produce_per_s",
    "ratio_ledger_to_raft_produce",
}


def test_bench_ledger_prints_cases_and_a_summary(tmp_path: Path) -> None:
    command = ["bench", "ledger", "--json", "--quick", "--dir", str(tmp_path)]
    completed = subprocess.run(
        [sys.executable, "-m", "quorumlog", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    assert [line["case"] for line in lines] == [*CASES, "summary"]
    summary = lines[-1]
    assert set(summary) >= SUMMARY_KEYS
    for key in SUMMARY_KEYS:
        assert summary[key] is not None and summary[key] > 0, key
    recovery = lines[CASES.index("recovery")]
    # Every entry acknowledged before the writer stopped is in the recovered ledger.
    assert recovery["entries_after_recovery"] >= recovery["entries_written"]
    assert list(tmp_path.iterdir()) == []  # the benchmark removed what it wrote
