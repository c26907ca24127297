"""`quorumlog bench ha --json --quick` runs end to end and prints its figures.

The figures themselves are never judged here (benchmarks do not pass or fail); this checks
that every case runs on real processes (3 nodes, fsync on), that the summary line has the
keys the issue names, that the failover case saw a new master at the next MasterEpoch, and
that nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PRODUCE_CASES = ["produce-ha", "produce-raft", "produce-ledger"]
ROUNDS = 2
CASES = [
    *PRODUCE_CASES * ROUNDS,
    "latency-ha",
    "latency-raft",
    "latency-ledger",
    "failover",
]
SUMMARY_KEYS = {
    "produce_records_per_s",
    "raft_topic_produce_per_s",
    "ledger_topic_produce_per_s",
    "ratio_ha_to_raft_produce",
    "ratio_ha_to_ledger_produce",
    "ha_p50_ms",
    "ha_p99_ms",
    "raft_p50_ms",
    "raft_p99_ms",
    "ledger_p50_ms",
    "ledger_p99_ms",
    "failover_seconds",
    "ha_client_cpu_us_per_record",
    "ha_node_cpu_us_per_record",
    "ha_client_cpu_share",
}


def test_bench_ha_prints_cases_and_a_summary(tmp_path: Path) -> None:
    command = ["bench", "ha", "--json", "--quick", "--rounds", str(ROUNDS), "--dir", str(tmp_path)]
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
    assert summary["rounds"] == ROUNDS
    assert len(summary["ratio_ha_to_raft_produce_rounds"]) == ROUNDS
    failover = lines[CASES.index("failover")]
    assert failover["new_master"] not in (None, failover["old_master"])
    assert failover["master_epoch_after"] == failover["master_epoch_before"] + 1
    assert list(tmp_path.iterdir()) == []  # the benchmark removed what it wrote
