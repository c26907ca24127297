"""`quorumlog bench kv --json` runs end to end with a tiny window and prints its figures.

The figures themselves are never judged here (benchmarks do not pass or fail); this only
checks that every phase runs and the summary line has its keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUMMARY_KEYS = {
    "ops_per_s",
    "p50_ms",
    "p99_ms",
    "pysyncobj_ops_per_s",
    "ratio_to_pysyncobj",
    "p99_ms_at_1000_ops",
    "node_rss_mb_max",
}
PHASES = ["disk", "quorumlog-throughput", "quorumlog-paced", "quorumlog-nodes"]


def test_bench_kv_prints_phases_and_a_summary(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "bench",
            "kv",
            "--json",
            "--seconds",
            "0.5",
            "--clients",
            "1",
            "--concurrency",
            "200",
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
    assert [line.get("phase") for line in lines[:-1]] == [*PHASES, "pysyncobj-throughput"]
    summary = lines[-1]
    assert set(summary) == SUMMARY_KEYS
    assert summary["ops_per_s"] > 0
    assert summary["pysyncobj_ops_per_s"] > 0
    assert summary["node_rss_mb_max"] > 0
    assert list(tmp_path.iterdir()) == []  # the benchmark removed what it wrote
