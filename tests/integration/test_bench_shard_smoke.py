"""`quorumlog bench shard --json` runs end to end at a tiny size and prints its figures.

The figures themselves are never judged here (benchmarks do not pass or fail); this checks
that every phase runs, the summary line has its keys, the moved shard was served by its
new owner, and the benchmark removed what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUMMARY_KEYS = {
    "ops_per_s",
    "p50_ms",
    "p99_ms",
    "migration_seconds",
    "garbage_collected_seconds",
    "unaffected_ops_ratio",
    "unaffected_ops_per_s_before",
    "unaffected_ops_per_s_during",
    "migration_seconds_paced",
    "unaffected_ops_ratio_paced",
    "unaffected_paced_ops_per_s",
    "shard_bytes",
    "shard_count",
    "groups",
    "migration_mib_per_second",
    "node_rss_mb_max",
    "load_average_at_start",
}
PHASES = ["cluster", "throughput", "fill", "migration-closed-loop", "migration-paced", "nodes"]


def test_bench_shard_prints_phases_and_a_summary(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "bench",
            "shard",
            "--json",
            "--seconds",
            "1",
            "--shard-megabytes",
            "1",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    assert [line.get("phase") for line in lines[:-1]] == PHASES
    summary = lines[-1]
    assert set(summary) == SUMMARY_KEYS
    assert summary["ops_per_s"] > 0
    assert summary["migration_seconds"] > 0
    assert summary["garbage_collected_seconds"] > 0
    assert summary["migration_seconds_paced"] > 0
    assert summary["unaffected_ops_per_s_before"] > 0
    assert summary["shard_bytes"] >= 900_000
    assert summary["groups"] == 3
    assert summary["node_rss_mb_max"] > 0
    assert list(tmp_path.iterdir()) == []  # the benchmark removed what it wrote
